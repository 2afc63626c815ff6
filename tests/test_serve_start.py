"""What `specroute serve` tells its operator: one line saying where it listens and in front of
what, each backend that is down (from the start or later) at warning with why, a policy pinned
to a depth no backend has, and 503s that name every backend with the reason it could not help."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import inprocess
import pytest
from inprocess import Send, Upstream
from servers import Server
from structlog.testing import capture_logs

from specroute.children import bound_socket, spawn, stop, wait_ready_sync

CHAT = {"model": inprocess.MODEL, "messages": [{"role": "user", "content": "x"}]}


def _events(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _first(events: list[dict[str, Any]], name: str, **fields: object) -> dict[str, Any]:
    for entry in events:
        if entry["event"] == name and all(entry.get(k) == v for k, v in fields.items()):
            return entry
    raise AssertionError(f"no {name} {fields} in {events}")


@pytest.mark.timeout(60)
def test_serve_logs_where_it_listens_a_dead_backend_and_a_missing_depth(
    emulator: Server, tmp_path: Path
) -> None:
    listener, held = bound_socket(), bound_socket()  # `held` never listens: refused, always
    port, dead, fd = listener.getsockname()[1], held.getsockname()[1], listener.fileno()
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "specroute", "serve", "--port", str(port), "--fd", str(fd)]
    argv += ["--backend", f"live={emulator.url}", "--backend", f"dead=http://127.0.0.1:{dead}"]
    argv += ["--policy", "static:steps=7"]
    with log.open("wb") as err, listener:
        process = spawn(argv, stdout=subprocess.DEVNULL, stderr=err, pass_fds=[fd])
    try:
        wait_ready_sync(f"http://127.0.0.1:{port}/ready", process=process, within=30)
        deadline = time.monotonic() + 20
        while "policy_depth_missing" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop(process)
        held.close()
    events = _events(log)
    listening = _first(events, "proxy_listening")
    assert (listening["host"], listening["port"]) == ("127.0.0.1", port)
    assert listening["policy"] == "static:steps=7"
    assert listening["backends"] == {"live": emulator.url, "dead": f"http://127.0.0.1:{dead}"}
    assert listening["healthy"] == ["live"]
    down = _first(events, "backend_down", backend="dead")
    assert (down["level"], down["reason"]) == ("warning", "connection refused")
    missing = _first(events, "policy_depth_missing")
    assert (missing["level"], missing["depth"], missing["depths"]) == ("warning", 7, [3])


async def _ok(_: bytes, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"choices": []}'})


async def _failing(_: bytes, send: Send) -> None:
    await send({"type": "http.response.start", "status": 500, "headers": []})
    await send({"type": "http.response.body", "body": b'{"error": "boom"}'})


async def _until(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _started(stack: contextlib.AsyncExitStack, upstream: Upstream) -> Upstream:
    return await stack.enter_async_context(upstream.running())


async def _both_go_down(other_model: bool) -> httpx.Response:
    a, b = Upstream(_ok), Upstream(_ok)
    if other_model:
        a._info["/server_info"]["served_model_name"] = "other/model"
    async with contextlib.AsyncExitStack() as keep_b:
        await _started(keep_b, b)
        async with contextlib.AsyncExitStack() as keep_a:
            await _started(keep_a, a)
            async with inprocess.proxy({"a": a, "b": b}) as (url, app):
                pool = app.state.pool
                if not other_model:
                    await keep_a.aclose()
                    await _until(lambda: not pool.by_name["a"].healthy, "a to be down")
                await keep_b.aclose()
                await _until(lambda: not pool.by_name["b"].healthy, "b to be down")
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    return await client.post("/v1/chat/completions", json=CHAT)
    raise AssertionError("unreachable")


def test_a_backend_that_goes_down_is_logged_at_warning_with_why() -> None:
    with capture_logs() as logs:
        reply = asyncio.run(_both_go_down(other_model=False))
    down = [e for e in logs if e["event"] == "backend_down"]
    assert {(e["backend"], e["log_level"], e["reason"]) for e in down} == {
        ("a", "warning", "connection refused"),
        ("b", "warning", "connection refused"),
    }
    assert reply.status_code == 503
    message = reply.json()["error"]["message"]
    assert message == (
        f"no healthy backend for model {inprocess.MODEL!r}: "
        "a: down: connection refused; b: down: connection refused"
    )


def test_no_healthy_backend_names_one_that_serves_another_model() -> None:
    reply = asyncio.run(_both_go_down(other_model=True))
    assert reply.status_code == 503
    message = reply.json()["error"]["message"]
    assert "a: serves other/model; b: down: connection refused" in message


async def _queue_timeout(
    handler: inprocess.Handler, release: asyncio.Event, **overrides: object
) -> httpx.Response:
    """A first request on `only` (held, or failed), then what the client gets while `only`
    cannot take another and `dead` never answered."""
    held = contextlib.closing(bound_socket())  # bound, never listening: connections refused
    dead = Upstream(_ok)
    dead.url = f"http://127.0.0.1:{held.thing.getsockname()[1]}"
    only = Upstream(handler)
    only._info["/server_info"]["max_running_requests"] = 1  # with overcommit 1: a limit of 1
    admission = {"queue_timeout_s": 0.3, "overcommit": 1.0}
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(held)
        await _started(stack, only)
        async with (
            inprocess.proxy({"only": only, "dead": dead}, admission=admission, **overrides) as (
                url,
                app,
            ),
            httpx.AsyncClient(base_url=url, timeout=10) as client,
        ):
            first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
            if release.is_set():  # the first one fails: its retry is the answer
                return await first
            backend = app.state.pool.by_name["only"]
            await _until(lambda: backend.in_flight == 1, "the first request to be held")
            second = await client.post("/v1/chat/completions", json=CHAT)
            release.set()
            assert (await first).status_code == 200
            return second
    raise AssertionError("unreachable")


def _held_until(release: asyncio.Event) -> inprocess.Handler:
    async def handler(body: bytes, send: Send) -> None:
        await release.wait()
        await _ok(body, send)

    return handler


def test_a_queue_timeout_names_the_full_backend_and_the_dead_one() -> None:
    async def run() -> httpx.Response:
        release = asyncio.Event()
        return await _queue_timeout(_held_until(release), release)

    reply = asyncio.run(run())
    assert reply.status_code == 503
    assert reply.json()["error"]["message"] == (
        "timed out waiting for a free backend; only: full: 1 in flight, limit 1; "
        "dead: down: connection refused"
    )


def test_a_request_whose_backend_fails_names_its_open_circuit_and_that_it_was_tried() -> None:
    async def run() -> httpx.Response:
        release = asyncio.Event()
        release.set()
        breaker = {"failure_threshold": 1, "open_s": 60}
        return await _queue_timeout(_failing, release, breaker=breaker)

    reply = asyncio.run(run())
    assert reply.status_code == 503
    assert reply.json()["error"]["message"] == (
        "timed out waiting for a free backend; only (tried): circuit open after failed "
        "requests; dead: down: connection refused"
    )


def test_a_missing_depth_is_warned_once_per_set_of_depths_found() -> None:
    from specroute.policies import create

    async def run() -> list[bool]:
        async with (
            Upstream(_ok, steps=1).running() as one,
            Upstream(_ok, steps=2).running() as two,
            inprocess.proxy({"one": one, "two": two}) as (_, app),
        ):
            watch, seven = app.state.depths, create("static:steps=7")
            return [
                watch.check(seven),
                watch.check(seven),  # the same depths again: already said
                watch.check(create("static:steps=2")),  # served: nothing to say
                watch.check(create("least_loaded")),  # pins no depth
                watch.check(seven),  # missing again after it was fine: said again
            ]

    with capture_logs() as logs:
        assert asyncio.run(run()) == [True, False, False, False, True]
    missing = [e for e in logs if e["event"] == "policy_depth_missing"]
    assert len(missing) >= 2
    assert {(e["depth"], tuple(e["depths"]), e["log_level"]) for e in missing} == {
        (7, (1, 2), "warning")
    }


def test_a_queue_timeout_names_a_backend_the_launcher_holds() -> None:
    async def run() -> httpx.Response:
        async with contextlib.AsyncExitStack() as keep_b:
            a, b = Upstream(_ok), await _started(keep_b, Upstream(_ok))
            admission = {"queue_timeout_s": 0.3}
            async with (
                a.running(),
                inprocess.proxy({"a": a, "b": b}, admission=admission) as (
                    url,
                    app,
                ),
            ):
                app.state.pool.holds.hold("a", "draining")
                await keep_b.aclose()
                await _until(lambda: not app.state.pool.by_name["b"].healthy, "b to be down")
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    return await client.post("/v1/chat/completions", json=CHAT)
        raise AssertionError("unreachable")

    reply = asyncio.run(run())
    assert reply.status_code == 503
    assert reply.json()["error"]["message"] == (
        "timed out waiting for a free backend; a: draining (the launcher is changing its "
        "depth); b: down: connection refused"
    )

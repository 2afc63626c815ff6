"""Faults through the proxy against real emulated backends: disconnects, crashes, stalls,
retries, health changes and admission, and in-flight counts that always return to zero."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import Server, bound_socket, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
FAST = ("--time-scale", "50", "--seed", "5")
BASE = """
[health]
interval_s = 0.1
timeout_s = 1.0
failure_threshold = 1
success_threshold = 1
[timeouts]
first_byte_s = 10.0
idle_s = 0.5
[retry]
max_attempts = 3
backoff_s = 0.01
[breaker]
failure_threshold = 1000
"""


def serve(tmp: Path, backends: list[Server], extra: str = "", ready: str = "/ready"):  # type: ignore[no-untyped-def]
    config = tmp / "proxy.toml"
    config.write_text(extra + BASE)
    args = ["serve", "--config", str(config), "--policy", "round_robin"]
    if "[[backends]]" not in extra:
        for backend in backends:
            args += ["--backend", backend.url]
    return run_server(args, ready_path=ready)


def chat(max_tokens: int = 16, stream: bool = True) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def in_flight(proxy: Server) -> list[int]:
    return [b["in_flight"] for b in httpx.get(proxy.url + "/pool").json()["backends"]]


def healthy(proxy: Server) -> list[bool]:
    return [b["healthy"] for b in httpx.get(proxy.url + "/pool").json()["backends"]]


def events(raw: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]


def aborted(backend: Server) -> float:
    for line in httpx.get(backend.url + "/metrics").text.splitlines():
        if line.startswith("sglang:num_aborted_requests_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_client_disconnect_cancels_the_upstream_request(tmp_path: Path) -> None:
    with start_emulator(3, "--seed", "1") as backend, serve(tmp_path, [backend]) as proxy:
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=chat(4000)) as reply:
            next(reply.iter_raw())  # the stream is under way; now hang up
        wait_for(lambda: aborted(backend) >= 1)
        wait_for(lambda: in_flight(proxy) == [0])


def test_client_that_gives_up_on_a_whole_reply_cancels_it_too(tmp_path: Path) -> None:
    with start_emulator(3, "--seed", "1") as backend, serve(tmp_path, [backend]) as proxy:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(proxy.url + "/v1/chat/completions", json=chat(4000, False), timeout=0.5)
        wait_for(lambda: aborted(backend) >= 1)
        wait_for(lambda: in_flight(proxy) == [0])


def test_client_disconnect_cancels_upstream_under_any_asgi_server() -> None:
    """Under uvicorn's plain protocols (no DisconnectSignal) the relay watches `receive()`."""
    import threading

    import uvicorn

    from specroute.config import load_config
    from specroute.proxy import create_app

    with start_emulator(3, "--seed", "1") as backend:
        sock = bound_socket()  # uvicorn listens on it: no port picked for it to bind later
        port = sock.getsockname()[1]
        config = load_config(
            environ={}, overrides={"backends": [{"url": backend.url}], "port": port}
        )
        server = uvicorn.Server(
            uvicorn.Config(create_app(config), port=port, http="h11", log_level="warning")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _ready(url))
            with httpx.stream("POST", url + "/v1/chat/completions", json=chat(4000)) as reply:
                next(reply.iter_raw())
            wait_for(lambda: aborted(backend) >= 1)
        finally:
            server.should_exit = True
            thread.join(10)
            sock.close()


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/ready").status_code == 200
    return False


def test_backend_killed_mid_stream_ends_with_error_event_and_done(tmp_path: Path) -> None:
    crashing = start_emulator(3, *FAST, "--exit-mid-stream-after-tokens", "6")
    with crashing as backend, serve(tmp_path, [backend]) as proxy:
        reply = httpx.post(proxy.url + "/v1/chat/completions", json=chat(200))
        assert reply.status_code == 200
        *content, error, done = events(reply.content)
        assert content  # tokens arrived before the crash
        assert json.loads(error)["error"]["code"] == "stream_interrupted"
        assert done == b"[DONE]"
        wait_for(lambda: in_flight(proxy) == [0])


def test_stalled_stream_ends_with_timeout_event(tmp_path: Path) -> None:
    stalling = start_emulator(3, *FAST, "--stall-after-tokens", "4")
    with stalling as backend, serve(tmp_path, [backend]) as proxy:
        reply = httpx.post(proxy.url + "/v1/chat/completions", json=chat(100))
        *_, error, done = events(reply.content)
        assert json.loads(error)["error"]["code"] == "upstream_timeout"
        assert done == b"[DONE]"
        assert in_flight(proxy) == [0]


def test_failures_before_the_first_byte_are_retried_invisibly(tmp_path: Path) -> None:
    failing = start_emulator(1, *FAST, "--fail-rate", "1.0")
    with failing as bad, start_emulator(3, *FAST) as good, serve(tmp_path, [bad, good]) as proxy:
        for stream in (True, False, True, False):
            reply = httpx.post(proxy.url + "/v1/chat/completions", json=chat(8, stream))
            assert reply.status_code == 200
            assert reply.headers["x-specroute-steps"] == "3"
        assert "specroute_upstream_retries_total{" in httpx.get(proxy.url + "/metrics").text
        assert in_flight(proxy) == [0, 0]


def test_backend_dying_on_request_is_retried_elsewhere(tmp_path: Path) -> None:
    dying = start_emulator(1, *FAST, "--exit-after-requests", "1")
    with dying as bad, start_emulator(3, *FAST) as good, serve(tmp_path, [bad, good]) as proxy:
        for _ in range(4):
            reply = httpx.post(proxy.url + "/v1/chat/completions", json=chat(8))
            assert reply.status_code == 200
        wait_for(lambda: healthy(proxy) == [False, True])


def test_unhealthy_backend_is_taken_out_and_brought_back(tmp_path: Path) -> None:
    # Not ready for longer than a proxy takes to start on a loaded machine, so the proxy is
    # seen refusing first; then it must notice the backend come up without a restart.
    slow_start = start_emulator(3, *FAST, "--not-ready-for", "8", ready_path=None)
    with slow_start as backend, serve(tmp_path, [backend], ready="/health") as proxy:
        assert httpx.get(proxy.url + "/ready").status_code == 503
        wait_for(lambda: healthy(proxy) == [True], timeout=30)
        assert httpx.get(proxy.url + "/ready").status_code == 200
        port = backend.port
        backend.kill()
        wait_for(lambda: healthy(proxy) == [False])
        reply = httpx.post(proxy.url + "/v1/chat/completions", json=chat(8, stream=False))
        assert reply.status_code == 503
        with start_emulator(3, *FAST, port=port):
            wait_for(lambda: healthy(proxy) == [True])
            reply = httpx.post(proxy.url + "/v1/chat/completions", json=chat(8, stream=False))
            assert reply.status_code == 200


def test_full_backends_queue_then_answer_429_or_503_with_retry_after(tmp_path: Path) -> None:
    with start_emulator(3, "--seed", "2", "--time-scale", "2") as backend:
        extra = (
            f'[[backends]]\nurl = "{backend.url}"\nmax_in_flight = 1\n'
            "[admission]\nqueue_size = 1\nqueue_timeout_s = 0.3\n"
        )
        with serve(tmp_path, [backend], extra) as proxy:
            statuses = asyncio.run(_three_at_once(proxy.url))
            assert statuses[0] == (200, None)
            assert sorted(statuses[1:]) == [(429, "1"), (503, "1")]
            wait_for(lambda: in_flight(proxy) == [0])


async def _three_at_once(url: str) -> list[tuple[int, str | None]]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        long = {**chat(600, False), "ignore_eos": True}
        first = asyncio.create_task(client.post("/v1/chat/completions", json=long))
        for _ in range(500):  # until the first request holds the only slot
            if (await client.get("/pool")).json()["backends"][0]["in_flight"]:
                break
            await asyncio.sleep(0.02)  # polling another process
        rest = asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(4, False)) for _ in range(2))
        )
        replies = [await first, *await rest]
    return [(r.status_code, r.headers.get("retry-after")) for r in replies]


@pytest.fixture(scope="module")
def faulty_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("faulty")
    flaky = start_emulator(1, *FAST, "--fail-rate", "0.3", "--malformed-sse-rate", "0.3")
    with flaky as a, start_emulator(2, *FAST, "--fail-rate", "0.2") as b, serve(tmp, [a, b]) as p:
        yield p


ACTION = st.tuples(
    st.sampled_from(["stream", "whole", "disconnect"]),
    st.integers(1, 40),
)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(ACTION, min_size=1, max_size=6))
def test_random_faults_and_disconnects_leave_every_count_at_zero(
    faulty_proxy: Server, actions: list[tuple[str, int]]
) -> None:
    asyncio.run(_run_actions(faulty_proxy.url, actions))
    wait_for(lambda: in_flight(faulty_proxy) == [0, 0])
    metrics = httpx.get(faulty_proxy.url + "/metrics").text
    gauges = [g for g in metrics.splitlines() if g.startswith("specroute_in_flight_requests{")]
    assert all(float(g.rsplit(" ", 1)[1]) == 0 for g in gauges)


async def _run_actions(url: str, actions: list[tuple[str, int]]) -> None:
    client = httpx.AsyncClient(base_url=url, timeout=30)
    async with client, asyncio.TaskGroup() as group:
        for kind, tokens in actions:
            group.create_task(_act(client, kind, tokens))


async def _act(client: httpx.AsyncClient, kind: str, tokens: int) -> None:
    body = chat(tokens, stream=kind != "whole")
    if kind != "disconnect":
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code in (200, 500, 502)
        return
    with contextlib.suppress(httpx.HTTPError):
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            async for _ in reply.aiter_raw():
                break  # hang up after the first bytes

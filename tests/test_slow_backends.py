"""Backends that fail slowly: one that accepts and never answers, one that sends its headers and
then nothing, one that trickles bytes that never finish an event or a body, a /ready that
trickles; and backends that answer 200 with what the route does not promise. Each costs its
client a clean error in OpenAI's shape and marks the backend unhealthy, also on a proxy that
started a moment ago and has learned nothing (the a priori limits)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import inprocess
import pytest
from inprocess import Send, Upstream, event

# Small limits where the test is not about the defaults: each case ends in about a second.
QUICK = {
    "header_s": 0.5,
    "first_token_floor_s": 0.5,
    "stall_floor_s": 0.5,
    "heartbeat_s": 0.2,
}
WITHIN_S = 10.0  # what the issue asks: a clean error within 10 s of the backend going quiet
START = {"type": "http.response.start", "status": 200}
SSE = [(b"content-type", b"text/event-stream")]
JSON = [(b"content-type", b"application/json")]


def _chat(stream: bool, max_tokens: int = 8) -> dict[str, object]:
    return {
        "model": inprocess.MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _token(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return event({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


class Backends:
    """Scripted misbehaviours; `gone` ends every handler still running when the test ends."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def never_answers(self, _: bytes, send: Send) -> None:
        await self.gone.wait()

    async def headers_then_silence(self, _: bytes, send: Send) -> None:
        await send({**START, "headers": SSE})
        await self.gone.wait()

    def trickle(
        self, head: list[tuple[bytes, bytes]], tokens: int, gap_s: float
    ) -> Callable[[bytes, Send], Awaitable[None]]:
        """A handler: `tokens` whole events, then an event (or body) a byte each `gap_s`."""

        async def handler(_: bytes, send: Send) -> None:
            await send({**START, "headers": head})
            for _ in range(tokens):
                await send({"type": "http.response.body", "body": _token("t"), "more_body": True})
            while not self.gone.is_set():
                await send({"type": "http.response.body", "body": b"d", "more_body": True})
                await asyncio.sleep(gap_s)

        return handler


async def _outcome(url: str, body: dict[str, object]) -> tuple[int, bytes, float]:
    """Status, raw body and seconds taken of one request (its own limit far above 10 s)."""
    started = time.monotonic()
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as reply,
    ):
        raw = b"".join([chunk async for chunk in reply.aiter_raw()])
    return reply.status_code, raw, time.monotonic() - started


def _error_of(status: int, raw: bytes) -> dict[str, Any]:
    """The OpenAI-shaped error a client got: the body of a failed reply, or a stream's
    error event followed by [DONE]."""
    if status != 200:
        return dict(json.loads(raw)["error"])
    data = [line for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert data[-1] == b"data: [DONE]"
    return dict(json.loads(data[-2].removeprefix(b"data: "))["error"])


def _stated_s(error: dict[str, Any]) -> float:
    """The limit an upstream_timeout's message says the backend ran into, in seconds."""
    found = re.search(r"(?:for|within) ([0-9.]+(?:e[+-]?[0-9]+)?) s\b", error["message"])
    assert found is not None, error["message"]
    return float(found.group(1))


async def _pool(url: str) -> dict[str, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url) as client:
        backends = (await client.get("/pool")).json()["backends"]
    return {b["name"]: b for b in backends}


async def _case(
    make: Callable[[Backends], Callable[[bytes, Send], Awaitable[None]]],
    body: dict[str, object],
    **overrides: object,
) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """One misbehaving backend behind a fresh proxy: the error its client got, the seconds
    it took, and the backend as /pool shows it afterwards."""
    scripts = Backends()
    async with (
        Upstream(make(scripts)).running() as bad,
        inprocess.proxy({"bad": bad}, **overrides) as (url, _),
    ):
        try:
            status, raw, took = await _outcome(url, body)
            seen = (await _pool(url))["bad"]
        finally:
            scripts.gone.set()  # the scripted handlers end before their servers stop
    return _error_of(status, raw), took, seen


def _fresh(timeouts: dict[str, float]) -> dict[str, object]:
    return {"timeouts": timeouts, "breaker": {"open_s": 60.0}}


CASES = {
    "never answers, streamed": (lambda b: b.never_answers, True),
    "never answers, whole": (lambda b: b.never_answers, False),
    "headers then silence": (lambda b: b.headers_then_silence, True),
    "trickles before the first token": (lambda b: b.trickle(SSE, 0, 0.05), True),
    "trickles between tokens": (lambda b: b.trickle(SSE, 3, 0.05), True),
    "trickles a whole body": (lambda b: b.trickle(JSON, 0, 0.05), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_slow_backend_costs_its_client_a_clean_error_and_its_health(name: str) -> None:
    make, stream = CASES[name]
    error, took, seen = asyncio.run(_case(make, _chat(stream), **_fresh(QUICK)))
    assert error["code"] == "upstream_timeout"
    assert error["type"] == "timeout"
    # The limit it ran into, stated, and waited out (how much later this machine's scheduler
    # let the error through is not the proxy's to decide).
    assert _stated_s(error) < WITHIN_S
    assert took >= _stated_s(error) - 0.01
    assert not seen["healthy"]
    assert seen["breaker"] == "open"


def test_a_fresh_proxy_with_the_default_limits_ends_slow_backends_within_10_s() -> None:
    """Nothing learned and nothing configured: the a priori limits, from the defaults."""

    async def both() -> list[tuple[dict[str, Any], float, dict[str, Any]]]:
        return list(
            await asyncio.gather(
                _case(lambda b: b.trickle(SSE, 0, 1.0), _chat(True)),  # a byte a second
                _case(lambda b: b.never_answers, _chat(False)),
            )
        )

    for error, took, seen in asyncio.run(both()):
        assert error["code"] == "upstream_timeout"
        assert _stated_s(error) < WITHIN_S  # not the 120 s `idle_s` or 900 s `first_byte_s`
        assert took >= _stated_s(error) - 0.01
        assert not seen["healthy"]


def test_the_error_states_the_limit_that_was_reached() -> None:
    limits = {**QUICK, "first_token_floor_s": 1.5}
    error, took, _ = asyncio.run(
        _case(lambda b: b.headers_then_silence, _chat(True), **_fresh(limits))
    )
    found = re.search(r"no event from the backend for ([0-9.]+) s", error["message"])
    assert found is not None, error["message"]
    stated = float(found.group(1))
    # The floor plus the prediction for a tiny prompt (a fraction of a second), and what the
    # client really waited: not a figure from some other clock.
    assert 1.5 <= stated < 2.0
    assert took >= stated - 0.01


# Replies that are not what the route promises --------------------------------------------------


async def _not_json(_: bytes, send: Send) -> None:
    await send({**START, "headers": JSON})
    await send({"type": "http.response.body", "body": b"<html>captive portal</html>"})


async def _not_sse(_: bytes, send: Send) -> None:
    await send({**START, "headers": JSON})
    await send({"type": "http.response.body", "body": b'{"choices": []}'})


@pytest.mark.parametrize(("handler", "stream"), [(_not_json, False), (_not_sse, True)])
def test_a_200_that_is_not_what_the_route_promises_is_a_502_and_a_broken_backend(
    handler: Callable[[bytes, Send], Awaitable[None]], stream: bool
) -> None:
    error, _, seen = asyncio.run(_case(lambda _: handler, _chat(stream), **_fresh(QUICK)))
    assert error["code"] == "bad_upstream_reply"
    assert error["type"] == "upstream_error"
    assert not seen["healthy"]
    assert seen["breaker"] == "open"


ODD_STATES = ["odd", [1], [None], [{"avg_spec_accept_length": "x"}], {"a": 1}]


async def _with_odd_states(states: object) -> tuple[int, dict[str, Any], int, int]:
    done = inprocess.stream_of([_token("t"), b"data: [DONE]\n\n"])
    backend = Upstream(done, info={"internal_states": states})
    async with (
        backend.running(),
        inprocess.proxy({"b": backend}, health={"metrics_interval_s": 0.05}) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        scraper = app.state.pool.scraper
        for _ in range(1000):  # the scraper outlives a view built on the odd states
            if scraper.scrapes >= 2:
                break
            await asyncio.sleep(0.01)
        info = await client.get("/server_info")
        chat = await client.post("/v1/chat/completions", json=_chat(True))
        pool = (await _pool(url))["b"]
    return info.status_code, pool, chat.status_code, scraper.scrapes


@pytest.mark.parametrize("states", ODD_STATES)
def test_an_odd_internal_states_neither_stops_the_proxy_nor_its_scraper_nor_server_info(
    states: object,
) -> None:
    info_status, pool, chat_status, scrapes = asyncio.run(_with_odd_states(states))
    assert info_status == 200
    assert pool["healthy"]
    assert chat_status == 200
    assert scrapes >= 2


# Replies too large to hold ----------------------------------------------------------------------


async def _endless(_: bytes, send: Send) -> None:
    """A streamed event four times the cap that never ends (the body stops mid-event)."""
    await send({**START, "headers": SSE})
    await send({"type": "http.response.body", "body": b"data: {", "more_body": True})
    for _ in range(64):  # 4 MiB, four times the cap
        await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _huge(_: bytes, send: Send) -> None:
    await send({**START, "headers": JSON})
    for _ in range(64):  # 4 MiB, four times the cap
        await send({"type": "http.response.body", "body": b" " * 65536, "more_body": True})
    await send({"type": "http.response.body", "body": b"{}"})


def test_an_event_past_its_cap_ends_the_stream_and_a_body_past_its_cap_is_a_502() -> None:
    caps = {"max_event_bytes": 1 << 20, "max_reply_bytes": 1 << 20}
    error, _, seen = asyncio.run(_case(lambda _: _endless, _chat(True), limits=caps))
    assert error["code"] in {"bad_upstream_reply", "stream_interrupted"}
    assert "over 1048576 bytes" in error["message"]
    assert not seen["healthy"]  # a never-ending event is a broken backend
    error, _, seen = asyncio.run(_case(lambda _: _huge, _chat(False), limits=caps))
    assert error["code"] == "upstream_reply_too_large"
    assert seen["healthy"]  # a large reply is no fault of the backend's


# A /ready that trickles -----------------------------------------------------------------------


class TricklingReady(Upstream):
    """Answers as SGLang does until `trickle` is set; then its /ready sends a byte at a time."""

    def __init__(self) -> None:
        super().__init__(inprocess.stream_of([_token("t"), b"data: [DONE]\n\n"]))
        self.trickle = asyncio.Event()
        self.gone = asyncio.Event()
        self.trickled = 0
        """Probes of /ready begun since `trickle` was set."""

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/ready" and self.trickle.is_set():
            self.trickled += 1
            await send({**START, "headers": [*JSON, (b"content-length", b"1000")]})
            while not self.gone.is_set():
                await send({"type": "http.response.body", "body": b" ", "more_body": True})
                await asyncio.sleep(0.05)
            return
        await super().__call__(scope, receive, send)


async def _ready_goes_quiet() -> int:
    """The probes begun on a /ready that trickles until the backend is marked unhealthy."""
    backend = TricklingReady()
    health = {"interval_s": 0.2, "timeout_s": 0.5, "success_threshold": 1,
              "failure_threshold": 3}  # fmt: skip
    async with (
        backend.running(),
        inprocess.proxy({"bad": backend}, health=health) as (url, _),
    ):
        try:
            assert (await _pool(url))["bad"]["healthy"]
            backend.trickle.set()
            # The bound only keeps a failure from hanging: a probe without a whole-request
            # deadline never ends, and the backend stays healthy for good.
            deadline = time.monotonic() + 60
            while (await _pool(url))["bad"]["healthy"]:
                assert time.monotonic() < deadline, f"still healthy, {backend.trickled} probes"
                await asyncio.sleep(0.02)
            return backend.trickled
        finally:
            backend.gone.set()


def test_a_trickling_ready_marks_the_backend_unhealthy_at_the_first_probes_deadline() -> None:
    """The first probe of the trickling /ready ends at its deadline and takes the backend out
    at once (not after `failure_threshold` probes): unhealthy within one probe interval plus
    the probe's deadline. A probe that waited out the body, or ended by a per-read timeout,
    would never end; a deadline counted as a plain failure would take three probes."""
    assert asyncio.run(_ready_goes_quiet()) == 1


def _done_then_open(scripts: Backends, after: bytes) -> Callable[[bytes, Send], Awaitable[None]]:
    """A whole answer, `[DONE]` included, then `after`, from a backend that then keeps its
    reply open."""

    async def handler(_: bytes, send: Send) -> None:
        await send({**START, "headers": SSE})
        for part in (_token("t"), b"data: [DONE]\n\n", after):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await scripts.gone.wait()

    return handler


async def _whole_then_slow_close(
    leave_at_done: bool, after: bytes = b""
) -> tuple[list[bytes], float, str, str]:
    """One stream from `_done_then_open` behind a proxy with the default limits: the data lines
    its client read, the seconds they took, the status the proxy recorded, and the backend's
    state in /pool. With `leave_at_done` the client stops at `[DONE]`, as the openai client
    does, and closes its connection while the proxy still waits for the backend's end."""
    scripts = Backends()
    async with (
        Upstream(_done_then_open(scripts, after)).running() as slow,
        inprocess.proxy({"slow": slow}) as (url, app),
    ):
        try:
            started = time.monotonic()
            lines: list[bytes] = []
            async with (
                httpx.AsyncClient(base_url=url, timeout=60) as client,
                client.stream("POST", "/v1/chat/completions", json=_chat(True)) as reply,
            ):
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        lines.append(line.encode())
                    if leave_at_done and line == "data: [DONE]":
                        break
            took = time.monotonic() - started
            requests = app.state.metrics.requests
            await inprocess.until(lambda: bool(requests.values), "the request's record")
            (labels,) = requests.values
            state = (await _pool(url))["slow"]["state"]
        finally:
            scripts.gone.set()
    return lines, took, labels[3], state


@pytest.mark.parametrize("leave_at_done", [False, True])
def test_a_whole_answer_from_a_backend_slow_to_close_is_whole_and_ok(leave_at_done: bool) -> None:
    """`[DONE]` ends the answer: the client's stream ends soon after it with nothing appended
    (no stall error), the request counts as a 200 even when its client leaves at `[DONE]`
    before the backend closes (not as a 499, a client that left), and the backend stays
    serving."""
    lines, took, status, state = asyncio.run(_whole_then_slow_close(leave_at_done))
    assert lines == [_token("t").strip(), b"data: [DONE]"]
    assert took < 4.0  # the stall limit between events is 5 s by default: none waited out
    assert status == "200"
    assert state == "serving"


@pytest.mark.parametrize(
    "after",
    [b"data: not json\n\n", b'data: {"choices": []}\n\n: comment\n\n', b"data: torn"],
    ids=["garbage", "events", "unterminated"],
)
def test_nothing_a_backend_sends_after_done_reaches_the_client_or_fails_the_answer(
    after: bytes,
) -> None:
    """Bytes after `[DONE]` (garbage, more events, a torn tail) are not the answer: the client
    gets the answer and `[DONE]` only, with no error event appended, the request is a 200 and
    the backend stays serving (it is not marked broken for what it sent after the end)."""
    lines, took, status, state = asyncio.run(_whole_then_slow_close(False, after))
    assert lines == [_token("t").strip(), b"data: [DONE]"]
    assert took < 4.0
    assert status == "200"
    assert state == "serving"


async def _drained_between_answer_and_done() -> tuple[list[bytes], str, str]:
    """A stream on `a` whose backend is drained, past the drain's deadline, after its token and
    before its `[DONE]`; `a` then keeps the reply open. The client's data lines, the status the
    proxy recorded and the proxy's /metrics once the request is recorded."""
    scripts = Backends()
    go = asyncio.Event()

    async def answer(_: bytes, send: Send) -> None:
        await send({**START, "headers": SSE})
        await send({"type": "http.response.body", "body": _token("t"), "more_body": True})
        await go.wait()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await scripts.gone.wait()

    async with (
        Upstream(answer).running() as a,
        Upstream(answer).running() as b,
        inprocess.proxy({"a": a, "b": b}, policy="round_robin", migration={"drain_s": 0.2}) as (
            url,
            app,
        ),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        try:
            lines: list[bytes] = []
            async with client.stream("POST", "/v1/chat/completions", json=_chat(True)) as reply:
                async for line in reply.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    lines.append(line.encode())
                    if len(lines) == 1:  # the token is out: drain its backend past the deadline
                        name = reply.headers["x-specroute-backend"]
                        state = {"state": "draining"}
                        put = await client.put(
                            f"/pool/backends/{name}/state", json=state, headers=inprocess.ADMIN
                        )
                        assert put.status_code == 200, put.text
                        await asyncio.sleep(0.4)
                        go.set()
            requests = app.state.metrics.requests
            await inprocess.until(lambda: bool(requests.values), "the request's record")
            (labels,) = requests.values
            metrics = (await client.get("/metrics")).text
        finally:
            scripts.gone.set()
    return lines, labels[3], metrics


def test_a_drain_does_not_move_a_stream_whose_last_event_is_out() -> None:
    """A backend drained while its stream waits for `[DONE]`: the stream's answer is whole at
    `[DONE]`, so it is not moved to another backend after it (no migration, nothing appended),
    and the request is a 200."""
    lines, status, metrics = asyncio.run(_drained_between_answer_and_done())
    assert lines == [_token("t").strip(), b"data: [DONE]"]
    assert status == "200"
    moved = [
        line
        for line in metrics.splitlines()
        if line.startswith("specroute_migrations_total{") and not line.endswith(" 0.0")
    ]
    assert moved == []

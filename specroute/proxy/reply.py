"""The reply to the client: a whole body, or an event stream relayed event by event as it
arrives; what the proxy asked for and the client did not is removed, every other event goes
on byte for byte, tokens are counted, a quiet backend gets heartbeats sent for it until its
stall limit, and a client that stops reading is let go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from specroute.errors import (
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceUnavailableError,
    SpecrouteError,
    StreamInterruptedError,
    UpstreamTimeoutError,
    error_body,
)
from specroute.pool import Stalled, StreamBroken, TimedOut, UpstreamFailure, UpstreamResponse
from specroute.proxy.bodies import BODY_MEMORY_FULL
from specroute.proxy.chunks import ReplyMeter, StreamRelay, strip_reply
from specroute.proxy.fields import Extras
from specroute.proxy.intake import Send
from specroute.proxy.stalls import HEARTBEAT, ClientTransport, SendWatch, StreamClock

__all__ = ["Reply", "shutting_down"]

Headers = list[tuple[bytes, bytes]]
_TICK_S = 0.001  # a wait that ends this close to the limit has reached it


def shutting_down() -> ServiceUnavailableError:
    return ServiceUnavailableError("proxy is shutting down", code="shutting_down", retry_after=1)


class Reply:
    """One request's reply as its client gets it: whether the headers went out (`committed`),
    whether it ended, its status and error; and what the attempt sending it measured."""

    __slots__ = (
        "_head",
        "_send",
        "_stall_s",
        "_started",
        "_watch",
        "client_gone",
        "committed",
        "ending",
        "error",
        "finished",
        "meter",
        "render_error",
        "status",
        "stream",
        "transport",
    )

    def __init__(
        self, send: Send, started: float, transport: ClientTransport | None = None
    ) -> None:
        self._send = send
        self._started = started
        self.transport = transport  # the client's connection, where the server gives it
        self._head: Headers = []
        self._stall_s = 0.0
        self._watch: SendWatch | None = None
        self.status = 0
        self.error: str | None = None
        self.committed = False
        self.finished = False
        self.client_gone = False
        self.ending = False  # the proxy is shutting down and ends this reply itself
        self.meter = ReplyMeter()
        self.stream: StreamRelay | None = None
        self.render_error: Callable[[SpecrouteError], bytes] = error_body
        """A whole error's body, in the shape the route's clients parse."""

    def new_attempt(self) -> None:
        self.meter = ReplyMeter()
        self.stream = None

    @property
    def measured(self) -> ReplyMeter:
        return self.stream.meter if self.stream is not None else self.meter

    async def send_whole(
        self,
        upstream: UpstreamResponse,
        extras: Extras,
        headers: Headers,
        measure: Callable[[bytes, ReplyMeter], None] | None = None,
    ) -> None:
        """The reply as one body: measured by `measure` where the route has its own format."""
        if measure is None:
            body = strip_reply(await upstream.read(), extras, self.meter)
        else:
            body = await upstream.read()
            measure(body, self.meter)
        self.status = upstream.status
        start = [
            (b"content-type", upstream.content_type),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ]
        self.committed = self.finished = True
        await self._send({"type": "http.response.start", "status": self.status, "headers": start})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send_passthrough(
        self, upstream: UpstreamResponse, headers: Headers, idle_s: float
    ) -> None:
        """A forwarded route's reply, its status and bytes passed on as they come (Ollama's
        newline-delimited JSON streams too), each read within `idle_s`."""
        self.status = upstream.status
        start = [(b"content-type", upstream.content_type), *headers]
        self.committed = True
        await self._send({"type": "http.response.start", "status": self.status, "headers": start})
        try:
            while (data := await upstream.next_chunk(idle_s)) is not None:
                await self._send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            self.finished = True
            if not self.client_gone:
                await self._send({"type": "http.response.body", "body": b""})

    async def send_stream(
        self,
        upstream: UpstreamResponse,
        stream: StreamRelay,
        headers: Headers,
        clock: StreamClock,
        stall_s: float,
    ) -> None:
        """Headers go out with the first event, so a backend that fails during prefill is
        still retried invisibly, unless the first token takes `heartbeat_s`: then they go out
        with a heartbeat. After that, failures end the stream with an error event (in the
        stream's own format: `stream.error_tail`)."""
        self.stream = stream
        self._head = [(b"content-type", upstream.content_type), *headers]
        self._stall_s = stall_s
        tail = b""
        try:
            await self._relay(self.stream, upstream, clock)
            tail = self.stream.rest()
            if not self.stream.saw_done:
                raise StreamBroken("stream ended before its last event")
        except UpstreamFailure as exc:
            if self.committed:
                self.error = str(exc)
                tail = stream.error_tail(_stream_failure(exc))
            raise
        except asyncio.CancelledError:
            if self._watch is not None and self._watch.stalled:  # nothing more can reach it
                self.client_gone = True
                self.error = "client stopped reading"
            elif self.ending:
                self.error = "proxy shutting down"
                tail = stream.error_tail(shutting_down())
            raise
        finally:
            if self._watch is not None:
                self._watch.close()
            if self.committed:
                self.finished = True
                if not self.client_gone:
                    await self._send({"type": "http.response.body", "body": tail})

    async def _relay(
        self, relay: StreamRelay, upstream: UpstreamResponse, clock: StreamClock
    ) -> None:
        """Each chunk's whole events to the client as soon as they are in. The read's own
        timeout is the clock: a read that times out is a heartbeat, or the stall."""
        send = self._send
        watch = self._watch
        wait, quiet, between = clock.first_wait(), 0.0, clock.gap_wait()
        while True:
            try:
                data = await upstream.next_chunk(wait)
            except TimedOut:
                quiet += wait
                wait = await self._heartbeat(relay, clock, quiet)
                watch = self._watch
                continue
            if data is None:
                return
            wait, quiet = between, 0.0
            out = relay.feed(data, time.perf_counter())
            if out:
                if watch is None:
                    watch = await self._commit()
                watch.sending = True
                await send({"type": "http.response.body", "body": out, "more_body": True})
                watch.sending = False
                watch.sent += len(out)

    async def _heartbeat(self, relay: StreamRelay, clock: StreamClock, quiet: float) -> float:
        """The stream has been quiet for `quiet` seconds: Stalled past its limit, else a
        heartbeat (the headers first, if they are not out); returns the next read's wait."""
        first = relay.ttft is None
        limit = clock.limit_s(first, relay.gaps)
        if quiet >= limit - _TICK_S:
            phase = "first_token" if first else "between_chunks"
            raise Stalled(phase, limit)
        watch = self._watch or await self._commit()
        watch.sending = True
        await self._send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
        watch.sending = False
        watch.sent += len(HEARTBEAT)
        return min(clock.heartbeat_s, limit - quiet)

    async def _commit(self) -> SendWatch:
        """The stream's headers go out; from now on its client's reading pace is watched."""
        task = asyncio.current_task()
        assert task is not None
        self.status = 200
        self.committed = True
        watch = self._watch = SendWatch(task, self._stall_s, self.transport)
        await self._send({"type": "http.response.start", "status": 200, "headers": self._head})
        return watch

    async def send_error(self, exc: SpecrouteError, headers: Headers) -> None:
        """`exc` in OpenAI's shape, unless the reply is under way (then it has its error)."""
        self.status = exc.status
        self.error = self.error or exc.message
        if self.committed:
            return
        self.committed = self.finished = True
        start = [(b"content-type", b"application/json"), *exc.headers(), *headers]
        if isinstance(exc, RequestTimeoutError | PayloadTooLargeError) or (
            exc.code == BODY_MEMORY_FULL
        ):
            start.append((b"connection", b"close"))  # the rest of its body was never read
        await self._send({"type": "http.response.start", "status": exc.status, "headers": start})
        await self._send(
            {"type": "http.response.body", "body": self.render_error(exc), "more_body": False}
        )


def _stream_failure(exc: UpstreamFailure) -> SpecrouteError:
    if isinstance(exc, TimedOut):
        return UpstreamTimeoutError(f"backend stream stalled: {exc}")
    return StreamInterruptedError(f"backend stream interrupted: {exc}")

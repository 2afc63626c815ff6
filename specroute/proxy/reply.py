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
from specroute.pool import (
    Stalled,
    StreamBroken,
    TimedOut,
    UpstreamFailure,
    UpstreamResponse,
)
from specroute.proxy.aborts import ABORT_MARK, BackendAborted, aborted
from specroute.proxy.bodies import BODY_MEMORY_FULL
from specroute.proxy.chunks import EventFilter, ReplyMeter, strip_reply
from specroute.proxy.fields import Extras
from specroute.proxy.intake import Send
from specroute.proxy.migrate import Moved
from specroute.proxy.stalls import HEARTBEAT, ClientTransport, SendWatch, StreamClock

__all__ = ["Reply", "shutting_down"]

Headers = list[tuple[bytes, bytes]]
_TICK_S = 0.001  # a wait that ends this close to the limit has reached it
_CLOSE_GRACE_S = 0.5
"""How long a stream's last event (`[DONE]`, or an event API's last) waits for the backend's
reply to end: SGLang and vLLM end it at once, and the upstream connection is then kept for
the next request; a backend slower than this has its connection closed instead, and its
client's reply ends without waiting (no stall, no error)."""


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
        "held",
        "meter",
        "move_check",
        "render_error",
        "resumable",
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
        self.resumable = False
        """A stream that fails is not ended here: its error tail is `held` for the relay,
        which moves the request to another backend or ends it (`end_held`)."""
        self.held: bytes | None = None
        self.move_check: Callable[[], bool] | None = None
        """Asked between reads of a stream that may move: True ends the read (`Moved`)."""
        self.meter = ReplyMeter()
        self.stream: EventFilter | None = None
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
        within_s: float,
        max_bytes: int,
        measure: Callable[[bytes, ReplyMeter], None] | None = None,
    ) -> None:
        """The whole body, read within `within_s` seconds and `max_bytes`, then sent on: a chat
        or completions 200 must be JSON (else BadReply); a route with its own format is
        measured by `measure`."""
        body = await upstream.read(within_s, max_bytes)
        # An abort with nothing sent yet: the request can go again.
        if upstream.status == 200 and ABORT_MARK in body and aborted(body):
            raise BackendAborted("the backend aborted the request (finish_reason abort)")
        if measure is None:
            body = strip_reply(body, extras, self.meter, upstream.status == 200)
        else:
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
        stream: EventFilter,
        headers: Headers,
        clock: StreamClock,
        stall_s: float,
    ) -> None:
        """Headers go out with the first event, so a backend that fails during prefill is
        still retried invisibly, unless the first token takes `heartbeat_s`: then they go out
        with a heartbeat. After that, failures end the stream with an error event (in the
        stream's own format: `stream.error_tail`), or hold it (`resumable`) for a move; a
        continuation's stream goes on under the headers already sent."""
        self.stream = stream
        self.held = None
        if not self.committed:
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
                if self.resumable:
                    self.held, tail = tail, b""
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
                self._watch = None
            if self.committed and self.held is None:
                self.finished = True
                if not self.client_gone:
                    await self._send({"type": "http.response.body", "body": tail})

    async def end_held(self) -> None:
        """End a stream whose tail was held for a migration that did not happen."""
        tail, self.held = self.held, None
        if tail is None:
            return
        self.finished = True
        if not self.client_gone:
            await self._send({"type": "http.response.body", "body": tail})

    async def _relay(
        self, relay: EventFilter, upstream: UpstreamResponse, clock: StreamClock
    ) -> None:
        """Each chunk's whole events to the client as soon as they are in. The stall clock
        runs from the last complete event, not the last byte: a backend that trickles bytes
        and finishes no event is as quiet as a silent one. The read's own timeout is the
        clock: a read that times out, or brings no whole event, is a heartbeat or the stall."""
        send = self._send
        watch = self._watch
        heard = said = time.perf_counter()  # the last event from the backend, to the client
        wait, between = clock.first_wait(), clock.gap_wait()
        move = self.move_check
        while True:
            if move is not None and not relay.saw_done and move():
                raise Moved("the backend is draining: the stream moves to another backend")
            try:
                data = await upstream.next_chunk(wait)
            except TimedOut:
                data = b""
            if data is None:
                return
            events = relay.events
            now = time.perf_counter()
            out = relay.feed(data, now) if data else b""
            if out:
                if watch is None:
                    watch = await self._commit()
                watch.sending = True
                await send({"type": "http.response.body", "body": out, "more_body": True})
                watch.sending = False
                watch.sent += len(out)
                said = now
                # The last event is out: the client has its whole answer, and its leaving now
                # (as the openai client does on `[DONE]`) cancels nothing that is left to do.
                if relay.saw_done:
                    self.finished = True
            if relay.aborted:
                raise BackendAborted("the backend aborted the request (finish_reason abort)")
            if relay.events != events:
                heard, wait = now, (_CLOSE_GRACE_S if relay.saw_done else between)
                continue
            if relay.saw_done:  # whole, and the backend slow to close: no stall, no error
                return
            wait, said = await self._quiet(relay, clock, heard, said)
            watch = self._watch

    async def _quiet(
        self, relay: EventFilter, clock: StreamClock, heard: float, said: float
    ) -> tuple[float, float]:
        """No event since `heard`, nothing to the client since `said`: Stalled past the
        limit, else a heartbeat if one is due (the headers first, if they are not out).
        Returns the next read's wait and when the client last got bytes."""
        first = relay.ttft is None
        limit = clock.limit_s(first, relay.gaps)
        now = time.perf_counter()
        if now - heard >= limit - _TICK_S:
            raise Stalled("first_token" if first else "between_chunks", limit)
        if now - said >= clock.heartbeat_s - _TICK_S:
            watch = self._watch or await self._commit()
            watch.sending = True
            await self._send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
            watch.sending = False
            watch.sent += len(HEARTBEAT)
            said = now
        return max(_TICK_S, min(heard + limit, said + clock.heartbeat_s) - now), said

    async def _commit(self) -> SendWatch:
        """The stream's headers go out (unless a migrated stream's went out already); from now
        on its client's reading pace is watched."""
        task = asyncio.current_task()
        assert task is not None
        watch = self._watch = SendWatch(task, self._stall_s, self.transport)
        if not self.committed:
            self.status = 200
            self.committed = True
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

"""The reply to the client: a whole body, or an event stream relayed event by event as it
arrives; what the proxy asked for and the client did not is removed, every other event goes
on byte for byte, tokens are counted, a quiet backend gets heartbeats sent for it until its
stall limit, and a client that stops reading is let go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import msgspec

from specroute.errors import (
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceUnavailableError,
    SpecrouteError,
    StreamInterruptedError,
    UpstreamTimeoutError,
    error_body,
    error_event,
)
from specroute.pool import Stalled, StreamBroken, TimedOut, UpstreamFailure, UpstreamResponse
from specroute.proxy.bodies import BODY_MEMORY_FULL
from specroute.proxy.intake import Extras, Send
from specroute.proxy.stalls import HEARTBEAT, ClientTransport, SendWatch, StreamClock
from specroute.sse import DONE, SSESplitter

__all__ = ["Reply", "ReplyMeter", "StreamRelay", "shutting_down", "strip_reply"]

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


# Reading what comes back -------------------------------------------------------------------


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class SpecDetails(msgspec.Struct):
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


class SglExt(msgspec.Struct):
    spec_tokens_details: SpecDetails | None = None


class MetaInfo(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


class Chunk(msgspec.Struct):
    choices: list[msgspec.Raw] = []
    usage: Usage | None = None
    sglext: SglExt | None = None
    meta_info: MetaInfo | None = None
    error: msgspec.Raw = msgspec.Raw()


_chunk = msgspec.json.Decoder(Chunk)
_any = msgspec.json.Decoder(dict[str, Any])


class ReplyMeter:
    """Tokens and speculative statistics seen in a reply (streamed or whole)."""

    __slots__ = (
        "accept_length",
        "completion_tokens",
        "error",
        "prompt_tokens",
        "response_id",
        "verify_ct",
    )

    def __init__(self) -> None:
        self.response_id: str | None = None
        """A Responses API reply's id: the backend that made it stores it."""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.verify_ct: int | None = None
        self.accept_length: float | None = None
        self.error: str | None = None

    def take(self, chunk: Chunk) -> None:
        if chunk.usage is not None:
            self.prompt_tokens = chunk.usage.prompt_tokens
            self.completion_tokens = chunk.usage.completion_tokens
        details = chunk.sglext.spec_tokens_details if chunk.sglext else None
        if details is not None:
            self.verify_ct = details.spec_verify_ct
            self.accept_length = details.spec_accept_length
        meta = chunk.meta_info
        if meta is not None:
            self.prompt_tokens = meta.prompt_tokens
            self.completion_tokens = meta.completion_tokens
            self.verify_ct = meta.spec_verify_ct
            self.accept_length = meta.spec_accept_length
        error = bytes(chunk.error)
        if error and error != b"null":
            self.error = error.decode("utf-8", "replace")[:200]


def _interesting(payload: bytes) -> bool:
    return (
        b'"usage"' in payload
        or b'"sglext"' in payload
        or b'"meta_info"' in payload
        or b'"error"' in payload
    )


class StreamRelay:
    """Feed upstream bytes; get back the bytes to forward (whole events only)."""

    __slots__ = (
        "_extras",
        "_last",
        "_splitter",
        "_started",
        "chunks",
        "gaps",
        "meter",
        "saw_done",
        "ttft",
    )

    def __init__(self, extras: Extras, started: float) -> None:
        self._extras = extras
        self._splitter = SSESplitter()
        self._started = started
        self._last: float | None = None
        self.chunks = 0
        self.gaps: list[float] = []
        self.ttft: float | None = None
        self.meter = ReplyMeter()
        self.saw_done = False

    def feed(self, data: bytes, now: float) -> bytes:
        out = [event for event, payload in self._splitter.feed(data) if self._keep(payload, now)]
        return b"".join(out) if len(out) != 1 else out[0]

    def rest(self) -> bytes:
        """An unterminated tail at the end of the stream, passed on as it came."""
        return self._splitter.rest()

    def error_tail(self, exc: SpecrouteError) -> bytes:
        """The stream's end on a failure: the error as one event, then `[DONE]`."""
        return error_event(exc)

    def _keep(self, payload: bytes | None, now: float) -> bool:
        if payload is None:
            return True  # comments, `event:` lines and other non-data events pass untouched
        if payload == DONE:
            self.saw_done = True
            return True
        if payload[:1] != b"{" or payload[-1:] != b"}":  # torn or garbled: clients cannot parse it
            raise StreamBroken(f"backend sent a malformed event: {payload[:40]!r}")
        chunk = _decode(payload) if _interesting(payload) else None
        if chunk is not None:
            self.meter.take(chunk)
        if chunk is None or chunk.choices or chunk.meta_info is not None:
            self._tick(now)
            return True
        extra_usage = chunk.usage is not None
        extra_sglext = chunk.sglext is not None
        if not (extra_usage or extra_sglext):
            return True
        return not (
            (not extra_usage or self._extras.strip_usage)
            and (not extra_sglext or self._extras.strip_sglext)
        )

    def _tick(self, now: float) -> None:
        self.chunks += 1
        if self._last is None:
            self.ttft = now - self._started
        else:
            self.gaps.append(now - self._last)
        self._last = now


def _decode(payload: bytes) -> Chunk | None:
    try:
        return _chunk.decode(payload)
    except msgspec.DecodeError:
        return None


def strip_reply(body: bytes, extras: Extras, meter: ReplyMeter) -> bytes:
    """A whole (non-streamed) reply: measure it, and remove `sglext` if the client did not ask."""
    chunk = _decode(body)
    if chunk is None:
        return body
    meter.take(chunk)
    if not (extras.strip_sglext and chunk.sglext is not None):
        return body
    data = _any.decode(body)
    data.pop("sglext", None)
    return msgspec.json.encode(data)

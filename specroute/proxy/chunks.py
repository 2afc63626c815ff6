"""Reading what comes back from a backend: the tokens and speculative statistics of a reply
(streamed or whole), and which stream events go on to the client (what the proxy asked for and
the client did not is removed; every other event goes on byte for byte)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from specroute.errors import SpecrouteError, error_event
from specroute.pool import BadReply, StreamBroken
from specroute.proxy.aborts import ABORT_MARK, aborted
from specroute.proxy.fields import Extras
from specroute.sse import DONE, EventTooLarge, SSESplitter

__all__ = ["EventFilter", "ReplyMeter", "strip_reply"]


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


class SpecDecoding(msgspec.Struct):
    """vLLM's per-request `metrics.speculative_decoding` (`--per-request-spec-decode-metrics`;
    vllm/entrypoints/generate/base/protocol.py, `SpeculativeDecodingMetrics`)."""

    num_spec_steps: int | None = None
    num_accepted_draft_tokens: int | None = None
    mean_acceptance_length: float | None = None


class RequestMetrics(msgspec.Struct):
    speculative_decoding: SpecDecoding | None = None


class Chunk(msgspec.Struct):
    choices: list[msgspec.Raw] = []
    usage: Usage | None = None
    metrics: RequestMetrics | None = None
    sglext: SglExt | None = None
    meta_info: MetaInfo | None = None
    error: msgspec.Raw = msgspec.Raw()


_chunk = msgspec.json.Decoder(Chunk)
_any = msgspec.json.Decoder(dict[str, Any])


class ReplyMeter:
    """Tokens and speculative statistics seen in a reply (streamed or whole)."""

    __slots__ = (
        "accept_length",
        "accepted_drafts",
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
        self.accepted_drafts: int | None = None
        """Draft tokens accepted over `verify_ct` verifies, where the engine says (vLLM)."""
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
        spec = chunk.metrics.speculative_decoding if chunk.metrics else None
        if spec is not None and spec.num_spec_steps and spec.num_accepted_draft_tokens is not None:
            self.verify_ct = spec.num_spec_steps
            self.accepted_drafts = spec.num_accepted_draft_tokens
            self.accept_length = spec.mean_acceptance_length
        error = bytes(chunk.error)
        if error and error != b"null":
            self.error = error.decode("utf-8", "replace")[:200]


class EventFilter:
    """Feed upstream bytes; get back the bytes to forward (whole events only). `events`
    counts the complete events with data (comments prove nothing of the backend's progress);
    one growing past `max_event_bytes` unfinished is a BadReply. An event that says the backend
    aborted the request is not passed on, nor anything after it: `aborted` is set, and the
    relay fails the stream. Nothing after the stream's last event (`saw_done`) is passed on or
    read: the client has its whole answer, and garbage after it fails nothing."""

    __slots__ = (
        "_extras",
        "_last",
        "_splitter",
        "_started",
        "_take",
        "aborted",
        "chunks",
        "events",
        "gaps",
        "meter",
        "saw_done",
        "ttft",
    )

    def __init__(self, extras: Extras, started: float, max_event_bytes: int | None = None) -> None:
        self._extras = extras
        self._splitter = SSESplitter(max_event_bytes)
        self._started = started
        self._last: float | None = None
        self.chunks = 0
        self.events = 0
        self.gaps: list[float] = []
        self.ttft: float | None = None
        self.meter = ReplyMeter()
        self.saw_done = False
        self.aborted = False
        self._take: Callable[[bytes], None] | None = None
        """Given each whole data event relayed (not `[DONE]`, nothing from the abort on):
        what a stream that may move keeps (`proxy.continued.Tap`)."""

    def feed(self, data: bytes, now: float) -> bytes:
        if self.saw_done:
            return b""  # the answer is whole: what follows is not split, so cannot overflow
        try:
            events = self._splitter.feed(data)
        except EventTooLarge as exc:
            raise BadReply(str(exc)) from exc
        out = [event for event, payload in events if self._keep(payload, now)]
        return b"".join(out) if len(out) != 1 else out[0]

    def rest(self) -> bytes:
        """An unterminated tail at the end of the stream, passed on as it came (none after the
        stream's last event)."""
        return b"" if self.saw_done else self._splitter.rest()

    def error_tail(self, exc: SpecrouteError) -> bytes:
        """The stream's end on a failure: the error as one event, then `[DONE]`."""
        return error_event(exc)

    def _keep(self, payload: bytes | None, now: float) -> bool:
        if self.aborted or self.saw_done:
            # The stream failed at its abort, or its answer is whole: nothing after either
            # goes on, nor is read (garbage after `[DONE]` fails nothing).
            return False
        if payload is None:
            return True  # comments, `event:` lines and other non-data events pass untouched
        self.events += 1
        if payload == DONE:
            self.saw_done = True
            return True
        if payload[:1] != b"{" or payload[-1:] != b"}":  # torn or garbled: clients cannot parse it
            raise StreamBroken(f"backend sent a malformed event: {payload[:40]!r}")
        if ABORT_MARK in payload and aborted(payload):
            self.aborted = True
            return False
        if self._take is not None:
            self._take(payload)
        # Only events that may carry usage, statistics or an error are decoded (spelled out
        # here rather than in a helper: this runs for every event).
        interesting = (
            b'"usage"' in payload
            or b'"sglext"' in payload
            or b'"meta_info"' in payload
            or b'"error"' in payload
        )
        chunk = _decode(payload) if interesting else None
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


def _is_object(body: bytes) -> bool:
    try:
        _any.decode(body)
    except msgspec.DecodeError:
        return False
    return True


def strip_reply(body: bytes, extras: Extras, meter: ReplyMeter, json: bool = False) -> bytes:
    """A whole (non-streamed) reply: measure it, and remove `sglext` if the client did not ask.
    With `json`, a body that is no JSON object is a BadReply."""
    chunk = _decode(body)
    if chunk is None:
        if json and not _is_object(body):
            raise BadReply(f"the backend's 200 is not a JSON object: {body[:40]!r}")
        return body
    meter.take(chunk)
    if not (extras.strip_sglext and chunk.sglext is not None):
        return body
    data = _any.decode(body)
    data.pop("sglext", None)
    return msgspec.json.encode(data)

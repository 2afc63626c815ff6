"""The reply formats of OpenAI's Responses API and Anthropic's Messages API, as the relay reads
them: named events (`event: response.output_text.delta`, `event: content_block_delta`) and no
`[DONE]`, tokens in their own usage fields, errors in their own shapes.

What is counted mirrors chat's chunks, so `pool.telemetry` reads both alike: one tick where
the reply's first text arrives (`response.output_item.added`, `message_start`), one per text
delta (one per engine iteration on SGLang), one where usage arrives at the end.
"""

from __future__ import annotations

import msgspec

from specroute.errors import SpecrouteError, error_body
from specroute.pool import StreamBroken
from specroute.proxy.chunks import EventFilter, ReplyMeter
from specroute.proxy.fields import Extras

__all__ = [
    "EVENT_APIS",
    "ApiEventFilter",
    "anthropic_error_body",
    "measure_whole",
    "render_error",
]

EVENT_APIS = frozenset({"responses", "messages"})
"""The relayed routes whose streams are named events that end without `[DONE]`."""

_TICKS = {
    "responses": frozenset(
        {
            "response.output_item.added",
            "response.output_text.delta",
            "response.completed",
            "response.incomplete",
            "response.failed",
        }
    ),
    "messages": frozenset({"message_start", "content_block_delta", "message_delta"}),
}
_ENDS = {
    "responses": frozenset(
        {"response.completed", "response.incomplete", "response.failed", "error"}
    ),
    "messages": frozenset({"message_stop"}),
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None


class Failure(msgspec.Struct):
    message: str | None = None


class Whole(msgspec.Struct):
    """A whole response or message, or the one an event carries."""

    id: str | None = None
    usage: Usage | None = None
    error: Failure | None = None


class Event(msgspec.Struct):
    type: str = ""
    sequence_number: int | None = None
    response: Whole | None = None
    message: Whole | None = None
    usage: Usage | None = None
    error: Failure | str | None = None


_event = msgspec.json.Decoder(Event)
_whole = msgspec.json.Decoder(Whole)
_encode = msgspec.json.Encoder().encode


def _take(meter: ReplyMeter, usage: Usage | None) -> None:
    if usage is None:
        return
    if usage.input_tokens is not None:
        meter.prompt_tokens = usage.input_tokens
    if usage.output_tokens is not None:
        meter.completion_tokens = usage.output_tokens


def measure_whole(body: bytes, meter: ReplyMeter) -> None:
    """Tokens and the response id of a whole (non-streamed) reply."""
    try:
        whole = _whole.decode(body)
    except msgspec.DecodeError:
        return
    _take(meter, whole.usage)
    meter.response_id = whole.id


class ApiEventFilter(EventFilter):
    """A Responses or Messages stream: every event goes on as it came; tokens, the response id
    and errors are read from it, and it has ended at its terminal event.

    Events before the first token (SGLang sends `response.created` and `.in_progress` at once)
    are held back until it comes, so that a backend failing during prefill is still retried
    unseen, as with chat; a quiet prefill still gets the headers and heartbeats in time."""

    __slots__ = ("_api", "_ends", "_held", "_sequence", "_ticks")

    def __init__(
        self, api: str, extras: Extras, started: float, max_event_bytes: int | None = None
    ) -> None:
        super().__init__(extras, started, max_event_bytes)
        self._api = api
        self._ticks = _TICKS[api]
        self._ends = _ENDS[api]
        self._sequence = -1
        self._held = b""

    def feed(self, data: bytes, now: float) -> bytes:
        out = super().feed(data, now)
        if self.ttft is None and not self.saw_done:
            self._held += out
            return b""
        if self._held:
            out, self._held = self._held + out, b""
        return out

    def rest(self) -> bytes:
        held, self._held = self._held, b""
        return held + super().rest()

    def _keep(self, payload: bytes | None, now: float) -> bool:
        if self.saw_done:
            return False  # after the terminal event: not the answer, neither relayed nor read
        if payload is None:
            return True
        self.events += 1
        if payload[:1] != b"{" or payload[-1:] != b"}":
            raise StreamBroken(f"backend sent a malformed event: {payload[:40]!r}")
        try:
            event = _event.decode(payload)
        except msgspec.DecodeError as exc:
            raise StreamBroken(f"backend sent a malformed event: {payload[:40]!r}") from exc
        if event.sequence_number is not None:
            self._sequence = event.sequence_number
        self._read(event)
        if event.type in self._ticks:
            self._tick(now)
        if event.type in self._ends:
            self.saw_done = True
        return True

    def _read(self, event: Event) -> None:
        meter = self.meter
        whole = event.response or event.message
        if whole is not None:
            meter.response_id = meter.response_id or whole.id
            _take(meter, whole.usage)
            if whole.error is not None and event.type == "response.failed":
                meter.error = (whole.error.message or "response failed")[:200]
        _take(meter, event.usage)
        if event.type == "error":
            error = event.error
            text = error.message if isinstance(error, Failure) else error
            meter.error = (text or "error event")[:200]

    def error_tail(self, exc: SpecrouteError) -> bytes:
        """The stream's end on a failure, in its own format's error event."""
        if self._api == "responses":
            # The Responses API's error event, plus the `error` object on which OpenAI's
            # SDKs raise rather than hand the event on.
            code = exc.code or exc.error_type
            data = {
                "type": "error",
                "code": code,
                "message": exc.message,
                "param": None,
                "sequence_number": self._sequence + 1,
                "error": {"type": exc.error_type, "code": code, "message": exc.message},
            }
            return b"event: error\ndata: " + _encode(data) + b"\n\n"
        return (
            b"event: error\ndata: "
            + anthropic_error_body(exc)
            + b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
        )


def anthropic_error_body(exc: SpecrouteError) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}`, as Anthropic's clients parse it."""
    kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
    return _encode({"type": "error", "error": {"type": kind, "message": exc.message}})


def render_error(api: str, exc: SpecrouteError) -> bytes:
    """A whole error reply in the shape the route's clients parse."""
    return anthropic_error_body(exc) if api in ("messages", "count_tokens") else error_body(exc)

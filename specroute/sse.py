"""Incremental server-sent-events parsing: bytes in, whole events out, as they came on the wire.

Chunks from the network may split an event (or a CRLF) at any byte; the splitter keeps the
partial event until the rest arrives. Lines may end in LF, CRLF or CR, as the SSE spec allows.
Only `data` fields matter to OpenAI-style streams. An event may be capped: one that grows past
the cap unfinished raises `EventTooLarge` instead of growing the buffer without bound.
"""

from __future__ import annotations

import re

__all__ = ["DONE", "EventTooLarge", "SSEDecoder", "SSESplitter", "event_data"]

DONE = b"[DONE]"
_LF = ord("\n")

_EOL = rb"(?:\r\n|\r(?!\n)|\n)"
# Non-empty lines, then the empty line that ends the event. Possessive, so a CRLF is never
# taken apart into a CR ending one line and an LF standing for an empty one.
_EVENT = re.compile(rb"(?:[^\r\n]++" + _EOL + rb")*+" + _EOL)
_LINE_END = re.compile(_EOL)


class EventTooLarge(ValueError):
    """An event grew past the splitter's cap before it ended."""


class SSESplitter:
    """Feed raw bytes, get back every event they complete: its bytes exactly as received (the
    empty line that ends it included, so the events joined are the bytes fed) and its data.
    With `max_event_bytes`, an unfinished event longer than that raises `EventTooLarge`."""

    __slots__ = ("_after_cr", "_buffer", "_max", "_pending", "_pending_bytes")

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self._buffer = b""
        self._after_cr = False  # the last event ended with a CR, the last byte fed
        self._max = max_event_bytes
        # Chunks with no line end that followed an unfinished event: none of them can end it,
        # so they wait here, joined once, not copied into the buffer each time.
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes | None]]:
        """Add bytes from the wire; return each event they complete, with `event_data`."""
        events: list[tuple[bytes, bytes | None]] = []
        if self._after_cr and chunk:
            self._after_cr = False
            if chunk.startswith(b"\n"):  # the LF of that CRLF: an empty line, on its own
                events.append((b"\n", None))
                chunk = chunk[1:]
        if self._buffer and b"\n" not in chunk and b"\r" not in chunk:
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)
            self._check(len(self._buffer) + self._pending_bytes)
            return events
        if self._pending:
            self._buffer = b"".join([self._buffer, *self._pending])
            self._pending.clear()
            self._pending_bytes = 0
        buffer = self._buffer + chunk if self._buffer else chunk
        if buffer.find(b"\r") < 0:  # SGLang's framing: searches, not a parse
            end = buffer.find(b"\n")
            if end == len(buffer) - 2 and buffer[-1] == _LF and buffer.startswith(b"data: "):
                self._buffer = b""  # one whole `data:` line and its empty one: SGLang's chunk
                events.append((buffer, buffer[6:end]))
                return events
            start = _split_lf(buffer, events)
        else:
            start = _split_any(buffer, events)
            self._after_cr = start == len(buffer) and buffer.endswith(b"\r")
        self._buffer = buffer[start:] if start else buffer
        self._check(len(self._buffer))
        return events

    def _check(self, unfinished: int) -> None:
        if self._max is not None and unfinished > self._max:
            self._buffer = b""
            self._pending.clear()
            self._pending_bytes = 0
            raise EventTooLarge(f"an event from the backend is over {self._max} bytes unfinished")

    def rest(self) -> bytes:
        """What followed the last whole event (an event the stream never finished); cleared."""
        rest = b"".join([self._buffer, *self._pending]) if self._pending else self._buffer
        self._buffer = b""
        self._pending.clear()
        self._pending_bytes = 0
        return rest


def _split_lf(buffer: bytes, events: list[tuple[bytes, bytes | None]]) -> int:
    """The events of a buffer with no CR in it; returns where the unfinished rest starts."""
    start = 0
    while (end := buffer.find(b"\n", start)) >= 0:
        if buffer.startswith(b"\n", end + 1):  # one line, then the empty one: the usual event
            event = buffer[start : end + 2]
            single = buffer.startswith(b"data: ", start)
            events.append((event, buffer[start + 6 : end] if single else event_data(event)))
            start = end + 2
            continue
        last = buffer.find(b"\n\n", end)
        if last < 0:
            break
        event = buffer[start : last + 2]
        events.append((event, event_data(event)))
        start = last + 2
    return start


def _split_any(buffer: bytes, events: list[tuple[bytes, bytes | None]]) -> int:
    """The same for any line ends. A CR ending the buffer counts as a line end at once, so an
    event framed by CRs is not held back waiting to see whether an LF follows."""
    start = 0
    while (match := _EVENT.match(buffer, start)) is not None:
        event = match.group()
        events.append((event, event_data(event)))
        start = match.end()
    return start


def event_data(event: bytes) -> bytes | None:
    """The data of one whole event (its `data` lines joined by LF), or None if it has none:
    comments, `event:`/`id:`/`retry:` only, or an empty line."""
    values = [
        line[5:].removeprefix(b" ") if line != b"data" else b""
        for line in _LINE_END.split(event)
        if line.startswith(b"data:") or line == b"data"
    ]
    return b"\n".join(values) if values else None


class SSEDecoder:
    """Feed raw bytes, get back the data payload of every event they complete."""

    __slots__ = ("_splitter",)

    def __init__(self) -> None:
        self._splitter = SSESplitter()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add bytes from the wire; return the payloads of the events completed by them."""
        return [data for _, data in self._splitter.feed(chunk) if data is not None]

    def close(self) -> bool:
        """End of stream: drop an unfinished event (as the SSE spec says); True if there was
        one, that is a line cut short or a data field that no empty line ended."""
        rest = self._splitter.rest()
        return bool(rest) and (
            not rest.endswith((b"\n", b"\r")) or event_data(rest + b"\n") is not None
        )

"""Incremental server-sent-events parsing: bytes in, whole events out, as they came on the wire.

Chunks from the network may split an event (or a CRLF) at any byte; the splitter keeps the
partial event until the rest arrives. Lines may end in LF, CRLF or CR, as the SSE spec allows.
Only `data` fields matter to OpenAI-style streams.
"""

from __future__ import annotations

import re

__all__ = ["DONE", "SSEDecoder", "SSESplitter", "event_data"]

DONE = b"[DONE]"

_EOL = rb"(?:\r\n|\r(?!\n)|\n)"
# Non-empty lines, then the empty line that ends the event. Possessive, so a CRLF is never
# taken apart into a CR ending one line and an LF standing for an empty one.
_EVENT = re.compile(rb"(?:[^\r\n]++" + _EOL + rb")*+" + _EOL)
_LINE_END = re.compile(_EOL)


class SSESplitter:
    """Feed raw bytes, get back every event they complete: its bytes exactly as received, the
    empty line that ends it included, so that the events joined are the bytes fed."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[bytes] = []
        start = 0
        if b"\r" not in buffer:  # SGLang's framing: a search, not a parse
            while (end := buffer.find(b"\n\n", start)) != -1:
                events.append(buffer[start : end + 2])
                start = end + 2
        else:
            # A CR ending the buffer counts as a line end at once; an LF after it in the next
            # chunk then reads as an empty line, which dispatches nothing.
            while (match := _EVENT.match(buffer, start)) is not None:
                events.append(match.group())
                start = match.end()
        self._buffer = buffer[start:] if start else buffer
        return events

    def rest(self) -> bytes:
        """What followed the last whole event (an event the stream never finished); cleared."""
        rest, self._buffer = self._buffer, b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The data of one whole event (its `data` lines joined by LF), or None if it has none:
    comments, `event:`/`id:`/`retry:` only, or an empty line."""
    if (
        event.startswith(b"data: ")
        and event.find(b"\n") == len(event) - 2
        and event.endswith(b"\n\n")
        and b"\r" not in event
    ):
        return event[6:-2]  # one `data: ` line ended by LF: every event SGLang sends
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
        payloads: list[bytes] = []
        for event in self._splitter.feed(chunk):
            data = event_data(event)
            if data is not None:
                payloads.append(data)
        return payloads

    def close(self) -> bool:
        """End of stream: drop an unfinished event (as the SSE spec says); True if there was
        one, that is a line cut short or a data field that no empty line ended."""
        rest = self._splitter.rest()
        return bool(rest) and (
            not rest.endswith((b"\n", b"\r")) or event_data(rest + b"\n") is not None
        )

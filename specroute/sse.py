"""Incremental server-sent-events parsing: bytes in, whole `data:` payloads out.

Chunks from the network may split an event (or a CRLF) at any byte; the decoder keeps the
partial line until the rest arrives. Only `data` fields matter to OpenAI-style streams.
"""

from __future__ import annotations

__all__ = ["DONE", "SSEDecoder", "encode_data"]

DONE = b"[DONE]"


def encode_data(payload: bytes) -> bytes:
    """One SSE event carrying `payload` as its data, as SGLang writes it."""
    return b"data: " + payload + b"\n\n"


class SSEDecoder:
    """Feed raw bytes, get back the data payload of every event they complete."""

    __slots__ = ("_buffer", "_data", "_pending_cr")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add bytes from the wire; return the payloads of the events completed by them."""
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = chunk.endswith(b"\r")
        self._buffer += chunk
        if b"\n" not in chunk and b"\r" not in chunk:
            return []
        text = bytes(self._buffer).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = text.split(b"\n")
        self._buffer = bytearray(rest)
        events: list[bytes] = []
        for line in lines:
            self._take_line(line, events)
        return events

    def close(self) -> bool:
        """End of stream: drop an unfinished event (as the SSE spec says); True if there was one."""
        truncated = bool(self._buffer) or bool(self._data)
        self._buffer.clear()
        self._data = []
        return truncated

    def _take_line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        # Comments (":"), `event:`, `id:` and `retry:` carry nothing OpenAI streams use.

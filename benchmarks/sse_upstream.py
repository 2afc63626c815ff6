"""A fast local SSE upstream for client benchmarks: answers every POST with an SGLang-style
chat stream (continuous usage on every chunk), each event written on its own so the client
reads them one by one, as from a real server. Raw asyncio (uvloop when present): it costs far
less per event than any HTTP client, so the client is what gets measured.

    python benchmarks/sse_upstream.py --port 8123 --events 200 --interval 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

__all__ = ["serve"]

_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def _chunked(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(count: int, tokens: int) -> list[bytes]:
    head = b'{"id":"b","object":"chat.completion.chunk","created":1,"model":"bench","choices":['
    words = b" word" * tokens
    out = []
    for i in range(1, count + 1):
        usage = b'{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d}' % (
            8 + i * tokens,
            i * tokens,
        )
        out.append(
            _chunked(
                head
                + b'{"index":0,"delta":{"reasoning_content":null,"content":"'
                + words
                + b'"},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":'
                + usage
                + b"}"
            )
        )
    out.append(_chunked(head + b'{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}'))
    out.append(_chunked(b"[DONE]") + b"0\r\n\r\n")
    return out


class _Stream(asyncio.Protocol):
    def __init__(self, events: list[bytes], interval: float) -> None:
        self.events, self.interval = events, interval
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            if head.startswith(b"POST"):
                asyncio.get_running_loop().create_task(self._reply())
            elif self.transport is not None:
                self.transport.write(_NOT_FOUND)

    async def _reply(self) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(_HEAD)
        for event in self.events:
            if transport.is_closing():
                return
            transport.write(event)
            while transport.get_write_buffer_size() > 65536:  # noqa: ASYNC110 - no drain event on raw transports
                await asyncio.sleep(0.001)
            await asyncio.sleep(self.interval)


async def serve(port: int, events: int, tokens: int, interval: float) -> None:
    """Serve until cancelled."""
    payloads = _events(events, tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Stream(payloads, interval), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events", type=int, default=200, help="content chunks per reply")
    parser.add_argument("--tokens", type=int, default=1, help="tokens per chunk")
    parser.add_argument("--interval", type=float, default=0.0, help="seconds between chunks")
    args = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.events, args.tokens, args.interval))


if __name__ == "__main__":
    main()

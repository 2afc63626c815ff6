"""The proxy's memory under replies that do not end: streams whose one SSE event never ends, and
non-streamed replies of S MB (two of each by default, 300 MB replies), from a loopback backend
in this process; the proxy's resident memory sampled throughout and its peak over its idle
baseline printed beside its configured caps (`limits.max_event_bytes`, `max_reply_bytes`).
Loopback only; each phase stops by itself.

    python benchmarks/reply_memory.py [--clients 2] [--size-mb 300] [--seconds 10]
                                      [--event-cap-mb N] [--reply-cap-mb N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from body_memory import _peak_rss, _reset_peak, _sample
from harness import Proxy, rss_bytes

from specroute.config import LimitsConfig

MB = 1024 * 1024
MODEL = "bench/model"
_PIECE = 1 * MB
_INFO = {
    "/ready": {"status": "ok"},
    "/server_info": {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "max_running_requests": 64,
        "served_model_name": MODEL,
    },
    "/v1/models": {"object": "list", "data": [{"id": MODEL, "object": "model"}]},
}


class Backend:
    """An SGLang-like backend whose POSTs never finish an event (streams) or send `size`
    bytes of JSON (the rest); `sent` counts the reply bytes it wrote."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                path = head.split(b" ", 2)[1].split(b"?")[0].decode()
                if head.startswith(b"POST"):
                    stream = json.loads(body).get("stream", False)
                    await (self._endless_event(writer) if stream else self._huge(writer))
                    return
                known = _INFO.get(path)
                answer = json.dumps(known).encode() if known is not None else b""
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )
                await writer.drain()
        writer.close()

    async def _endless_event(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        piece = b"x" * _PIECE
        start = b'data: {"choices":[{"delta":{"content":"'
        writer.write(b"%x\r\n%s\r\n" % (len(start), start))
        while True:  # until the proxy hangs up
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            self.sent += len(piece)

    async def _huge(self, writer: asyncio.StreamWriter) -> None:
        head, tail = b'{"x":"', b'"}'
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (self.size, head)
        )
        left = self.size - len(head) - len(tail)
        piece = b"x" * _PIECE
        while left > 0:
            part = piece if left >= _PIECE else piece[:left]
            writer.write(part)
            await writer.drain()
            left -= len(part)
            self.sent += len(part)
        writer.write(tail)
        await writer.drain()


async def _phase(
    proxy: Proxy, requests: Callable[[httpx.AsyncClient], Awaitable[object]], clients: int
) -> tuple[int, float, Counter[str]]:
    """`clients` requests at once: (peak RSS in bytes, seconds, what each got)."""
    _reset_peak(proxy.pid)
    peak, stop = [rss_bytes(proxy.pid)], asyncio.Event()
    sampler = asyncio.create_task(_sample(proxy.pid, stop, peak))
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=proxy.url, timeout=120) as client:
        results = await asyncio.gather(
            *(requests(client) for _ in range(clients)), return_exceptions=True
        )
    elapsed = time.monotonic() - started
    stop.set()
    await sampler
    answers = Counter(str(r) if not isinstance(r, BaseException) else repr(r) for r in results)
    return max(peak[0], _peak_rss(proxy.pid)), elapsed, answers


def _chat(stream: bool) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": stream}


async def _stream(client: httpx.AsyncClient, seconds: float) -> str:
    """Read the stream until it ends (or `seconds` pass): how it ended."""
    tail = b""
    with contextlib.suppress(TimeoutError):
        async with (
            asyncio.timeout(seconds),
            client.stream("POST", "/v1/chat/completions", json=_chat(True)) as reply,
        ):
            async for chunk in reply.aiter_raw():
                tail = (tail + chunk)[-300:]
            return f"{reply.status_code} {_code(tail)}"
    return "still open"


async def _whole(client: httpx.AsyncClient) -> str:
    reply = await client.post("/v1/chat/completions", json=_chat(False))
    return f"{reply.status_code} {_code(reply.content)}"


def _code(raw: bytes) -> str:
    found = raw.rfind(b'"code":"')
    return raw[found + 8 :].split(b'"', 1)[0].decode() if found >= 0 else "-"


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="specroute-replies-"))
    backend = Backend(int(args.size_mb * MB))
    server = await asyncio.start_server(backend.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    defaults = LimitsConfig()
    event_cap = int(args.event_cap_mb * MB) if args.event_cap_mb else defaults.max_event_bytes
    reply_cap = int(args.reply_cap_mb * MB) if args.reply_cap_mb else defaults.max_reply_bytes
    config = work / "proxy.toml"
    config.write_text(
        f'[[backends]]\nurl = "http://127.0.0.1:{port}"\n[health]\ninterval_s = 1.0\n'
        f"[limits]\nmax_event_bytes = {event_cap}\nmax_reply_bytes = {reply_cap}\n"
    )
    print(f"clients={args.clients} reply={args.size_mb:g} MB")
    print(f"caps: max_event_bytes {event_cap / MB:g} MB, max_reply_bytes {reply_cap / MB:g} MB")
    phases: list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[object]], int]] = [
        ("never-ending SSE event", lambda c: _stream(c, args.seconds), event_cap),
        (f"{args.size_mb:g} MB replies", _whole, reply_cap),
    ]
    ok = True
    try:
        for name, requests, cap in phases:
            # A proxy of its own per phase: the first phase leaves its backend unhealthy.
            proxy = Proxy(config, work / "proxy.log")
            try:
                await proxy.start()
                await asyncio.sleep(1.0)
                baseline = rss_bytes(proxy.pid)
                sent = backend.sent
                peak, elapsed, answers = await _phase(proxy, requests, args.clients)
            finally:
                proxy.stop()
            over = (peak - baseline) / MB
            # Each client's cap held once, and once more while the last piece is joined to it.
            bound = args.clients * 2 * cap / MB
            within = over <= bound
            ok = ok and within
            got = ", ".join(f"{a} x{n}" for a, n in sorted(answers.items()))
            print(
                f"{name}: backend sent {(backend.sent - sent) / MB:.0f} MB in {elapsed:.2f} s; "
                f"baseline RSS {baseline / MB:.1f} MB, peak {peak / MB:.1f} MB, "
                f"{over:.1f} MB over baseline (bound {bound:g} MB = {args.clients} x 2 x cap); "
                f"answers: {got}"
            )
            print(f"[{'PASS' if within else 'FAIL'}] {name}: {over:.1f} MB <= {bound:g} MB")
        return 0 if ok else 1
    finally:
        server.close()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=2, help="requests at once per phase")
    parser.add_argument("--size-mb", type=float, default=300.0, help="each reply's size, MB")
    parser.add_argument("--seconds", type=float, default=10.0, help="the longest a stream runs")
    parser.add_argument("--event-cap-mb", type=float, default=None, help="max_event_bytes, MB")
    parser.add_argument("--reply-cap-mb", type=float, default=None, help="max_reply_bytes, MB")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))

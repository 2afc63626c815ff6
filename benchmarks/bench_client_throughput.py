"""How many SSE chunks per second can one client core take? Measures the HTTP client options
for the bench (httpx's own pool, httpx over an aiohttp transport, raw aiohttp, and the bench's
`BenchClient`) against a fast local upstream (`sse_upstream.py`) on loopback, then runs the real
`bench sweep` path against a paced upstream at a target rate to show whether the client's
self-check stays clear.

Each measurement runs in its own process pinned to CPU 0, the upstream pinned to CPU 1, so
"one core" means one core. Every client does the same work per chunk: SSE framing and a
msgspec decode of the chunk. Run:  .venv/bin/python benchmarks/bench_client_throughput.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from specroute.children import free_port, spawn, stop, wait_ready_sync

HERE = Path(__file__).resolve().parent
BODY = b'{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true}'
OPTIONS = ("httpx", "httpx-aiohttp", "aiohttp", "benchclient")


class Delta(msgspec.Struct):
    content: str | None = None


class Choice(msgspec.Struct):
    delta: Delta | None = None


class Chunk(msgspec.Struct):
    choices: list[Choice] = []


decode_chunk = msgspec.json.Decoder(Chunk).decode


@contextlib.contextmanager
def upstream(events: int, interval: float, tokens: int = 1) -> Iterator[str]:
    port = free_port()
    args = [
        sys.executable,
        str(HERE / "sse_upstream.py"),
        "--port",
        str(port),
        "--events",
        str(events),
        "--interval",
        str(interval),
        "--tokens",
        str(tokens),
    ]
    proc = spawn(args)
    os.sched_setaffinity(proc.pid, {1})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready_sync(url, process=proc, within=10, name="sse_upstream", connect_only=True)
        yield url
    finally:
        stop(proc)


def count_events(decoder: Any, data: bytes) -> int:
    n = 0
    for payload in decoder.feed(data):
        if payload != b"[DONE]":
            decode_chunk(payload)
        n += 1
    return n


async def httpx_stream(url: str, transport: Any) -> tuple[Any, Any]:
    import httpx

    from specroute.sse import SSEDecoder

    client = (
        httpx.AsyncClient(transport=transport, timeout=60)
        if transport
        else httpx.AsyncClient(
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=4096), timeout=60
        )
    )

    async def one() -> int:
        decoder, n = SSEDecoder(), 0
        async with client.stream("POST", url + "/v1/chat/completions", content=BODY) as r:
            async for data in r.aiter_raw():
                n += count_events(decoder, data)
        return n

    return client, one


async def aiohttp_stream(url: str) -> tuple[Any, Any]:
    import aiohttp

    from specroute.sse import SSEDecoder

    client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4096))

    async def one() -> int:
        decoder, n = SSEDecoder(), 0
        async with client.post(url + "/v1/chat/completions", data=BODY) as r:
            async for data in r.content.iter_any():
                n += count_events(decoder, data)
        return n

    return client, one


async def bench_client_stream(url: str) -> tuple[Any, Any]:
    from specroute.bench.client import BenchClient, RequestRecord
    from specroute.bench.workload import PreparedRequest

    client = BenchClient(connections=4096)
    await client.__aenter__()
    prepared = PreparedRequest("/v1/chat/completions", BODY, "default", True)

    async def one() -> int:
        record = RequestRecord(index=0, scheduled=0.0)
        await client.stream(url, prepared, record, 0.0)
        return len(record.chunk_tokens) + 2 if record.error is None else 0  # + finish, [DONE]

    class Closer:
        async def aclose(self) -> None:
            await client.__aexit__(None, None, None)

    return Closer(), one


async def measure(option: str, url: str, streams: int, seconds: float) -> dict[str, Any]:
    if option == "httpx":
        client, one = await httpx_stream(url, None)
    elif option == "httpx-aiohttp":
        from httpx_aiohttp import AiohttpTransport

        client, one = await httpx_stream(url, AiohttpTransport())
    elif option == "aiohttp":
        client, one = await aiohttp_stream(url)
    else:
        client, one = await bench_client_stream(url)
    total = 0
    deadline = time.perf_counter() + seconds

    async def user() -> None:
        nonlocal total
        while time.perf_counter() < deadline:
            received = await one()  # not `total += await ...`: that reads `total` before awaiting
            total += received

    await asyncio.gather(*(one() for _ in range(min(streams, 32))))  # warm connections
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(user() for _ in range(streams)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await client.aclose() if hasattr(client, "aclose") else await client.close()
    return {
        "option": option,
        "streams": streams,
        "chunks": total,
        "seconds": round(wall, 2),
        "chunks_per_s": round(total / wall),
        "cpu": round(cpu / wall, 2),
        "chunks_per_cpu_s": round(total / cpu),
    }


def child(args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {0})
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    result = asyncio.run(measure(args.option, args.url, args.streams, args.seconds))
    print(json.dumps({**result, "loop": args.loop}))


def run_child(option: str, url: str, streams: int, seconds: float, loop: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--option",
            option,
            "--url",
            url,
            "--streams",
            str(streams),
            "--seconds",
            str(seconds),
            "--loop",
            loop,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def paced_sweep(streams: int, rate_per_stream: float, seconds: float, loop: str) -> dict[str, Any]:
    """The real bench path (`run_sweep`) at about streams x rate chunks/s, on one core."""
    events = int(rate_per_stream * seconds)
    with upstream(events, 1.0 / rate_per_stream, tokens=3) as url:
        code = (
            "import asyncio, os, json, msgspec\n"
            "os.sched_setaffinity(0, {0})\n"
            + (
                "import uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())\n"
                if loop == "uvloop"
                else ""
            )
            + "from specroute.bench import SweepSettings, run_sweep, parse_target\n"
            f"s = SweepSettings(targets=[parse_target('{url}')], concurrency=[{streams}],"
            f" requests={streams}, warmup=1)\n"
            "r = asyncio.run(run_sweep(s))\n"
            "lv = r.levels[0]\n"
            "print(json.dumps({'client': msgspec.to_builtins(lv.client),"
            " 'errors': lv.summary.errors, 'aggregate_tok_s': lv.summary.aggregate_tok_s}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--option", choices=OPTIONS)
    parser.add_argument("--url")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--events", type=int, default=200, help="chunks per reply (unpaced)")
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=25000.0,
        help="chunks/s for the paced `bench sweep` check",
    )
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(
        f"# one client core (CPU 0), upstream on CPU 1; {args.streams} streams, "
        f"{args.events} chunks per reply, {args.seconds:g} s each"
    )
    with upstream(args.events, 0.0) as url:
        for loop in ("asyncio", "uvloop"):
            for option in OPTIONS:
                print(json.dumps(run_child(option, url, args.streams, args.seconds, loop)))
    streams = 250
    for loop in ("asyncio", "uvloop"):
        result = paced_sweep(streams, args.paced_rate / streams, 8.0, loop)
        print(json.dumps({"paced_bench_sweep": True, "loop": loop, **result}))


if __name__ == "__main__":
    main()

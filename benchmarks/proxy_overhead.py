"""The proxy's added latency and throughput against a fast canned upstream, beside going direct.

    python benchmarks/proxy_overhead.py [--requests 2000]
                                        [--dashboard-clients N]

Starts a minimal SGLang-like upstream (raw ASGI on uvicorn: a canned chat completion and a
short stream) and a proxy in front of it, each in its own process, then drives both with the
same aiohttp client at concurrency 1 and 64 and prints p50/p99 latency and requests/second.
With `--dashboard-clients N`, N dashboard viewers poll the proxy as the page does, throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import aiohttp

from specroute.bench.stats import percentile
from specroute.children import spawn, stop, wait_ready_sync

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MODEL = "bench/model"
COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


def _event(choices: list[object], **extra: object) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": choices, **extra}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


STREAM = [
    _event([{"index": 0, "delta": {"role": "assistant", "content": "o"}}]),
    _event([{"index": 0, "delta": {"content": "k"}, "finish_reason": "stop"}]),
    _event([], usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
    b"data: [DONE]\n\n",
]
INFO = {
    "/ready": b'{"status":"ok"}',
    "/server_info": json.dumps(
        {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "max_running_requests": 4096,
            "served_model_name": MODEL,
        }
    ).encode(),
    "/v1/models": json.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
    ).encode(),
    "/metrics": b"",
}
COMPACT = (",", ":")
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, separators=COMPACT
).encode()
STREAM_BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    separators=COMPACT,
).encode()


async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
    """The fast upstream: answers from memory, no framework."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    json_type = [(b"content-type", b"application/json")]
    if scope["method"] == "POST" and b'"stream":true' in body:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in STREAM:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    out = COMPLETION if scope["method"] == "POST" else INFO.get(scope["path"], b"{}")
    await send({"type": "http.response.start", "status": 200, "headers": json_type})
    await send({"type": "http.response.body", "body": out})


def _serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(upstream, port=port, log_level="warning", loop="uvloop", http="httptools")


def _serve_proxy(port: int, backend: str) -> None:
    """The proxy as `specroute serve` runs it (uvloop, the limited httptools protocol)."""
    from specroute.config import load_config
    from specroute.logs import configure_logging
    from specroute.proxy import create_app
    from specroute.proxy.server import serve

    configure_logging("warning", json=True)
    config = load_config(
        environ={},
        overrides={
            "backends": [{"url": backend}],
            "port": port,
            "host": "127.0.0.1",
            "log_level": "warning",
        },
    )
    serve(create_app(config), config)


@contextlib.contextmanager
def _process(code: str, port: int) -> Iterator[None]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = spawn([sys.executable, "-c", code], env=env)
    try:
        wait_ready_sync(f"http://127.0.0.1:{port}/ready", process=proc, poll_s=0.1)
        yield
    finally:
        stop(proc)


async def _drive(url: str, body: bytes, concurrency: int, total: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(count: int) -> None:
            for _ in range(count):
                start = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    assert response.status == 200, response.status
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(
            *(worker(max(1, total // concurrency // 10)) for _ in range(concurrency))
        )
        latencies.clear()  # warm-up done
        began = time.perf_counter()
        await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return latencies, len(latencies) / elapsed


# Dashboard viewers (--dashboard-clients) ---------------------------------------------------
async def _view_dashboards(port: int, clients: int) -> None:
    """`clients` open dashboards, polling as the page does: its data every second, /pool every
    3 s (/policy only when the policy changes). Runs in its own process, apart from the load."""
    base = f"http://127.0.0.1:{port}"

    async def viewer(session: aiohttp.ClientSession) -> None:
        seq, tick = 0, 0
        while True:
            async with session.get(f"{base}/dashboard/data?since={seq}") as response:
                seq = (await response.json())["seq"]
            if tick % 3 == 0:
                async with session.get(base + "/pool") as response:
                    await response.read()
            tick += 1
            await asyncio.sleep(1.0)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(viewer(session) for _ in range(clients)))


@contextlib.contextmanager
def _dashboard_viewers(code: str, clients: int) -> Iterator[None]:
    if clients <= 0:
        yield
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = spawn([sys.executable, "-c", code], env=env)
    try:
        time.sleep(2.0)  # every viewer has loaded its history before the first timed run
        yield
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard viewers exited early ({proc.returncode})")
    finally:
        stop(proc)


# ---------------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--dashboard-clients", type=int, default=0, metavar="N",
        help="keep N dashboard viewers polling the proxy during the run",
    )  # fmt: skip
    args = parser.parse_args()
    up_port, proxy_port = 18301, 18300
    here = os.path.abspath(__file__)
    load = f"import runpy; m = runpy.run_path({here!r}); m"
    up_code = f"{load}['_serve_upstream']({up_port})"
    proxy_code = f"{load}['_serve_proxy']({proxy_port}, 'http://127.0.0.1:{up_port}')"
    viewers_code = (
        f"import asyncio, runpy; m = runpy.run_path({here!r}); "
        f"asyncio.run(m['_view_dashboards']({proxy_port}, {args.dashboard_clients}))"
    )
    print(f"requests={args.requests} dashboard_clients={args.dashboard_clients}")
    print(f"{'kind':7} {'conc':>4} {'target':7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    with (
        _process(up_code, up_port),
        _process(proxy_code, proxy_port),
        _dashboard_viewers(viewers_code, args.dashboard_clients),
    ):
        for kind, body in (("chat", BODY), ("stream", STREAM_BODY)):
            for concurrency in (1, 64):
                rows = {}
                for target, port in (("direct", up_port), ("proxy", proxy_port)):
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    lat, rps = asyncio.run(_drive(url, body, concurrency, args.requests))
                    rows[target] = (_pct(lat, 50), _pct(lat, 99), rps)
                    p50, p99, rate = rows[target]
                    print(f"{kind:7} {concurrency:4} {target:7} {p50:8.3f} {p99:8.3f} {rate:8.0f}")
                added = rows["proxy"][0] - rows["direct"][0]
                share = rows["proxy"][2] / rows["direct"][2]
                summary = f"added p50 {added:.3f} ms, proxy/direct req/s {share:.2f}"
                print(f"{kind:7} {concurrency:4} {summary}")


if __name__ == "__main__":
    main()

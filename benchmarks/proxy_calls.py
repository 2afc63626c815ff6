"""The proxy's own cost per request, in Python function calls and CPU, for two source trees.

    python benchmarks/proxy_calls.py BASE_TREE [CURRENT_TREE] [--requests 2000] [--rounds 3]
                                     [--concurrency 16] [--top 0]

Robust on a loaded machine, where wall-clock latency says little: each tree's proxy runs in its
own process (PYTHONPATH=TREE, uvloop and the limited httptools protocol as `specroute serve`
runs it, each tree's own defaults) in front of benchmarks/proxy_overhead.py's canned upstream;
this process drives it and reads, over a control route the worker adds, the proxy process's CPU
time (unprofiled) and its cProfile call count over the measured requests. Trees alternate
A B A B; the table shows each tree's median over the rounds. `--top K` also prints the K
functions whose calls per request differ most between the trees (from the last round); `--dump
DIR` keeps each tree's last profile for `python -m pstats`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import runpy
import socket
import statistics
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp

from specroute.children import spawn, stop, wait_ready_sync

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

HERE = Path(__file__).resolve()
OVERHEAD = HERE.with_name("proxy_overhead.py")
CONTROL = "/__calls"


class Meter:
    """The worker's control route around the proxy app: `start` notes the process's CPU time
    (and with `?profile=1` starts a fresh cProfile), `stop` answers what was spent since."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state  # the server reads the proxy's state (auth, pool) through it
        self._cpu = 0.0
        self._profile: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(CONTROL):
            await self.app(scope, receive, send)
            return
        body = self._start(scope) if scope["path"].endswith("/start") else self._stop(scope)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _start(self, scope: Scope) -> bytes:
        import cProfile
        import time

        self._profile = cProfile.Profile() if scope["query_string"] == b"profile=1" else None
        self._cpu = time.process_time()
        if self._profile is not None:
            self._profile.enable()
        return b"{}"

    def _stop(self, scope: Scope) -> bytes:
        import pstats
        import time
        from urllib.parse import parse_qs

        cpu = time.process_time() - self._cpu
        out: dict[str, Any] = {"cpu_s": cpu}
        if self._profile is not None:
            self._profile.disable()
            stats = pstats.Stats(self._profile)
            out["calls"] = stats.total_calls  # type: ignore[attr-defined]  # set by pstats
            functions: dict[str, int] = {}  # by file and name: line numbers differ between trees
            for (file, _, name), counts in stats.stats.items():  # type: ignore[attr-defined]
                key = f"{Path(file).name}:{name}" if file != "~" else name.split(" at 0x")[0]
                functions[key] = functions.get(key, 0) + counts[1]
            out["functions"] = functions
            for path in parse_qs(scope["query_string"].decode()).get("dump", []):
                stats.dump_stats(path)
        return json.dumps(out).encode()


def _serve_proxy(fd: int, backend: str) -> None:
    """The worker: the tree on PYTHONPATH's proxy on the inherited socket, configured and
    served as `specroute serve` does (its defaults), with the meter's route beside it."""
    import gc

    import uvicorn

    from specroute.config import load_config
    from specroute.logs import configure_logging
    from specroute.proxy import create_app
    from specroute.proxy.protocol import limited_protocol

    configure_logging("warning", json=True)
    overrides = {"backends": [{"url": backend}], "host": "127.0.0.1", "log_level": "warning"}
    config = load_config(environ={}, overrides=overrides)
    app = Meter(create_app(config))
    gc.collect()
    gc.freeze()
    server = uvicorn.Config(
        app,
        loop="uvloop",
        http=limited_protocol(config.limits, app.state.auth),
        ws="none",
        proxy_headers=False,
        lifespan="on",
        log_level="warning",
        access_log=False,
    )
    uvicorn.Server(server).run(sockets=[socket.socket(fileno=fd)])


def _serve_upstream(fd: int) -> None:
    import uvicorn

    upstream = runpy.run_path(str(OVERHEAD))["upstream"]
    uvicorn.run(upstream, fd=fd, log_level="warning", loop="uvloop", http="httptools")


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _child(code: str, sock: socket.socket, pythonpath: str) -> Any:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    load = f"import runpy; m = runpy.run_path({str(HERE)!r}); m"
    proc = spawn([sys.executable, "-P", "-c", f"{load}{code}"], env=env, pass_fds=[sock.fileno()])
    port = sock.getsockname()[1]
    wait_ready_sync(f"http://127.0.0.1:{port}/ready", process=proc, poll_s=0.1)
    return proc


async def _measure(base: str, body: bytes, args: argparse.Namespace, dump: str) -> dict[str, Any]:
    """Warm up, then the measured requests twice: unprofiled (CPU), profiled (calls)."""
    url = f"{base}/v1/chat/completions"
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def drive(total: int) -> None:
            async def worker(count: int) -> None:
                for _ in range(count):
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        assert response.status == 200, response.status

            share = total // args.concurrency
            await asyncio.gather(*(worker(share) for _ in range(args.concurrency)))

        async def control(path: str) -> dict[str, Any]:
            async with session.get(base + CONTROL + path) as response:
                result: dict[str, Any] = await response.json()
                return result

        await drive(args.requests // 2)
        n = args.requests // args.concurrency * args.concurrency
        await control("/start")
        await drive(args.requests)
        cpu = await control("/stop")
        await control("/start?profile=1")
        await drive(args.requests)
        calls = await control(f"/stop?dump={dump}" if dump else "/stop")
    return {
        "cpu_us": 1e6 * cpu["cpu_s"] / n,
        "calls": calls["calls"] / n,
        "functions": {k: v / n for k, v in calls["functions"].items()},
    }


def _run_tree(name: str, tree: str, upstream_url: str, args: argparse.Namespace) -> dict[str, Any]:
    sock = _listener()
    path = os.pathsep.join([tree, os.path.join(tree, "tests")])
    proc = _child(f"['_serve_proxy']({sock.fileno()}, {upstream_url!r})", sock, path)
    try:
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        overhead = runpy.run_path(str(OVERHEAD))
        return {
            kind: asyncio.run(_measure(base, overhead[body], args, _dump(args, name, kind)))
            for kind, body in (("chat", "BODY"), ("stream", "STREAM_BODY"))
        }
    finally:
        stop(proc)
        sock.close()


def _dump(args: argparse.Namespace, name: str, kind: str) -> str:
    return os.path.join(os.path.abspath(args.dump), f"{name}-{kind}.prof") if args.dump else ""


def _print_top(a: dict[str, float], b: dict[str, float], top: int) -> None:
    names = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0.0) - a.get(k, 0.0)))
    for name in names[:top]:
        before, after = a.get(name, 0.0), b.get(name, 0.0)
        print(f"    {after - before:+7.1f}  {before:7.1f} -> {after:7.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the source tree to compare against (a checkout's root)")
    parser.add_argument("current", nargs="?", default=str(HERE.parents[1]))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--top", type=int, default=0, metavar="K")
    parser.add_argument("--dump", metavar="DIR", help="write each tree's profiles (pstats) here")
    args = parser.parse_args()
    trees = {"base": os.path.abspath(args.base), "current": os.path.abspath(args.current)}
    up_sock = _listener()
    here = os.pathsep.join(sys.path)
    upstream = _child(f"['_serve_upstream']({up_sock.fileno()})", up_sock, here)
    upstream_url = f"http://127.0.0.1:{up_sock.getsockname()[1]}"
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    try:
        for _ in range(args.rounds):
            for name, tree in trees.items():  # A B A B: drift in the machine's load hits both
                runs[name].append(_run_tree(name, tree, upstream_url, args))
    finally:
        stop(upstream)
    print(f"requests={args.requests} concurrency={args.concurrency} rounds={args.rounds}")
    for name, tree in trees.items():
        print(f"  {name:8} {tree}")
    print(f"{'kind':7} {'tree':8} {'calls/req':>10} {'cpu us/req':>11}  (median; each round)")
    for kind in ("chat", "stream"):
        for name in trees:
            calls = [run[kind]["calls"] for run in runs[name]]
            cpu = [run[kind]["cpu_us"] for run in runs[name]]
            each = " ".join(f"{c:.0f}" for c in cpu)
            print(
                f"{kind:7} {name:8} {statistics.median(calls):10.1f} "
                f"{statistics.median(cpu):11.0f}  ({each})"
            )
        if args.top:
            a, b = (runs[name][-1][kind]["functions"] for name in trees)
            _print_top(a, b, args.top)


if __name__ == "__main__":
    main()

"""`specroute demo`: the proxy on localhost in front of three emulated SGLang servers.

Starts emulated servers at steps 1, 2 and 3 (no GPU: the emulator's calibrated model stands in),
starts `specroute serve` in front of them, sends a short run of greedy and sampled requests to
show where each went and why, prints how to point the OpenAI client at it, and serves until
Ctrl-C, then stops everything it started. If the proxy or a backend dies, it says so and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import httpx
import msgspec

from specroute.children import ChildFailed, is_socket, spawn, stop_async, wait_exit, wait_ready
from specroute.cmdline import Subcommands
from specroute.emulator.fleet import EmulatedServer, emulated_fleet
from specroute.emulator.profiles import DEFAULT_PROFILE, PROFILES
from specroute.helpformat import DefaultsHelp
from specroute.logs import configure_logging

__all__ = ["register"]

STEPS = (1, 2, 3)
PROMPT = "Explain in one paragraph why speculative decoding helps most when a GPU is not busy."
SINGLES = ("greedy", "sampled", "greedy", "sampled")
SAMPLINGS = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 1.0, "top_p": 0.95}}
_chunk = msgspec.json.Decoder(dict[str, object])


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


@contextlib.asynccontextmanager
async def running_proxy(
    servers: Sequence[EmulatedServer], host: str, port: int, policy: str, fd: int | None = None
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """`specroute serve` in a child process (its own session: Ctrl-C reaches only the demo,
    which stops it once), ready when the block starts; with `fd`, on that inherited socket."""
    backends = [arg for s in servers for arg in ("--backend", f"{s.label}={s.url}")]
    inherit = [] if fd is None else ["--fd", str(fd)]
    process = spawn(
        [sys.executable, "-m", "specroute", "serve", *backends, "--host", host,
         "--port", str(port), *inherit, "--policy", policy, "--log-level", "warning"],
        new_session=True,
        pass_fds=() if fd is None else (fd,),
    )  # fmt: skip
    url = f"http://{host}:{port}"
    try:
        await wait_ready(url + "/ready", process=process, poll_s=0.1, name="the proxy")
        yield url, process
    finally:
        await stop_async(process)  # SIGTERM: no KeyboardInterrupt traceback if still starting


class Served(msgspec.Struct):
    request_id: str
    kind: str
    backend: str
    steps: str
    tokens: int
    tok_s: float
    ttft_ms: float


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, kind: str, max_tokens: int
) -> Served:
    """A streamed chat completion; tokens counted from the usage the proxy passes on."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **SAMPLINGS[kind],
    }
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = _chunk.decode(line[6:])
            if not first and chunk.get("choices"):
                first = time.perf_counter()
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                tokens = int(usage.get("completion_tokens", 0))
    end = time.perf_counter()
    decode = end - (first or start)
    return Served(
        request_id=response.headers.get("x-request-id", ""),
        kind=kind,
        backend=response.headers.get("x-specroute-backend", "?"),
        steps=response.headers.get("x-specroute-steps", "?"),
        tokens=tokens,
        tok_s=(tokens - 1) / decode if tokens > 1 and decode > 0 else 0.0,
        ttft_ms=((first or end) - start) * 1000,
    )


async def decision_reasons(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    """The policy's reason for each recent request, from `GET /pool`, by request id."""
    recent = (await client.get(url + "/pool")).json().get("recent_decisions", [])
    return {d["request_id"]: d["reason"] for d in recent if isinstance(d, dict)}


async def show_traffic(url: str, policy: str) -> str:
    """Requests alone, then a burst of 24 at once, with where each went."""
    async with httpx.AsyncClient(timeout=120.0) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        print(f"\nModel served by the pool: {model}. Policy: {policy}.\n")
        print("One request at a time, and why the policy chose its backend:")
        print(f"  {'traffic':8} {'backend':8} {'steps':>5} {'tokens':>6} {'tok/s':>7}  why")
        alone = [await one_request(client, url, model, kind, 96) for kind in SINGLES]
        reasons = await decision_reasons(client, url)
        for s in alone:
            why = reasons.get(s.request_id, "")
            print(f"  {s.kind:8} {s.backend:8} {s.steps:>5} {s.tokens:>6} {s.tok_s:7.1f}  {why}")
        print("\n24 requests at once (half greedy, half sampled):")
        burst = await asyncio.gather(
            *(one_request(client, url, model, ("greedy", "sampled")[i % 2], 96) for i in range(24))
        )
        by_backend: dict[tuple[str, str], list[Served]] = collections.defaultdict(list)
        for s in burst:
            by_backend[s.backend, s.steps].append(s)
        head = f"{'requests':>8} {'greedy':>6} {'sampled':>7} {'mean tok/s':>10}"
        print(f"  {'backend':8} {'steps':>5} {head}")
        for (backend, steps), served in sorted(by_backend.items(), key=lambda kv: kv[0][1]):
            greedy = sum(s.kind == "greedy" for s in served)
            mean = sum(s.tok_s for s in served) / len(served)
            print(
                f"  {backend:8} {steps:>5} {len(served):>8} {greedy:>6} "
                f"{len(served) - greedy:>7} {mean:10.1f}"
            )
    return str(model)


def client_lines(url: str, model: str) -> str:
    return f"""
Point the official OpenAI client at the proxy:

    from openai import OpenAI
    client = OpenAI(base_url="{url}/v1", api_key="unused")
    reply = client.chat.completions.create(
        model="{model}", messages=[{{"role": "user", "content": "Hello"}}], max_tokens=64
    )
    print(reply.choices[0].message.content)

Or look around:  curl {url}/pool    curl {url}/metrics    curl {url}/v1/models
"""


def _exited(children: Mapping[str, subprocess.Popen[bytes]]) -> list[str]:
    return [
        f"{name} exited with status {p.poll()}"
        for name, p in children.items()
        if p.poll() is not None
    ]


async def serve_until_stopped(children: Mapping[str, subprocess.Popen[bytes]]) -> int:
    """Wait for SIGINT or SIGTERM (0), or for a child to die (1, after saying which)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    exits = {asyncio.create_task(wait_exit(p)): name for name, p in children.items()}
    try:
        done, _ = await asyncio.wait([stopping, *exits], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in [stopping, *exits]:
            task.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if stopping in done:
        print("\nStopped the proxy and the emulated servers.", flush=True)
        return 0
    died = [f"{exits[t]} exited with status {t.result()}" for t in done if t in exits]
    print(f"specroute demo: {'; '.join(died)}; stopping the rest", file=sys.stderr, flush=True)
    return 1


async def demo(args: argparse.Namespace) -> int:
    if args.fd is None and not _port_free(args.host, args.port):
        print(f"specroute demo: port {args.port} is in use; pass --port", file=sys.stderr)
        return 2
    if args.fd is not None and not is_socket(args.fd):
        print(f"specroute demo: --fd {args.fd} is not a socket this process inherited",
              file=sys.stderr)  # fmt: skip
        return 2
    print(
        "specroute demo: starting three EMULATED SGLang servers (no GPU; a model calibrated to "
        f"the seed measurement, profile {args.profile}) at steps 1, 2 and 3, and the proxy in "
        "front of them...",
        flush=True,
    )
    async with emulated_fleet(STEPS, profile=args.profile, new_session=True) as servers:
        for s in servers:
            print(f"  emulated backend {s.label:7} {s.url}")
        proxy_at = (args.host, args.port, args.policy, args.fd)
        async with running_proxy(servers, *proxy_at) as (url, proxy):
            print(f"  proxy                   {url}", flush=True)
            children = {"the proxy": proxy}
            children.update({f"emulated backend {s.label}": s.process for s in servers})
            try:
                model = await show_traffic(url, args.policy)
            except httpx.HTTPError as exc:
                why = "; ".join(_exited(children)) or f"{type(exc).__name__}: {exc}"
                print(f"specroute demo: the sample requests failed: {why}", file=sys.stderr)
                return 1
            print(client_lines(url, model), flush=True)
            if args.exit_after_traffic:
                return 0
            print("Serving until Ctrl-C.", flush=True)
            return await serve_until_stopped(children)


def _run(args: argparse.Namespace) -> int:
    configure_logging("warning")
    try:
        return asyncio.run(demo(args))
    except KeyboardInterrupt:
        print("\nStopped the proxy and the emulated servers.")
        return 0
    except ChildFailed as exc:  # the child said why on stderr already (a bad SPECROUTE_* ...)
        print(f"specroute demo: {exc}; stopped everything it started", file=sys.stderr)
        return 1


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "demo",
        description=__doc__,
        formatter_class=DefaultsHelp,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--fd", type=int, default=None, metavar="N",
        help="the proxy listens on inherited socket N, bound by the parent to --host:--port "
        "(tests do so: the port is held from the start)",
    )  # fmt: skip
    parser.add_argument("--policy", default="throughput")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    parser.add_argument(
        "--exit-after-traffic", action="store_true",
        help="stop after the sample requests instead of serving until Ctrl-C",
    )  # fmt: skip
    parser.set_defaults(run=_run)

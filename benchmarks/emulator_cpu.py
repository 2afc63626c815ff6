"""How many concurrent streams can one emulator core serve before it, not the model, sets the pace?

    python benchmarks/emulator_cpu.py [--concurrency 64,128,256,512,1024] [--time-scale 1,10]

Starts one emulator (seed profile, --max-running-requests large, greedy requests so every
request accepts nearly all drafts), then for each concurrency N runs a lean aiohttp client in
its own process that keeps N long streams open (a finished request is replaced at once) and
counts the words of every content chunk during a measurement window. Emulator and client are
pinned to different cores when there are two. For each N it prints the achieved per-request
decode speed (tokens in the window / N / window) against the profile's prediction
`E_k / (T(N, k) / time_scale)`, the chunk rate, and both processes' CPU share. When the
emulator's core saturates, achieved speed falls below the prediction: from there on the
emulator, not the modelled GPU, sets the pace. `--time-scale` multiplies the chunk rate the
model asks for, so it finds the ceiling without thousands of sockets. (The client's core must
not saturate first: check its column.)
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from specroute.children import free_port, spawn, stop, wait_ready_sync  # noqa: E402  # after the path

CONTENT = b'"content":"'


def pin(cpu: int, pid: int = 0) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(pid, {cpu})


# -- client process -----------------------------------------------------------------------
class Window:
    """Counts the tokens and chunks that arrive while the measurement window is open."""

    def __init__(self) -> None:
        self.open = False
        self.tokens = 0
        self.chunks = 0


async def one_stream(session: Any, url: str, body: bytes, window: Window) -> None:
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        async for line in r.content:
            at = line.find(CONTENT)
            if at >= 0 and window.open:
                words = line.count(b" ", at)  # one word with a leading space per token
                if words:  # the role chunk has empty content
                    window.tokens += words
                    window.chunks += 1


async def drive(url: str, n: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    import aiohttp

    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "benchmark the emulator"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    window = Window()
    done = asyncio.Event()

    async def worker(session: aiohttp.ClientSession) -> None:
        while not done.is_set():
            await one_stream(session, url, body, window)

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(n)]
        await asyncio.sleep(3.0)  # warm-up: the batch fills
        cpu0 = time.process_time()
        window.open = True
        print("START", flush=True)
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        window.open = False
        elapsed = time.perf_counter() - started
        client_cpu = (time.process_time() - cpu0) / elapsed
        print("END", flush=True)
        done.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "per_request": window.tokens / n / elapsed,
        "tokens_per_s": window.tokens / elapsed,
        "chunks_per_s": window.chunks / elapsed,
        "client_cpu": client_cpu,
    }


def client_main(args: argparse.Namespace) -> None:
    pin(0)
    result = asyncio.run(drive(args.url, args.n, args.seconds, args.max_tokens))
    print("RESULT " + json.dumps(result), flush=True)


# -- parent -------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def emulator(port: int, steps: int, time_scale: float, max_running: int) -> Iterator[int]:
    args = [sys.executable, "-m", "specroute", "emulate", "--steps", str(steps)]
    args += ["--port", str(port), "--time-scale", str(time_scale)]
    args += ["--max-running-requests", str(max_running)]
    process = spawn(
        args,
        env={"PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pin(1, process.pid)
    try:
        url = f"http://127.0.0.1:{port}/ready"
        wait_ready_sync(url, process=process, poll_s=0.1, name="the emulator")
        yield process.pid
    finally:
        stop(process, grace_s=15)


def measure(pid: int, url: str, n: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--client", "--url", url, "--n", str(n)]
    cmd += ["--seconds", str(seconds), "--max-tokens", str(max_tokens)]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    cpu0 = wall0 = 0.0
    result: dict[str, Any] = {}
    for line in client.stdout:
        if line.startswith("START"):
            cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
        elif line.startswith("END"):
            result["cpu"] = (cpu_seconds(pid) - cpu0) / (time.perf_counter() - wall0)
        elif line.startswith("RESULT "):
            result.update(json.loads(line[7:]))
    client.wait()
    return result


def predicted_speed(n: int, steps: int, time_scale: float) -> float:
    from specroute.emulator.profiles import get_profile

    profile = get_profile("seed-qwen35-122b")
    return profile.expected_tokens("greedy", steps) / (
        profile.iteration_time(n, steps) / time_scale
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", default="64,128,256,512,1024")
    parser.add_argument("--time-scale", default="1,10")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--max-tokens", type=int, default=2000)
    args = parser.parse_args()
    if args.client:
        client_main(args)
        return
    print(f"cores: {os.cpu_count()}  steps: {args.steps}  greedy, max_tokens {args.max_tokens}")
    header = f"{'scale':>5} {'N':>5} {'predicted':>10} {'achieved':>9} {'ratio':>6}"
    print(header + f" {'agg tok/s':>10} {'chunks/s':>9} {'emu CPU':>8} {'client CPU':>10}")
    for scale in [float(s) for s in args.time_scale.split(",")]:
        port = free_port()
        levels = [int(n) for n in args.concurrency.split(",")]
        with emulator(port, args.steps, scale, max(levels) * 2) as pid:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            for n in levels:
                r = measure(pid, url, n, args.seconds, args.max_tokens)
                want = predicted_speed(n, args.steps, scale)
                got = r.get("per_request", 0.0)
                cpu, client_cpu = 100 * r.get("cpu", 0.0), 100 * r.get("client_cpu", 0.0)
                print(
                    f"{scale:>5g} {n:>5} {want:>10.1f} {got:>9.1f} {got / want:>6.2f} "
                    f"{r['tokens_per_s']:>10.0f} {r['chunks_per_s']:>9.0f} {cpu:>7.0f}%"
                    f" {client_cpu:>9.0f}%",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""The proxy's memory under large request bodies: N concurrent bodies of S MB (eight of 30 MB by
default) sent through the proxy, its resident memory sampled throughout, and the peak over its
idle baseline printed beside the cap on bodies held at once (`limits.max_body_bytes_in_flight`).
Loopback only; it stops by itself.

    python benchmarks/body_memory.py [--bodies 8] [--size-mb 30] [--cap-mb N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from harness import Emulator, Proxy, rss_bytes

MB = 1024 * 1024
MODEL = "Qwen/Qwen3.5-122B-A10B"
GOAL_MB = 128.0  # the bound on the peak over baseline at the default cap


def _body(size: int) -> bytes:
    head = b'{"model":"%s","max_tokens":4,"messages":[{"role":"user","content":"' % MODEL.encode()
    tail = b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _peak_rss(pid: int) -> int:
    """The process's resident high-water mark (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak(pid: int) -> bool:
    """Start the high-water mark afresh (Linux `clear_refs` 5); False where that is refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def _sample(pid: int, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_bytes(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.005)


async def _round(proxy: Proxy, body: bytes, bodies: int) -> tuple[int, float, Counter[str]]:
    """One burst: (peak RSS in bytes, seconds, statuses)."""
    peak, stop = [rss_bytes(proxy.pid)], asyncio.Event()
    sampler = asyncio.create_task(_sample(proxy.pid, stop, peak))
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=proxy.url, timeout=120) as client:
        replies = await asyncio.gather(
            *(client.post("/v1/chat/completions", content=body) for _ in range(bodies)),
            return_exceptions=True,
        )
    elapsed = time.monotonic() - started
    stop.set()
    await sampler
    statuses = Counter(
        str(r.status_code) if isinstance(r, httpx.Response) else type(r).__name__ for r in replies
    )
    return max(peak[0], _peak_rss(proxy.pid)), elapsed, statuses


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="specroute-bodies-"))
    emulator = Emulator(1, ["--time-scale", "50", "--seed", "1"], work)
    emulator.start()
    await emulator.ready()
    config = work / "proxy.toml"
    text = f'[[backends]]\nurl = "{emulator.url}"\n[health]\ninterval_s = 1.0\n'
    if args.cap_mb is not None:
        text += f"[limits]\nmax_body_bytes_in_flight = {int(args.cap_mb * MB)}\n"
    config.write_text(text)
    proxy = Proxy(config, work / "proxy.log")
    try:
        await proxy.start()
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            for _ in range(20):  # warm: imports, pools and first allocations done
                await client.post("/v1/chat/completions", content=_body(4096))
        await asyncio.sleep(1.0)
        baseline = rss_bytes(proxy.pid)
        body = _body(int(args.size_mb * MB))
        cap = args.cap_mb if args.cap_mb is not None else 64.0
        print(f"bodies={args.bodies} size={args.size_mb:g} MB cap={cap:g} MB")
        print(f"baseline RSS {baseline / MB:.1f} MB")
        worst = 0.0
        for index in range(args.rounds):
            _reset_peak(proxy.pid)
            peak, elapsed, statuses = await _round(proxy, body, args.bodies)
            over = (peak - baseline) / MB
            worst = max(worst, over)
            answered = ", ".join(f"{status} x{n}" for status, n in sorted(statuses.items()))
            print(
                f"round {index + 1}: peak RSS {peak / MB:.1f} MB, {over:.1f} MB over baseline, "
                f"{elapsed:.2f} s, answers: {answered}"
            )
        ok = worst <= GOAL_MB
        print(f"[{'PASS' if ok else 'FAIL'}] peak over baseline {worst:.1f} MB <= {GOAL_MB:g} MB")
        return 0 if ok else 1
    finally:
        proxy.stop()
        emulator.kill()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bodies", type=int, default=8, help="concurrent bodies per round")
    parser.add_argument("--size-mb", type=float, default=30.0, help="each body's size, MB")
    parser.add_argument("--cap-mb", type=float, default=None, help="override the cap, MB")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))

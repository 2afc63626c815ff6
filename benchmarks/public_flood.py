"""Keyless clients hammering a public route of `specroute serve` over an emulator, as the probe
did: `--connections` keyless connections each send `--pipelined` `GET /metrics` requests in one
write and read what comes back, while a client with a key tries six times per 2.5 s (chat
completions and /v1/models in turn, a fresh connection each). Prints the keyed tries that
succeeded in each window, the attackers' replies, and the proxy's CPU. Loopback; stops by itself.

    python benchmarks/public_flood.py [--connections 500] [--pipelined 100] [--windows 6]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import Emulator, Proxy
from lockout import (
    ADMIN,
    CONFIG,
    DRIP_S,
    KEY,
    MODEL,
    TRIES_PER_WINDOW,
    Attacker,
    Try,
    _raise_fd_limit,
    _verdict,
    keyed_tries,
    report_windows,
)

REQUEST = b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n"


async def attack(
    port: int, pipelined: int, until: float, gate: asyncio.Semaphore, out: Attacker
) -> int:
    """One keyless connection: `pipelined` requests in one write, then read until the proxy
    closes it or the run ends; the replies that began, counted."""
    async with gate:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        except (OSError, TimeoutError):
            return 0
    out.sent_at = time.perf_counter()
    writer.write(REQUEST * pipelined)
    replies, tail = 0, b""
    try:
        while (left := until - time.perf_counter()) > 0:
            try:
                data = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                break
            if not data:
                out.closed_after = time.perf_counter() - out.sent_at
                break
            if not out.reply:
                out.reply = data[:64]
            seen = tail + data
            replies += seen.count(b"HTTP/1.1 ")
            tail = seen[-8:]
    except OSError:
        out.closed_after = time.perf_counter() - out.sent_at
    finally:
        writer.close()
    return replies


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (USER_HZ)


async def flood(proxy: Proxy, args: argparse.Namespace) -> bool:
    start = time.perf_counter()
    until = start + args.windows * DRIP_S
    cpu_before = _cpu_s(proxy.pid)
    attackers = [Attacker() for _ in range(args.connections)]
    tries: list[Try] = []
    keyed = threading.Thread(
        target=keyed_tries, args=(proxy.url, start, args.windows * TRIES_PER_WINDOW, tries)
    )
    keyed.start()
    gate = asyncio.Semaphore(256)
    replies = await asyncio.gather(
        *(attack(proxy.port, args.pipelined, until, gate, a) for a in attackers)
    )
    await asyncio.to_thread(keyed.join)
    cpu = _cpu_s(proxy.pid) - cpu_before
    made = [a for a in attackers if a.sent_at is not None]
    closed = sum(a.closed_after is not None for a in made)
    firsts: dict[str, int] = {}
    for a in made:
        status = a.reply.split(b" ", 2)[1].decode() if a.reply.startswith(b"HTTP/") else "none"
        firsts[status] = firsts.get(status, 0) + 1
    print(
        f"\n{args.connections} keyless connections x {args.pipelined} pipelined GET /metrics "
        f"({len(REQUEST) * args.pipelined * len(made) / 1e6:.2f} MB sent once)"
    )
    passed = report_windows(tries, attackers, args)
    print(
        f"attackers: {len(made)} connected, {closed} closed by the proxy; replies begun "
        f"{sum(replies)} of {len(made) * args.pipelined} asked; first status {firsts}"
    )
    print(f"proxy CPU during the run: {cpu:.1f} s over {time.perf_counter() - start:.1f} s")
    return passed


async def main(args: argparse.Namespace) -> int:
    _raise_fd_limit(args.connections + 512)  # the proxy, a child, inherits it
    work = Path(tempfile.mkdtemp(prefix="specroute-public-flood-"))
    emulator = Emulator(3, ["--time-scale", "50", "--model-name", MODEL], work)
    config = work / "proxy.toml"
    config.write_text(
        CONFIG.format(key=KEY, admin=ADMIN, header=10.0, body=10.0, backend=emulator.url)
    )
    proxy = Proxy(config, work / "proxy.log")
    print(f"public flood: logs in {work}")
    try:
        emulator.start()
        await emulator.ready()
        await proxy.start()
        passed = await flood(proxy, args)
    finally:
        proxy.stop()
        emulator.stop()
    print(f"\noverall: {_verdict(passed)}")
    return 0 if passed else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=500, help="keyless connections")
    parser.add_argument("--pipelined", type=int, default=100, help="requests per connection")
    parser.add_argument("--windows", type=int, default=6, help=f"windows of {DRIP_S} s each")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))

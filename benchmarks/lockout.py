"""Hostile clients against `specroute serve` over an emulator, as the probe ran them: thousands of
keyless connections that never finish a request and send one byte every 2.5 s, while a client
with a key tries six times per 2.5 s; then one client sending an endless header value, then an
endless name. Prints the keyed tries that succeeded in each window, when the attackers were
closed, and the endless headers' status and the proxy's memory growth. Loopback; stops by itself.

    python benchmarks/lockout.py [--connections 4200] [--windows 6] [--scenario NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import Emulator, Proxy, rss_bytes

from specroute.bench.stats import percentile

KEY, ADMIN = "sk-lockout-bench", "sk-lockout-admin"
MODEL = "bench/model"
DRIP_S = 2.5
TRIES_PER_WINDOW = 6
HEAD = b"host: x\r\ncontent-length: 1000000000\r\n\r\n"
# (request, how many connections: None = --connections, the byte dripped every DRIP_S)
SCENARIOS: dict[str, tuple[bytes, int | None, bytes]] = {
    "public-get-body": (b"GET /health HTTP/1.1\r\n" + HEAD, None, b"x"),
    "chunked-keyless": (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        b"fffffff\r\n{",  # a chunk of 256 MiB that never ends
        None,
        b"x",
    ),
    "policy-keyless": (b"PUT /policy HTTP/1.1\r\n" + HEAD, None, b"x"),
    "headers-never-end": (b"GET /health HTTP/1.1\r\nhost: x\r\nx-drip: ", None, b"x"),
    "policy-admin-body": (
        b"PUT /policy HTTP/1.1\r\nhost: x\r\ncontent-length: 65536\r\n"
        + f"authorization: Bearer {ADMIN}\r\n\r\n".encode(),
        10,  # a key holder: not a lockout, only a body that must meet its deadline
        b"x",
    ),
}
CONFIG = """
api_keys = ["{key}"]
admin_key = "{admin}"
log_level = "warning"
[limits]
header_timeout_s = {header}
body_timeout_s = {body}
[[backends]]
url = "{backend}"
"""


@dataclass
class Attacker:
    sent_at: float | None = None  # None: the connection was never made
    closed_after: float | None = None  # None: still open at the end
    reply: bytes = b""


@dataclass
class Try:
    at: float
    ok: bool
    latency: float
    outcome: str


async def attack(
    port: int, source: str, scenario: tuple[bytes, int | None, bytes], until: float,
    gate: asyncio.Semaphore, out: Attacker,
) -> None:  # fmt: skip
    """One connection: its request, then a byte every DRIP_S until the proxy closes it."""
    request, _, drip = scenario
    async with gate:
        try:
            opening = asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            reader, writer = await asyncio.wait_for(opening, 10)
        except (OSError, TimeoutError):
            return
    out.sent_at = time.perf_counter()
    writer.write(request)
    try:
        while (left := until - time.perf_counter()) > 0:
            try:
                data = await asyncio.wait_for(reader.read(4096), min(DRIP_S, left))
            except TimeoutError:
                writer.write(drip)
                continue
            if not data:
                break
            out.reply = (out.reply + data)[:64]
        else:
            return
    except OSError:
        pass
    finally:
        writer.close()
    out.closed_after = time.perf_counter() - out.sent_at


def keyed_tries(url: str, start: float, count: int, out: list[Try]) -> None:
    """A client with a key, a fresh connection for every try, six tries per DRIP_S."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    limits = httpx.Limits(max_keepalive_connections=0)
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, headers=headers, limits=limits, timeout=2.0) as client:
        for i in range(count):
            at = start + i * DRIP_S / TRIES_PER_WINDOW
            time.sleep(max(0.0, at - time.perf_counter()))
            began = time.perf_counter()
            try:
                if i % 2:
                    reply = client.post("/v1/chat/completions", json=chat)
                else:
                    reply = client.get("/v1/models")
                ok, outcome = reply.status_code == 200, str(reply.status_code)
            except httpx.HTTPError as exc:
                ok, outcome = False, type(exc).__name__
            out.append(Try(began - start, ok, time.perf_counter() - began, outcome))


async def flood(proxy: Proxy, name: str, source: str, args: argparse.Namespace) -> bool:
    scenario = SCENARIOS[name]
    count = scenario[1] or args.connections
    start = time.perf_counter()
    until = start + args.windows * DRIP_S
    attackers = [Attacker() for _ in range(count)]
    gate = asyncio.Semaphore(256)
    tries: list[Try] = []
    keyed = threading.Thread(
        target=keyed_tries, args=(proxy.url, start, args.windows * TRIES_PER_WINDOW, tries)
    )
    keyed.start()
    await asyncio.gather(*(attack(proxy.port, source, scenario, until, gate, a) for a in attackers))
    await asyncio.to_thread(keyed.join)
    print(f"\n{name}: {count} connections, each sending {scenario[0][:48]!r}...")
    return report_windows(tries, attackers, args) & report_attackers(attackers, args)


def report_windows(tries: list[Try], attackers: list[Attacker], args: argparse.Namespace) -> bool:
    print(f"{'window':>6} {'keyed ok':>9} {'p50 ms':>8} {'max ms':>8} {'attackers open':>15}")
    passed = True
    for window in range(args.windows):
        inside = [t for t in tries if window * DRIP_S <= t.at < (window + 1) * DRIP_S]
        ok = sum(t.ok for t in inside)
        passed &= ok >= TRIES_PER_WINDOW - 1
        latency = [t.latency * 1000 for t in inside] or [0.0]
        end = (window + 1) * DRIP_S
        still = sum(
            a.sent_at is not None and (a.closed_after is None or a.closed_after > end)
            for a in attackers
        )  # roughly: attackers all started within the first window
        failures = ",".join(t.outcome for t in inside if not t.ok)
        print(
            f"{window:>6} {ok:>5}/{len(inside):<3} {percentile(latency, 50):8.1f} "
            f"{max(latency):8.1f} {still:>15} {failures}"
        )
    print(
        f"keyed: >= {TRIES_PER_WINDOW - 1}/{TRIES_PER_WINDOW} in every window: {_verdict(passed)}"
    )
    return passed


def report_attackers(attackers: list[Attacker], args: argparse.Namespace) -> bool:
    made = [a for a in attackers if a.sent_at is not None]
    closed = sorted(a.closed_after for a in made if a.closed_after is not None)
    replies: dict[str, int] = {}
    for a in made:
        status = a.reply.split(b" ", 2)[1].decode() if a.reply.startswith(b"HTTP/") else "none"
        replies[status] = replies.get(status, 0) + 1
    bound = max(args.header_timeout, args.body_timeout) + 2.0  # + the closing linger
    passed = len(closed) == len(made) and (not closed or closed[-1] <= bound)
    when = (
        f"p50 {percentile(closed, 50):.2f} s, p99 {percentile(closed, 99):.2f} s, "
        f"max {closed[-1]:.2f} s"
        if closed
        else "none closed"
    )
    print(
        f"attackers: {len(made)} connected ({len(attackers) - len(made)} not), {len(closed)} "
        f"closed by the proxy after their request: {when}; replies {replies}"
    )
    print(f"attackers closed within the header or body timeout (+2 s linger): {_verdict(passed)}")
    return passed


async def endless_header(proxy: Proxy, start: bytes, seconds: float) -> bool:
    """Send a header line without end in 64 KiB chunks; the proxy's RSS is sampled throughout."""
    assert proxy.process is not None
    pid = proxy.process.pid
    before = peak = rss_bytes(pid)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n" + start)
    sent, reply = 0, b""
    began = time.perf_counter()
    read = asyncio.ensure_future(reader.read(4096))
    while time.perf_counter() - began < seconds and not read.done():
        writer.write(b"a" * 65536)
        sent += 65536
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.drain(), 1.0)
        await asyncio.sleep(0.005)
        peak = max(peak, rss_bytes(pid))
    with contextlib.suppress(OSError, TimeoutError):
        reply = await asyncio.wait_for(read, 2.0)
    writer.close()
    growth = peak - before
    status = reply.split(b"\r\n", 1)[0].decode(errors="replace") or "no reply"
    passed = reply.startswith(b"HTTP/1.1 431") and growth < 1 << 20
    print(
        f"\nendless header {start.decode()!r}...: {status!r} after "
        f"{time.perf_counter() - began:.2f} s and {sent / 1024:.0f} KiB sent; proxy RSS growth "
        f"{growth / 1024:.0f} KiB (peak over before): {_verdict(passed)}"
    )
    return passed


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < need:
            print(f"only {target} descriptors allowed (hard limit); fewer connections will open")


async def main(args: argparse.Namespace) -> int:
    _raise_fd_limit(args.connections + 512)  # the proxy, a child, inherits it
    work = Path(tempfile.mkdtemp(prefix="specroute-lockout-"))
    emulator = Emulator(3, ["--time-scale", "50", "--model-name", MODEL], work)
    config = work / "proxy.toml"
    config.write_text(
        CONFIG.format(
            key=KEY, admin=ADMIN, header=args.header_timeout, body=args.body_timeout,
            backend=emulator.url,
        )
    )  # fmt: skip
    proxy = Proxy(config, work / "proxy.log")
    print(f"lockout: logs in {work}")
    passed = True
    try:
        emulator.start()
        await emulator.ready()
        await proxy.start()
        for start in (b"x-big: ", b"x-big"):
            passed &= await endless_header(proxy, start, seconds=10.0)
        for index, name in enumerate(args.scenario):
            passed &= await flood(proxy, name, f"127.0.0.{2 + index}", args)
    finally:
        proxy.stop()
        emulator.stop()
    print(f"\noverall: {_verdict(passed)}")
    return 0 if passed else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=4200, help="attackers per scenario")
    parser.add_argument("--windows", type=int, default=6, help=f"windows of {DRIP_S} s each")
    parser.add_argument("--header-timeout", type=float, default=10.0, help="proxy's, seconds")
    parser.add_argument("--body-timeout", type=float, default=10.0, help="proxy's, seconds")
    parser.add_argument(
        "--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS),
        help="which floods to run (default: all, one after another)",
    )  # fmt: skip
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))

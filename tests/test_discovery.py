"""Backends from DNS names that come and go, and several proxies over the same backends seeing
each other's load through the backends' scraped metrics."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog
from servers import bound_socket, run_server, start_emulator

from specroute.children import spawn, stop, wait_ready_sync
from specroute.config import BackendConfig, Config, HealthConfig
from specroute.pool import Pool, UpstreamClient
from specroute.pool.discovery import DnsDiscovery, expand, resolve_host

ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


@pytest.fixture(autouse=True, scope="module")
def _live_log_stream() -> None:
    """Earlier tests may have configured structlog onto a capture stream pytest has closed."""
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__),
        cache_logger_on_first_use=False,
    )


def test_expand_makes_one_backend_per_address_keeping_port_and_key() -> None:
    entry = BackendConfig(
        url="http://sglang.ns.svc:30000", name="k2", api_key="s", resolve_every_s=5
    )
    found = expand(entry, {"10.0.0.2", "10.0.0.1"})
    assert list(found) == ["k2/10.0.0.1:30000", "k2/10.0.0.2:30000"]
    assert found["k2/10.0.0.1:30000"].url == "http://10.0.0.1:30000"
    assert found["k2/10.0.0.1:30000"].api_key == "s"
    assert found["k2/10.0.0.1:30000"].resolve_every_s is None


def test_system_resolver_finds_localhost() -> None:
    assert "127.0.0.1" in asyncio.run(resolve_host("localhost", 80))


def _one_port_on_all() -> list[socket.socket]:
    """A socket per address in ADDRESSES, all bound to one port, for the emulators to inherit."""
    for _ in range(50):
        first = bound_socket(ADDRESSES[0])
        socks = [first]
        try:
            for address in ADDRESSES[1:]:
                sock = socket.socket()
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, first.getsockname()[1]))
                sock.set_inheritable(True)
        except OSError:
            for sock in socks:
                sock.close()
            continue
        return socks
    raise RuntimeError("no port free on every loopback address")


@pytest.fixture(scope="module")
def same_port_emulators() -> Iterator[int]:
    """Three emulators on one port at three loopback addresses, as pods behind a Service."""
    socks = _one_port_on_all()
    port = socks[0].getsockname()[1]
    argv = [sys.executable, "-m", "specroute", "emulate", "--port", str(port)]
    procs = [
        spawn(
            [*argv, "--steps", str(k), "--host", address, "--fd", str(sock.fileno())],
            stderr=subprocess.DEVNULL,
            pass_fds=[sock.fileno()],
        )
        for k, (address, sock) in enumerate(zip(ADDRESSES, socks, strict=True), start=1)
    ]
    for sock in socks:
        sock.close()  # the emulators hold them now
    try:
        for address, proc in zip(ADDRESSES, procs, strict=True):
            wait_ready_sync(f"http://{address}:{port}/ready", process=proc, poll_s=0.1)
        yield port
    finally:
        for proc in procs:
            stop(proc)


def test_dns_discovery_adds_and_removes_backends_as_the_name_changes(
    same_port_emulators: int,
) -> None:
    answer = {"127.0.0.1", "127.0.0.2"}

    async def resolve(host: str, port: int) -> set[str]:
        assert host == "sglang-headless.default.svc"
        return set(answer)

    async def scenario() -> list[list[tuple[str, int | None, bool]]]:
        entry = BackendConfig(
            url=f"http://sglang-headless.default.svc:{same_port_emulators}", resolve_every_s=60
        )
        config = Config(backends=(entry,), health=HealthConfig(success_threshold=1))
        client = UpstreamClient(config.timeouts, config.client)
        pool = Pool(Config(health=config.health), client)
        await pool.start()
        discovery = DnsDiscovery(config.backends, pool, resolve)
        seen = []
        try:
            await discovery.start()
            seen.append([(b.url, b.steps, b.healthy) for b in pool.backends])
            answer.clear()
            answer.update({"127.0.0.2", "127.0.0.3"})  # one pod went, another came
            await discovery.refresh(0)
            seen.append([(b.url, b.steps, b.healthy) for b in pool.backends])
        finally:
            await discovery.stop()
            await pool.stop()
            await client.aclose()
        return seen

    first, second = asyncio.run(scenario())
    port = same_port_emulators
    assert first == [(f"http://127.0.0.1:{port}", 1, True), (f"http://127.0.0.2:{port}", 2, True)]
    assert second == [(f"http://127.0.0.2:{port}", 2, True), (f"http://127.0.0.3:{port}", 3, True)]


def test_a_failed_lookup_keeps_the_backends_already_known(same_port_emulators: int) -> None:
    calls = 0

    async def resolve(host: str, port: int) -> set[str]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise socket.gaierror("temporary failure in name resolution")
        return {"127.0.0.1"}

    async def scenario() -> int:
        entry = BackendConfig(url=f"http://svc:{same_port_emulators}", resolve_every_s=60)
        config = Config(health=HealthConfig(success_threshold=1))
        client = UpstreamClient(config.timeouts, config.client)
        pool = Pool(config, client)
        discovery = DnsDiscovery([entry], pool, resolve)
        await discovery.start()
        await discovery.refresh(0)
        count = len(pool.backends)
        await discovery.stop()
        await pool.stop()
        await client.aclose()
        return count

    assert asyncio.run(scenario()) == 1


def _pool_load(proxy: str) -> tuple[int, int]:
    """(own in-flight, scraped running + queued) summed over the proxy's backends."""
    backends = httpx.get(proxy + "/pool", timeout=5).json()["backends"]
    own = sum(b["in_flight"] for b in backends)
    scraped = sum((b["running"] or 0) + (b["queued"] or 0) for b in backends)
    return own, scraped


async def _hold_streams(proxy: str, count: int, other: str) -> tuple[int, int, float]:
    """Open `count` streams through `proxy`; return what `other` reports while they run."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    lines = []  # hold the line iterators: a dropped one closes its stream
    async with httpx.AsyncClient(timeout=60) as client, contextlib.AsyncExitStack() as stack:
        for _ in range(count):
            reply = await stack.enter_async_context(
                client.stream("POST", proxy + "/v1/chat/completions", json=body)
            )
            assert reply.status_code == 200
            lines.append(reply.aiter_lines())
            await anext(lines[-1])
        started = time.monotonic()
        while True:
            own, scraped = await asyncio.to_thread(_pool_load, other)
            if scraped >= count or time.monotonic() - started > 20:
                return own, scraped, time.monotonic() - started
            await asyncio.sleep(0.1)


def test_two_proxies_see_each_others_load_through_scraped_metrics(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text("[health]\ninterval_s = 0.2\nmetrics_interval_s = 0.5\n")
    emulate = ("--decode-log-interval", "1", "--model-name", "tiny")
    with (
        start_emulator(1, *emulate) as e1,
        start_emulator(2, *emulate) as e2,
        start_emulator(3, *emulate) as e3,
    ):
        backends = [arg for e in (e1, e2, e3) for arg in ("--backend", e.url)]
        serve = ["serve", "--config", str(config), *backends]
        with run_server(serve) as a, run_server(serve) as b:
            for proxy, other in ((a.url, b.url), (b.url, a.url)):
                own, scraped, waited = asyncio.run(_hold_streams(proxy, 4, other))
                print(f"other proxy saw {scraped} running after {waited:.2f} s")
                assert own == 0  # none of these requests went through the other proxy
                assert scraped >= 4  # yet it sees them, from the backends' /metrics

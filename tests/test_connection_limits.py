"""Who may hold the proxy's connections: replies given before a body was read end their
connection, every body has a deadline, one peer address has a cap, and keyless clients, however
many and however slow, cannot take the slots kept for clients with a key."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from servers import Server, run_server, start_emulator

from specroute.config import load_config
from specroute.errors import ConfigError
from specroute.proxy.connections import ConnectionTable

MODEL = "Qwen/Qwen3.5-122B-A10B"
KEY = "sk-limits-test"
ADMIN = "sk-limits-admin"
AUTH = {"authorization": f"Bearer {KEY}"}
LIMIT = 200
RESERVE = 20
PER_PEER = 160
TIMEOUT_S = 1.5
CONFIG = f"""
api_keys = ["{KEY}"]
admin_key = "{ADMIN}"
[health]
interval_s = 0.2
[limits]
header_timeout_s = {TIMEOUT_S}
body_timeout_s = {TIMEOUT_S}
max_connections = {LIMIT}
reserved_connections = {RESERVE}
max_connections_per_peer = {PER_PEER}
"""
NEVER_ENDS = b"content-length: 1000000000\r\n"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = tmp_path_factory.mktemp("limits") / "proxy.toml"
    config.write_text(CONFIG)
    with start_emulator(3, "--time-scale", "50", "--seed", "5") as backend:
        args = ["serve", "--config", str(config), "--backend", backend.url]
        with run_server(args) as server:
            yield server


def _connect(proxy: Server, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), 10, source_address=(source, 0))


def _drip_until_closed(sock: socket.socket, within_s: float) -> tuple[bytes, float | None]:
    """Send one byte every 0.1 s, reading what comes: (the reply, seconds until the proxy
    closed the connection, or None if it was still open after `within_s`)."""
    start = time.monotonic()
    reply = b""
    sock.settimeout(0.1)
    while time.monotonic() - start < within_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            with contextlib.suppress(OSError):  # the proxy may be lingering, or gone
                sock.send(b"x")
            continue
        except OSError:
            return reply, time.monotonic() - start
        if not chunk:
            return reply, time.monotonic() - start
        reply += chunk
    return reply, None


def _head(reply: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    fields = dict(line.split(b": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in fields.items()}


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"GET /health HTTP/1.1\r\nhost: x\r\n" + NEVER_ENDS, 200),
        (b"GET /nowhere HTTP/1.1\r\nhost: x\r\n" + NEVER_ENDS, 404),
        (b"PUT /policy HTTP/1.1\r\nhost: x\r\n" + NEVER_ENDS, 401),
        (b"DELETE /policy HTTP/1.1\r\nhost: x\r\n" + NEVER_ENDS, 405),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n",
            401,
        ),
    ],
    ids=["public-get", "not-found", "admin-keyless", "method", "chunked-keyless"],
)
def test_a_reply_before_the_body_was_read_closes_the_connection(
    proxy: Server, request_head: bytes, status: int
) -> None:
    with _connect(proxy) as sock:
        sock.sendall(request_head + b"\r\n" + b"a" * 10)
        reply, closed_after = _drip_until_closed(sock, within_s=8)
    got, fields = _head(reply)
    assert got == status
    assert fields[b"connection"] == b"close"
    assert closed_after is not None, "still open while the client kept sending"


def test_an_admin_body_that_never_ends_gets_408_within_the_body_timeout(proxy: Server) -> None:
    with _connect(proxy) as sock:
        sock.sendall(
            b"PUT /policy HTTP/1.1\r\nhost: x\r\n"
            + f"authorization: Bearer {ADMIN}\r\ncontent-length: 4096\r\n\r\n".encode()
            + b'{"policy": "round_robin", "options": {"a": "'
        )
        reply, closed_after = _drip_until_closed(sock, within_s=TIMEOUT_S + 8)
    assert _head(reply)[0] == 408
    assert b'"request_timeout"' in reply or b"not received within" in reply
    assert closed_after is not None


async def _hold_open(
    proxy: Server, source: str, data: bytes, holding: asyncio.Semaphore, stop: asyncio.Event
) -> float | None:
    """One keyless attacker: send `data` (then release `holding`), then a byte every 0.25 s
    until the proxy closes the connection (seconds until then) or `stop` is set (None)."""
    start = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", proxy.port, local_addr=(source, 0)
        )
    except OSError:
        holding.release()
        return 0.0
    try:
        writer.write(data)
        holding.release()
        while not stop.is_set():
            try:
                if not await asyncio.wait_for(reader.read(65536), 0.25):
                    return time.monotonic() - start
            except TimeoutError:
                writer.write(b"x")
    except OSError:
        return time.monotonic() - start
    finally:
        writer.close()
    return None


async def _flood(proxy: Server, data: bytes, count: int) -> tuple[list[int], list[float | None]]:
    """`count` keyless connections from two addresses hold on while a keyed client sends a
    request every 0.1 s on a fresh connection: (its statuses, the attackers' times to close)."""
    stop, holding = asyncio.Event(), asyncio.Semaphore(0)
    sources = ["127.0.0.2", "127.0.0.3"]
    attackers = [
        asyncio.create_task(_hold_open(proxy, sources[i % 2], data, holding, stop))
        for i in range(count)
    ]
    for _ in attackers:  # every one connected and its request sent
        await holding.acquire()
    statuses = []
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=proxy.url, headers=AUTH, limits=limits) as client:
        for i in range(20):
            path = "/v1/models" if i % 2 else "/pool"
            try:
                statuses.append((await client.get(path, timeout=2)).status_code)
            except httpx.HTTPError:
                statuses.append(0)
            await asyncio.sleep(0.1)  # the keyed client's pace, not a wait for anything
    # The proxy must close every attacker (evicted, or at its header or body timeout); the
    # deadline only keeps a failure from hanging the test.
    await asyncio.wait(attackers, timeout=60)
    stop.set()
    return statuses, list(await asyncio.gather(*attackers))


def test_keyless_drip_on_a_public_route_leaves_keyed_clients_served(proxy: Server) -> None:
    head = b"GET /health HTTP/1.1\r\nhost: x\r\n" + NEVER_ENDS + b"\r\n"
    statuses, closed = asyncio.run(_flood(proxy, head, 300))
    assert statuses.count(200) >= 19, statuses
    assert all(t is not None for t in closed), "attackers left open"


def test_keyless_headers_that_never_end_leave_room_for_keyed_clients(proxy: Server) -> None:
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: "
    statuses, closed = asyncio.run(_flood(proxy, head, 300))
    assert statuses.count(200) >= 19, statuses
    # the ones not closed for room are closed at the header timeout
    assert all(t is not None for t in closed), sorted(map(str, closed))


def test_one_address_cannot_hold_more_than_its_share(proxy: Server) -> None:
    sockets = [_connect(proxy, "127.0.0.4") for _ in range(PER_PEER + 20)]
    try:
        closed = 0
        for sock in sockets[PER_PEER:]:
            sock.settimeout(2)
            with contextlib.suppress(OSError):
                closed += sock.recv(1) == b""
        assert closed == 20
        reply = httpx.get(proxy.url + "/v1/models", headers=AUTH, timeout=5)
        assert reply.status_code == 200
    finally:
        for sock in sockets:
            sock.close()


def test_reserve_must_leave_room_for_keyless_connections(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text("[limits]\nmax_connections = 10\nreserved_connections = 10\n")
    with pytest.raises(ConfigError, match="reserved_connections"):
        load_config(config, environ={})
    assert load_config(environ={}).limits.reserve == 4096 // 16


def test_table_closes_the_keyless_connection_idle_longest_for_a_newcomer() -> None:
    table: ConnectionTable[str] = ConnectionTable(3)
    for name in "abc":
        assert table.admit(name, "peer") == (True, None)
    assert table.request("a", keyed=False)  # a is busy, b idle longest
    assert table.admit("d", "peer") == (True, "b")
    assert len(table) == 3


def test_table_never_closes_a_keyed_connection_to_make_room() -> None:
    table: ConnectionTable[str] = ConnectionTable(2)
    for name in "ab":
        table.admit(name, "peer")
        table.request(name, keyed=True)
        table.idle(name)
    assert table.admit("c", "peer") == (False, None)


def test_table_keeps_the_reserve_for_connections_with_a_key() -> None:
    table: ConnectionTable[str] = ConnectionTable(4, reserve=2)
    for name in "ab":
        table.admit(name, "peer")
        assert table.request(name, keyed=False)  # both busy: none to close
    assert table.admit("c", "peer") == (True, None)  # past the share: must show a key
    assert not table.request("c", keyed=False)
    table.release("c")
    assert table.admit("d", "peer") == (True, None)
    assert table.request("d", keyed=True)


def test_table_caps_each_peer_address() -> None:
    table: ConnectionTable[str] = ConnectionTable(10, per_peer=2)
    assert table.admit("a", "10.0.0.1")[0]
    assert table.admit("b", "10.0.0.1")[0]
    assert table.admit("c", "10.0.0.1") == (False, None)
    assert table.admit("d", "10.0.0.2")[0]
    table.release("a")
    assert table.admit("e", "10.0.0.1")[0]


_OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "key", "nokey", "idle", "close"]), st.integers(0, 5)),
    max_size=100,
)


@given(_OPS)
def test_table_invariants_hold_under_any_sequence(ops: list[tuple[str, int]]) -> None:
    table: ConnectionTable[int] = ConnectionTable(4, reserve=1, per_peer=3)
    open_: set[int] = set()
    keyed: set[int] = set()
    for op, conn in ops:
        if op == "admit" and conn not in open_:
            admitted, victim = table.admit(conn, str(conn % 3))
            assert victim not in keyed, "a keyed connection was closed for room"
            if victim is not None:
                open_.discard(victim)
            if admitted:
                open_.add(conn)
        elif op in ("key", "nokey") and conn in open_:
            table.request(conn, keyed=op == "key")
            (keyed.add if op == "key" else keyed.discard)(conn)
        elif op == "idle" and conn in open_:
            table.idle(conn)
        elif op == "close":
            table.release(conn)
            open_.discard(conn)
            keyed.discard(conn)
        assert len(table) == len(open_) <= 4
        assert table.keyless == len(open_ - keyed)
    for conn in list(open_):
        table.release(conn)
    assert len(table) == table.keyless == 0

"""Broken and hostile input against a real proxy: bodies that are huge, truncated, not JSON,
deeply nested or of the wrong types; oversized headers; clients that send slowly, stop reading
or open too many connections. Each gets a 4xx in OpenAI's error shape or a closed connection,
never a 500, and the proxy serves on with its counts and memory where they were."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import Server, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
KEY = "sk-hostile-test"
ADMIN = "sk-hostile-admin"
AUTH = {"authorization": f"Bearer {KEY}"}
LIMIT = 1 << 20
CONFIG = f"""
api_keys = ["{KEY}"]
class_keys = ["{KEY}"]
admin_key = "{ADMIN}"
max_body_bytes = {LIMIT}
[health]
interval_s = 0.2
[limits]
max_header_bytes = 16384
max_headers = 50
header_timeout_s = 1.0
body_timeout_s = 1.0
max_connections = 48
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = tmp_path_factory.mktemp("hostile") / "proxy.toml"
    config.write_text(CONFIG)
    backend_ctx = start_emulator(3, "--time-scale", "20", "--seed", "4")
    with backend_ctx as backend:
        args = ["serve", "--config", str(config), "--backend", backend.url]
        with run_server(args) as server:
            yield server


def chat(**extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **extra,
    }


def assert_openai_error(reply: httpx.Response, status: int) -> dict[str, object]:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    return dict(error)


def post(proxy: Server, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        proxy.url + "/v1/chat/completions",
        content=content,
        headers={**AUTH, "content-type": "application/json", **headers},
        timeout=30,
    )


def raw_exchange(proxy: Server, data: bytes, *, wait_s: float = 10.0) -> bytes:
    """Send raw bytes, then read until the proxy closes the connection (or `wait_s` passes)."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=wait_s) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    reply = b""
    with contextlib.suppress(OSError):  # a reset counts as closed
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def in_flight(proxy: Server) -> list[int]:
    pool = httpx.get(proxy.url + "/pool", headers=AUTH).json()
    return [b["in_flight"] for b in pool["backends"]]


def rss_kib(proxy: Server) -> int:
    for line in Path(f"/proc/{proxy.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_body_over_the_limit_is_413_whether_declared_or_streamed(proxy: Server) -> None:
    huge = b'{"model":"' + b"x" * (LIMIT + 10) + b'"}'
    assert_openai_error(post(proxy, huge), 413)
    chunked = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=iter([huge[i : i + 65536] for i in range(0, len(huge), 65536)]),
        headers=AUTH,
        timeout=30,
    )
    assert_openai_error(chunked, 413)


def test_body_shorter_than_declared_is_408_after_the_body_timeout(proxy: Server) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        + f"authorization: Bearer {KEY}\r\n".encode()
        + b"content-type: application/json\r\ncontent-length: 500\r\n\r\n"
    )
    reply = raw_exchange(proxy, head + b'{"model": "x", "mess')
    assert reply.startswith(b"HTTP/1.1 408")
    assert b'"request_timeout"' in reply


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b'{"model": "x", "mess',
        b"\xff\xfe\x00garbage",
        b"model=x&messages=y",
        b"[]",
        b"null",
        b'"a string"',
        b'{"model": "m", "messages": [], "max_tokens": 1e999999}',
        b"{" * 50_000,
        b'{"model":"m","messages":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    ],
    ids=lambda c: repr(c[:24]),
)
def test_bodies_that_are_not_a_request_are_400(proxy: Server, content: bytes) -> None:
    assert_openai_error(post(proxy, content), 400)


@pytest.mark.parametrize(
    "body",
    [
        {"model": 5, "messages": []},
        {"model": None, "messages": []},
        {"model": MODEL},
        chat(stream="yes"),
        chat(max_tokens="many"),
        chat(temperature=[1]),
        chat(n={"a": 1}),
        chat(stream_options="on"),
        chat(top_k=1.5),
    ],
)
def test_fields_of_the_wrong_type_or_missing_are_400(proxy: Server, body: object) -> None:
    assert_openai_error(post(proxy, json.dumps(body).encode()), 400)


def test_text_content_type_with_a_json_body_is_served_as_sglang_does(proxy: Server) -> None:
    reply = post(proxy, json.dumps(chat()).encode(), **{"content-type": "text/plain"})
    assert reply.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        b"x-big: " + b"a" * 20_000 + b"\r\n",
        b"".join(b"x-h%d: v\r\n" % i for i in range(80)),
    ],
    ids=["one-huge-header", "too-many-headers"],
)
def test_oversized_or_too_many_headers_are_431_and_the_connection_closes(
    proxy: Server, headers: bytes
) -> None:
    request = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n"
    reply = raw_exchange(proxy, request)
    assert reply.startswith(b"HTTP/1.1 431")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "headers_too_large"


@pytest.mark.parametrize("start", [b"x-big: ", b"x-big"], ids=["endless-value", "endless-name"])
def test_a_header_line_that_never_ends_is_431_as_soon_as_it_passes_the_limit(
    proxy: Server, start: bytes
) -> None:
    chunk = b"a" * 8192
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + start)
        with contextlib.suppress(OSError):
            for _ in range(512):  # 4 MiB, far past the limit, unless answered first
                sock.sendall(chunk)
                if select.select([sock], [], [], 0)[0]:
                    break
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 431")  # not 408 at the header timeout, all buffered


def test_headers_sent_too_slowly_get_408_and_the_connection_closes(proxy: Server) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408")


def test_connections_beyond_the_limit_are_closed_and_the_proxy_serves_on(proxy: Server) -> None:
    sockets = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(80)]
    try:
        closed = 0
        for sock in sockets:
            sock.settimeout(0.2)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass  # still open: within the limit
            except OSError:
                closed += 1
        assert closed >= 80 - 48
    finally:
        for sock in sockets:
            sock.close()
    reply = httpx.get(proxy.url + "/v1/models", headers=AUTH, timeout=10)
    assert reply.status_code == 200


def test_client_that_stops_reading_mid_stream_frees_its_backend_when_it_leaves(
    proxy: Server,
) -> None:
    body = json.dumps(chat(max_tokens=20_000, ignore_eos=True, stream=True)).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        + f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n".encode()
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", proxy.port))
    try:
        sock.sendall(request)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # then read nothing more
        deadline = time.monotonic() + 10
        while in_flight(proxy) != [1] and time.monotonic() < deadline:
            time.sleep(0.05)  # polling another process
        assert in_flight(proxy) == [1]
        assert post(proxy, json.dumps(chat()).encode()).status_code == 200  # others are served
    finally:
        sock.close()
    deadline = time.monotonic() + 10
    while in_flight(proxy) != [0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_flight(proxy) == [0]


def test_memory_stays_bounded_under_a_burst_of_bad_requests(proxy: Server) -> None:
    bad = [b"x" * (LIMIT - 100), b"{" * 100_000, b'{"model": 1}', b"[" * 10_000]
    for content in bad:  # warm up allocator pools first
        post(proxy, content)
    before = rss_kib(proxy)
    with httpx.Client(headers=AUTH, timeout=30) as client:
        for i in range(200):
            client.post(proxy.url + "/v1/chat/completions", content=bad[i % len(bad)])
    growth_mib = (rss_kib(proxy) - before) / 1024
    assert growth_mib < 32, f"proxy grew by {growth_mib:.1f} MiB over 200 bad requests"
    assert in_flight(proxy) == [0]


async def _many_classes(proxy: Server, count: int) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, headers=AUTH, timeout=60) as client:
        limit = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with limit:
                klass = {"x-specroute-class": f"tenant-{i}"}
                reply = await client.post("/v1/chat/completions", json=chat(), headers=klass)
                assert reply.status_code == 200

        await asyncio.gather(*(one(i) for i in range(count)))


def test_client_named_workload_classes_are_capped(proxy: Server) -> None:
    asyncio.run(_many_classes(proxy, 300))
    estimates = httpx.get(proxy.url + "/pool", headers=AUTH).json()["estimates"]
    named = [c for c in estimates["classes"] if c.startswith("tenant-")]
    assert 0 < len(named) <= 256


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b'{"policy": 5}',
        b'{"policy": "nope"}',
        b'{"policy": "round_robin", "options": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
    ],
    ids=["empty", "truncated", "wrong-type", "unknown-policy", "deeply-nested"],
)
def test_bad_admin_bodies_are_400(proxy: Server, content: bytes) -> None:
    reply = httpx.put(
        proxy.url + "/policy", content=content, headers={"authorization": f"Bearer {ADMIN}"}
    )
    assert_openai_error(reply, 400)


def test_metrics_report_the_proxys_own_loop_lag_descriptors_and_memory(proxy: Server) -> None:
    text = httpx.get(proxy.url + "/metrics").text
    for name in (
        'specroute_event_loop_lag_seconds{stat="max"}',
        "specroute_process_open_fds",
        "specroute_process_resident_memory_bytes",
    ):
        assert any(line.startswith(name + " ") for line in text.splitlines()), name


def test_stream_left_unread_is_ended_and_its_backend_freed(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text("[health]\ninterval_s = 0.2\n[limits]\nclient_stall_s = 0.5\n")
    fast = start_emulator(3, "--time-scale", "1000", "--seed", "4")
    args = ["serve", "--config", str(config)]
    with fast as backend, run_server([*args, "--backend", backend.url]) as proxy:
        body = json.dumps(chat(max_tokens=60_000, ignore_eos=True, stream=True)).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", proxy.port))
        try:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            assert sock.recv(64).startswith(b"HTTP/1.1 200")  # then never read again
            deadline = time.monotonic() + 20
            pool = proxy.url + "/pool"
            while time.monotonic() < deadline:  # polling another process
                if httpx.get(pool).json()["backends"][0]["in_flight"] == 0:
                    break
                time.sleep(0.1)
            assert httpx.get(pool).json()["backends"][0]["in_flight"] == 0  # socket still open
            # ended by the proxy (recorded as the client's doing), not finished by the backend
            assert 'status="499"' in httpx.get(proxy.url + "/metrics").text
        finally:
            sock.close()

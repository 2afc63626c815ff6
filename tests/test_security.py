"""Keys on every route that needs one (found by enumerating the app, so a new route cannot slip
through), constant-time comparison, no keys or prompts in logs, backend keys never shown to
clients, and no request a client can steer to a URL of its choosing."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import Server, bound_socket, start_emulator

from specroute.children import spawn, wait_ready_sync
from specroute.config import BackendConfig, Config
from specroute.proxy.app import create_app
from specroute.proxy.auth import Auth
from specroute.proxy.info import scrub_secrets

MODEL = "Qwen/Qwen3.5-122B-A10B"
CLIENT_KEY = "sk-client-4f1d9a"
ADMIN_KEY = "sk-admin-77c2e0"
UPSTREAM_KEY = "sk-upstream-b3a5c8"
PROMPT = "PROMPT-MARKER-91d7 please keep this secret"
# Every route open without a key, each on purpose: a new one fails the enumeration test below
# until it is added here. The dashboard page holds no data (its data route needs a key).
PUBLIC = {("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics"), ("GET", "/dashboard")}
ADMIN = {("PUT", "/policy"), ("PUT", "/plan"), ("PUT", "/pool/backends/{name:str}/state")}


def _concrete(path: str) -> str:
    """A request path for a route pattern (`/openapi/{path:str}` -> `/openapi/x`)."""
    return "/".join("x" if p.startswith("{") else p for p in path.split("/"))


async def _statuses(headers: dict[str, str]) -> dict[tuple[str, str], int]:
    config = Config(
        backends=(BackendConfig(url="http://127.0.0.1:9"),),
        api_keys=(CLIENT_KEY,),
        admin_key=ADMIN_KEY,
    )
    app = create_app(config)
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # ASGI callable
    found = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        for method, path, _ in app.routes():
            reply = await client.request(method, _concrete(path), headers=headers, content=b"{}")
            found[(method, path)] = reply.status_code
    return found


def test_every_route_but_the_listed_public_ones_needs_a_key() -> None:
    app = create_app(Config(backends=(BackendConfig(url="http://127.0.0.1:9"),)))
    routes = app.routes()
    assert {(m, p) for m, p, access in routes if access == "public"} == PUBLIC
    assert {(m, p) for m, p, access in routes if access == "admin"} == ADMIN
    assert {("POST", "/v1/chat/completions"), ("POST", "/generate")} <= {
        (m, p) for m, p, _ in routes
    }
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": CLIENT_KEY}):
        statuses = asyncio.run(_statuses(headers))
        for route, status in statuses.items():
            if route in PUBLIC:
                assert status != 401, route
            else:
                assert status == 401, (route, headers, status)


def test_admin_routes_refuse_client_keys_and_accept_the_admin_key() -> None:
    with_client = asyncio.run(_statuses({"authorization": f"Bearer {CLIENT_KEY}"}))
    with_admin = asyncio.run(_statuses({"authorization": f"Bearer {ADMIN_KEY}"}))
    for route in ADMIN:
        assert with_client[route] == 401
        assert with_admin[route] not in (401, 403)
    for route, status in with_client.items():
        if route not in ADMIN:
            assert status != 401, route


def test_keys_are_compared_in_constant_time_against_every_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    auth = Auth(("k1", "k2", "k3"), admin_key=None)
    auth.check(b"Bearer k1")  # the first key matches: the others are still compared
    assert len(calls) == 3
    for near_miss in (b"Bearer k", b"Bearer k11", b"Bearer K1", b"Bearer  ", b"Basic k1"):
        with pytest.raises(Exception, match="API key"):
            auth.check(near_miss)


def test_backend_keys_in_server_info_are_never_passed_on() -> None:
    info = {"model_path": "m", "api_key": "a", "admin_api_key": "b", "hf_token": "c"}
    assert scrub_secrets(info) == {"model_path": "m"}


@contextlib.contextmanager
def _logged_proxy(tmp: Path, backend: Server) -> Iterator[tuple[Server, Path]]:
    """The proxy at its default log level, its stderr (where it logs) kept in a file."""
    config = tmp / "proxy.toml"
    config.write_text(
        f'api_keys = ["{CLIENT_KEY}"]\nadmin_key = "{ADMIN_KEY}"\n'
        f'[[backends]]\nurl = "{backend.url}"\napi_key = "{UPSTREAM_KEY}"\n'
        "[health]\ninterval_s = 0.2\n"
    )
    log = tmp / "proxy.log"
    with log.open("wb") as sink, bound_socket() as sock:  # the proxy listens on it
        port, fd = sock.getsockname()[1], sock.fileno()
        argv = ["serve", "--config", str(config), "--port", str(port), "--fd", str(fd)]
        process = spawn(
            [sys.executable, "-m", "specroute", *argv],
            stdout=sink,
            stderr=sink,
            env={"PYTHONUNBUFFERED": "1"},
            pass_fds=[fd],
        )
        server = Server(url=f"http://127.0.0.1:{port}", port=port, process=process)
        try:
            wait_ready_sync(server.url + "/ready", process=process, output=log)
            yield server, log
        finally:
            server.stop()


def _traffic(url: str) -> list[httpx.Response]:
    client = {"authorization": f"Bearer {CLIENT_KEY}"}
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    wrong = {"authorization": "Bearer sk-wrong-" + PROMPT[:6]}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
    bad_length = {"model": MODEL, "prompt": PROMPT, "max_tokens": -1}
    posts: list[tuple[str, dict[str, str], dict[str, object] | bytes]] = [
        ("/v1/chat/completions", client, chat),
        ("/v1/chat/completions", client, {**chat, "stream": True}),
        ("/generate", client, {"text": PROMPT}),
        ("/v1/completions", client, bad_length),
        ("/v1/chat/completions", client, b'{"model": "' + PROMPT.encode()),
        ("/v1/chat/completions", wrong, chat),
    ]
    gets = ["/pool", "/server_info", "/model_info", "/v1/models", "/metrics", "/policy"]
    with httpx.Client(base_url=url, timeout=30) as http:
        replies = [http.post(path, headers=headers, **_body(body)) for path, headers, body in posts]
        policy = {"policy": "round_robin"}
        replies += [http.put("/policy", json=policy, headers=h) for h in (client, admin)]
        replies += [http.get(path, headers=client) for path in [*gets, "/openapi/openapi.json"]]
    return replies


def _body(body: dict[str, object] | bytes) -> dict[str, object]:
    return {"content": body} if isinstance(body, bytes) else {"json": body}


def test_keys_and_prompts_stay_out_of_logs_and_backend_keys_out_of_replies(tmp_path: Path) -> None:
    backend_ctx = start_emulator(3, "--time-scale", "50", "--api-key", UPSTREAM_KEY)
    with backend_ctx as backend, _logged_proxy(tmp_path, backend) as (proxy, log):
        replies = _traffic(proxy.url)
    assert replies[0].status_code == 200  # the backend key was sent upstream
    for reply in replies:
        seen = reply.content + b"".join(k + v for k, v in reply.headers.raw)
        assert UPSTREAM_KEY.encode() not in seen, reply.request.url
        assert ADMIN_KEY.encode() not in seen
    text = log.read_text()
    assert "request_finished" in text  # the log was written
    for secret in (CLIENT_KEY, ADMIN_KEY, UPSTREAM_KEY, "PROMPT-MARKER", "sk-wrong"):
        assert secret not in text, secret


class _Canary:
    """A listener on loopback that counts connections: nothing should ever reach it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
    return reply


def test_no_client_input_makes_the_proxy_connect_to_another_address(tmp_path: Path) -> None:
    canary = _Canary()
    elsewhere = f"127.0.0.1:{canary.port}"
    body = (
        b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, '
        b'"base_url": "http://%s", "url": "http://%s/v1", "api_base": "http://%s"}'
    ) % (MODEL.encode(), *(elsewhere.encode(),) * 3)
    target = elsewhere.encode()
    heads = [
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\n" % target,
        b"POST http://%s/v1/chat/completions HTTP/1.1\r\nhost: x\r\n" % target,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-forwarded-host: %s\r\n" % target,
        b"POST //%s/v1/chat/completions HTTP/1.1\r\nhost: x\r\n" % target,
        b"POST /v1/chat/completions/../../%s HTTP/1.1\r\nhost: x\r\n" % target,
    ]
    rest = (
        f"authorization: Bearer {CLIENT_KEY}\r\n".encode()
        + b"content-type: application/json\r\nconnection: close\r\n"
        + b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    backend_ctx = start_emulator(3, "--time-scale", "50", "--api-key", UPSTREAM_KEY)
    try:
        with backend_ctx as backend, _logged_proxy(tmp_path, backend) as (proxy, _):
            for head in heads:
                reply = _raw(proxy.port, head + rest)
                status = int(reply.split(b" ", 2)[1])
                assert status == 200 or 400 <= status < 500, reply[:200]
    finally:
        canary.close()
    assert canary.hits == 0

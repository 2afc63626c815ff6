"""The proxy and scripted SGLang-like backends served inside the test's own event loop, on
loopback sockets: a test drives real HTTP through the proxy and can reach into the running app
(its current policy, its pool) while a request is in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import uvicorn

from specroute.config import load_config
from specroute.proxy import ProxyApp, create_app
from specroute.proxy.protocol import limited_protocol

__all__ = ["ADMIN", "MODEL", "Handler", "Upstream", "event", "proxy", "stream_of", "until"]

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]
Handler = Callable[[bytes, Send], Awaitable[None]]
"""Answers one POST: its body, and the ASGI `send` to answer with."""

MODEL = "scripted/model"
ADMIN = {"authorization": "Bearer admin-key"}


async def until(check: Callable[[], bool], what: str, within_s: float = 10.0) -> None:
    """Poll `check` on this loop until it holds; AssertionError naming `what` past `within_s`."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def event(data: object, eol: bytes = b"\n") -> bytes:
    """One SSE event carrying `data` as JSON, its lines ended by `eol`."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + eol + eol


def stream_of(events: list[bytes]) -> Handler:
    """A handler that streams `events`, one write each."""

    async def handler(_: bytes, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in events:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return handler


class Upstream:
    """A scripted backend: answers the pool's probes as SGLang at depth `steps` does (its
    /server_info with `info` added), and each POST with `handler`; `bodies` holds what it was
    sent."""

    def __init__(
        self, handler: Handler, steps: int = 1, info: dict[str, Any] | None = None
    ) -> None:
        self.handler = handler
        self.bodies: list[bytes] = []
        self.url = ""
        self._info = {
            "/ready": {"status": "ok"},
            "/server_info": {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": steps,
                "max_running_requests": 64,
                "served_model_name": MODEL,
                **(info or {}),
            },
        }

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan off
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "POST":
            self.bodies.append(body)
            await self.handler(body, send)
            return
        known = self._info.get(scope["path"])
        headers = [(b"content-type", b"application/json")]
        answer = b"" if known is None else json.dumps(known).encode()
        status = 200 if known is not None or scope["path"] == "/metrics" else 404
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Upstream]:
        async with _serving(self, lifespan="off") as url:
            self.url = url
            yield self


@contextlib.asynccontextmanager
async def proxy(
    backends: dict[str, Upstream], **overrides: object
) -> AsyncIterator[tuple[str, ProxyApp]]:
    """The proxy in front of `backends` (by name), served as `specroute serve` serves it;
    yields its url and the app once /ready answers 200."""
    config = load_config(
        environ={},
        overrides={
            "backends": [{"name": name, "url": b.url} for name, b in backends.items()],
            "admin_key": "admin-key",
            "health": {"interval_s": 0.1, "success_threshold": 1},
            "retry": {"backoff_s": 0.01},
            **overrides,
        },
    )
    app = create_app(config)
    http = limited_protocol(config.limits, app.state.auth)
    async with _serving(app, lifespan="on", http=http) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            for _ in range(500):  # readiness polled: the pool probes its backends first
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.02)
            else:
                raise TimeoutError("the proxy did not become ready")
        yield url, app


@contextlib.asynccontextmanager
async def _serving(app: Any, **config: Any) -> AsyncIterator[str]:
    """uvicorn serving `app` on a free loopback port in this event loop, until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # A handler still waiting when the test ends (a failed one) is cancelled, not waited for.
    options = {"log_level": "warning", "timeout_graceful_shutdown": 1, **config}
    server = uvicorn.Server(uvicorn.Config(app, **options))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # it failed to start: say why
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()

"""Graceful shutdown: on SIGTERM the proxy stops accepting, lets streams in flight finish for
its grace period, then ends the rest with an error event and `[DONE]`; no stream is cut bare."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
from servers import Server, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
CONFIG = """
[health]
interval_s = 0.2
[limits]
shutdown_grace_s = 2.0
"""


def body(max_tokens: int) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def _stream(client: httpx.AsyncClient, max_tokens: int, started: asyncio.Event) -> bytes:
    """The whole raw stream; `started` is set once its first event has arrived."""
    raw = b""
    async with client.stream("POST", "/v1/chat/completions", json=body(max_tokens)) as reply:
        assert reply.status_code == 200
        async for piece in reply.aiter_raw():
            raw += piece
            started.set()
    return raw


async def _refused(url: str) -> bool:
    """Poll until new connections are refused (the listener closes as shutdown begins)."""
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
        for _ in range(100):
            try:
                await client.get("/health")
            except httpx.ConnectError:
                return True
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)  # polling another process
    return False


async def _sigterm_during_streams(proxy: Server) -> tuple[list[bytes], list[bytes], bool]:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=60.0) as client:
        short_started = [asyncio.Event() for _ in range(3)]
        long_started = [asyncio.Event() for _ in range(3)]
        short = [asyncio.create_task(_stream(client, 60, e)) for e in short_started]
        long = [asyncio.create_task(_stream(client, 4000, e)) for e in long_started]
        for event in (*short_started, *long_started):
            await asyncio.wait_for(event.wait(), timeout=30)
        proxy.process.send_signal(signal.SIGTERM)
        refused = await _refused(proxy.url)
        return list(await asyncio.gather(*short)), list(await asyncio.gather(*long)), refused


def _events(raw: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]


def test_sigterm_lets_streams_finish_then_ends_the_rest_with_an_error_event(
    tmp_path: Path,
) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(CONFIG)
    with start_emulator(3, "--seed", "3") as backend:
        proxy_ctx = run_server(["serve", "--config", str(config), "--backend", backend.url])
        with proxy_ctx as proxy:
            short, long, refused = asyncio.run(_sigterm_during_streams(proxy))
            # uvicorn re-raises the signal once it has shut down: -SIGTERM is a clean end
            assert proxy.process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert refused, "the proxy kept accepting connections after SIGTERM"
    for raw in short:  # finished within the grace period: complete, no error
        events = _events(raw)
        assert events[-1] == b"[DONE]"
        assert not any(b'"error"' in e for e in events)
    for raw in long:  # still running at the end of the grace period: error event, then [DONE]
        *content, error, done = _events(raw)
        assert content
        assert json.loads(error)["error"]["code"] == "shutting_down"
        assert done == b"[DONE]"

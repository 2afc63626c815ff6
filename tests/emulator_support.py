"""Client-side helpers for the emulator tests: read an SSE stream, parse Prometheus text."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from specroute.sse import DONE, SSEDecoder

__all__ = ["metric", "parse_metrics", "stream_events", "wait_for"]


def stream_events(
    client: httpx.Client, path: str, body: dict[str, Any], **kwargs: Any
) -> list[Any]:
    """POST a streaming request; the decoded JSON of every event, "[DONE]" as the string."""
    events: list[Any] = []
    decoder = SSEDecoder()
    with client.stream("POST", path, json=body, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for chunk in response.iter_raw():
            events.extend(
                "[DONE]" if payload == DONE else json.loads(payload)
                for payload in decoder.feed(chunk)
            )
    assert not decoder.close()
    return events


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {'name{labels}': value}, plus summed {'name': total} per name."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        samples[key] = float(value)
        name = key.split("{", 1)[0]
        if name != key:
            samples[name] = samples.get(name, 0.0) + float(value)
    return samples


def metric(client: httpx.Client, name: str) -> float:
    """One metric summed over its series; 0 when the server has not exported it yet."""
    return parse_metrics(client.get("/metrics").text).get(name, 0.0)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until `condition()` holds; fail the test if it never does."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)

"""A pool serving only agents still learns its acceptance per class: Responses and Messages
streams carry no speculative details, so the proxy learns from their usage and the pace of
their text deltas, and lands within 5% of the emulator's true class acceptance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import Server, run_server, start_emulator

from specroute.emulator.profiles import get_profile

MODEL = "Qwen/Qwen3.5-122B-A10B"
FAST = ("--time-scale", "50", "--seed", "11")
CONFIG = """
policy = "static:steps=3"
[health]
interval_s = 0.2
success_threshold = 1
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = Path(tmp_path_factory.mktemp("agents")) / "proxy.toml"
    config.write_text(CONFIG)
    with start_emulator(1, *FAST) as shallow, start_emulator(3, *FAST) as deep:
        args = ["serve", "--config", str(config), "--backend", shallow.url, "--backend", deep.url]
        with run_server(args) as server:
            yield server


def _stream(proxy: Server, api: str, temperature: float) -> None:
    if api == "responses":
        path = "/v1/responses"
        body = {"input": "write some code", "max_output_tokens": 300}
    else:
        path = "/v1/messages"
        body = {"messages": [{"role": "user", "content": "write some code"}], "max_tokens": 300}
    body |= {"model": MODEL, "temperature": temperature, "ignore_eos": True, "stream": True}
    reply = httpx.post(proxy.url + path, json=body, timeout=30)
    assert reply.status_code == 200
    assert reply.headers["x-specroute-steps"] == "3"
    assert "event: " in reply.text


def test_acceptance_per_class_is_learned_from_responses_and_messages(proxy: Server) -> None:
    for _ in range(8):
        for api in ("responses", "messages"):
            _stream(proxy, api, 0.0)
            _stream(proxy, api, 0.8)
    estimates = httpx.get(proxy.url + "/pool").json()["estimates"]
    profile = get_profile("seed-qwen35-122b")
    for klass, emulated in (("greedy", "greedy"), ("sampled", "high")):
        learned = estimates["classes"][f"{MODEL}:{klass}"]
        assert learned["samples"] >= 16
        assert learned["accept_length"]["3"] == pytest.approx(
            profile.expected_tokens(emulated, 3), rel=0.05
        )
    assert estimates["acceptance_sources"] == {"chunks": 32}

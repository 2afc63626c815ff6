"""Depth-aware routing through the real proxy in front of emulated servers at depths 1 and 3:
a switched policy (with options) routes the very next request, and GET /pool and /metrics
show per-class acceptance that matches the emulator's true class acceptance. A request in
flight through a switch keeps the policy it came in under."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import inprocess
import pytest
from inprocess import Send, Upstream, event, stream_of
from servers import Server, run_server, start_emulator

from specroute.emulator.profiles import get_profile
from specroute.policies import Decision, Outcome, PoolView, RouteRequest

MODEL = "Qwen/Qwen3.5-122B-A10B"
ADMIN = {"authorization": "Bearer admin-key"}
FAST = ("--time-scale", "50", "--seed", "5", "--decode-log-interval", "1")
CONFIG = """
policy = "static:steps=1"
admin_key = "admin-key"
[health]
interval_s = 0.2
success_threshold = 1
metrics_interval_s = 0.3
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = Path(tmp_path_factory.mktemp("switch")) / "proxy.toml"
    config.write_text(CONFIG)
    with start_emulator(1, *FAST) as shallow, start_emulator(3, *FAST) as deep:
        args = ["serve", "--config", str(config), "--backend", shallow.url, "--backend", deep.url]
        with run_server(args) as server:
            yield server


def _chat(proxy: Server, temperature: float, tokens: int = 8) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "write some code"}],
        "max_tokens": tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
    }
    reply = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 200
    return reply


def test_a_switched_policy_routes_the_next_request(proxy: Server) -> None:
    assert _chat(proxy, 0.0).headers["x-specroute-steps"] == "1"
    change = {"policy": "static", "options": {"steps": 3}}
    switched = httpx.put(proxy.url + "/policy", json=change, headers=ADMIN)
    assert switched.json() == {"policy": "static", "options": {"steps": 3}, "previous": "static"}
    reply = _chat(proxy, 0.0)
    assert reply.headers["x-specroute-steps"] == "3"
    assert reply.headers["x-specroute-policy"] == "static"
    shown = httpx.get(proxy.url + "/policy").json()
    assert shown["options"] == {"steps": 3}
    assert {"static", "threshold", "throughput", "bandit"} <= set(shown["available"])


def test_bad_policy_options_are_refused_and_the_policy_stays(proxy: Server) -> None:
    before = httpx.get(proxy.url + "/policy").json()
    change = {"policy": "throughput", "options": {"objective": "fastest"}}
    refused = httpx.put(proxy.url + "/policy", json=change, headers=ADMIN)
    assert refused.status_code == 400
    assert "objective" in refused.json()["error"]["message"]
    assert httpx.get(proxy.url + "/policy").json() == before


def test_pool_acceptance_per_class_matches_the_emulator(proxy: Server) -> None:
    httpx.put(proxy.url + "/policy", json={"policy": "static:steps=3"}, headers=ADMIN)
    for _ in range(16):
        _chat(proxy, 0.0, tokens=300)
        _chat(proxy, 0.8, tokens=300)
    estimates = httpx.get(proxy.url + "/pool").json()["estimates"]
    profile = get_profile("seed-qwen35-122b")
    for klass, emulated in (("greedy", "greedy"), ("sampled", "high")):
        learned = estimates["classes"][f"{MODEL}:{klass}"]
        assert learned["samples"] >= 16
        assert learned["accept_length"]["3"] == pytest.approx(
            profile.expected_tokens(emulated, 3), rel=0.05
        )
    assert estimates["acceptance_sources"]["spec_details"] >= 32
    metrics = httpx.get(proxy.url + "/metrics").text
    assert f'specroute_class_accept_alpha{{workload_class="{MODEL}:greedy"}}' in metrics
    assert "specroute_backend_iteration_seconds" in metrics
    assert 'specroute_routed_requests_total{policy="static"' in metrics


def test_throughput_policy_sends_a_lone_request_deep(proxy: Server) -> None:
    httpx.put(proxy.url + "/policy", json={"policy": "throughput"}, headers=ADMIN)
    for temperature in (0.0, 0.8):
        assert _chat(proxy, temperature).headers["x-specroute-steps"] == "3"


class FirstByName:
    """A third-party policy: the candidate first by name; keeps what it chose and observed."""

    name = "first_by_name"

    def __init__(self) -> None:
        self.chosen: list[str] = []
        self.observed: list[tuple[str, int]] = []

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        backend = min(b.name for b in view.backends)
        self.chosen.append(backend)
        return Decision(backend=backend, reason="first by name")

    def observe(self, outcome: Outcome) -> None:
        self.observed.append((outcome.backend, outcome.status))


def test_a_request_in_flight_keeps_its_policy_through_a_switch_and_its_retry() -> None:
    asyncio.run(_switch_while_the_first_backend_holds_the_request())


async def _switch_while_the_first_backend_holds_the_request() -> None:
    arrived, switched = asyncio.Event(), asyncio.Event()

    async def fails_after_the_switch(_: bytes, send: Send) -> None:
        arrived.set()
        await switched.wait()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"error":"engine died"}'})

    chunk = {"id": "r", "choices": [{"index": 0, "delta": {"content": "ok"}}]}
    good = stream_of([event(chunk), b"data: [DONE]\n\n"])
    first = FirstByName()
    body = {"model": inprocess.MODEL, "messages": [], "stream": True}
    async with (
        Upstream(fails_after_the_switch).running() as a,
        Upstream(good).running() as b,
        inprocess.proxy({"a": a, "b": b}) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        app.state.policy = first  # as a policy registered under `specroute.policies` would be
        request = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await arrived.wait()
        change = await client.put("/policy", json={"policy": "round_robin"}, headers=ADMIN)
        assert change.json()["previous"] == "first_by_name"
        switched.set()
        reply = await request
        assert app.state.policy.name == "round_robin"  # the next request gets the new one
    assert reply.status_code == 200
    assert reply.headers["x-specroute-policy"] == "first_by_name"
    assert reply.headers["x-specroute-backend"] == "b"
    assert first.chosen == ["a", "b"]  # the retry was routed by the request's own policy
    assert first.observed == [("a", 500), ("b", 200)]  # which learned both attempts

"""The operator's dashboard: the sampler's ring of pool samples (no sockets), and the routes on a
real proxy in front of an emulated backend: the page, its data, keys, and the policy switch."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from servers import Server, run_server

from specroute.config import load_config
from specroute.proxy.dashboard import Sampler
from specroute.proxy.state import ProxyState

CLIENT = {"authorization": "Bearer client-key"}
ADMIN = {"authorization": "Bearer admin-key"}
CONFIG = """
policy = "least_loaded"
api_keys = ["client-key"]
admin_key = "admin-key"
[health]
interval_s = 0.2
success_threshold = 1
metrics_interval_s = 0.3
"""
INFO = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "max_running_requests": 17}


def _state() -> ProxyState:
    state = ProxyState(
        load_config(environ={}, overrides={"backends": [{"url": "http://127.0.0.1:9"}]})
    )
    state.pool.backends[0].apply_server_info(INFO)
    return state


def _samples(body: bytes) -> list[dict[str, Any]]:
    data = msgspec.json.decode(body)
    assert isinstance(data["samples"], list)
    return data["samples"]


def test_sampler_counts_routed_requests_per_depth_and_relayed_tokens() -> None:
    state = _state()
    sampler = Sampler(state)
    name = state.pool.backends[0].name
    first = sampler.take()
    assert first.depths == {"3": 0}
    assert first.backends[name].tok_s == 0.0
    for _ in range(3):
        state.metrics.decisions.inc(("least_loaded", name))
    state.metrics.tokens.inc((name, "3"), 300)
    second = sampler.take()
    assert second.depths == {"3": 3}
    assert second.backends[name].routed == 3
    assert second.backends[name].tok_s > 0
    assert second.backends[name].limit == 34  # capacity 17, twice over-committed by default
    assert sampler.take().depths == {"3": 0}  # counts are per tick, not cumulative


def test_sampler_measures_acceptance_from_scraped_counter_changes() -> None:
    state = _state()
    sampler = Sampler(state)
    backend = state.pool.backends[0]
    name = backend.name
    backend.metrics.generation_tokens, backend.metrics.verify_calls = 1000.0, 400.0
    backend.metrics.accept_length = 2.0  # the server's own long-run mean
    assert sampler.take().backends[name].accept_length == 2.0
    backend.metrics.generation_tokens, backend.metrics.verify_calls = 1350.0, 500.0
    assert sampler.take().backends[name].accept_length == pytest.approx(3.5)


def test_data_since_returns_only_newer_samples_from_a_bounded_ring() -> None:
    sampler = Sampler(_state(), size=5)
    for _ in range(8):
        sampler.take()
    assert [s["seq"] for s in _samples(sampler.since(0))] == [4, 5, 6, 7, 8]
    assert [s["seq"] for s in _samples(sampler.since(6))] == [7, 8]
    assert _samples(sampler.since(8)) == []
    # A client that saw a previous run of the proxy (a larger seq) gets everything again.
    assert len(_samples(sampler.since(100))) == 5
    data = msgspec.json.decode(sampler.since(8))
    assert (data["seq"], data["size"], data["interval_s"]) == (8, 5, 1.0)
    assert data["rate_s"] == 5.0  # the span each tok/s is averaged over, which the page names


@pytest.fixture(scope="module")
def proxy(emulator: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = Path(tmp_path_factory.mktemp("dashboard")) / "proxy.toml"
    config.write_text(CONFIG)
    with run_server(["serve", "--config", str(config), "--backend", emulator.url]) as server:
        yield server


def test_dashboard_page_needs_no_key_and_loads_nothing_from_elsewhere(proxy: Server) -> None:
    page = httpx.get(proxy.url + "/dashboard", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"  # the charset once
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "connect-src 'self'" in csp
    html = page.text
    assert "<script" in html
    assert "policy-select" in html
    assert "admin-key" in html
    # No stylesheet, script, image or font from another origin.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert not re.search(r"@import|url\(\s*[\"']?(https?:)?//", html)


def test_dashboard_data_needs_a_client_key_and_lists_each_backend(proxy: Server) -> None:
    assert httpx.get(proxy.url + "/dashboard/data", timeout=10).status_code == 401
    reply = httpx.get(proxy.url + "/dashboard/data", headers=CLIENT, timeout=10)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("application/json")
    data = reply.json()
    assert data["interval_s"] > 0
    assert data["samples"]
    latest = data["samples"][-1]
    assert latest["seq"] == data["seq"]
    assert latest["policy"] == "least_loaded"
    [backend] = latest["backends"].values()
    assert backend["steps"] == 3
    assert backend["limit"] > 0
    assert {"healthy", "in_flight", "tok_s", "accept_length", "routed"} <= backend.keys()
    later = httpx.get(
        proxy.url + "/dashboard/data", params={"since": data["seq"]}, headers=CLIENT, timeout=10
    ).json()
    assert all(s["seq"] > data["seq"] for s in later["samples"])


def _latest_policy(proxy: Server, seq: int) -> str:
    """The policy in the first sample taken after `seq` (the sampler ticks once a second)."""
    for _ in range(100):
        reply = httpx.get(
            proxy.url + "/dashboard/data", params={"since": seq}, headers=CLIENT, timeout=10
        )
        samples = reply.json()["samples"]
        if samples:
            return str(samples[-1]["policy"])
        time.sleep(0.1)
    raise AssertionError("no new sample")


def test_only_the_admin_key_switches_the_policy_the_dashboard_shows(proxy: Server) -> None:
    change = {"policy": "round_robin"}
    refused = httpx.put(proxy.url + "/policy", json=change, headers=CLIENT, timeout=10)
    assert refused.status_code == 401
    switched = httpx.put(proxy.url + "/policy", json=change, headers=ADMIN, timeout=10)
    assert switched.status_code == 200
    # Samples after this one were all taken after the switch.
    seq = httpx.get(proxy.url + "/dashboard/data", headers=CLIENT, timeout=10).json()["seq"]
    try:
        assert _latest_policy(proxy, seq) == "round_robin"
    finally:
        httpx.put(proxy.url + "/policy", json={"policy": "least_loaded"}, headers=ADMIN)

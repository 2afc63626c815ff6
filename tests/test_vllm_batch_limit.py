"""A vLLM server launched without a prior: the proxy reads its batch limit from its scrapes
(running requests while others waited, in two reads running) and admits by it from then on;
the rule (`specroute.batch_limit`) ignores an arrival caught between two scheduler steps."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from emulator_support import wait_for
from servers import Server, start_emulator
from structlog.testing import capture_logs
from test_proxy_vllm import API_KEY, MODEL, pool_of, serve

from specroute.batch_limit import BatchLimit
from specroute.config import AdmissionConfig, BackendConfig, BreakerConfig, HealthConfig
from specroute.pool.backend import Backend
from specroute.pool.promtext import BackendMetrics


def _backend(**config: object) -> Backend:
    backend = Backend(
        BackendConfig(url="http://127.0.0.1:1", engine="vllm", **config),  # type: ignore[arg-type]
        health=HealthConfig(), admission=AdmissionConfig(), breaker=BreakerConfig(),
        tuned_capacity={3: 17},
    )  # fmt: skip
    backend.apply_vllm(None)
    return backend


def test_a_limit_needs_requests_waiting_in_two_reads_running_at_one_depth() -> None:
    limits = BatchLimit()
    limits.read(2, 9, 1)  # one arrival between two scheduler steps
    limits.read(2, 10, 0)
    assert limits.at(2) is None
    limits.read(2, 21, 4)
    limits.read(2, 20, 3)  # a slot freed a moment: still a full batch a step later
    assert limits.at(2) == 21
    limits.read(3, 17, 2)  # the first read at a new depth
    assert limits.at(3) is None
    limits.read(3, 16, 2)
    assert (limits.at(2), limits.at(3)) == (21, 17)


def test_a_vllm_backend_without_a_limit_takes_what_its_scrapes_showed_at_its_depth() -> None:
    backend = _backend(steps=2)
    assert (backend.capacity, backend.limit) == (None, None)
    with capture_logs() as logs:
        for running, waiting in ((21, 5), (21, 2), (20, 3)):
            backend.scraped(BackendMetrics(running=running, queued=waiting))
    assert (backend.capacity, backend.limit) == (21, 42)  # overcommit 2
    seen = [e for e in logs if e["event"] == "batch_limit_seen"]  # once, not at every scrape
    assert seen == [{"event": "batch_limit_seen", "log_level": "info", "backend": backend.name,
                     "steps": 2, "limit": 21, "used": 21}]  # fmt: skip
    backend.configured_steps = 3  # restarted deeper: the prior's figure there
    assert backend.capacity == 17
    stated = _backend(steps=2, capacity=30)  # the operator's figure stands
    for _ in range(2):
        stated.scraped(BackendMetrics(running=21, queued=5))
    assert stated.capacity == 30


def test_the_proxy_learns_an_emulated_vllm_servers_limit_under_load(tmp_path: Path) -> None:
    # The emulated seed at K = 2 holds 21 requests (its KV blocks bind before --max-num-seqs).
    # Time runs 5x: the 39 requests past the limit wait through two batches, several scrapes
    # even on a machine whose cores are busy elsewhere (19 past it missed them there, in CI).
    with (
        start_emulator(2, "--engine", "vllm", "--time-scale", "5", ready_path="/health") as server,
        serve(tmp_path, [(server, 'engine = "vllm"\nsteps = 2')]) as proxy,
    ):
        wait_for(lambda: pool_of(proxy)[0]["healthy"])
        assert pool_of(proxy)[0]["capacity"] is None
        with ThreadPoolExecutor(60) as pool:
            replies = list(pool.map(lambda _: _chat(proxy), range(60)))
        assert replies == [200] * 60
        (backend,) = pool_of(proxy)
        assert (backend["capacity"], backend["limit"]) == (21, 42)


def _chat(proxy: Server) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400}
    headers = {"authorization": f"Bearer {API_KEY}"}
    reply = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    return reply.status_code

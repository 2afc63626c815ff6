"""The 503's explanation and routing read one rule: a backend is called available exactly when
routing would offer it, whatever its health, circuit, load, replica share, model or hold."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from specroute.config import AdmissionConfig, BackendConfig, BreakerConfig, Config, HealthConfig
from specroute.pool import Pool, Share, UpstreamClient
from specroute.proxy.unavailable import unavailable

_CIRCUITS = ("closed", "open", "stalled", "stalled_long_ago", "trial_out")
backend_states = st.fixed_dictionaries(
    {
        "reachable": st.booleans(),
        "capacity": st.none() | st.integers(1, 4),
        "leases": st.integers(0, 4),
        "model": st.sampled_from(["m", "other"]),
        "circuit": st.sampled_from(_CIRCUITS),
        "held": st.booleans(),
    }
)


def _pool(states: list[dict[str, object]], replicas: int, rank: int) -> Pool:
    config = Config(
        backends=tuple(
            BackendConfig(url=f"http://127.0.0.1:{10000 + i}", name=f"b{i}")
            for i in range(len(states))
        ),
        health=HealthConfig(success_threshold=1, failure_threshold=1),
        admission=AdmissionConfig(overcommit=1.0),
        breaker=BreakerConfig(failure_threshold=1, open_s=10),
    )
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    pool.index.share = Share(replicas=replicas, rank=rank)
    now = time.monotonic()
    for backend, state in zip(pool.backends, states, strict=True):
        info = {"served_model_name": state["model"], "max_running_requests": state["capacity"]}
        backend.apply_server_info(info)
        backend.on_probe(True)
        pool.index.add(backend)
        for _ in range(int(state["leases"])):  # type: ignore[call-overload]
            pool.lease(backend)
        circuit = state["circuit"]
        if circuit == "open":
            backend.breaker.on_failure(now)
        elif circuit == "stalled":
            backend.breaker.on_stall(now)
        elif circuit in ("stalled_long_ago", "trial_out"):
            backend.breaker.on_stall(now - 60)  # past open_s: its one trial may go
            if circuit == "trial_out":
                backend.breaker.allows(now)
                backend.breaker.on_send()
        if not state["reachable"]:
            backend.on_probe(False)
            pool.index.touch(backend)
        if state["held"]:
            pool.holds.hold(backend.name, "draining")
    return pool


@settings(max_examples=300, deadline=None)
@given(
    states=st.lists(backend_states, min_size=1, max_size=4),
    replicas=st.integers(1, 3),
    rank=st.integers(0, 2),
    model=st.sampled_from([None, "m"]),
)
def test_the_503_calls_a_backend_available_exactly_when_routing_offers_it(
    states: list[dict[str, object]], replicas: int, rank: int, model: str | None
) -> None:
    pool = _pool(states, replicas, min(rank, replicas - 1))
    view = pool.routing_view(model)
    offered = set() if view is None else {b.name for b in view.backends}
    explained = unavailable(pool, model)
    said_available = {b.name for b in pool.backends if f"{b.name}: available" in explained}
    assert said_available == offered, explained


def test_a_backend_with_no_room_in_this_replicas_share_says_so() -> None:
    state = {"reachable": True, "capacity": 4, "leases": 2, "model": "m"}
    pool = _pool([{**state, "circuit": "closed", "held": False}], replicas=2, rank=0)
    assert pool.routing_view("m") is None  # 2 of its 4 slots are this replica's, both taken
    assert unavailable(pool, "m") == (
        "b0: no room left in this proxy's share of it (2 proxy replicas split it)"
    )

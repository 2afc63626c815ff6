"""Built-in policies and the registry: pure functions of the request and the pool view."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specroute.policies import (
    BackendView,
    LeastLoaded,
    PoolView,
    RoundRobin,
    RouteRequest,
    UnknownPolicyError,
    available,
    create,
)

REQUEST = RouteRequest(route="chat", model="m", workload_class="m:greedy", stream=False)


def _backend(
    name: str, in_flight: int = 0, capacity: int | None = 10, queued: int | None = None
) -> BackendView:
    return BackendView(
        name=name,
        url=f"http://{name}",
        model="m",
        steps=1,
        algorithm="EAGLE",
        adaptive=False,
        capacity=capacity,
        limit=None,
        healthy=True,
        in_flight=in_flight,
        queued=queued,
    )


def test_round_robin_takes_each_backend_in_turn() -> None:
    policy = RoundRobin()
    view = PoolView(backends=(_backend("a"), _backend("b"), _backend("c")))
    assert [policy.choose(REQUEST, view).backend for _ in range(6)] == list("abcabc")


def test_least_loaded_prefers_idle_backend() -> None:
    view = PoolView(backends=(_backend("a", 3), _backend("b", 0), _backend("c", 1)))
    assert LeastLoaded().choose(REQUEST, view).backend == "b"


def test_least_loaded_weighs_load_by_capacity() -> None:
    view = PoolView(backends=(_backend("small", 2, capacity=4), _backend("big", 3, capacity=20)))
    decision = LeastLoaded().choose(REQUEST, view)
    assert decision.backend == "big"
    assert decision.reason == "lowest load 0.15 req/slot (3 in flight)"


def test_least_loaded_compares_a_server_whose_limit_is_unknown_on_the_same_scale() -> None:
    # Twins: one has shown its limit (21), the other not yet; the one with fewer requests wins.
    view = PoolView(backends=(_backend("shown", 10, capacity=21), _backend("unknown", 5, None)))
    assert LeastLoaded().choose(REQUEST, view).backend == "unknown"
    view = PoolView(backends=(_backend("shown", 4, capacity=21), _backend("unknown", 5, None)))
    assert LeastLoaded().choose(REQUEST, view).backend == "shown"


def test_least_loaded_counts_the_backends_own_queue() -> None:
    view = PoolView(backends=(_backend("a", 0, queued=5), _backend("b", 1)))
    assert LeastLoaded().choose(REQUEST, view).backend == "b"


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.one_of(st.none(), st.integers(1, 30))),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["round_robin", "least_loaded"]),
    st.integers(1, 20),
)
def test_policies_only_pick_backends_in_the_view(
    loads: list[tuple[int, int | None]], name: str, calls: int
) -> None:
    view = PoolView(
        backends=tuple(_backend(f"b{i}", n, capacity=c) for i, (n, c) in enumerate(loads))
    )
    names = {b.name for b in view.backends}
    policy = create(name)
    for _ in range(calls):
        assert policy.choose(REQUEST, view).backend in names


def test_registry_lists_builtins_and_rejects_unknown_names() -> None:
    assert {"round_robin", "least_loaded"} <= set(available())
    with pytest.raises(UnknownPolicyError, match="least_loaded"):
        create("nope")

"""Decisions that scale with configurations, not servers: the grouped index stays in load order
as counts change, and every built-in policy choosing from the groups picks what a scan of
every backend would (the same load, gain, score), never a backend the pool rules out."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from specroute.policies import (
    BackendView,
    Candidates,
    ClassEstimate,
    Groups,
    LazyBackends,
    PoolView,
    RouteRequest,
    create,
)
from specroute.policies.groups import level
from specroute.policies.predict import has_room, loads, predict

GREEDY = RouteRequest(route="chat", model="m", workload_class="m:greedy", stream=True)
SAMPLED = RouteRequest(route="chat", model="m", workload_class="m:sampled", stream=True)
CLASSES = {
    "m:greedy": ClassEstimate(alpha=0.95, samples=50, mean_tokens=300),
    "m:sampled": ClassEstimate(alpha=0.45, samples=50, mean_tokens=300),
}
CONFIGS: list[tuple[int, int | None]] = [(1, 26), (2, 21), (3, 17), (3, 30), (2, None)]
"""(depth, capacity): two groups at depth 3; a k2 server that has not said its limit."""


def _backend(name: str, config: int, in_flight: int, queued: int | None = None) -> BackendView:
    steps, capacity = CONFIGS[config]
    return BackendView(
        name=name, url=f"http://{name}", model="m", steps=steps, algorithm="EAGLE",
        adaptive=False, capacity=capacity, limit=None if capacity is None else 2 * capacity,
        healthy=True, in_flight=in_flight, queued=queued, iteration_intercept_s=0.02,
        iteration_per_token_s=0.0003,
    )  # fmt: skip


def _load(backend: BackendView, among: list[BackendView]) -> float:
    """`backend`'s load on the scale of `among` (`loads`)."""
    return loads(among)[[b.name for b in among].index(backend.name)]


def _view(backends: list[BackendView], candidates: Candidates | None = None) -> PoolView:
    return PoolView(
        backends=tuple(backends) if candidates is None else LazyBackends(candidates),
        classes=CLASSES,
        in_flight_total=sum(b.in_flight for b in backends),
        capacity_total=sum(b.capacity or 0 for b in backends),
        candidates=candidates,
    )


_ops = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 1), st.integers(0, 40), st.integers(0, 3)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_groups_keep_members_in_load_order_as_counts_change(
    ops: list[tuple[int, int, int, int]],
) -> None:
    groups = Groups()
    current: dict[str, tuple[int, BackendView]] = {}
    for index, config, in_flight, keep in ops:
        name = f"b{index}"
        if keep:  # three puts (new counts) for one removal
            view = _backend(name, config, in_flight, queued=in_flight % 3)
            groups.put(view, index)
            current[name] = (index, view)
        else:
            groups.remove(name)
            current.pop(name, None)
        by_key: dict[tuple[int, bool, int | None], list[tuple[int, int, str]]] = {}
        for position, view in current.values():
            key = (view.steps or 0, view.adaptive, view.capacity)
            by_key.setdefault(key, []).append((level(view), position, view.name))
        assert {g.key: [b.name for b in g.members()] for g in groups.groups()} == {
            key: [name for _, _, name in sorted(members)] for key, members in by_key.items()
        }
        assert [b.name for b in groups.ordered()] == [
            v.name for _, v in sorted(current.values(), key=lambda pv: pv[0])
        ]
        assert groups.batch_total == sum(v.in_flight for _, v in current.values())
        assert groups.capacity_total == sum(v.capacity or 0 for _, v in current.values())


_pools = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 40)), min_size=1, max_size=12).map(
    lambda rows: [_backend(f"b{i}", c, n) for i, (c, n) in enumerate(rows)]
)


@settings(max_examples=80, deadline=None)
@given(backends=_pools, greedy=st.booleans())
def test_grouped_decisions_match_a_scan_of_every_backend(
    backends: list[BackendView], greedy: bool
) -> None:
    request = GREEDY if greedy else SAMPLED
    grouped = _view(backends, Candidates(Groups.of(backends)))
    by_name = {b.name: b for b in backends}
    room = [b for b in backends if has_room(b)] or backends

    chosen = by_name[create("least_loaded").choose(request, grouped).backend]
    assert _load(chosen, backends) == min(loads(backends))

    for objective in ("throughput", "latency"):
        policy = create(f"throughput:objective={objective}")
        chosen = by_name[policy.choose(request, grouped).backend]
        field = "gain" if objective == "throughput" else "effective_speed"
        scores = [getattr(predict(request.workload_class, b, grouped), field) for b in room]
        got = getattr(predict(request.workload_class, chosen, grouped), field)
        assert got >= max(scores) - 1e-9 * abs(max(scores))
        assert has_room(chosen) or not any(has_room(b) for b in backends)

    chosen = by_name[create("static:steps=3").choose(request, grouped).backend]
    depth = min({b.steps or 0 for b in room}, key=lambda k: (abs(k - 3), -k))
    assert chosen.steps == depth
    at_depth = [b for b in room if b.steps == depth]
    assert _load(chosen, at_depth) == min(loads(at_depth))

    threshold = create("threshold:table=0.3:3 inf:1")
    chosen = by_name[threshold.choose(request, grouped).backend]
    capacity = sum(b.capacity or 0 for b in backends)
    wanted = 3 if capacity and (sum(b.in_flight for b in backends) + 1) / capacity <= 0.3 else 1
    scores = [
        x + 0.1 * abs((b.steps or 0) - wanted) for b, x in zip(room, loads(room), strict=True)
    ]
    mine = _load(chosen, room) + 0.1 * abs((chosen.steps or 0) - wanted)
    assert mine <= min(scores) + 1e-12


@settings(max_examples=60, deadline=None)
@given(
    backends=_pools,
    barred=st.sets(st.integers(0, 11)),
    name=st.sampled_from(
        ["round_robin", "least_loaded", "static", "threshold", "throughput", "bandit"]
    ),
)
def test_no_policy_picks_a_member_the_pool_rules_out(
    backends: list[BackendView], barred: set[int], name: str
) -> None:
    allowed = {b.name for i, b in enumerate(backends) if i not in barred}
    if not allowed:
        return
    candidates = Candidates(Groups.of(backends), usable=lambda b: b.name in allowed)
    policy = create(name)
    for request in (GREEDY, SAMPLED, GREEDY):
        assert policy.choose(request, _view(backends, candidates)).backend in allowed


def test_round_robin_takes_every_usable_backend_in_turn_across_groups() -> None:
    backends = [_backend(f"b{i}", i % 4, 0) for i in range(6)]
    candidates = Candidates(Groups.of(backends), usable=lambda b: b.name != "b2")
    policy = create("round_robin")
    picks = [policy.choose(GREEDY, _view(backends, candidates)).backend for _ in range(6)]
    assert picks == ["b0", "b1", "b3", "b4", "b5", "b0"]


def test_a_view_lists_its_usable_backends_only_when_asked() -> None:
    backends = [_backend(f"b{i}", i % 4, i) for i in range(5)]
    asked: list[str] = []

    def usable(b: BackendView) -> bool:
        asked.append(b.name)
        return b.name != "b1"

    lazy = LazyBackends(Candidates(Groups.of(backends), usable=usable))
    assert asked == []
    assert [b.name for b in lazy] == ["b0", "b2", "b3", "b4"]
    assert len(lazy) == 4
    assert lazy[0].name == "b0"


def test_a_group_member_whose_count_changes_moves_within_its_group() -> None:
    a, b = _backend("a", 0, 3), _backend("b", 0, 5)
    groups = Groups.of([a, b])
    (group,) = groups.groups()
    assert group.best().name == "a"  # type: ignore[union-attr]
    groups.put(msgspec.structs.replace(a, in_flight=9), 0)
    assert [m.name for m in group.members()] == ["b", "a"]
    assert groups.batch_total == 14

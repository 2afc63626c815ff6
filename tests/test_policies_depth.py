"""Depth-aware policies (static, threshold, throughput, bandit) on hand-built pool views, their
options, and the invariant that none picks an unusable or full backend while another has room."""

from __future__ import annotations

import re
import subprocess
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specroute.policies import (
    BackendView,
    Bandit,
    BanditOptions,
    ClassEstimate,
    Outcome,
    PoolView,
    RouteRequest,
    Static,
    StaticOptions,
    Threshold,
    ThresholdOptions,
    Throughput,
    ThroughputOptions,
    UnknownPolicyError,
    available,
    create,
    parse_spec,
)
from specroute.policies.predict import predict
from specroute.speculation import expected_tokens

GREEDY = RouteRequest(route="chat", model="m", workload_class="m:greedy", stream=True)
SAMPLED = RouteRequest(route="chat", model="m", workload_class="m:sampled", stream=True)
CLASSES = {
    "m:greedy": ClassEstimate(alpha=0.95, samples=50, mean_tokens=300),
    "m:sampled": ClassEstimate(alpha=0.45, samples=50, mean_tokens=300),
}


def _backend(name: str, steps: int, in_flight: int = 0, capacity: int = 20) -> BackendView:
    return BackendView(
        name=name, url=f"http://{name}", model="m", steps=steps, algorithm="EAGLE",
        adaptive=False, capacity=capacity, limit=2 * capacity, healthy=True,
        in_flight=in_flight, iteration_intercept_s=0.02, iteration_per_token_s=0.0003,
    )  # fmt: skip


def _view(*backends: BackendView) -> PoolView:
    return PoolView(
        backends=backends,
        classes=CLASSES,
        in_flight_total=sum(b.in_flight for b in backends),
        capacity_total=sum(b.capacity or 0 for b in backends),
    )


def test_static_pins_one_depth_and_spills_to_the_nearest_when_it_is_full() -> None:
    policy = Static(StaticOptions(steps=3))
    view = _view(_backend("k1", 1), _backend("k2", 2), _backend("k3", 3))
    assert policy.choose(GREEDY, view).backend == "k3"
    full = _view(_backend("k1", 1), _backend("k2", 2), _backend("k3", 3, in_flight=20))
    decision = policy.choose(GREEDY, full)
    assert decision.backend == "k2"
    assert "no room" in decision.reason


def test_threshold_prefers_deep_when_quiet_and_shallow_when_busy() -> None:
    policy = Threshold(ThresholdOptions(table="0.25:3 0.6:2 inf:1", spread=0.1))
    quiet = _view(_backend("k1", 1), _backend("k2", 2), _backend("k3", 3))
    assert policy.choose(GREEDY, quiet).backend == "k3"
    busy = _view(_backend("k1", 1, 14), _backend("k2", 2, 14), _backend("k3", 3, 14))
    decision = policy.choose(GREEDY, busy)
    assert decision.backend == "k1"
    assert re.match(r"pool load \d\.\d\d req/slot -> depth 1;", decision.reason)


def test_threshold_spreads_instead_of_piling_onto_the_preferred_depth() -> None:
    policy = Threshold(ThresholdOptions(table="inf:3", spread=0.1))
    view = _view(_backend("k2", 2, 2), _backend("k3", 3, 8))
    assert policy.choose(GREEDY, view).backend == "k2"  # 0.15 + 0.1 < 0.45


def test_threshold_weighs_a_server_whose_limit_is_unknown_like_its_neighbours() -> None:
    # k2 has not said its limit: its 2 requests count against the 20 slots k3 has, not as 2.0.
    policy = Threshold(ThresholdOptions(table="inf:3", spread=0.1))
    unknown = msgspec.structs.replace(_backend("k2", 2, 2), capacity=None, limit=None)
    view = _view(unknown, _backend("k3", 3, 8))
    assert policy.choose(GREEDY, view).backend == "k2"  # 0.1 + 0.1 < 0.4


def test_threshold_never_queues_behind_a_full_server_while_another_has_room() -> None:
    # The preferred depth 0 is full (1 of 1); depth 7 has room but is 7 steps away: its score
    # (0 + 0.5 x 7) is worse than the full one's (1 + 0), and still it must take the request.
    policy = Threshold(ThresholdOptions(table="inf:0", spread=0.5))
    view = _view(_backend("k0", 0, in_flight=1, capacity=1), _backend("k7", 7, capacity=1))
    assert policy.choose(SAMPLED, view).backend == "k7"
    every_one_full = _view(_backend("k0", 0, 1, 1), _backend("k7", 7, 1, 1))
    assert policy.choose(SAMPLED, every_one_full).backend == "k0"  # then the preference holds


def test_throughput_sends_everything_deep_on_an_idle_pool() -> None:
    view = _view(_backend("k1", 1), _backend("k3", 3))
    for objective in ("latency", "throughput", "goodput"):
        policy = Throughput(ThroughputOptions(objective=objective))  # type: ignore[arg-type]
        assert policy.choose(GREEDY, view).backend == "k3"
        assert policy.choose(SAMPLED, _view(_backend("k1", 1), _backend("k3", 3))).backend == "k3"


def test_a_server_that_did_not_say_its_limit_is_full_while_its_engine_queues() -> None:
    # Two vLLM servers that have not shown their --max-num-seqs yet. The deep one would win an
    # idle pool's request, but its gauges say 8 running and 3 waiting: it is full, and the
    # request goes where it runs at once. Once its queue is gone it has room again.
    def vllm(name: str, steps: int, running: int, queued: int) -> BackendView:
        return msgspec.structs.replace(
            _backend(name, steps), capacity=None, limit=None, running=running, queued=queued
        )

    queuing = vllm("k3", 3, running=8, queued=3)
    view = _view(vllm("k1", 1, running=2, queued=0), queuing)
    for objective in ("latency", "throughput", "goodput"):
        policy = Throughput(ThroughputOptions(objective=objective))  # type: ignore[arg-type]
        assert policy.choose(GREEDY, view).backend == "k1"
    prediction = predict("m:greedy", queuing, view)
    assert prediction.full
    assert prediction.wait_s > 0
    drained = _view(vllm("k1", 1, running=2, queued=0), vllm("k3", 3, running=8, queued=0))
    assert Throughput().choose(GREEDY, drained).backend == "k3"
    assert not predict("m:greedy", vllm("k3", 3, running=8, queued=0), drained).full


def test_throughput_splits_classes_by_depth_under_load() -> None:
    view = _view(_backend("k1", 1, 15), _backend("k3", 3, 15))
    assert Throughput().choose(GREEDY, view).backend == "k3"
    assert Throughput().choose(SAMPLED, view).backend == "k1"


def test_throughput_reason_shows_the_numbers_it_compared() -> None:
    decision = Throughput().choose(GREEDY, _view(_backend("k1", 1), _backend("k3", 3)))
    assert "k1(k=1)" in decision.reason
    assert "k3(k=3)" in decision.reason
    # Each number carries its unit: this request's speed and the pool's gain, in tok/s.
    assert re.search(r"k1\(k=1\) v=\d+ tok/s gain=[+-]\d+ tok/s", decision.reason)
    assert re.search(r"k3\(k=3\) v=\d+ tok/s gain=[+-]\d+ tok/s", decision.reason)


def test_throughput_counts_queue_wait_past_capacity_and_prefers_room() -> None:
    full = _backend("k3", 3, in_flight=20, capacity=20)
    prediction = predict("m:greedy", full, _view(full))
    assert prediction.full
    assert prediction.wait_s > 0
    assert prediction.effective_speed < prediction.speed
    for objective in ("latency", "throughput"):
        policy = Throughput(ThroughputOptions(objective=objective))  # type: ignore[arg-type]
        assert policy.choose(GREEDY, _view(_backend("k1", 1, 19), full)).backend == "k1"
    shorter = _backend("k1", 1, in_flight=30, capacity=20)
    assert Throughput().choose(GREEDY, _view(shorter, full)).backend == "k3"


def test_goodput_keeps_every_running_request_above_the_floor() -> None:
    slow_deep = msgspec.structs.replace(_backend("k3", 3), iteration_intercept_s=0.05)
    view = _view(_backend("k1", 1, 10), slow_deep)
    k1, k3 = (predict("m:greedy", b, view) for b in view.backends)
    assert k3.gain > k1.gain
    assert k3.slowest_after < k1.slowest_after
    assert Throughput().choose(GREEDY, view).backend == "k3"
    floor = (k1.slowest_after + k3.slowest_after) / 2
    goodput = Throughput(ThroughputOptions(objective="goodput", floor_tok_s=floor))
    assert goodput.choose(GREEDY, view).backend == "k1"


def test_unknown_classes_use_the_pool_prior() -> None:
    view = msgspec.structs.replace(_view(_backend("k3", 3)), classes={}, prior_alpha=0.5)
    assert predict("new", view.backends[0], view).speed == pytest.approx(
        expected_tokens(0.5, 3) / (0.02 + 0.0003 * 4)
    )


def _reward(policy: Bandit, backend: BackendView, klass: str, tok_s: float) -> None:
    policy.observe(
        Outcome(
            backend=backend.name, steps=backend.steps, workload_class=klass, status=200,
            stream=True, completion_tokens=int(tok_s), duration_s=1.0,
        )
    )  # fmt: skip


@pytest.mark.parametrize("method", ["ucb", "thompson"])
def test_bandit_learns_which_depth_pays_for_each_class(method: str) -> None:
    policy = Bandit(BanditOptions(method=method, seed=1))  # type: ignore[arg-type]
    k1, k3 = _backend("k1", 1), _backend("k3", 3)
    view = _view(k1, k3)
    pays = {("m:greedy", "k1"): 100, ("m:greedy", "k3"): 200, ("m:sampled", "k1"): 100}
    picks: dict[str, list[str]] = {"m:greedy": [], "m:sampled": []}
    for _ in range(300):
        for request in (GREEDY, SAMPLED):
            chosen = policy.choose(request, view).backend
            picks[request.workload_class].append(chosen)
            reward = pays.get((request.workload_class, chosen), 60)
            _reward(policy, k1 if chosen == "k1" else k3, request.workload_class, reward)
    assert picks["m:greedy"][-100:].count("k3") >= 85
    assert picks["m:sampled"][-100:].count("k1") >= 85


def test_bandit_explores_every_depth_first_and_says_so() -> None:
    policy = Bandit(BanditOptions(seed=0))
    view = _view(_backend("k1", 1), _backend("k2", 2), _backend("k3", 3))
    seen = set()
    for _ in range(3):
        decision = policy.choose(GREEDY, view)
        seen.add(decision.backend)
        _reward(
            policy, next(b for b in view.backends if b.name == decision.backend), "m:greedy", 50
        )
        assert "bandit" in decision.reason
    assert seen == {"k1", "k2", "k3"}


def test_policies_take_options_from_specs_and_mappings() -> None:
    assert parse_spec("throughput:objective=goodput, floor_tok_s=40") == (
        "throughput",
        {"objective": "goodput", "floor_tok_s": "40"},
    )
    policy = create("throughput:objective=goodput,floor_tok_s=40")
    assert isinstance(policy, Throughput)
    assert policy.options == ThroughputOptions(objective="goodput", floor_tok_s=40.0)
    policy = create("throughput", {"objective": "latency"})
    assert isinstance(policy, Throughput)
    assert policy.options.objective == "latency"
    threshold = create("threshold:table=0.5:3 inf:1")
    assert isinstance(threshold, Threshold)
    assert threshold.table == ((0.5, 3), (float("inf"), 1))


@pytest.mark.parametrize(
    "spec",
    ["throughput:objective=fastest", "throughput:nope=1", "least_loaded:x=1", "bandit:discount=2"],
)
def test_bad_policy_options_are_rejected_with_the_policy_named(spec: str) -> None:
    with pytest.raises(UnknownPolicyError, match=spec.split(":")[0]):
        create(spec)


def test_a_misspelt_policy_option_names_the_option_meant() -> None:
    with pytest.raises(UnknownPolicyError, match=r"`objectve`; did you mean objective\?"):
        create("throughput:objectve=goodput")
    with pytest.raises(UnknownPolicyError, match=r"`specroute policies` lists bandit's options"):
        create("bandit:zzqq=1")


def test_policies_command_lists_every_policy_with_its_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "specroute", "policies"], capture_output=True, text=True, check=True
    ).stdout
    for name in ("round_robin", "least_loaded", "static", "threshold", "throughput", "bandit"):
        assert name in out
    for option in ("objective", "floor_tok_s", "table"):
        assert f"\n        {option} " in out  # each option on its own line, with its default


@st.composite
def _pools(draw: st.DrawFn) -> list[BackendView]:
    count = draw(st.integers(1, 5))
    backends = []
    for i in range(count):
        capacity = draw(st.integers(1, 30))
        backend = _backend(f"b{i}", draw(st.integers(0, 4)), capacity=capacity)
        backends.append(
            msgspec.structs.replace(
                backend,
                healthy=draw(st.booleans()),
                in_flight=draw(st.integers(0, 2 * capacity)),
            )
        )
    return backends


@settings(max_examples=60, deadline=None)
@given(
    pools=st.lists(_pools(), min_size=1, max_size=8),
    name=st.sampled_from(
        [
            "least_loaded",
            "static",
            "threshold",
            "throughput",
            "bandit",
            "throughput:objective=latency",
            "throughput:objective=goodput,floor_tok_s=50",
        ]
    ),
    greedy=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_no_policy_picks_an_unusable_or_full_backend_while_another_has_room(
    pools: list[list[BackendView]], name: str, greedy: list[bool]
) -> None:
    policy = create(name)
    for backends, is_greedy in zip(pools, greedy, strict=False):
        # What the pool offers: healthy backends below their in-flight limit.
        usable = tuple(b for b in backends if b.healthy and b.in_flight < (b.limit or 1 << 30))
        if not usable:
            continue
        request = GREEDY if is_greedy else SAMPLED
        decision = policy.choose(request, _view(*usable))
        chosen = next(b for b in usable if b.name == decision.backend)
        if any(b.in_flight < (b.capacity or 1 << 30) for b in usable):
            assert chosen.in_flight < (chosen.capacity or 1 << 30)
        policy.observe(
            Outcome(
                backend=chosen.name, steps=chosen.steps, workload_class=request.workload_class,
                status=200, stream=True, completion_tokens=100, duration_s=1.0,
            )
        )  # fmt: skip


def test_every_builtin_is_listed() -> None:
    assert {"static", "threshold", "throughput", "bandit"} <= set(available())

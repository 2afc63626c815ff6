"""Latency lanes without a socket: which lane a request is in (its key, `service_tier`, a
trusted header), where `throughput` sends each lane, and the reserve on the deepest servers
that batch requests borrow only while no interactive request waits."""

from __future__ import annotations

import msgspec
import pytest
from test_policies_depth import GREEDY, SAMPLED, _backend, _view

from specroute.config import load_config
from specroute.errors import ConfigError
from specroute.lanes import LanesConfig, lane_of
from specroute.policies import Outcome, PoolView, RouteRequest, Throughput
from specroute.proxy.auth import Auth
from specroute.proxy.lane_stats import RECENT, LaneStats
from specroute.proxy.lanes import LaneResolver, decode_speed, with_priority
from specroute.proxy.metrics import ProxyMetrics
from specroute.wire import LaneSnapshot

FAST, SLOW, TRUSTED = b"Bearer sk-fast", b"Bearer sk-slow", b"Bearer sk-trusted"
LANES = LanesConfig(interactive_keys=("sk-fast",), batch_keys=("sk-slow",))


def _resolver(lanes: LanesConfig = LANES) -> LaneResolver:
    keys = ("sk-fast", "sk-slow", "sk-trusted", "sk-other")
    return LaneResolver(lanes, Auth(keys, "admin", class_keys=("sk-trusted",)))


def _interactive(request: RouteRequest) -> RouteRequest:
    return msgspec.structs.replace(request, lane="interactive", target_tok_s=50.0)


@pytest.mark.parametrize(
    ("tier", "lane"),
    [("priority", "interactive"), ("flex", "batch"), ("auto", "batch"), (None, "batch")],
)
def test_service_tier_names_the_lane(tier: str | None, lane: str) -> None:
    assert _resolver().resolve(b"Bearer sk-other", None, tier) == lane


def test_without_a_lanes_section_only_a_request_naming_its_lane_leaves_batch() -> None:
    """docs/operators.md: with no `[lanes]` the proxy still reads `service_tier`."""
    unconfigured = load_config(environ={}).lanes
    assert _resolver(unconfigured).resolve(None, None, None) == "batch"
    assert _resolver(unconfigured).resolve(None, None, "priority") == "interactive"
    assert _resolver(unconfigured).resolve(None, None, "default") == "batch"


def test_auto_and_default_tiers_follow_the_config() -> None:
    lanes = LanesConfig(tier_default="interactive", default="batch")
    for tier in ("auto", "default"):
        assert lane_of(lanes, header=None, trusted=False, key_lane=None, tier=tier) == (
            "interactive"
        )
    assert lane_of(lanes, header=None, trusted=False, key_lane=None, tier="other") == "batch"
    assert lane_of(LanesConfig(default="interactive"), header=None, trusted=False,
                   key_lane=None, tier=None) == "interactive"  # fmt: skip


def test_a_keys_lane_wins_over_its_service_tier() -> None:
    resolver = _resolver()
    assert resolver.resolve(FAST, None, None) == "interactive"
    assert resolver.resolve(SLOW, None, "priority") == "batch"  # a batch key cannot jump
    assert resolver.resolve(FAST, None, "flex") == "interactive"


def test_only_a_trusted_key_names_its_lane_by_header() -> None:
    resolver = _resolver()
    assert resolver.resolve(TRUSTED, b"interactive", None) == "interactive"
    assert resolver.resolve(b"Bearer admin", b"Interactive", "flex") == "interactive"
    assert resolver.resolve(TRUSTED, b"batch", "priority") == "batch"
    assert resolver.resolve(SLOW, b"interactive", None) == "batch"  # not trusted: ignored
    assert resolver.resolve(b"Bearer sk-other", b"interactive", None) == "batch"
    assert resolver.resolve(TRUSTED, b"urgent", "priority") == "interactive"  # unknown name


def test_lane_keys_must_be_api_keys_and_in_one_lane() -> None:
    with pytest.raises(ConfigError, match=r"lanes\.interactive_keys"):
        load_config(environ={}, overrides={"lanes": {"interactive_keys": ["nope"]}})
    with pytest.raises(ConfigError, match="both"):
        load_config(
            environ={},
            overrides={
                "api_keys": ["a"],
                "lanes": {"interactive_keys": ["a"], "batch_keys": ["a"]},
            },
        )
    tpot = load_config(environ={}, overrides={"lanes": {"target_tpot_ms": 8}})
    assert tpot.lanes.target == pytest.approx(125.0)


def test_engine_priority_is_set_in_the_forwarded_body() -> None:
    assert with_priority(b'{"model":"m"} ', msgspec.UNSET, 1) == b'{"model":"m","priority":1}'
    assert with_priority(b"{}", msgspec.UNSET, 0) == b'{"priority":0}'
    replaced = msgspec.json.decode(with_priority(b'{"priority":9,"a":1}', 9, 0))
    assert replaced == {"priority": 0, "a": 1}  # the lane decides, not the client
    assert with_priority(b'{"priority":1}', 1, 1) == b'{"priority":1}'


def test_decode_speed_times_the_tokens_after_the_first() -> None:
    assert decode_speed(11, 0.5, 1.5) == pytest.approx(10.0)
    assert decode_speed(1, 0.5, 1.5) is None
    assert decode_speed(10, None, 1.5) is None


def test_lane_stats_count_the_target_met_and_missed_and_the_longest_wait() -> None:
    metrics = ProxyMetrics()
    stats = LaneStats(metrics.registry, target_tok_s=100.0)
    stats.observe("interactive", 0.0, 150.0)
    stats.observe("interactive", 0.5, 80.0)
    stats.observe("interactive", 0.1, None)  # too short to time
    stats.observe("batch", 2.0, 40.0)  # batch has no speed target
    report = stats.report({"interactive": 2})
    assert report["interactive"] == LaneSnapshot(
        requests=3, waiting=2, target_tok_s=100.0, met=1, missed=1, attainment=0.5,
        mean_tok_s=115.0, tok_s_p50=115.0, tok_s_p90=pytest.approx(143.0),
        tok_s_p99=pytest.approx(149.3), mean_wait_s=pytest.approx(0.2), wait_p50_s=0.1,
        wait_p99_s=pytest.approx(0.492), max_wait_s=0.5,
    )  # fmt: skip
    assert report["batch"].attainment == 1.0
    text = metrics.render().decode()
    assert 'specroute_lane_requests_total{lane="interactive",target="missed"} 1.0' in text
    assert 'specroute_lane_requests_total{lane="interactive",target="unmeasured"} 1.0' in text
    assert 'specroute_lane_target_attainment_ratio{lane="interactive"} 0.5' in text
    speed = 'specroute_lane_recent_tokens_per_second{lane="interactive",quantile="0.5"}'
    assert f"{speed} 115.0" in text
    assert 'specroute_lane_recent_queue_wait_seconds{lane="batch",quantile="0.99"} 2.0' in text


def test_lane_stats_percentiles_follow_the_recent_requests_only() -> None:
    stats = LaneStats(ProxyMetrics().registry, target_tok_s=100.0)
    for _ in range(RECENT):
        stats.observe("interactive", 5.0, 10.0)
    for _ in range(RECENT):
        stats.observe("interactive", 0.0, 200.0)
    lane = stats.snapshot("interactive")
    assert (lane.tok_s_p50, lane.tok_s_p99, lane.wait_p99_s) == (200.0, 200.0, 0.0)
    assert lane.attainment == 0.5  # since start
    assert lane.max_wait_s == 5.0


def test_lane_load_counts_requests_in_flight_by_class_until_they_leave() -> None:
    metrics = ProxyMetrics()
    stats = LaneStats(metrics.registry, target_tok_s=0.0)
    stats.arrive("interactive", "m:greedy")
    stats.arrive("interactive", "m:greedy")
    stats.arrive("interactive", "m:chat")
    stats.arrive("batch", "m:sampled")
    stats.leave("interactive", "m:greedy")
    assert stats.snapshot("interactive").in_flight == 2
    assert stats.snapshot("interactive").classes == {"m:greedy": 1, "m:chat": 1}
    assert 'specroute_lane_in_flight_requests{lane="batch"} 1.0' in metrics.render().decode()
    stats.leave("batch", "m:sampled")
    stats.leave("interactive", "m:greedy")
    stats.leave("interactive", "m:chat")
    assert [stats.snapshot(lane).in_flight for lane in ("interactive", "batch")] == [0, 0]
    assert stats.snapshot("interactive").classes == {}


def test_interactive_goes_deep_where_batch_goes_for_throughput() -> None:
    view = _view(_backend("k1", 1, 5), _backend("k3", 3, 5))
    assert Throughput().choose(SAMPLED, view).backend == "k1"  # the larger gain
    decision = Throughput().choose(_interactive(SAMPLED), view)
    assert decision.backend == "k3"  # the faster for this request
    assert decision.reason.startswith("interactive >= 50 tok/s -> k3")


def test_interactive_takes_a_shallow_server_with_room_over_a_full_deep_one() -> None:
    view = _view(_backend("k1", 1, 10), _backend("k3", 3, 20))
    assert Throughput().choose(_interactive(GREEDY), view).backend == "k1"


def _reserved_view(waiting: int = 0) -> PoolView:
    """k3 has 2 slots left, both in the reserve; k1 has room; batch would choose k3."""
    view = _view(_backend("k1", 1, 18), _backend("k3", 3, 18))
    return msgspec.structs.replace(view, reserve=2, interactive_waiting=waiting)


def test_batch_borrows_the_reserve_while_no_interactive_request_waits() -> None:
    assert Throughput().choose(GREEDY, _reserved_view()).backend == "k3"


def test_batch_leaves_the_reserve_while_an_interactive_request_waits() -> None:
    decision = Throughput().choose(GREEDY, _reserved_view(waiting=1))
    assert decision.backend == "k1"
    assert "reserve of 2 kept on the deepest" in decision.reason
    # The reserve is the interactive lane's own: it takes it.
    assert Throughput().choose(_interactive(GREEDY), _reserved_view(1)).backend == "k3"


def test_an_interactive_request_queued_on_a_server_holds_the_reserve_until_it_ends() -> None:
    policy = Throughput()
    everyone_full = _view(_backend("k1", 1, 30), _backend("k3a", 3, 20))
    assert policy.choose(_interactive(GREEDY), everyone_full).backend == "k3a"
    k3b = _backend("k3b", 3, 18)
    now = msgspec.structs.replace(
        _view(_backend("k1", 1, 18), _backend("k3a", 3, 21), k3b), reserve=2
    )
    assert policy.choose(GREEDY, now).backend == "k1"  # one interactive is queued on k3a
    ended = Outcome(backend="k3a", steps=3, workload_class="m:greedy", status=200,
                    stream=True, lane="interactive")  # fmt: skip
    policy.observe(ended)
    assert policy.choose(GREEDY, now).backend == "k3b"  # nothing waits: batch borrows


def test_an_interactive_request_sent_shallower_holds_the_reserve_until_it_ends() -> None:
    policy = Throughput()
    deep_full = _view(_backend("k1", 1, 5), _backend("k3a", 3, 20))
    assert policy.choose(_interactive(GREEDY), deep_full).backend == "k1"  # k3a had no room
    now = msgspec.structs.replace(
        _view(_backend("k1", 1, 18), _backend("k3a", 3, 20), _backend("k3b", 3, 18)), reserve=2
    )
    assert policy.choose(GREEDY, now).backend == "k1"  # it waits for a deep slot
    policy.observe(Outcome(backend="k1", steps=1, workload_class="m:greedy", status=200,
                           stream=True, lane="interactive"))  # fmt: skip
    assert policy.choose(GREEDY, now).backend == "k3b"


def test_batch_queues_off_the_deepest_server_while_an_interactive_request_waits() -> None:
    everyone_full = _view(_backend("k1", 1, 22), _backend("k3", 3, 21))
    assert Throughput().choose(GREEDY, everyone_full).backend == "k3"  # the shorter wait
    waiting = msgspec.structs.replace(everyone_full, reserve=1, interactive_waiting=1)
    assert Throughput().choose(GREEDY, waiting).backend == "k1"
    assert Throughput().choose(_interactive(GREEDY), waiting).backend == "k3"

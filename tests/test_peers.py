"""Replicas sharing one pool: each one's estimates blended by weight, a peer that goes (from DNS,
or silent too long) dropped from the blend, the backends' free room split so that shares add up
to it, and a scrape that is too old aging out of the combined load."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from inprocess import Upstream, stream_of

from specroute.config import load_config
from specroute.pool import RoutingIndex, UpstreamClient
from specroute.pool.load import LoadMark, Share, headroom, share_of
from specroute.pool.peers import Peers
from specroute.pool.sharing import (
    ClassWire,
    EstimatesWire,
    IterationWire,
    PeerTable,
    Weighted,
    blend_classes,
    blend_iteration,
    local_estimates,
)
from specroute.pool.telemetry import Telemetry


def _wire(instance: str, alpha: float, weight: float, length: float) -> EstimatesWire:
    klass = ClassWire(
        alpha=Weighted(alpha, weight),
        accept_length={3: Weighted(length, weight)},
        samples=int(weight),
        mean_tokens=Weighted(100.0 * alpha, weight),
        first_token_s=Weighted(alpha, weight),
        prefill_pause_s=Weighted(alpha / 10, weight),
    )
    return EstimatesWire(instance=instance, classes={"m:greedy": klass})


def test_estimates_blend_weighted_by_their_samples() -> None:
    blended = blend_classes([_wire("a", 0.9, 300.0, 3.6), _wire("b", 0.5, 100.0, 2.0)])
    est = blended["m:greedy"]
    assert est.alpha == pytest.approx((0.9 * 300 + 0.5 * 100) / 400)
    assert est.accept_length[3] == pytest.approx((3.6 * 300 + 2.0 * 100) / 400)
    assert est.mean_tokens == pytest.approx((90 * 300 + 50 * 100) / 400)
    assert est.first_token_s == pytest.approx((0.9 * 300 + 0.5 * 100) / 400)
    assert est.prefill_pause_s == pytest.approx((0.09 * 300 + 0.05 * 100) / 400)
    assert est.samples == 400


def test_iteration_fits_blend_by_observations_and_a_prior_weighs_nothing() -> None:
    mine = IterationWire(backend="b", steps=2, intercept_s=0.5, per_token_s=0.1, observations=0)
    seen = IterationWire(
        backend="b", steps=2, intercept_s=0.02, per_token_s=0.001, observations=9, stall_s=0.004
    )
    fit = blend_iteration(mine, [seen, None])
    assert (fit.intercept_s, fit.per_token_s, fit.observations) == (0.02, 0.001, 9)
    assert fit.stall_s == pytest.approx(0.004)
    other = msgspec.structs.replace(seen, observations=3, stall_s=0.0)
    assert blend_iteration(other, [seen]).stall_s == pytest.approx(0.004 * 9 / 12)
    assert blend_iteration(mine, [None]) == mine


def test_a_replica_serves_what_it_learned_with_the_weights() -> None:
    telemetry = Telemetry()
    telemetry.acceptance.observe("m:greedy", steps=3, accept_length=3.5, verifies=40.0)
    telemetry.lengths.observe("m:greedy", 120)
    telemetry.first_tokens.observe("m:greedy", 0.3)
    telemetry.pauses.observe("m:greedy", 0.4, 4.0)
    wire = local_estimates(telemetry, "me")
    klass = wire.classes["m:greedy"]
    assert klass.accept_length[3] == Weighted(3.5, 40.0)
    assert klass.alpha.weight == 40.0
    assert klass.mean_tokens == Weighted(120.0, 1.0)
    assert klass.first_token_s == Weighted(0.3, 1.0)
    assert klass.prefill_pause_s == Weighted(0.1, 4.0)


def test_a_peer_that_disappears_is_dropped_from_blending() -> None:
    table = PeerTable("me", stale_after_s=10.0)
    table.listed({"http://a", "http://b", "http://me"})
    table.read("http://a", _wire("A", 0.9, 100.0, 3.6), now=0.0)
    table.read("http://b", _wire("B", 0.5, 100.0, 2.0), now=0.0)
    table.read("http://me", _wire("me", 0.7, 0.0, 3.0), now=0.0)
    assert {w.instance for w in table.live(now=1.0)} == {"A", "B"}
    assert table.share(now=1.0) == Share(3, sorted(["A", "B", "me"]).index("me"))
    table.listed({"http://a", "http://me"})  # b left DNS: gone at once
    assert [w.instance for w in table.live(now=1.0)] == ["A"]
    assert blend_classes(table.live(1.0))["m:greedy"].alpha == pytest.approx(0.9)
    table.read("http://a", _wire("A", 0.9, 100.0, 3.6), now=2.0)
    assert [w.instance for w in table.live(now=11.0)] == ["A"]
    assert table.live(now=12.5) == []  # a silent peer ages out too
    assert table.share(now=12.5) == Share(2, None)  # listed, unread: the even split only


@given(free=st.integers(-5, 80), replicas=st.integers(1, 7), offset=st.integers(0, 1000))
def test_the_free_room_split_by_rank_adds_up_to_it_exactly(
    free: int, replicas: int, offset: int
) -> None:
    shares = [share_of(free, Share(replicas, r), offset) for r in range(replicas)]
    assert sum(shares) == max(0, free)
    assert max(shares) - min(shares) <= 1
    assert share_of(free, Share(replicas, None), offset) * replicas <= max(0, free)


def test_stale_scrapes_age_out_of_the_combined_load() -> None:
    mark = LoadMark()
    mark.moved(3, now=0.0, keep_s=10.0)
    mark.scraped(total=10, own=3, now=1.0, lag_s=0.5)  # 7 requests of other clients
    assert mark.combined(3, now=5.0, stale_after_s=15.0) == 10
    assert headroom(mark, 3, 20, Share(1, 0), now=5.0, stale_after_s=15.0) == 10
    assert mark.combined(3, now=16.5, stale_after_s=15.0) is None
    assert headroom(mark, 3, 20, Share(1, 0), now=16.5, stale_after_s=15.0) == 17
    assert headroom(mark, 3, 20, Share(2, 0), now=16.5, stale_after_s=15.0) == 10 - 3


def test_our_requests_that_ended_after_the_gauges_are_not_counted_as_someone_elses() -> None:
    mark = LoadMark()
    mark.moved(6, now=0.0, keep_s=10.0)
    mark.moved(4, now=0.6, keep_s=10.0)  # two of ours ended; the gauges still show them
    mark.scraped(total=6, own=4, now=0.8, lag_s=0.5)
    assert mark.others == 0
    mark.scraped(total=6, own=4, now=2.0, lag_s=0.5)  # by now the gauges would show 4
    assert mark.others == 2


def test_replicas_split_each_backends_capacity_whatever_a_lagging_scrape_says() -> None:
    capacity = 10
    rooms = [
        headroom(LoadMark(), 0, capacity, Share(3, r), now=0.0, stale_after_s=15.0, offset=7)
        for r in range(3)
    ]
    assert sum(r for r in rooms if r is not None) == capacity
    mark = LoadMark()
    mark.scraped(total=10, own=2, now=0.0, lag_s=0.0)  # requests already gone still counted
    mine = headroom(mark, 2, capacity, Share(3, 0), now=0.1, stale_after_s=15.0, offset=7)
    assert mine == (rooms[0] or 0) - 2


def test_split_by_room_each_replica_takes_its_share_of_it_and_what_it_frees() -> None:
    capacity, total = 10, 3  # one request from each replica and one from another client
    marks = []
    for _ in range(2):
        mark = LoadMark()
        mark.scraped(total=total, own=1, now=0.0, lag_s=0.0)
        marks.append(mark)
    rooms = [
        headroom(m, 1, capacity, Share(2, r), now=0.1, stale_after_s=15.0, offset=5, split="room")
        for r, m in enumerate(marks)
    ]
    assert sum(r for r in rooms if r is not None) == capacity - total
    freed = headroom(
        marks[0], 0, capacity, Share(2, 0), now=0.1, stale_after_s=15.0, offset=5, split="room"
    )
    assert freed == (rooms[0] or 0) + 1


def test_peers_found_by_dns_are_read_and_dropped_when_dns_forgets_them() -> None:
    async def run() -> None:
        peer = Upstream(stream_of([]))
        wire = _wire("peer-1", 0.8, 50.0, 3.2)
        peer._info["/pool/estimates"] = msgspec.to_builtins(wire)  # what a peer answers
        listed = {"127.0.0.1"}

        async def resolve(host: str, port: int) -> set[str]:
            return set(listed)

        async with peer.running():
            port = int(peer.url.rsplit(":", 1)[1])
            config = load_config(
                environ={}, overrides={"replicas": {"peers": [f"http://peers:{port}"]}}
            )
            client = UpstreamClient(config.timeouts, config.client)
            changes: list[int] = []
            table = PeerTable("me", stale_after_s=30.0)
            peers = Peers(config, client, table, lambda: changes.append(1), resolve=resolve)
            try:
                await peers.refresh(resolve=True)
                assert [w.instance for w in table.live(time.monotonic())] == ["peer-1"]
                listed.clear()
                await peers.refresh(resolve=True)
                assert table.live(time.monotonic()) == []
                assert len(changes) == 2
            finally:
                await client.aclose()

    asyncio.run(run())


def test_the_pool_blends_its_own_classes_with_live_peers_and_drops_one_that_ages_out() -> None:
    telemetry = Telemetry()
    telemetry.acceptance.observe("m:greedy", steps=3, accept_length=2.0, verifies=100.0)
    table = PeerTable("me", stale_after_s=10.0)
    table.listed({"http://a"})
    index = RoutingIndex(load_config(environ={}), telemetry, table)
    table.read("http://a", _wire("A", 0.9, 300.0, 3.6), now=0.0)
    blended = index.classes("me", now=1.0)["m:greedy"]
    assert blended.accept_length[3] == pytest.approx((2.0 * 100 + 3.6 * 300) / 400)
    assert index.classes("me", now=11.0)["m:greedy"].accept_length[3] == pytest.approx(2.0)

"""The moves of a non-streamed request (`proxy.resend`) without a socket: which failures move
it, its bound and its deadline, and the drain watch that ends its wait."""

from __future__ import annotations

import asyncio
import time

import pytest

from specroute.pool import (
    AttemptLimits,
    BadReply,
    ConnectFailed,
    Holds,
    ReplyTooLarge,
    Stalled,
    StreamBroken,
    UpstreamFailure,
)
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.migrate import Moved
from specroute.proxy.resend import DrainWatch, Resend, Resender


def test_failures_after_the_backend_took_the_request_move_it_once() -> None:
    resend = Resend(1, time.perf_counter(), 60.0)
    assert resend.verdict("a", StreamBroken("gone")) == ("interrupted", "pending")
    assert resend.pending == ("interrupted", "a")
    Resender(ProxyMetrics()).settle("r1", resend, "b")
    assert resend.moves == 1
    assert resend.pending is None
    assert resend.verdict("b", Stalled("headers", 1.0)) == ("stalled", "limit")


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        (Stalled("headers", 2.0), "stalled"),
        (BadReply("not JSON"), "bad_reply"),
        (Moved("draining"), "drain"),
    ],
)
def test_each_failure_after_sending_has_its_cause(failure: UpstreamFailure, cause: str) -> None:
    resend = Resend(2, time.perf_counter(), 60.0)
    assert resend.verdict("a", failure) == (cause, "pending")


def test_unsent_or_too_large_replies_are_not_moves() -> None:
    resend = Resend(1, time.perf_counter(), 60.0)
    assert resend.verdict("a", ConnectFailed("refused")) is None
    assert resend.verdict("a", ReplyTooLarge("big")) is None
    assert resend.pending is None


def test_no_time_left_ends_the_request() -> None:
    resend = Resend(3, time.perf_counter() - 10.0, 5.0)
    assert resend.verdict("a", StreamBroken("gone")) == ("interrupted", "no_budget")


def test_an_attempt_gets_only_what_is_left_of_the_request() -> None:
    limits = AttemptLimits(header_s=30.0, first_s=2.0, gap_s=1.0, reply_s=30.0)
    assert Resend(1, time.perf_counter(), 600.0).bound(limits) == limits
    bounded = Resend(1, time.perf_counter(), 10.0).bound(limits)
    assert 9.0 < bounded.reply_s <= 10.0
    assert bounded.header_s == bounded.reply_s
    assert bounded.first_s == 2.0


def test_metric_counts_moves_and_ends() -> None:
    metrics = ProxyMetrics()
    resender = Resender(metrics)
    resend = Resend(1, time.perf_counter(), 60.0)
    assert resender.failed("r1", resend, "a", StreamBroken("gone")) is True
    resender.settle("r1", resend, None)  # no backend left to take it
    assert resender.failed("r1", resend, "a", ConnectFailed("refused")) is None
    text = metrics.render().decode()
    assert 'specroute_migrations_total{cause="interrupted",outcome="no_backend"} 1.0' in text
    assert 'outcome="moved"' not in text


async def _wait_on(holds: Holds, name: str, after_s: float) -> None:
    await DrainWatch(holds, after_s).wait(asyncio.Event().wait(), name)


def test_a_drained_backend_ends_the_wait_with_moved() -> None:
    holds = Holds()
    holds.hold("a", "draining", time.monotonic() - 5.0)
    with pytest.raises(Moved):
        asyncio.run(asyncio.wait_for(_wait_on(holds, "a", 2.0), 10.0))


def test_a_drain_that_begins_during_the_wait_ends_it_at_its_deadline() -> None:
    async def scenario() -> float:
        holds = Holds()
        waiting = asyncio.create_task(_wait_on(holds, "a", 0.05))
        await asyncio.sleep(0)  # the watch is armed on a serving backend
        assert not waiting.done()
        holds.hold("a", "draining")
        began = time.monotonic()
        with pytest.raises(Moved):
            await asyncio.wait_for(waiting, 10.0)
        return time.monotonic() - began

    assert asyncio.run(scenario()) >= 0.05


def test_work_that_finishes_comes_back_and_other_backends_drains_do_not_matter() -> None:
    async def scenario() -> str:
        holds = Holds()
        holds.hold("b", "draining", time.monotonic() - 5.0)

        async def answer() -> str:
            await asyncio.sleep(0)
            return "answer"

        return await DrainWatch(holds, 0.0).wait(answer(), "a")

    assert asyncio.run(scenario()) == "answer"


def test_a_timeout_of_the_work_itself_is_not_a_move() -> None:
    async def scenario() -> None:
        async def slow() -> None:
            raise TimeoutError("the work's own")

        await DrainWatch(Holds(), 0.0).wait(slow(), "a")

    with pytest.raises(TimeoutError, match="the work's own"):
        asyncio.run(scenario())


def test_a_wait_cancelled_by_its_client_while_its_backend_drains_stays_cancelled() -> None:
    async def scenario() -> None:
        holds = Holds()
        holds.hold("a", "draining", time.monotonic() - 5.0)
        waiting = asyncio.create_task(_wait_on(holds, "a", 0.0))
        await asyncio.sleep(0)  # the watch is armed
        waiting.cancel()  # the client left: that cancel must not turn into a move
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(asyncio.wait_for(scenario(), 10.0))


def test_after_a_move_the_task_is_not_left_cancelling_and_can_wait_again() -> None:
    async def scenario() -> str:
        holds = Holds()
        holds.hold("a", "draining", time.monotonic() - 5.0)
        watch = DrainWatch(holds, 0.0)
        with pytest.raises(Moved):
            await watch.wait(asyncio.Event().wait(), "a")
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0  # else a later timeout in the request misreads itself
        return await watch.wait(asyncio.sleep(0.01, "answer"), "b")

    assert asyncio.run(asyncio.wait_for(scenario(), 10.0)) == "answer"

"""A tick of the depth loop that fails on a bug is logged and the loop goes on: before, the
exception ended the loop's task, `specroute launch` kept it until shutdown, and the pool kept
its depths with nothing said."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs
from test_actuator import pool_answer
from test_restart_times import IdleProxy

from specroute.planner import Setting
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ReconfigureOptions, Reconfigurer
from specroute.wire import PlanDocument, PoolSnapshot


class FlakyProxy(IdleProxy):
    """Answers /pool with a snapshot the planner cannot read for `broken` calls, then well;
    stops the loop after `calls` answers."""

    def __init__(self, broken: int, calls: int, stop: asyncio.Event) -> None:
        self.broken, self.calls, self.stop = broken, calls, stop
        self.answered = 0
        self.published: list[PlanDocument] = []

    async def pool(self) -> PoolSnapshot:
        self.answered += 1
        if self.answered >= self.calls:
            self.stop.set()
        if self.answered <= self.broken:
            raise ValueError("a bug in reading the pool")
        return pool_answer({"m:g": 3})

    async def publish(self, document: PlanDocument) -> None:
        self.published.append(document)


def _run(broken: int, calls: int) -> tuple[Reconfigurer, FlakyProxy, list[dict[str, object]]]:
    async def main() -> tuple[Reconfigurer, FlakyProxy]:
        stop = asyncio.Event()
        proxy = FlakyProxy(broken, calls, stop)
        now = [0.0]

        async def sleep(seconds: float) -> None:
            now[0] += seconds

        act = Actuator("auto", [("a", Setting(steps=1), 88.0), ("b", Setting(steps=3), 88.0)],
                       clock=lambda: now[0])  # fmt: skip

        async def restart(name: str, setting: Setting) -> str | None:
            return None

        options = ReconfigureOptions(mode="advise", plan_every=1)
        loop = Reconfigurer(options, proxy, act, restart, limit=lambda k: 16, sleep=sleep)
        await asyncio.wait_for(loop.run(stop), timeout=10)
        return loop, proxy

    with capture_logs() as logs:
        loop, proxy = asyncio.run(main())
    return loop, proxy, logs


def test_a_tick_that_fails_is_logged_once_and_the_loop_plans_on() -> None:
    loop, proxy, logs = _run(broken=3, calls=6)
    assert proxy.answered == 6  # it kept asking after the failures
    assert loop.failed_ticks == 3
    failed = [e for e in logs if e["event"] == "plan_failed"]
    assert len(failed) == 1  # the same error three times: one line, with its traceback
    assert failed[0]["log_level"] == "error"
    assert "a bug in reading the pool" in str(failed[0])
    assert proxy.published  # the ticks after it planned and published


def test_a_loop_with_no_failure_logs_none() -> None:
    loop, _, logs = _run(broken=0, calls=3)
    assert loop.failed_ticks == 0
    assert not [e for e in logs if e["event"] == "plan_failed"]

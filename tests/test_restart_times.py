"""The restart time the planner charges: the configured figure until a server has restarted,
then what that server showed (hold -> ready, timed by the loop on its own clock)."""

from __future__ import annotations

import asyncio

import pytest

from specroute.planner import Change, Setting
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ReconfigureOptions, Reconfigurer
from specroute.reconfigure.restart_times import RestartTimes
from specroute.wire import HoldAnswer, HoldState, PlanDocument, PoolSnapshot

K1, K3 = Setting(steps=1), Setting(steps=3)
PROFILE_STARTUP_S = 88.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class IdleProxy:
    """A proxy whose backends have nothing in flight: drains end at once."""

    async def pool(self) -> PoolSnapshot:
        raise AssertionError("not sampled in these tests")

    async def publish(self, document: PlanDocument) -> None:
        self.document = document

    async def hold(
        self,
        name: str,
        state: HoldState,
        *,
        to: str = "",
        reason: str = "",
        setting: Setting | None = None,
    ) -> HoldAnswer:
        return HoldAnswer(
            backend=name, state=state, in_flight=0, reachable=True, steps=None, capacity=None
        )

    async def aclose(self) -> None:
        return None


def _change(act: Actuator, restart_s: float, clock: Clock) -> None:
    """One change of server `a` carried out by the loop; the restart takes `restart_s`."""

    async def restart(name: str, setting: Setting) -> str | None:
        clock.now += restart_s
        return None

    loop = Reconfigurer(ReconfigureOptions(mode="auto"), IdleProxy(), act, restart,
                        limit=lambda k: 16)  # fmt: skip
    before = act.slots["a"].setting
    after = K3 if before == K1 else K1
    change = Change(server="a", before=before, after=after, cost_tokens=1.0)
    act.slots["a"].phase, act.slots["a"].target = "draining", after
    act.slots["a"].started = clock.now
    asyncio.run(loop._carry_out(change))


def _charged(act: Actuator, name: str) -> float:
    return next(s.startup_s for s in act.servers() if s.name == name)


def test_the_planner_is_charged_the_configured_startup_before_any_restart() -> None:
    act = Actuator("auto", [("a", K1, PROFILE_STARTUP_S)], clock=Clock())
    assert _charged(act, "a") == PROFILE_STARTUP_S


def test_with_the_weight_cache_the_charged_restart_falls_to_what_the_server_showed() -> None:
    clock = Clock()
    act = Actuator("auto", [("a", K1, PROFILE_STARTUP_S), ("b", K1, PROFILE_STARTUP_S)],
                   clock=clock)  # fmt: skip
    _change(act, 36.4, clock)  # a cache client: weight load ~1 s instead of ~53 s
    assert act.restart_times.seen("a") == pytest.approx((36.4,))
    assert _charged(act, "a") == pytest.approx(36.4)
    assert _charged(act, "b") == PROFILE_STARTUP_S  # b has not restarted: still the profile's
    assert act.slots["a"].setting == K3


def test_a_restart_that_fails_is_not_taken_as_the_servers_restart_time() -> None:
    clock = Clock()
    act = Actuator("auto", [("a", K1, PROFILE_STARTUP_S)], clock=clock)
    calls: list[Setting] = []

    async def restart(name: str, setting: Setting) -> str | None:
        calls.append(setting)
        clock.now += 5.0 if len(calls) == 1 else 40.0
        return "exited with status 1" if len(calls) == 1 else None

    loop = Reconfigurer(ReconfigureOptions(mode="auto"), IdleProxy(), act, restart,
                        limit=lambda k: 16)  # fmt: skip
    act.slots["a"].phase, act.slots["a"].target = "draining", K3
    act.slots["a"].started = clock.now
    asyncio.run(loop._carry_out(Change(server="a", before=K1, after=K3, cost_tokens=1.0)))
    assert calls == [K3, K1]  # the new flags failed; the fallback came up in 40 s
    assert act.restart_times.seen("a") == (40.0,)


def test_the_charge_is_the_median_of_the_recent_restarts() -> None:
    times = RestartTimes(recent=3)
    assert times.charged("a", 88.0) == 88.0
    for seconds in (30.0, 300.0, 32.0, 34.0):  # the first drops out; 300 s is one slow disk
        times.observe("a", seconds)
    assert times.seen("a") == (300.0, 32.0, 34.0)
    assert times.charged("a", 88.0) == 34.0


def test_plan_shows_the_restart_time_charged() -> None:
    clock = Clock()
    act = Actuator("auto", [("a", K1, PROFILE_STARTUP_S)], clock=clock)
    _change(act, 12.0, clock)
    loop = Reconfigurer(ReconfigureOptions(mode="auto"), IdleProxy(), act,
                        lambda n, s: asyncio.sleep(0, None), limit=lambda k: 16)  # fmt: skip
    (row,) = loop.document().servers
    assert row.startup_s == 12.0

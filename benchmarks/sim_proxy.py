"""The proxy as the depth loop sees it in the simulator (`depth_sim.py`): `GET /pool` built
from what the real proxy knows, never the emulator's truth, the plan document kept, and the
backend holds, behind the loop's `Link`."""

from __future__ import annotations

from typing import Any

from specroute.planner import Setting
from specroute.proxy.info import class_snapshots, prior_depths
from specroute.wire import (
    BackendSnapshot,
    HoldAnswer,
    HoldState,
    PlanDocument,
    PoolEstimates,
    PoolSnapshot,
)


class SimProxy:
    """The proxy as the depth loop sees it (`reconfigure.Link`): `GET /pool` built from what
    the real proxy knows (its own in-flight counts, its telemetry's fits and classes, its
    queue), the plan document kept, and the backend holds."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.document: PlanDocument | None = None
        self.answers: list[tuple[float, PoolSnapshot]] = []
        """Every /pool answer and when: what a replay through `specroute launch`'s link gets."""

    async def pool(self) -> PoolSnapshot:
        self.sim.calls += 1
        answer = self.sim.snapshot()
        self.answers.append((self.sim.now, answer))
        return answer

    async def publish(self, document: PlanDocument) -> None:
        self.sim.calls += 1
        self.document = document
        plan = document.plan
        seen = self.sim.decisions
        if plan is not None and (not seen or seen[-1][0] != plan.at):
            seen.append((plan.at, plan.verdict, plan.reason, tuple(c.server for c in plan.start)))

    async def hold(
        self,
        name: str,
        state: HoldState,
        *,
        to: str = "",
        reason: str = "",
        setting: Setting | None = None,
    ) -> HoldAnswer:
        self.sim.calls += 1
        return self.sim.hold(name, state)

    async def aclose(self) -> None:
        return None


def pool_snapshot(sim: Any) -> PoolSnapshot:
    """`GET /pool` as the real proxy would answer: per backend its own in-flight count,
    discovered depth and capacity, and the telemetry's iteration fit; the classes learned."""
    backends = []
    for node, slot in zip(sim.nodes, sim.slots, strict=True):
        up = slot.state != "starting"
        steps = node.engine.active_steps if up else None
        fit = None if steps is None else sim.telemetry.iteration_model(node.name, steps)
        cap = node.engine.max_running_requests
        backends.append(BackendSnapshot(
            name=node.name, url="sim", model=sim.model, steps=steps, algorithm="EAGLE",
            adaptive=node.engine.adaptive is not None or bool(slot.setting.table),
            capacity=cap if up else None,
            limit=int(cap * sim.overcommit), healthy=up, in_flight=node.in_flight,
            running=None, queued=None, accept_length=None, gen_throughput=None,
            iteration_intercept_s=None if fit is None else fit.intercept,
            iteration_per_token_s=None if fit is None else fit.slope,
            iteration_samples=0 if fit is None else fit.observations,
            iteration_tokens=None if fit is None else fit.tokens,
            iteration_stall_s=0.0 if fit is None else fit.stall_s,
        ))  # fmt: skip
    classes = class_snapshots(sim.telemetry.classes())
    depths = prior_depths(sim.telemetry)
    estimates = PoolEstimates(classes=classes, local_classes=classes, depths=depths,
                              prior_alpha=sim.telemetry.acceptance.prior_alpha,
                              capacity=dict(sorted(sim.tuned_capacity.items())))  # fmt: skip
    return PoolSnapshot(policy=sim.policy.name, waiting=len(sim.waiting), backends=backends,
                        estimates=estimates)  # fmt: skip

"""The launcher's depth loop: read the proxy's /pool, run the one planner of the deployment,
publish its plan to the proxy (`PUT /plan`), and in `auto` carry out each change: drain (the
proxy sends the server nothing new), stop, restart at the new depth, wait for /ready, readmit
(the proxy rediscovers depth and capacity); a start that fails falls back to the last good flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import msgspec
import structlog

from specroute.planner import (
    DEFAULT_DWELL_S,
    Change,
    Estimates,
    Plan,
    Planner,
    PlannerOptions,
    Setting,
)
from specroute.reconfigure.accounts import Ledger
from specroute.reconfigure.actuator import Actuator, Mode, Record
from specroute.reconfigure.readings import LaneTraffic, Traffic, estimates
from specroute.wire import (
    ChangeRecord,
    HoldAnswer,
    HoldChange,
    HoldState,
    PlanDocument,
    PlanSummary,
    PoolSnapshot,
    ServerRow,
    SettingWire,
)

__all__ = [
    "Link",
    "ProxyLink",
    "ReconfigureOptions",
    "Reconfigurer",
    "Restart",
    "Sleep",
    "replicas",
]

log = structlog.get_logger()
_pool = msgspec.json.Decoder(PoolSnapshot)
_hold = msgspec.json.Decoder(HoldAnswer)
_encode = msgspec.json.Encoder().encode

Restart = Callable[[str, Setting], Awaitable[str | None]]
"""Restart one server at a setting and wait for /ready: None when it came up, else why not."""
Sleep = Callable[[float], Awaitable[None]]
"""Wait this many seconds of the loop's clock (`asyncio.sleep`, or a simulator's)."""


class ReconfigureOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`specroute launch --reconfigure ...`: the mode, what the planner may assign, and the
    loop's pace. `planner` holds further PlannerOptions fields (`--planner-option K=V`)."""

    mode: Mode = "advise"
    allowed_steps: tuple[int, ...] = (0, 1, 2, 3)
    allow_adaptive: bool = False
    min_dwell_s: float = DEFAULT_DWELL_S
    max_unavailable: int = 1
    drain_s: float = 30.0
    tick_s: float = 2.0
    plan_every: int = 5
    """A plan every this many samples of the load."""
    planner: dict[str, Any] = {}

    def planner_options(
        self, adaptive: tuple[Any, ...] = (), tables: bool = False
    ) -> PlannerOptions:
        fields = {
            "max_steps": max(self.allowed_steps),
            "min_dwell_s": self.min_dwell_s,
            "max_unavailable": self.max_unavailable,
            "drain_s": self.drain_s,
            "adaptive": adaptive,
            "tables": tables,
            **self.planner,
        }
        return msgspec.convert(fields, PlannerOptions, strict=False)


class Link(Protocol):
    """What the loop asks of a proxy: its /pool, PUT /plan, backend holds."""

    async def pool(self) -> PoolSnapshot: ...

    async def publish(self, document: PlanDocument) -> None: ...

    async def hold(
        self,
        name: str,
        state: HoldState,
        *,
        to: str = "",
        reason: str = "",
        setting: Setting | None = None,
    ) -> HoldAnswer:
        """Set a backend's state (draining, restarting, serving) with the change it is part
        of and the setting it runs; its in-flight count back."""
        ...

    async def aclose(self) -> None: ...


class ProxyLink:
    """The proxy's admin routes, with the admin key: /pool, PUT /plan, backend holds."""

    def __init__(self, url: str, admin_key: str, timeout_s: float = 10.0) -> None:
        self.client = httpx.AsyncClient(
            base_url=url, timeout=timeout_s, headers={"authorization": f"Bearer {admin_key}"}
        )

    async def pool(self) -> PoolSnapshot:
        response = await self.client.get("/pool")
        response.raise_for_status()
        return _pool.decode(response.content)

    async def publish(self, document: PlanDocument) -> None:
        (await self.client.put("/plan", content=_encode(document))).raise_for_status()

    async def hold(
        self,
        name: str,
        state: HoldState,
        *,
        to: str = "",
        reason: str = "",
        setting: Setting | None = None,
    ) -> HoldAnswer:
        """Set a backend's state (draining, restarting, serving) with the change it is part
        of (the setting it moves `to`, the plan's `reason`): the proxy then tells a planned
        restart from an outage; `setting`, what it runs, for what its engine does not say.
        Its in-flight count back."""
        wire = None if setting is None else msgspec.convert(msgspec.to_builtins(setting),
                                                            SettingWire)  # fmt: skip
        body = _encode(HoldChange(state, to=to, reason=reason, setting=wire))
        response = await self.client.put(f"/pool/backends/{name}/state", content=body)
        response.raise_for_status()
        return _hold.decode(response.content)

    async def aclose(self) -> None:
        await self.client.aclose()


def replicas(settings: list[Setting]) -> dict[str, int]:
    """Servers per depth ("adaptive" for SGLang-adaptive ones, "dynamic" for vLLM's K per
    batch size): what Kubernetes scales to."""
    out: dict[str, int] = {}
    for s in settings:
        key = "adaptive" if s.tiers else "dynamic" if s.table else str(s.steps)
        out[key] = out.get(key, 0) + 1
    return out


class Reconfigurer:
    """One planner, one actuator, and the tasks carrying out the changes it begins. Time is
    the actuator's clock and `sleep`: wall time in `specroute launch`, virtual time in the
    simulator (`benchmarks/depth_sim.py`), which runs this same loop."""

    def __init__(
        self,
        options: ReconfigureOptions,
        link: Link,
        actuator: Actuator,
        restart: Restart,
        *,
        limit: Callable[[int], int],
        adaptive: tuple[Any, ...] = (),
        tables: bool = False,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.options = options
        self.link = link
        self.actuator = actuator
        self._sleep = sleep
        self.planner = Planner(options.planner_options(adaptive, tables))
        self._restart = restart
        self._limit = limit
        self.traffic = Traffic()
        self.lanes = LaneTraffic()
        self.ledger = Ledger(window_s=self.planner.options.window_s)
        self.plan: Plan | None = None
        self.note = "no estimates yet: waiting for the first requests"
        self._ticks = 0
        self._undeclared = {n for n, s in actuator.slots.items() if s.setting.table}
        self._tasks: set[asyncio.Task[None]] = set()
        self.failed_ticks = 0
        """Ticks that failed on something other than the proxy's answer: a bug, which must
        not stop the loop for good (the pool would keep its depths, silently)."""
        self.last_failure: Exception | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Sample, plan and act until `stop`; changes under way finish before it returns."""
        clock = self.actuator.clock
        while not stop.is_set():
            started = clock()
            try:
                await self.tick()
            except (httpx.HTTPError, msgspec.DecodeError) as exc:
                log.warning("plan_skipped", error=str(exc) or type(exc).__name__)
            except Exception as exc:
                # Logged with its traceback the first time and whenever it changes; the next
                # tick tries again.
                self.failed_ticks += 1
                if repr(self.last_failure) != repr(exc):
                    log.error("plan_failed", error=repr(exc), failed_ticks=self.failed_ticks,
                              exc_info=exc)  # fmt: skip
                self.last_failure = exc
            await self._pause(stop, self.options.tick_s - (clock() - started))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        """`seconds` of the loop's clock, or until `stop`."""
        if seconds <= 0 or stop.is_set():
            return
        pause = asyncio.ensure_future(self._sleep(seconds))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((pause, stopped), return_when=asyncio.FIRST_COMPLETED)
        for task in (pause, stopped):
            task.cancel()

    async def tick(self) -> None:
        """One sample of the load; every `plan_every` samples a plan, published."""
        await self._declare()
        await self.consider(await self.link.pool())

    async def _declare(self) -> None:
        """Tell the proxy, once, which servers were launched with vLLM's K per batch size (their
        engine does not say; a restart's readmission says it for the setting that came up)."""
        for name in sorted(self._undeclared):
            slot = self.actuator.slots[name]
            if slot.phase == "serving":
                await self.link.hold(name, "serving", setting=slot.setting)
            self._undeclared.discard(name)

    async def consider(self, pool: PoolSnapshot) -> None:
        """One /pool answer: observed, and every `plan_every` answers planned on."""
        now = self.actuator.clock()
        loads, queued = self.traffic.sample(pool)
        self.planner.observe(now, loads, queued)
        self.planner.lanes = self.lanes.sample(pool)
        self.ledger.sample(now, self.traffic.tokens)
        self._ticks += 1
        if self._ticks % self.options.plan_every:
            return
        self._settle_accounts(now)
        est = estimates(pool, self.options.allowed_steps, self._limit)
        if est is not None:
            self._decide(now, est)
        await self.publish()

    def _decide(self, now: float, est: Estimates) -> None:
        plan = self.planner.plan(now, self.actuator.servers(), est)
        if self.plan is None or plan.verdict != self.plan.verdict:
            log.info("plan_changed", mode=self.actuator.mode, verdict=plan.verdict,
                     reason=plan.reason, gain_tok_s=round(plan.gain, 1))  # fmt: skip
        self.plan, self.note = plan, ""
        for change in self.actuator.admit(plan):
            self.ledger.begin(now, change.server, plan)
            task = asyncio.create_task(self._carry_out(change), name=f"reconfigure-{change.server}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _carry_out(self, change: Change) -> None:
        """Drain, restart (falling back once), readmit; one log line with the outcome."""
        name = change.server
        log.info("reconfigure_started", server=name, before=change.before.label,
                 after=change.after.label, reason=self.actuator.slots[name].reason)  # fmt: skip
        try:
            record = await self._steps(name)
        except httpx.HTTPError as exc:
            record = self.actuator.abort(name, f"proxy unreachable: {exc}")
        finally:
            with contextlib.suppress(httpx.HTTPError):
                await self.link.hold(name, "serving", setting=self.actuator.slots[name].setting)
        self.ledger.done(self.actuator.clock(), name, record.outcome == "done")
        self._log(record)
        await self._publish_quietly()

    async def _steps(self, name: str) -> Record:
        await self._drain(name)
        setting: Setting | None = self.actuator.drained(name)
        await self._publish_quietly()
        to, reason = self._change(name)
        await self.link.hold(name, "restarting", to=to, reason=reason)
        while setting is not None:
            began = self.actuator.clock()
            error = await self._restart(name, setting)
            if error is None:
                self.actuator.restart_times.observe(name, self.actuator.clock() - began)
                return self.actuator.ready(name)
            setting = self.actuator.failed(name, error)
        return self.actuator.history[-1]

    async def _drain(self, name: str) -> None:
        """The proxy stops sending it requests; wait for its streams, up to `drain_s`."""
        clock = self.actuator.clock
        deadline = clock() + self.options.drain_s
        while True:
            to, reason = self._change(name)
            answer = await self.link.hold(name, "draining", to=to, reason=reason)
            if answer.in_flight == 0 or clock() >= deadline:
                return
            await self._sleep(min(0.2, max(0.0, deadline - clock())))

    def _settle_accounts(self, now: float) -> None:
        """Close the accounts of changes that settled; each verdict moves the planner's bar."""
        for account in self.ledger.close(now, self.planner.regimes.view(now).started_at):
            if account.realized_gain is not None:
                self.planner.account(account.realized_gain, account.forecast_gain,
                                     noise=account.realized_gain_noise or 0.0)  # fmt: skip
            log.info("change_accounted", **msgspec.structs.asdict(account),
                     bar=round(self.planner.bar, 4))  # fmt: skip

    def _change(self, name: str) -> tuple[str, str]:
        """The change under way on `name`, for its hold: where it goes and why."""
        return self.actuator.restarting_into(name).label, self.actuator.slots[name].reason

    def _log(self, record: Record) -> None:
        fields = msgspec.to_builtins(record)
        if record.outcome == "done":
            log.info("reconfigured", **fields)
        else:
            log.warning("reconfigured", **fields)

    async def _publish_quietly(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.publish()

    async def publish(self) -> None:
        await self.link.publish(self.document())

    def document(self) -> PlanDocument:
        """What `GET /plan` shows: the plan with its numbers, each server's state, the
        changes under way and past ones, outcome counts, and the replicas per depth wanted
        now: the current ones with the changes the plan would begin now. Times are ages in
        seconds and UTC ISO times (`published_at`, `plan_made_at`, `since`, `finished_at`)."""
        act = self.actuator
        now = act.clock()
        wall = datetime.datetime.now(datetime.UTC)  # wall-clock times, to match the logs

        def at(moment: float) -> str:
            when = wall - datetime.timedelta(seconds=now - moment)
            return when.isoformat(timespec="seconds").replace("+00:00", "Z")  # as the logs

        current = {s.name: s.setting for s in act.slots.values()}
        wanted = dict(current)
        for change in self.plan.start if self.plan is not None else ():
            wanted[change.server] = change.after
        servers = [
            ServerRow(name=s.name, setting=s.setting.label, state=s.phase,
                      target=None if s.target is None else s.target.label,
                      fallback=s.fallback, since_s=round(now - s.since, 1), since=at(s.since),
                      startup_s=round(act.restart_times.charged(s.name, s.startup_s), 1))
            for s in act.slots.values()
        ]  # fmt: skip
        return PlanDocument(
            mode=act.mode,
            planner="specroute launch",
            note=self.note,
            plan=None if self.plan is None else summary(self.plan),
            plan_age_s=None if self.plan is None else round(now - self.plan.at, 1),
            plan_made_at=None if self.plan is None else at(self.plan.at),
            published_at=at(now),
            servers=servers,
            pending=[s.name for s in servers if s.state != "serving"],
            history=[
                ChangeRecord(
                    **msgspec.structs.asdict(r), ago_s=round(now - r.at, 1), finished_at=at(r.at)
                )
                for r in reversed(act.history)
            ],
            accounts=list(self.ledger.accounts),
            outcomes={str(k): n for k, n in act.outcomes.items()},
            replicas=replicas(list(wanted.values())),
            current_replicas=replicas(list(current.values())),
        )


def summary(plan: Plan) -> PlanSummary:
    """The plan as `/plan` carries it (a field renamed on either side fails here)."""
    return msgspec.convert(msgspec.to_builtins(plan), PlanSummary)

"""The reconfiguration actuator's state machine: each launched server serving, draining or
restarting, what it restarts into, the last flags that worked, and the history of changes.
Pure like the circuit breaker: the clock is injected and the caller does the I/O."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from specroute.planner import Change, Plan, ServerState, Setting
from specroute.reconfigure.restart_times import RestartTimes

__all__ = ["Actuator", "ChangeResult", "Mode", "Phase", "Record", "Slot"]

Mode = Literal["off", "advise", "auto"]
Phase = Literal["serving", "draining", "restarting"]
ChangeResult = Literal["done", "fell_back", "failed"]
"""done: it serves at the new depth; fell_back: the new flags failed and the last good ones
serve again; failed: neither came up (the supervisor keeps trying the last good flags)."""

_HISTORY = 50


class Slot(msgspec.Struct, kw_only=True):
    """One launched server. `setting` is its last good flags; while a change is in flight
    `target` is the setting it is moving to; after a failed start it restarts at `setting`
    again (`fallback`)."""

    name: str
    setting: Setting
    startup_s: float
    phase: Phase = "serving"
    since: float = 0.0
    target: Setting | None = None
    fallback: bool = False
    """The restart under way is the fallback to `setting`."""
    started: float = 0.0
    """When the change under way began (its drain)."""
    reason: str = ""
    changed_at: float | None = None


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """One finished change, as /plan and the log show it."""

    server: str
    before: str
    after: str
    outcome: ChangeResult
    took_s: float
    reason: str
    error: str = ""
    at: float = 0.0
    """Monotonic time it finished (the caller's clock)."""


class Actuator:
    """Which changes begin (auto only), and each server's way through drain, restart and
    readmission; `advise` and `off` never begin one."""

    def __init__(
        self,
        mode: Mode,
        servers: Sequence[tuple[str, Setting, float]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = mode
        self.clock = clock
        now = clock()
        self.slots = {n: Slot(name=n, setting=s, startup_s=t, since=now) for n, s, t in servers}
        self.history: list[Record] = []
        self.outcomes: dict[ChangeResult, int] = {"done": 0, "fell_back": 0, "failed": 0}
        self.restart_times = RestartTimes()
        """The restarts each server has shown; what the planner charges once there is one."""

    def admit(self, plan: Plan) -> list[Change]:
        """The plan's changes to begin now: in `auto` only, on serving servers; each one is
        draining from here on."""
        if self.mode != "auto":
            return []
        begun = []
        for change in plan.start:
            slot = self.slots.get(change.server)
            if slot is None or slot.phase != "serving" or change.after == slot.setting:
                continue
            now = self.clock()
            slot.phase, slot.since, slot.started = "draining", now, now
            slot.target, slot.fallback, slot.reason = change.after, False, plan.reason
            begun.append(change)
        return begun

    def drained(self, name: str) -> Setting:
        """Its streams finished (or the drain ran out): it restarts; returns the setting."""
        slot = self.slots[name]
        assert slot.phase == "draining"
        assert slot.target is not None
        slot.phase, slot.since = "restarting", self.clock()
        return slot.target

    def ready(self, name: str) -> Record:
        """It answered /ready at the setting it restarted into and was readmitted."""
        slot = self.slots[name]
        return self._finish(slot, "fell_back" if slot.fallback else "done")

    def failed(self, name: str, error: str) -> Setting | None:
        """The restart did not come up: the setting to fall back to, or None when the
        fallback itself failed (the change is over, `failed`)."""
        slot = self.slots[name]
        if slot.fallback:
            self._finish(slot, "failed", error)
            return None
        slot.fallback, slot.since = True, self.clock()
        slot.reason = f"{slot.reason}; fell back: {error}" if slot.reason else error
        return slot.setting

    def abort(self, name: str, error: str) -> Record:
        """The change could not go on (the proxy stopped answering): over, `failed`."""
        return self._finish(self.slots[name], "failed", error)

    def _finish(self, slot: Slot, outcome: ChangeResult, error: str = "") -> Record:
        now = self.clock()
        target = slot.target or slot.setting
        record = Record(
            server=slot.name, before=slot.setting.label, after=target.label, outcome=outcome,
            took_s=round(now - slot.started, 3), reason=slot.reason, error=error, at=now,
        )  # fmt: skip
        if outcome == "done":
            slot.setting = target
        slot.changed_at = now  # a failed depth waits out the dwell too: no retry storm
        slot.phase, slot.since, slot.target, slot.fallback = "serving", now, None, False
        self.outcomes[outcome] += 1
        self.history = [*self.history, record][-_HISTORY:]
        return record

    def restarting_into(self, name: str) -> Setting:
        """The flags the server runs (or is starting) with: the fallback's are the last good."""
        slot = self.slots[name]
        return slot.setting if slot.fallback or slot.target is None else slot.target

    def servers(self) -> list[ServerState]:
        """The planner's view: a server in a change counts at the setting it restarts into."""
        return [
            ServerState(
                name=s.name, setting=self.restarting_into(s.name),
                startup_s=self.restart_times.charged(s.name, s.startup_s),
                state="serving" if s.phase == "serving" else (
                    "draining" if s.phase == "draining" else "starting"),
                changed_at=s.changed_at,
            )
            for s in self.slots.values()
        ]  # fmt: skip

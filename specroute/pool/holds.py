"""Backends taken out of routing by the launcher's actuator while it changes their depth:
draining (its streams finish, nothing new is sent) or restarting (down on purpose), each with
the change it is part of, so a planned restart is never mistaken for an outage."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Literal

import msgspec

__all__ = ["BACKEND_STATES", "BackendState", "Hold", "HoldState", "Holds"]

HoldState = Literal["draining", "restarting"]
BackendState = Literal["serving", "draining", "restarting", "down"]
"""What a backend is doing, as logs, `/pool`, `specroute_backend_state` and the dashboard say:
a restarting backend failing its health checks is restarting, not down."""
BACKEND_STATES: tuple[BackendState, ...] = ("serving", "draining", "restarting", "down")


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """One backend held: in which state, since when (monotonic seconds), and the change it
    is part of (the setting it moves to, e.g. `k3`, and the plan's reason), as the actuator
    said."""

    state: HoldState
    since: float
    to: str = ""
    reason: str = ""


class Holds:
    """Which backends are held, how and since when."""

    def __init__(self) -> None:
        self._held: dict[str, Hold] = {}

    def hold(
        self,
        name: str,
        state: HoldState,
        now: float | None = None,
        *,
        to: str = "",
        reason: str = "",
    ) -> None:
        """Hold `name` in `state`; holding it again in the same state keeps its `since` (and
        its change, unless this one names another)."""
        held = self._held.get(name)
        if held is None or held.state != state:
            since = time.monotonic() if now is None else now
            self._held[name] = Hold(state=state, since=since, to=to, reason=reason)
        elif (to or reason) and (to, reason) != (held.to, held.reason):
            self._held[name] = msgspec.structs.replace(held, to=to, reason=reason)

    def release(self, name: str) -> None:
        self._held.pop(name, None)

    def get(self, name: str) -> Hold | None:
        return self._held.get(name)

    def state(self, name: str) -> HoldState | None:
        held = self._held.get(name)
        return None if held is None else held.state

    def since(self, name: str) -> float | None:
        held = self._held.get(name)
        return None if held is None else held.since

    def state_of(self, name: str, healthy: bool) -> BackendState:
        """The backend's state: restarting while held so, whatever its health checks say (a
        restart fails them on purpose); else down when unhealthy, even while draining (a
        drain keeps the server up); else draining or serving."""
        held = self.state(name)
        if held == "restarting":
            return "restarting"
        if not healthy:
            return "down"
        return held or "serving"

    def excluding(self, exclude: Collection[str]) -> Collection[str]:
        """`exclude` plus every held backend: a policy is never offered one."""
        if not self._held:
            return exclude
        return {*exclude, *self._held}

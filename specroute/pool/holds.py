"""Backends taken out of routing by the launcher's actuator while it changes their depth:
draining (its streams finish, nothing new is sent) or restarting (down on purpose)."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Literal

__all__ = ["HoldState", "Holds"]

HoldState = Literal["draining", "restarting"]


class Holds:
    """Which backends are held and since when (monotonic seconds)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[HoldState, float]] = {}

    def hold(self, name: str, state: HoldState, now: float | None = None) -> None:
        """Hold `name` in `state`; holding it again in the same state keeps its `since`."""
        held = self._held.get(name)
        if held is None or held[0] != state:
            self._held[name] = (state, time.monotonic() if now is None else now)

    def release(self, name: str) -> None:
        self._held.pop(name, None)

    def state(self, name: str) -> HoldState | None:
        held = self._held.get(name)
        return None if held is None else held[0]

    def since(self, name: str) -> float | None:
        held = self._held.get(name)
        return None if held is None else held[1]

    def excluding(self, exclude: Collection[str]) -> Collection[str]:
        """`exclude` plus every held backend: a policy is never offered one."""
        if not self._held:
            return exclude
        return {*exclude, *self._held}

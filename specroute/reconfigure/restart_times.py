"""The restart time each server has shown: every restart the loop carries out is timed from its
`restarting` hold to /ready again, and the planner is charged the server's own recent figure
(the configured or profile start-up until the server has restarted once). A weight cache, a warm
page cache or a slow disk change it per server; a constant would not."""

from __future__ import annotations

from collections import deque
from statistics import median

import structlog

__all__ = ["RECENT", "RestartTimes"]

log = structlog.get_logger()

RECENT = 3
"""Restarts per server the charge is the median of: one slow outlier does not swing it."""


class RestartTimes:
    """Seconds each server took to come back, newest last, at most `RECENT` of them."""

    def __init__(self, recent: int = RECENT) -> None:
        self.recent = recent
        self._seen: dict[str, deque[float]] = {}

    def observe(self, name: str, seconds: float) -> None:
        """One restart of `name` took `seconds` from its restart to ready."""
        seen = self._seen.setdefault(name, deque(maxlen=self.recent))
        seen.append(seconds)
        log.info("restart_timed", server=name, took_s=round(seconds, 1),
                 charged_s=round(median(seen), 1), restarts_seen=len(seen))  # fmt: skip

    def seen(self, name: str) -> tuple[float, ...]:
        """The restarts of `name` kept, oldest first."""
        return tuple(self._seen.get(name, ()))

    def charged(self, name: str, configured_s: float) -> float:
        """The restart time the planner charges `name`: the median of its recent restarts,
        else `configured_s` (what the launch measured or the profile says)."""
        seen = self._seen.get(name)
        return median(seen) if seen else configured_s

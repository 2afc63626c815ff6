"""A per-backend circuit breaker: open after consecutive failures, or at once when a request
stalls or gets a bad reply; one trial after a pause."""

from __future__ import annotations

import enum

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Pure state machine; the caller passes `now` (monotonic seconds). `stalled` holds from a
    stall until a request succeeds (or the backend passes its health checks again after
    failing them): the backend counts as unhealthy meanwhile."""

    __slots__ = (
        "_failures",
        "_opened_at",
        "_trial_out",
        "open_s",
        "stalled",
        "state",
        "threshold",
    )

    def __init__(self, threshold: int, open_s: float) -> None:
        self.threshold = threshold
        self.open_s = open_s
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_out = False
        self.stalled = False

    def allows(self, now: float) -> bool:
        """May a request be sent now? (Half-open lets exactly one trial through.)"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and now - self._opened_at >= self.open_s:
            self.state = BreakerState.HALF_OPEN
            self._trial_out = False
        return self.state is BreakerState.HALF_OPEN and not self._trial_out

    def on_send(self) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self._trial_out = True

    def on_success(self) -> None:
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._trial_out = False
        self.stalled = False

    def on_failure(self, now: float) -> None:
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self.threshold:
            self.state = BreakerState.OPEN
            self._opened_at = now
            self._trial_out = False

    def on_stall(self, now: float) -> None:
        """A request waited past its limit (it held its client for that long), or the backend
        answered what the route does not promise: one is enough to open the circuit."""
        self.stalled = True
        self._failures = max(self._failures + 1, self.threshold)
        self.state = BreakerState.OPEN
        self._opened_at = now
        self._trial_out = False

    def on_abandon(self) -> None:
        """The request ended with no verdict (the client left): let another trial through."""
        self._trial_out = False

    def reset(self) -> None:
        """A backend that passed its health checks again starts with a clean record."""
        self.on_success()

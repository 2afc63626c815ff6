"""The last routing decisions, for `GET /pool`, the dashboard and the demo: a bounded ring."""

from __future__ import annotations

import collections
import time
from typing import Any

__all__ = ["RecentDecisions"]


class RecentDecisions:
    """Appending is one tuple on the request path; rendering happens only when asked."""

    __slots__ = ("_ring",)

    def __init__(self, size: int = 100) -> None:
        self._ring: collections.deque[tuple[float, str, str, str, int | None, str, str]] = (
            collections.deque(maxlen=size)
        )

    def record(
        self,
        request_id: str,
        workload_class: str,
        backend: str,
        steps: int | None,
        policy: str,
        reason: str,
    ) -> None:
        self._ring.append(
            (time.monotonic(), request_id, workload_class, backend, steps, policy, reason)
        )

    def render(self) -> list[dict[str, Any]]:
        """Newest first, with each decision's age in seconds."""
        now = time.monotonic()
        return [
            {
                "age_s": round(now - at, 3),
                "request_id": request_id,
                "workload_class": klass,
                "backend": backend,
                "steps": steps,
                "policy": policy,
                "reason": reason,
            }
            for at, request_id, klass, backend, steps, policy, reason in reversed(self._ring)
        ]

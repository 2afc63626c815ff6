"""Which requests get their `request_finished` log line: every failure, and an evenly spaced
share of the rest (`request_log_share`), so a busy proxy's log stays a size an operator keeps."""

from __future__ import annotations

__all__ = ["RequestLogSampler"]


class RequestLogSampler:
    """Pure and deterministic: with share 0.25, every fourth success is logged, not a random
    quarter; with 1.0 (the default) every request, with 0.0 only failures."""

    __slots__ = ("_successes", "share")

    def __init__(self, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError("request_log_share must be between 0 and 1")
        self.share = share
        self._successes = 0

    def keep(self, *, failed: bool) -> bool:
        """Whether this request's line is written; `failed`: an error status or message."""
        if failed or self.share >= 1.0:
            return True
        before = int(self._successes * self.share)
        self._successes += 1
        return int(self._successes * self.share) > before

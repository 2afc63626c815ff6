"""Injected failures, so clients and proxies can be tested against a misbehaving backend.

Each `--fail-rate`, `--exit-*`, `--stall-after-tokens`, `--not-ready-for` and
`--malformed-sse-rate` option maps to one decision here; draws use their own PRNG seeded from
`--seed`, so a run's faults repeat with the same seed and request order.
"""

from __future__ import annotations

import os
import random
import time

import structlog

from specroute.emulator.options import EmulatorOptions

__all__ = ["EXIT_STATUS", "MALFORMED_EVENT", "Faults"]

log = structlog.get_logger()

EXIT_STATUS = 3
"""Status of a deliberate hard exit, distinct from a crash (1) and a usage error (2)."""

MALFORMED_EVENT = b'data: {"id":"malformed","object":"chat.completion.chunk","choices":[{"ind\n\n'
"""A `data:` line whose JSON is cut short, as a broken proxy or a torn write would leave it."""


class Faults:
    """The fault options of one server and the little state they need."""

    def __init__(self, options: EmulatorOptions) -> None:
        self.options = options
        self._rng = random.Random(f"faults-{options.seed}")
        self._requests = 0
        self._ready_at = time.monotonic() + options.not_ready_for

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self._ready_at

    def restart_clock(self) -> None:
        """Start the not-ready window when the server starts listening."""
        self._ready_at = time.monotonic() + self.options.not_ready_for

    def admit(self) -> bool:
        """Count one generation request; False means answer it with a 500.

        With `--exit-after-requests N`, receiving request N + 1 ends the process at once.
        """
        self._requests += 1
        limit = self.options.exit_after_requests
        if limit is not None and self._requests > limit:
            self.exit("exit_after_requests", requests=limit)
        rate = self.options.fail_rate
        return not (rate and self._rng.random() < rate)

    def malformed_stream(self) -> bool:
        """Whether this stream emits one broken `data:` line after its first content."""
        rate = self.options.malformed_sse_rate
        return bool(rate) and self._rng.random() < rate

    @property
    def stream_limit(self) -> int | None:
        """Tokens a stream may send (a non-streamed request generate) before
        `--exit-mid-stream...` or `--stall...` acts."""
        limits = [
            n
            for n in (self.options.exit_mid_stream_after_tokens, self.options.stall_after_tokens)
            if n is not None
        ]
        return min(limits) if limits else None

    def limit_reached(self, sent_tokens: int) -> None:
        """The stream has sent `stream_limit` tokens: exit if asked to, else (stall) return."""
        limit = self.options.exit_mid_stream_after_tokens
        if limit is not None and sent_tokens >= limit:
            self.exit("exit_mid_stream", tokens=sent_tokens)

    @staticmethod
    def exit(reason: str, **data: int) -> None:
        """Die like a crashed server: no shutdown, no flush of open responses."""
        log.warning("fault_exit", reason=reason, status=EXIT_STATUS, **data)
        os._exit(EXIT_STATUS)

"""The proxy's own `/metrics`, rendered at most once per interval however many ask: a request
that comes sooner waits for the next rendering, which then answers every request waiting, so an
answer counts everything that happened before its request and a flood costs one render."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["PacedRender"]


class PacedRender:
    """`render()` at most once per `interval_s` (0: on every call), shared by the callers."""

    __slots__ = ("_clock", "_interval_s", "_last", "_next", "_render", "renders")

    def __init__(
        self,
        render: Callable[[], bytes],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._render = render
        self._interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._next: asyncio.Future[bytes] | None = None
        self.renders = 0

    async def get(self) -> bytes:
        """A rendering begun no earlier than this call."""
        if self._next is None:
            now = self._clock()
            wait = 0.0 if self._last is None else self._last + self._interval_s - now
            if wait <= 0:
                return self._now()
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            loop.call_later(wait, self._due, self._next)
        # Shielded: a waiter that gives up must not cancel the rendering the others wait for.
        return await asyncio.shield(self._next)

    def _now(self) -> bytes:
        self._last = self._clock()
        self.renders += 1
        return self._render()

    def _due(self, future: asyncio.Future[bytes]) -> None:
        self._next = None
        try:
            future.set_result(self._now())
        except Exception as exc:  # each waiter's request fails with it, through its handler
            future.set_exception(exc)

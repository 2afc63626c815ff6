"""The cap on request-body bytes the proxy holds at once, all requests together: a request
reserves its body's bytes before it reads them (its declared length at once, or chunk by chunk),
waits briefly in line when there is no room, else gets a 503, and gives them back when it ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from specroute.errors import ServiceUnavailableError

__all__ = ["BODY_MEMORY_FULL", "BodyBudget", "BodyHold"]

BODY_MEMORY_FULL = "body_memory_full"
"""The error code of the 503 a request gets when no room came within the wait."""


class BodyBudget:
    """Bytes held for request bodies under `limit`. Waiters are served in order, so a large
    body is not passed over forever by small ones; each waits at most `wait_s`."""

    __slots__ = ("_limit", "_retry_after_s", "_wait_s", "_waiters", "in_use")

    def __init__(self, limit: int, wait_s: float, retry_after_s: float = 1.0) -> None:
        self._limit = limit
        self._wait_s = wait_s
        self._retry_after_s = retry_after_s
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.in_use = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def hold(self) -> BodyHold:
        """One request's share, empty until it reads; release it in `finally`."""
        return BodyHold(self)

    async def reserve(self, size: int) -> None:
        """Take `size` bytes, waiting in line for room up to `wait_s`, then a 503."""
        if not self._waiters and self.in_use + size <= self._limit:
            self.in_use += size
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        granted = False
        try:
            async with asyncio.timeout(self._wait_s):
                await waiter
            granted = True
        except TimeoutError:
            raise ServiceUnavailableError(
                f"request bodies in flight are at the limit of {self._limit} bytes; retry later",
                code=BODY_MEMORY_FULL,
                retry_after=self._retry_after_s,
            ) from None
        finally:
            if not granted:
                if waiter.done() and not waiter.cancelled():
                    self.give_back(size)  # granted just as the wait ended
                else:
                    waiter.cancel()
                    with contextlib.suppress(ValueError):  # `_wake` may have dropped it
                        self._waiters.remove(entry)
                    self._wake()  # the next in line may fit now

    def give_back(self, size: int) -> None:
        """Return `size` bytes and let waiters that now fit in."""
        self.in_use -= size
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            size, waiter = waiters[0]
            if waiter.done():  # cancelled with its task, which has not run on yet
                waiters.popleft()
                continue
            if self.in_use + size > self._limit:
                return
            waiters.popleft()
            self.in_use += size
            waiter.set_result(None)


class BodyHold:
    """The bytes one request holds; `release()` is idempotent."""

    __slots__ = ("_budget", "held")

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.held = 0

    async def take(self, size: int) -> None:
        """Reserve `size` more bytes, waiting for room (ServiceUnavailableError past the wait)."""
        if size > 0:
            await self._budget.reserve(size)
            self.held += size

    def release(self) -> None:
        held, self.held = self.held, 0
        if held:
            self._budget.give_back(held)

"""A policy pinned to one depth (`static:steps=K`) in a pool with no backend at that depth gets a
warning, once for each set of depths discovery finds: `serve` learns depths from /server_info
as backends come up, so it warns instead of refusing to start (`launch` knows them: it refuses)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from specroute.policies import Policy, pinned_depth
from specroute.pool import Pool
from specroute.tasks import cancel

__all__ = ["DepthWatch"]

log = structlog.get_logger()


class DepthWatch:
    """Compares the policy's pinned depth with the depths discovered, every `every_s`."""

    def __init__(self, pool: Pool, every_s: float) -> None:
        self._pool = pool
        self._every_s = every_s
        self._warned: tuple[int, frozenset[int]] | None = None
        self._task: asyncio.Task[None] | None = None

    def check(self, policy: Policy) -> bool:
        """Warn if `policy` pins a depth that no discovered backend has; True when it warned
        just now (the same depths found again do not warn twice)."""
        wanted = pinned_depth(policy)
        backends = self._pool.backends
        found = frozenset(b.steps for b in backends if b.steps is not None)
        if wanted is None or not found or wanted in found:
            self._warned = None
            return False
        if self._warned == (wanted, found):
            return False
        self._warned = (wanted, found)
        log.warning(
            "policy_depth_missing",
            policy=policy.name,
            depth=wanted,
            depths=sorted(found),
            undiscovered=sorted(b.name for b in backends if b.steps is None),
            using="the nearest depth with room",
        )
        return True

    def start(self, current: Callable[[], Policy]) -> None:
        """Check now (the pool has had its first look) and then every `every_s`, with the
        policy of the moment (PUT /policy may change it)."""
        self._task = asyncio.create_task(self._run(current), name="depth-watch")

    async def _run(self, current: Callable[[], Policy]) -> None:
        while True:
            self.check(current())
            await asyncio.sleep(self._every_s)

    async def stop(self) -> None:
        await cancel([self._task])
        self._task = None

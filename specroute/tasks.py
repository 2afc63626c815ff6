"""Background asyncio tasks: stopping them the one way every part does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel"]


async def cancel(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task, then wait for each to finish; the cancellation they end with is
    expected and swallowed, any other error comes through. None entries are skipped."""
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task

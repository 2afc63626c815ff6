"""A watch on a streaming client's reading pace. A client that stops reading but keeps its
connection open would otherwise hold a backend slot for as long as it likes: once a write to it
has been blocked for a whole period, its stream is ended and the backend freed."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["SendWatch"]


class SendWatch:
    """Set `sending` around each write and count it in `sent`; a write blocked through two
    consecutive checks `limit_s` apart cancels `task` and sets `stalled`."""

    __slots__ = ("_handle", "_limit_s", "_seen", "_task", "sending", "sent", "stalled")

    def __init__(self, task: asyncio.Task[Any], limit_s: float) -> None:
        self._task = task
        self._limit_s = limit_s
        self.sending = False
        self.sent = 0
        self.stalled = False
        self._seen = -1  # no write is blocked at the first check
        self._handle = asyncio.get_running_loop().call_later(limit_s, self._check)

    def _check(self) -> None:
        if self.sending and self.sent == self._seen:
            self.stalled = True
            self._task.cancel()
            return
        self._seen = self.sent
        self._handle = asyncio.get_running_loop().call_later(self._limit_s, self._check)

    def close(self) -> None:
        self._handle.cancel()

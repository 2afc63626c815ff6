"""The proxy process's own health as Prometheus gauges: event-loop lag (how late a short timer
fires: the wait every request's next step suffers), open file descriptors and resident memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
from pathlib import Path

__all__ = ["ProcessMonitor"]

_INTERVAL_S = 0.25
_PAGE = resource.getpagesize()


def _open_fds() -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd"))
    return None


def _rss_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    return None


class ProcessMonitor:
    """Samples event-loop lag in the background; `render()` reports the last and the worst lag
    since the previous scrape, and reads descriptors and memory at scrape time."""

    def __init__(self, interval_s: float = _INTERVAL_S) -> None:
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None
        self.last_lag_s = 0.0
        self.max_lag_s = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self._interval)
            lag = max(0.0, time.perf_counter() - before - self._interval)
            self.last_lag_s = lag
            self.max_lag_s = max(self.max_lag_s, lag)

    def render(self) -> list[str]:
        worst, self.max_lag_s = self.max_lag_s, self.last_lag_s
        lines = [
            "# HELP specroute_event_loop_lag_seconds How late a timer fired (last; max since "
            "the previous scrape).",
            "# TYPE specroute_event_loop_lag_seconds gauge",
            f'specroute_event_loop_lag_seconds{{stat="last"}} {self.last_lag_s:.6f}',
            f'specroute_event_loop_lag_seconds{{stat="max"}} {worst:.6f}',
        ]
        for name, doc, value in (
            ("specroute_process_open_fds", "Open file descriptors.", _open_fds()),
            ("specroute_process_resident_memory_bytes", "Resident memory.", _rss_bytes()),
        ):
            if value is not None:
                lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name} {value}"]
        return lines

"""The proxy process's own health as Prometheus gauges: event-loop lag (how late a short timer
fires: the wait every request's next step suffers), open file descriptors and resident memory."""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from specroute.looplag import LoopLagSampler

__all__ = ["LAG_WINDOW_S", "ProcessMonitor", "TrailingMax"]

_INTERVAL_S = 0.25
LAG_WINDOW_S = 60.0
"""The worst lag reported is the worst of this many trailing seconds, whoever scrapes."""
_PAGE = resource.getpagesize()


def _open_fds() -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd"))
    return None


def _rss_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    return None


class TrailingMax:
    """The largest value added in the last `window_s` seconds of `clock`; reading it changes
    nothing that another reader would see."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window_s
        self._clock = clock
        # (time, value) with values strictly decreasing: the head is the window's maximum.
        self._peaks: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, value: float) -> None:
        now = self._clock()
        peaks = self._peaks
        while peaks and peaks[-1][1] <= value:
            peaks.pop()
        peaks.append((now, value))
        self._expire(now)

    def value(self) -> float:
        """0.0 when nothing was added within the window."""
        self._expire(self._clock())
        return self._peaks[0][1] if self._peaks else 0.0

    def _expire(self, now: float) -> None:
        peaks = self._peaks
        while peaks and peaks[0][0] <= now - self._window:
            peaks.popleft()


class ProcessMonitor:
    """A `prometheus_client` collector: samples event-loop lag in the background, and reports
    the last lag, the worst of the trailing `window_s`, descriptors and memory when scraped."""

    def __init__(
        self,
        interval_s: float = _INTERVAL_S,
        *,
        window_s: float = LAG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sampler = LoopLagSampler(interval_s, self.record)
        self._window_s = window_s
        self._worst = TrailingMax(window_s, clock)
        self.last_lag_s = 0.0

    def start(self) -> None:
        self._sampler.start()

    async def stop(self) -> None:
        await self._sampler.stop()

    def record(self, lag_s: float) -> None:
        """One lag measurement (the sampler's callback)."""
        self.last_lag_s = lag_s
        self._worst.add(lag_s)

    @property
    def max_lag_s(self) -> float:
        return self._worst.value()

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "specroute_event_loop_lag_seconds",
            f"How late a timer fired (last; max over the last {self._window_s:g} s).",
            labels=("stat",),
        )
        lag.add_metric(("last",), self.last_lag_s)
        lag.add_metric(("max",), self.max_lag_s)
        yield lag
        for name, doc, value in (
            ("specroute_process_open_fds", "Open file descriptors.", _open_fds()),
            ("specroute_process_resident_memory_bytes", "Resident memory.", _rss_bytes()),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)

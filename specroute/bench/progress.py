"""Progress of long bench work on stderr: a live line redrawn on a terminal; otherwise (CI, nohup,
a pipe) a plain line every `every_s` seconds and one as each level ends."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from specroute.bench.client import RequestRecord

__all__ = ["Progress"]


class Progress:
    """Counts finished requests of the current level. `enabled` (default: stderr is a terminal)
    selects the live line, redrawn at most ten times a second; without it, `every_s` (None:
    silent, as the Python API's default) spaces the plain lines."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._stream = stream or sys.stderr
        self.enabled = self._stream.isatty() if enabled is None else enabled
        self._every_s = every_s
        self._clock = clock
        self._label = ""
        self._total: int | None = None
        self._done = self._errors = self._tokens = 0
        self._started = self._drawn = 0.0

    @property
    def _periodic(self) -> bool:
        return not self.enabled and self._every_s is not None

    def level(self, label: str, total: int | None) -> None:
        self._level_ended()
        self._label, self._total = label, total
        self._done = self._errors = self._tokens = 0
        self._started = self._drawn = self._clock()
        self._draw(force=True)

    def done(self, record: RequestRecord) -> None:
        self._done += 1
        self._errors += 0 if record.ok else 1
        self._tokens += record.completion_tokens
        self._draw()

    def close(self) -> None:
        self._level_ended()
        if self.enabled:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()

    def _status(self, now: float) -> str:
        elapsed = max(1e-9, now - self._started)
        total = f"/{self._total}" if self._total else ""
        return (
            f"{self._label}: {self._done}{total} requests, {self._errors} errors, "
            f"{self._tokens / elapsed:,.0f} tok/s, {elapsed:.0f} s"
        )

    def _level_ended(self) -> None:
        if self._periodic and self._label:
            self._stream.write(self._status(self._clock()) + ", level done\n")
            self._stream.flush()
        self._label = ""

    def _draw(self, *, force: bool = False) -> None:
        now = self._clock()
        if self.enabled:
            if force or now - self._drawn >= 0.1:
                self._drawn = now
                self._stream.write("\r\x1b[2K" + self._status(now))
                self._stream.flush()
        elif self._every_s is not None and now - self._drawn >= self._every_s:
            self._drawn = now
            self._stream.write(self._status(now) + "\n")
            self._stream.flush()

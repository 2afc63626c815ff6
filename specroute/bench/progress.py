"""A one-line live progress display on stderr, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from specroute.bench.client import RequestRecord

__all__ = ["Progress"]


class Progress:
    """Counts finished requests of the current level and redraws at most ten times a second."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self._stream = stream or sys.stderr
        self.enabled = self._stream.isatty() if enabled is None else enabled
        self._label = ""
        self._total: int | None = None
        self._done = self._errors = self._tokens = 0
        self._started = self._drawn = 0.0

    def level(self, label: str, total: int | None) -> None:
        self._label, self._total = label, total
        self._done = self._errors = self._tokens = 0
        self._started = time.perf_counter()
        self._draw(force=True)

    def done(self, record: RequestRecord) -> None:
        self._done += 1
        self._errors += 0 if record.ok else 1
        self._tokens += record.completion_tokens
        self._draw()

    def close(self) -> None:
        if self.enabled:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()

    def _draw(self, *, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._drawn < 0.1):
            return
        self._drawn = now
        elapsed = max(1e-9, now - self._started)
        total = f"/{self._total}" if self._total else ""
        self._stream.write(
            f"\r\x1b[2K{self._label}: {self._done}{total} requests, {self._errors} errors, "
            f"{self._tokens / elapsed:,.0f} tok/s, {elapsed:.0f} s"
        )
        self._stream.flush()

"""`specroute tune`'s progress over the whole plan: a bar with the ETA on a terminal, one line
per finished level otherwise. The ETA adds what is left of the sweeps (each level estimated by
the same level on the previous depth, else by the tokens it sends at the rate so far) and the
start-ups still to come (at the mean start-up seen)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TextIO

import msgspec

from specroute.bench.client import RequestRecord
from specroute.bench.progress import Progress

__all__ = ["LevelWork", "TuneProgress", "format_duration"]

_BAR = 24


class LevelWork(msgspec.Struct, frozen=True):
    """One level still to run: which server, traffic kind and concurrency, how many tokens."""

    server: str
    kind: str
    concurrency: int
    tokens: int


def format_duration(seconds: float | None) -> str:
    """`47s`, `3m05s`, `1h12m`; `?` when unknown."""
    if seconds is None:
        return "?"
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class TuneProgress(Progress):
    """Told the levels ahead (`plan`), which server and traffic run (`server`, `kind`), and fed
    by the sweep like its own progress (`level`, `done`, `close`)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(stream, enabled=enabled)
        self._clock = clock
        self._todo: list[LevelWork] = []
        self._servers_left = 0
        self._startups: list[float] = []
        self._seen: dict[tuple[str, int], float] = {}
        self._tokens_done = 0
        self._level_time = 0.0
        self._current: LevelWork | None = None
        self._level_started = 0.0
        self._level_requests = (0, 0)
        self._server = self._kind = ""
        self._started = clock()
        self._line_at = 0.0

    def plan(self, levels: Sequence[LevelWork], servers: int) -> None:
        self._todo, self._servers_left = list(levels), servers
        self._started = self._clock()

    def server(self, label: str) -> None:
        self._server = label

    def started(self, label: str, seconds: float) -> None:
        """A server became ready after `seconds`."""
        self._startups.append(seconds)
        self._servers_left = max(0, self._servers_left - 1)

    def kind(self, name: str) -> None:
        self._kind = name

    def loading(self, label: str, seconds: float, log: str) -> None:
        if self.enabled:
            self._write(f"{self._prefix()} {label} loading {format_duration(seconds)} ({log})")
        else:
            self._say(f"  {label}: loading, {seconds:.0f} s")

    # The sweep's calls ---------------------------------------------------------------------
    def level(self, label: str, total: int | None) -> None:
        self._finish_level()
        shape = label.rsplit(" ", 1)[-1]
        concurrency = int(shape[2:]) if shape.startswith("C=") else 0
        match = next(
            (
                w
                for w in self._todo
                if (w.server, w.kind, w.concurrency) == (self._server, self._kind, concurrency)
            ),
            None,
        )
        if match is not None:
            self._todo.remove(match)
        self._current = match
        self._level_started = self._clock()
        self._level_requests = (0, total or 0)
        self._draw_bar(force=True)

    def done(self, record: RequestRecord) -> None:
        done, total = self._level_requests
        self._level_requests = (done + 1, total)
        self._tokens_done += record.completion_tokens
        self._draw_bar()

    def close(self) -> None:
        """The end of one sweep (one server, one traffic kind)."""
        self._finish_level()
        if self.enabled:
            self._write("")

    # Estimates -----------------------------------------------------------------------------
    def _rate(self) -> float | None:
        return self._tokens_done / self._level_time if self._level_time > 0 else None

    def _estimate(self, work: LevelWork) -> float | None:
        seen = self._seen.get((work.kind, work.concurrency))
        if seen is not None:
            return seen
        rate = self._rate()
        return work.tokens / rate if rate else None

    def remaining_s(self) -> float | None:
        """Seconds left over the whole plan, None until there is a rate to go by."""
        total = 0.0
        for work in self._todo:
            estimate = self._estimate(work)
            if estimate is None:
                return None
            total += estimate
        if self._current is not None:
            estimate = self._estimate(self._current)
            if estimate is None:
                return None
            total += max(0.0, estimate - (self._clock() - self._level_started))
        if self._servers_left:
            mean = sum(self._startups) / len(self._startups) if self._startups else 0.0
            total += mean * self._servers_left
        return total

    def _finish_level(self) -> None:
        if self._current is None:
            return
        seconds = self._clock() - self._level_started
        self._level_time += seconds
        work, self._current = self._current, None
        self._seen[(work.kind, work.concurrency)] = seconds
        if not self.enabled:
            done, _ = self._level_requests
            self._say(
                f"  {work.server} {work.kind} C={work.concurrency}: {done} requests in "
                f"{seconds:.1f} s | {self._percent()} | ETA {format_duration(self.remaining_s())}"
            )

    # Rendering -----------------------------------------------------------------------------
    def _percent(self) -> str:
        left = self.remaining_s()
        elapsed = self._clock() - self._started
        if left is None:
            return "?%"
        return f"{elapsed / max(1e-9, elapsed + left):.0%}"

    def _prefix(self) -> str:
        left = self.remaining_s()
        elapsed = self._clock() - self._started
        share = elapsed / (elapsed + left) if left is not None and elapsed + left > 0 else 0.0
        filled = round(share * _BAR)
        bar = "#" * filled + "-" * (_BAR - filled)
        return (
            f"tune [{bar}] {self._percent()} {format_duration(elapsed)} "
            f"ETA {format_duration(left)} |"
        )

    def _draw_bar(self, *, force: bool = False) -> None:
        now = self._clock()
        if not self.enabled or (not force and now - self._line_at < 0.2):
            return
        self._line_at = now
        done, total = self._level_requests
        where = f"{self._server} {self._kind}"
        if self._current is not None:
            where += f" C={self._current.concurrency}"
        self._write(f"{self._prefix()} {where} {done}/{total}")

    def _write(self, text: str) -> None:
        self._stream.write("\r\x1b[2K" + text)
        self._stream.flush()

    def _say(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def say(self, text: str) -> None:
        """A line of its own, above the bar."""
        if self.enabled:
            self._write("")
        self._say(text)

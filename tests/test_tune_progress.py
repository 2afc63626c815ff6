"""The tune's progress over the whole plan: the ETA from levels seen, tokens left and start-ups
to come; a line per finished level when the output is not a terminal."""

from __future__ import annotations

import io

import pytest

from specroute.bench.client import RequestRecord
from specroute.tune.progress import LevelWork, TuneProgress, format_duration


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(tokens: int) -> RequestRecord:
    return RequestRecord(index=0, klass="greedy", greedy=True, scheduled=0.0, sent=0.0,
                         completion_tokens=tokens)  # fmt: skip


def _plan(progress: TuneProgress) -> None:
    work = [
        LevelWork(s, "greedy", c, tokens=3 * c * 10) for s in ("steps1", "steps2") for c in (1, 4)
    ]
    progress.plan(work, servers=2)


def test_the_eta_adds_levels_seen_tokens_left_at_the_rate_so_far_and_start_ups() -> None:
    clock, out = Clock(), io.StringIO()
    progress = TuneProgress(out, enabled=False, clock=clock)
    _plan(progress)
    assert progress.remaining_s() is None  # no rate yet
    progress.server("steps1")
    clock.now = 20.0
    progress.started("steps1", 20.0)
    progress.kind("greedy")
    progress.level("steps1 C=1", 3)
    for _ in range(3):
        progress.done(_record(15))
    clock.now = 23.0  # 45 tokens in 3 s: 15 tok/s
    progress.level("steps1 C=4", 12)
    clock.now = 25.0
    # Now: C=4 here 120 tokens at 15 tok/s, 2 s gone (6 s left); steps2: C=1 as seen here (3 s),
    # C=4 at the rate (8 s); one start-up at the mean seen (20 s).
    assert progress.remaining_s() == pytest.approx(6 + 3 + 8 + 20)
    progress.close()
    assert "steps1 greedy C=1: 3 requests in 3.0 s" in out.getvalue()
    assert "ETA" in out.getvalue()


def test_a_level_the_plan_does_not_list_changes_no_estimate() -> None:
    clock = Clock()
    progress = TuneProgress(io.StringIO(), enabled=False, clock=clock)
    _plan(progress)
    progress.server("steps1")
    progress.started("steps1", 5.0)
    progress.kind("greedy")
    progress.level("steps1 C=1", 3)
    progress.done(_record(30))
    clock.now = 3.0
    progress.level("steps1 C=7", 3)  # not in the plan: it changes no estimate
    clock.now = 6.0
    progress.close()
    assert progress.remaining_s() == pytest.approx(12 + 3 + 12 + 5)


def test_a_terminal_gets_one_redrawn_bar() -> None:
    clock, out = Clock(), io.StringIO()
    progress = TuneProgress(out, enabled=True, clock=clock)
    _plan(progress)
    progress.server("steps1")
    progress.kind("greedy")
    progress.level("steps1 C=1", 3)
    assert out.getvalue().startswith("\r\x1b[2Ktune [")
    assert "steps1 greedy C=1 0/3" in out.getvalue()
    assert "\n" not in out.getvalue()


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "?"), (4.4, "4s"), (185, "3m05s"), (4320, "1h12m")]
)
def test_durations_read_as_an_operator_would(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text

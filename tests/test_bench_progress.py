"""Bench progress in every mode: a redrawn line on a terminal, plain periodic lines and one per
finished level elsewhere, nothing from the Python API by default."""

from __future__ import annotations

import io

import pytest
from servers import refused_url

from specroute.bench.client import RequestRecord
from specroute.bench.progress import Progress
from specroute.cli import main


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ok(index: int) -> RequestRecord:
    return RequestRecord(index=index, scheduled=0.0, completion_tokens=10)


def test_off_a_terminal_a_line_every_interval_and_one_per_finished_level() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, every_s=10.0, clock=clock)
    assert not progress.enabled  # a StringIO is no terminal
    progress.level("target busy-32", None)
    for i in range(30):
        clock.now += 1.0
        progress.done(_ok(i))
    progress.level("target quiet-1", None)
    clock.now += 2.0
    progress.done(_ok(30))
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines == [
        "target busy-32: 10 requests, 0 errors, 10 tok/s, 10 s",
        "target busy-32: 20 requests, 0 errors, 10 tok/s, 20 s",
        "target busy-32: 30 requests, 0 errors, 10 tok/s, 30 s",
        "target busy-32: 30 requests, 0 errors, 10 tok/s, 30 s, level done",
        "target quiet-1: 1 requests, 0 errors, 5 tok/s, 2 s, level done",
    ]


def test_on_a_terminal_the_line_is_redrawn_in_place() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, enabled=True, every_s=10.0, clock=clock)
    progress.level("target C=4", 8)
    clock.now += 1.0
    progress.done(_ok(0))
    progress.close()
    text = stream.getvalue()
    assert "\n" not in text
    assert "\r\x1b[2Ktarget C=4: 1/8 requests, 0 errors, 10 tok/s, 1 s" in text


def test_the_python_api_default_is_silent() -> None:
    stream = io.StringIO()
    progress = Progress(stream, enabled=False)
    progress.level("target C=1", 3)
    progress.done(_ok(0))
    progress.close()
    assert stream.getvalue() == ""


def test_bench_trace_in_a_pipe_says_when_each_phase_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with refused_url() as url:
        main(["bench", "trace", "scenarios/policy-eval.toml", url, "--duration-scale", "0.002"])
    err = capsys.readouterr().err
    for phase in ("quiet-1", "light-8", "busy-32", "saturated-64"):
        assert f"target {phase}: " in err
    assert err.count(", level done") == 6

"""The bench's plots are readable: a trace's phases stay apart even when two have the same users,
and every latency line is labelled in a panel of its own target."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import start_emulator

from specroute.bench import load_scenario, run_trace
from specroute.bench.plots import save_plots
from specroute.bench.sweep import SweepResult

pytest.importorskip("matplotlib", reason="plots need the plot extra: pip install 'specroute[plot]'")

REPEATED = """
name = "repeated"
[[mix]]
name = "sampled"
temperature = 0.8
max_tokens = 8
[[phases]]
name = "quiet"
concurrency = 1
duration = 0.3
[[phases]]
name = "busy"
concurrency = 4
duration = 0.3
[[phases]]
name = "quiet-again"
concurrency = 1
duration = 0.3
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SweepResult]:
    path = tmp_path_factory.mktemp("trace") / "repeated.toml"
    path.write_text(REPEATED)
    with start_emulator(2, "--seed", "5", "--time-scale", "20") as server:
        yield asyncio.run(run_trace(load_scenario(path), server.url))


def _figures(monkeypatch: pytest.MonkeyPatch, result: SweepResult, tmp_path: Path) -> list[object]:
    """The figures `save_plots` drew, kept open to be read back."""
    import matplotlib.pyplot as plt

    kept: list[object] = []
    monkeypatch.setattr(plt, "close", kept.append)
    save_plots(result, tmp_path)
    return kept


def test_a_trace_plots_each_phase_in_order_even_with_repeated_users(
    trace: SweepResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    throughput, _ = _figures(monkeypatch, trace, tmp_path)
    for ax in throughput.axes:  # type: ignore[attr-defined]
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == [0, 1, 2]
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["quiet\nC=1", "busy\nC=4", "quiet-again\nC=1"]
    assert (tmp_path / "throughput.png").stat().st_size > 1000


def test_every_latency_line_is_labelled_in_its_targets_panel(
    trace: SweepResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, latency = _figures(monkeypatch, trace, tmp_path)
    for ax in latency.axes:  # type: ignore[attr-defined]
        assert ax.get_title().startswith("target: ")
        legend = ax.get_legend()
        assert legend is not None
        assert [t.get_text() for t in legend.get_texts()] == ["quiet", "busy", "quiet-again"]

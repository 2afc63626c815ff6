"""PNG plots of a sweep or a trace (matplotlib, through `specroute.plotting`): per-request and
aggregate tok/s per target, against concurrency for a sweep and phase by phase for a trace, and
latency distributions, one panel per target so that every line is labelled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specroute.bench.sweep import LevelResult, SweepResult
from specroute.plotting import pyplot

__all__ = ["save_plots"]

_TITLES = ("per-request tok/s", "aggregate tok/s")


def _finish(fig: Any, plt: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sweep_throughput(axes: Any, result: SweepResult) -> None:
    for target in result.targets:
        levels = sorted(
            (lv for lv in result.levels if lv.target == target.label and lv.rate is None),
            key=lambda lv: lv.concurrency,
        )
        xs = [lv.concurrency for lv in levels]
        for ax, attr in zip(axes, ("per_request_tok_s", "aggregate_tok_s"), strict=True):
            ys = [getattr(lv.summary, attr) for lv in levels]
            ax.plot(xs, ys, marker="o", label=target.label)
    ticks = sorted({lv.concurrency for lv in result.levels if lv.concurrency > 0})
    for ax, title in zip(axes, _TITLES, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrency")
        ax.set_title(title)


def _trace_throughput(axes: Any, result: SweepResult) -> None:
    """Phases in the order they ran: two phases with the same users stay two points."""
    phases = [lv for lv in result.levels if lv.target == result.targets[0].label]
    xs = list(range(len(phases)))
    labels = [f"{lv.phase}\n{_shape(lv)}" for lv in phases]
    for ax, attr, title in zip(
        axes, ("per_request_tok_s", "aggregate_tok_s"), _TITLES, strict=True
    ):
        ax.plot(xs, [getattr(lv.summary, attr) for lv in phases], marker="o", label="target")
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_xlabel("phase, in the order it ran")
        ax.set_title(title)


def _shape(level: LevelResult) -> str:
    return f"rate {level.rate:g}/s" if level.rate is not None else f"C={level.concurrency}"


def _throughput(plt: Any, result: SweepResult, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if result.kind == "trace":
        _trace_throughput(axes, result)
    else:
        _sweep_throughput(axes, result)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _finish(fig, plt, path)


def _latency(plt: Any, result: SweepResult, path: Path) -> None:
    """TTFT and TPOT CDFs, a column per target and a line per level, coloured from light (least
    load) to dark: at most a handful of labelled lines in any panel."""
    labels = [t.label for t in result.targets]
    fig, axes = plt.subplots(
        2, len(labels), figsize=(max(6.0, 3.6 * len(labels)), 6.4), squeeze=False
    )
    for col, label in enumerate(labels):
        levels = [lv for lv in result.levels if lv.target == label]
        colours = plt.cm.viridis_r(
            [0.15 + 0.8 * i / max(1, len(levels) - 1) for i in range(len(levels))]
        )
        for lv, colour in zip(levels, colours, strict=True):
            name = lv.phase or _shape(lv)
            ttft = sorted(r.ttft * 1e3 for r in lv.records if r.ok and r.ttft is not None)
            tpot = sorted(t * 1e3 for r in lv.records if r.ok and (t := r.tpot) is not None)
            for row, values in enumerate((ttft, tpot)):
                if values:
                    fractions = [(i + 1) / len(values) for i in range(len(values))]
                    axes[row][col].plot(values, fractions, color=colour, label=name)
        for row, metric in enumerate(("TTFT (ms)", "TPOT (ms)")):
            ax = axes[row][col]
            ax.set_title(f"{label}: {metric}", fontsize=9)
            ax.set_ylabel("fraction of requests" if col == 0 else "")
            ax.grid(alpha=0.3)
            if ax.get_lines():
                ax.legend(fontsize=7)
    _finish(fig, plt, path)


def save_plots(result: SweepResult, directory: str | Path) -> list[Path]:
    """Write `throughput.png` and `latency.png` into `directory`; return their paths (callers
    check `plotting.plots_missing()` before any work)."""
    plt = pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "throughput.png", out / "latency.png"]
    _throughput(plt, result, paths[0])
    _latency(plt, result, paths[1])
    return paths

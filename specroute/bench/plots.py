"""PNG plots of a sweep (matplotlib, imported only here and only when asked): per-request and
aggregate tok/s against concurrency per target, and latency distributions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specroute.bench.sweep import SweepResult
from specroute.plotting import pyplot

__all__ = ["save_plots"]


def _throughput(plt: Any, result: SweepResult, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for target in result.targets:
        levels = sorted(
            (lv for lv in result.levels if lv.target == target.label and lv.rate is None),
            key=lambda lv: lv.concurrency,
        )
        xs = [lv.concurrency for lv in levels]
        axes[0].plot(
            xs, [lv.summary.per_request_tok_s for lv in levels], marker="o", label=target.label
        )
        axes[1].plot(
            xs, [lv.summary.aggregate_tok_s for lv in levels], marker="o", label=target.label
        )
    ticks = sorted({lv.concurrency for lv in result.levels if lv.concurrency > 0})
    for ax, title in zip(axes, ("per-request tok/s", "aggregate tok/s"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _latency(plt: Any, result: SweepResult, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for lv in result.levels:
        name = f"{lv.target} {lv.phase or 'C=' + str(lv.concurrency)}"
        ttft = sorted(r.ttft * 1e3 for r in lv.records if r.ok and r.ttft is not None)
        tpot = sorted(t * 1e3 for r in lv.records if r.ok and (t := r.tpot) is not None)
        for ax, values in ((axes[0], ttft), (axes[1], tpot)):
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    for ax, title in zip(axes, ("TTFT (ms), CDF", "TPOT (ms), CDF"), strict=True):
        ax.set_title(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if len(result.levels) <= 15:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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

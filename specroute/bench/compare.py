"""`bench compare`: saved results side by side, each value with its ratio to the first result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from specroute.bench.levels import LevelSummary
from specroute.bench.report import format_grid
from specroute.bench.sweep import LevelResult, SweepResult

__all__ = ["METRICS", "level_key", "render_comparison"]

METRICS: tuple[tuple[str, Callable[[LevelSummary], float]], ...] = (
    ("per-request tok/s", lambda s: s.per_request_tok_s),
    ("aggregate tok/s", lambda s: s.aggregate_tok_s),
    ("TTFT p50 ms", lambda s: s.ttft.p50 * 1e3),
    ("TPOT p50 ms", lambda s: s.tpot.p50 * 1e3),
)


def level_key(level: LevelResult) -> str:
    """What lines up across results: the target and the phase, concurrency or rate."""
    if level.phase:
        return f"{level.target} {level.phase}"
    shape = f"C={level.concurrency}" if level.rate is None else f"{level.rate:g}/s"
    return f"{level.target} {shape}"


def _cell(value: float | None, base: float | None) -> str:
    if value is None:
        return "-"
    if base is None or base == 0 or value is base:
        return f"{value:,.1f}"
    return f"{value:,.1f} (x{value / base:.2f})"


def render_comparison(results: Sequence[tuple[str, SweepResult]], *, markdown: bool = False) -> str:
    """One grid per metric: a row per level key, a column per result, ratios to the first."""
    names = [Path(name).stem for name, _ in results]
    tables = [{level_key(lv): lv.summary for lv in result.levels} for _, result in results]
    keys = list(dict.fromkeys(k for table in tables for k in table))
    blocks = []
    for title, get in METRICS:
        rows = []
        for key in keys:
            values = [get(t[key]) if key in t else None for t in tables]
            base = values[0]
            rows.append(
                [key, *(_cell(v, base) if i else _cell(v, None) for i, v in enumerate(values))]
            )
        grid = format_grid(["level", *names], rows, markdown=markdown)
        blocks.append(f"### {title}\n\n{grid}" if markdown else f"{title}\n{grid}")
    return "\n\n".join(blocks)

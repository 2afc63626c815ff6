"""`bench compare`: saved results side by side, one column per target of each result, one row per
concurrency level, rate or phase, each value with its ratio to a baseline column."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from specroute.bench.levels import LevelSummary
from specroute.bench.report import format_grid
from specroute.bench.sweep import LevelResult, SweepResult

__all__ = ["METRICS", "Column", "columns", "level_key", "render_comparison"]

METRICS: tuple[tuple[str, Callable[[LevelSummary], float]], ...] = (
    ("per-request tok/s", lambda s: s.per_request_tok_s),
    ("aggregate tok/s", lambda s: s.aggregate_tok_s),
    ("TTFT p50 ms", lambda s: s.ttft.p50 * 1e3),
    ("TPOT p50 ms", lambda s: s.tpot.p50 * 1e3),
)

Column = tuple[str, dict[str, LevelSummary]]
"""A column's label and its levels' summaries by `level_key`."""


def level_key(level: LevelResult) -> str:
    """What lines up across targets and results: the phase, concurrency or rate."""
    if level.phase:
        return level.phase
    return f"C={level.concurrency}" if level.rate is None else f"{level.rate:g}/s"


def _rows(results: Sequence[tuple[str, SweepResult]]) -> list[str]:
    """Concurrency levels by size, then rates by size, then phases in the order they came."""
    order: dict[str, tuple[int, float, int]] = {}
    for _, result in results:
        for lv in result.levels:
            kind, size = (
                (2, 0.0) if lv.phase else (0, lv.concurrency) if lv.rate is None else (1, lv.rate)
            )
            order.setdefault(level_key(lv), (kind, size, len(order)))
    return sorted(order, key=order.__getitem__)


def _targets(result: SweepResult) -> list[str]:
    named = [t.label for t in result.targets]
    return named + [t for t in dict.fromkeys(lv.target for lv in result.levels) if t not in named]


def columns(results: Sequence[tuple[str, SweepResult]]) -> list[Column]:
    """A column per target of each result, named by the target; by the file too where two
    results share a target name (e.g. before and after a change), and numbered if still equal."""
    found = [(Path(path).stem, t, r) for path, r in results for t in _targets(r)]
    clash = len({t for _, t, _ in found}) < len(found)
    out: list[Column] = []
    seen: dict[str, int] = {}
    for stem, target, result in found:
        label = target if not clash else stem if len(_targets(result)) == 1 else f"{stem}:{target}"
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label} ({seen[label]})"
        levels = {level_key(lv): lv.summary for lv in result.levels if lv.target == target}
        out.append((label, levels))
    return out


def _cell(value: float | None, base: float | None) -> str:
    if value is None:
        return "-"
    if base is None or base == 0:
        return f"{value:,.1f}"
    return f"{value:,.1f} (x{value / base:.2f})"


def render_comparison(
    results: Sequence[tuple[str, SweepResult]],
    *,
    baseline: str | None = None,
    markdown: bool = False,
) -> str:
    """One grid per metric: a row per level, a column per target, ratios to `baseline` (a
    column's label; the first column when None). An unknown baseline raises ValueError."""
    cols = columns(results)
    labels = [label for label, _ in cols]
    if baseline is not None and baseline not in labels:
        raise ValueError(f"baseline {baseline!r} is none of the columns: {', '.join(labels)}")
    base_at = 0 if baseline is None else labels.index(baseline)
    keys = _rows(results)
    blocks = [f"Ratios (xN) against {labels[base_at]}." if cols else "No levels to compare."]
    for title, get in METRICS:
        rows = []
        for key in keys:
            values = [get(levels[key]) if key in levels else None for _, levels in cols]
            base = values[base_at]
            rows.append(
                [key, *(_cell(v, None if i == base_at else base) for i, v in enumerate(values))]
            )
        grid = format_grid(["level", *labels], rows, markdown=markdown)
        blocks.append(f"### {title}\n\n{grid}" if markdown else f"{title}\n{grid}")
    return "\n\n".join(blocks)

"""Renderings of a sweep: the seed write-up's table for a terminal or Markdown, one CSV row per
level, and JSON (every setting and every request) that `compare` and `profile` read back."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from specroute.bench.levels import LevelSummary
from specroute.bench.reference import Reference
from specroute.bench.sweep import SweepResult

__all__ = [
    "format_grid",
    "level_rows",
    "load_result",
    "render_csv",
    "render_markdown",
    "render_table",
    "save_result",
]

Cell = str | float | int | None


def format_grid(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool = False
) -> str:
    """Aligned columns (first left, rest right), or a Markdown table."""
    if markdown:
        lines = [
            "| " + " | ".join(headers) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _levels(result: SweepResult) -> list[int]:
    return sorted({lv.concurrency for lv in result.levels})


def _labels(result: SweepResult) -> list[str]:
    return [t.label for t in result.targets] or sorted({lv.target for lv in result.levels})


def _with_reference(value: float, ref: float | None) -> str:
    if ref is None:
        return f"{value:,.1f}"
    return f"{value:,.1f} (ref {ref:,.0f}, {(value - ref) / ref:+.1%})"


def _metric_grid(
    result: SweepResult,
    title: str,
    get: Callable[[LevelSummary], float],
    ref_field: str,
    reference: Reference | None,
    markdown: bool,
) -> str:
    labels = _labels(result)
    rows = []
    for concurrency in _levels(result):
        values = {lab: lv.summary for lab in labels if (lv := result.level(lab, concurrency))}
        best = max(values, key=lambda lab: get(values[lab]), default=None)
        row = [str(concurrency)]
        for lab in labels:
            if lab not in values:
                row.append("-")
                continue
            point = reference.lookup(lab, concurrency) if reference else None
            cell = _with_reference(get(values[lab]), getattr(point, ref_field) if point else None)
            row.append(cell + (" *" if lab == best and len(values) > 1 else "  "))
        rows.append(row)
    grid = format_grid(["C", *labels], rows, markdown=markdown)
    return f"### {title}\n\n{grid}" if markdown else f"{title}\n{grid}"


def _ms(value: float) -> str:
    return f"{value * 1e3:,.1f}"


def _accept(summary: LevelSummary) -> str:
    parts = [summary.accept.chunks, summary.accept.sglext, summary.accept.metrics]
    return "/".join("-" if v is None else f"{v:.2f}" for v in parts)


def _detail_rows(result: SweepResult) -> list[list[str]]:
    rows = []
    for lv in result.levels:
        s = lv.summary
        rows.append(
            [
                lv.phase or lv.target,
                str(lv.concurrency) if lv.rate is None else f"{lv.rate:g}/s",
                str(s.succeeded),
                str(s.errors),
                f"{s.request_per_s:.2f}",
                f"{_ms(s.ttft.p50)}/{_ms(s.ttft.p99)}",
                f"{_ms(s.tpot.p50)}/{_ms(s.tpot.p99)}",
                f"{_ms(s.itl.p50)}/{_ms(s.itl.p99)}",
                _accept(s),
                "LIMIT" if lv.client.limited else f"{lv.client.cpu_fraction:.0%}",
            ]
        )
    return rows


_DETAIL_HEADERS = [
    "target",
    "C",
    "ok",
    "err",
    "req/s",
    "TTFT p50/p99 ms",
    "TPOT p50/p99 ms",
    "ITL p50/p99 ms",
    "accept chunk/sglext/metrics",
    "client CPU",
]


def _warnings(result: SweepResult) -> list[str]:
    seen = list(result.warnings)
    for lv in result.levels:
        label = lv.phase or (
            f"{lv.target} C={lv.concurrency}" if lv.rate is None else f"{lv.target} {lv.rate:g}/s"
        )
        seen += [f"{label}: {w}" for w in lv.summary.warnings]
        seen += [f"{label}: {e}" for e in lv.summary.error_samples]
    return seen


def _class_cell(summary: LevelSummary) -> str:
    return ", ".join(
        f"{name} {c.per_request_tok_s:.0f} tok/s"
        + (f" L={c.accept.best():.2f}" if c.accept.best() is not None else "")
        for name, c in summary.classes.items()
    )


def _phase_grid(result: SweepResult, markdown: bool) -> str:
    rows = [
        [
            lv.phase,
            str(lv.concurrency) if lv.rate is None else f"{lv.rate:g}/s",
            str(lv.summary.succeeded),
            f"{lv.summary.per_request_tok_s:,.1f}",
            f"{lv.summary.aggregate_tok_s:,.1f}",
            f"{_ms(lv.summary.ttft.p50)}",
            _class_cell(lv.summary) or "-",
        ]
        for lv in result.levels
    ]
    headers = [
        "phase",
        "users",
        "ok",
        "per-request tok/s",
        "aggregate tok/s",
        "TTFT p50 ms",
        "by class",
    ]
    grid = format_grid(headers, rows, markdown=markdown)
    title = f"Trace {result.scenario.get('name', '') if result.scenario else ''} per phase"
    return f"### {title}\n\n{grid}" if markdown else f"{title}\n{grid}"


def _render(result: SweepResult, reference: Reference | None, markdown: bool) -> str:
    grids = (
        [_phase_grid(result, markdown)]
        if result.kind == "trace"
        else [
            _metric_grid(
                result,
                "Per-request tok/s (mean of 1/TPOT)",
                lambda s: s.per_request_tok_s,
                "per_request_tok_s",
                reference,
                markdown,
            ),
            _metric_grid(
                result,
                "Aggregate tok/s (tokens / level wall time)",
                lambda s: s.aggregate_tok_s,
                "aggregate_tok_s",
                reference,
                markdown,
            ),
        ]
    )
    parts = [
        *grids,
        ("### Latency and acceptance\n\n" if markdown else "Latency and acceptance\n")
        + format_grid(_DETAIL_HEADERS, _detail_rows(result), markdown=markdown),
    ]
    notes = _warnings(result)
    if notes:
        bullet = "- " if markdown else "! "
        parts.append(
            ("### Warnings\n\n" if markdown else "") + "\n".join(bullet + n for n in notes)
        )
    footer = "* best target at this level"
    if reference is not None:
        footer += f"; ref: {reference.source or 'reference'}"
    parts.append(footer)
    return "\n\n".join(parts)


def render_table(result: SweepResult, reference: Reference | None = None) -> str:
    """The terminal table: per-request and aggregate tok/s per target and concurrency (best
    marked, reference figures and % difference beside them), then latencies and warnings."""
    return _render(result, reference, markdown=False)


def render_markdown(result: SweepResult, reference: Reference | None = None) -> str:
    return _render(result, reference, markdown=True) + "\n"


def level_rows(result: SweepResult) -> list[dict[str, Cell]]:
    """One flat row per level: every summary number (latencies in seconds)."""
    rows = []
    for lv in result.levels:
        row: dict[str, Cell] = {
            "target": lv.target,
            "concurrency": lv.concurrency,
            "rate": lv.rate,
            "phase": lv.phase,
        }
        summary = msgspec.to_builtins(lv.summary)
        for key, value in summary.items():
            if isinstance(value, dict):
                row.update({f"{key}_{k}": v for k, v in value.items()})
            elif not isinstance(value, list):
                row[key] = value
        row.update(
            {
                f"client_{k}": v
                for k, v in msgspec.to_builtins(lv.client).items()
                if not isinstance(v, list)
            }
        )
        rows.append(row)
    return rows


def render_csv(result: SweepResult) -> str:
    rows = level_rows(result)
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                k: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v
                for k, v in row.items()
            }
        )
    return out.getvalue()


def save_result(result: SweepResult, path: str | Path) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=1))


def load_result(path: str | Path) -> SweepResult:
    return msgspec.json.decode(Path(path).read_bytes(), type=SweepResult)

"""`specroute tune`'s outputs in --out: the prior (`prior.json`, the profile format), the report
as Markdown and JSON, and `tune.png` (matplotlib, imported only here): per-request and
aggregate tok/s against concurrency for every server, one row per traffic kind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from specroute.plotting import plots_missing, pyplot
from specroute.profile_format import Profile, encode_profile
from specroute.tune.layout import ServerPlan, TuneLayout, TuneOptions
from specroute.tune.render import render
from specroute.tune.report import build_report
from specroute.tune.run import DepthResult

__all__ = ["save_plot", "write_outputs"]


def _axes_row(axes: Any, profile: Profile, kind: str) -> None:
    for target in profile.targets:
        points = sorted(
            (p for p in target.points if p.traffic == kind), key=lambda p: p.concurrency
        )
        if not points:
            continue
        xs = [p.concurrency for p in points]
        axes[0].plot(xs, [p.per_request_tok_s for p in points], marker="o", label=target.label)
        axes[1].plot(xs, [p.aggregate_tok_s for p in points], marker="o", label=target.label)
    ticks = sorted({p.concurrency for t in profile.targets for p in t.points})
    for ax, title in zip(axes, ("per-request tok/s", "aggregate tok/s"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrency")
        ax.set_title(f"{kind}: {title}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def save_plot(profile: Profile, path: Path) -> None:
    plt = pyplot()
    kinds = [t.name for t in profile.traffic]
    fig, axes = plt.subplots(len(kinds), 2, figsize=(11, 4.2 * len(kinds)), squeeze=False)
    for row, kind in zip(axes, kinds, strict=True):
        _axes_row(row, profile, kind)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    options: TuneOptions,
    plans: Sequence[ServerPlan],
    results: Mapping[str, DepthResult],
    failures: Mapping[str, str],
    layout: TuneLayout,
) -> str:
    """Write the prior, report.md, report.json and tune.png; return the terminal report."""
    report, profile = build_report(options, plans, results, failures, layout)
    layout.out.mkdir(parents=True, exist_ok=True)
    layout.prior.write_bytes(encode_profile(profile) + b"\n")
    layout.report_markdown.write_text(render(report, profile, markdown=True))
    layout.report_json.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2))
    written = [layout.prior, layout.report_markdown, layout.report_json]
    missing = plots_missing()  # the report stands without the picture; `tune` said so up front
    if missing is None:
        save_plot(profile, layout.plot)
        written.append(layout.plot)
    files = ", ".join(str(p) for p in written[:-1]) + f" and {written[-1]}"
    skipped = "" if missing is None else f"No {layout.plot.name}: {missing}.\n"
    return render(report, profile) + f"Wrote {files}.\n" + skipped

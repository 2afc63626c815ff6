"""`specroute tune`'s report laid out for a terminal or as Markdown: capacity per depth, the
seed write-up's tables per traffic kind (best server per level marked), the gain of each extra
step, the recommendation, the launch command and the gap to the seed's figures."""

from __future__ import annotations

from collections.abc import Sequence

from specroute.bench.report import format_grid
from specroute.emulator.seed import SEED_TOLERANCE
from specroute.launch.argv import PlanError
from specroute.launch.defaults import launch_depths
from specroute.profile_format import Profile
from specroute.recommend import MIN_STEP_GAIN, Advice, StepGain
from specroute.tune.engine_facts import EngineFacts
from specroute.tune.report import SeedCheck, TuneReport

__all__ = ["render"]

_TITLES = {"per_request": "Per-request tok/s (mean of 1/TPOT)", "aggregate": "Aggregate tok/s"}


_ENGINES = {"sglang": "SGLang", "vllm": "vLLM"}


def _pct(value: float) -> str:
    return f"{value:+.1%}"


def _section(title: str, body: str, markdown: bool) -> str:
    return f"### {title}\n\n{body}" if markdown else f"{title}\n{body}"


def _cell(value: float, ref: float | None, best: bool) -> str:
    text = f"{value:,.1f}"
    if ref:
        text += f" (seed {ref:,.0f}, {_pct(value / ref - 1)})"
    return text + (" *" if best else "  ")


def _refs(report: TuneReport, metric: str) -> dict[tuple[str, int], float]:
    if report.seed is None:
        return {}
    name = "aggregate" if metric == "aggregate" else "per-request"
    return {(g.label, g.concurrency): g.published for g in report.seed.gaps if g.metric == name}


def _grid(report: TuneReport, profile: Profile, kind: str, metric: str, markdown: bool) -> str:
    field = "aggregate_tok_s" if metric == "aggregate" else "per_request_tok_s"
    labels = [d.label for d in report.depths]
    cells = {
        (t.label, p.concurrency): float(getattr(p, field))
        for t in profile.targets
        for p in t.points
        if p.traffic == kind
    }
    seed_kind = report.seed is not None and report.seed.traffic == kind
    refs = _refs(report, metric) if seed_kind else {}
    rows = []
    for c in report.concurrency:
        row = {lab: cells[(lab, c)] for lab in labels if (lab, c) in cells}
        best = max(row, key=lambda lab: row[lab], default=None)
        line = [str(c)]
        for lab in labels:
            marked = lab == best and len(row) > 1
            line.append(_cell(row[lab], refs.get((lab, c)), marked) if lab in row else "-")
        rows.append(line)
    grid = format_grid(["C", *labels], rows, markdown=markdown)
    return _section(f"{kind}: {_TITLES[metric]}", grid, markdown)


def _depth_table(report: TuneReport, markdown: bool) -> str:
    kinds = [t.name for t in report.traffic]
    headers = ["server", "steps", "max_running_requests", "ready after", "sweeps"]
    headers += [f"accept {k} chunks/sglext/metrics" for k in kinds]
    rows = []
    for d in report.depths:
        row = [
            d.label,
            f"{d.steps} (adaptive)" if d.adaptive else str(d.steps),
            str(d.max_running_requests),
            f"{d.startup_s:.1f} s",
            f"{d.sweep_s:.0f} s",
        ]
        row += [
            "/".join("-" if v is None else f"{v:.2f}" for v in d.accept.get(k, [])) for k in kinds
        ]
        rows.append(row)
    source = report.engine.source if report.engine else "/server_info"
    title = f"Capacity per depth ({source}) and wall-clock times of this run"
    return _section(title, format_grid(headers, rows, markdown=markdown), markdown)


def _step_sentence(gain: StepGain, before: StepGain | None) -> str:
    lo, hi = min(gain.aggregate), max(gain.aggregate)
    text = (
        f"- {gain.label} over {gain.previous}: {_pct(gain.overall)} overall "
        f"({_pct(gain.aggregate[lo])} at C={lo}, {_pct(gain.aggregate[hi])} at C={hi})"
    )
    if before is None:
        return text + "."
    verdict = {"diminishing": "a diminishing return", "not diminishing": "not diminishing"}
    said = verdict.get(gain.verdict, gain.verdict)
    return text + f", after {_pct(before.overall)} for the step before: {said}."


def _gains(advice: Advice, markdown: bool) -> str:
    steps = advice.steps
    levels = sorted(steps[0].aggregate)
    headers = ["C", *(f"{g.previous} -> {g.label}" for g in steps)]
    rows = [
        [
            str(c),
            *(
                f"{_pct(g.aggregate[c])} ({_pct(g.per_request[c])})" if c in g.aggregate else "-"
                for g in steps
            ),
        ]
        for c in levels
    ]
    rows.append(["overall", *(_pct(g.overall) for g in steps)])
    lines = [format_grid(headers, rows, markdown=markdown), ""]
    lines += [_step_sentence(g, steps[i - 1] if i else None) for i, g in enumerate(steps)]
    if advice.diminishing_from:
        verdict = f"Returns diminish from {advice.diminishing_from} on"
    else:
        verdict = "No diminishing return within the depths measured"
    if advice.worth_up_to:
        verdict += (
            f"; every step up to {advice.worth_up_to} gains at least {MIN_STEP_GAIN:.0%} overall."
        )
    lines.append(verdict)
    title = f"{advice.traffic}: gain of each extra step, aggregate (per-request) tok/s"
    return _section(title, "\n".join(lines), markdown)


def _advice(advice: Advice, servers: int, markdown: bool) -> str:
    regimes = "; ".join(
        f"C {r.low}" + (f"-{r.high}" if r.high != r.low else "") + f": {r.label}"
        for r in advice.regimes
    )
    lines = [
        f"- best fixed depth: {advice.best_fixed} (at worst {advice.best_fixed_gap:.1%} below "
        f"the best server, at C={advice.best_fixed_gap_at})",
        f"- best depth per load: {regimes}",
    ]
    mix = advice.mix
    if mix is not None:
        loads = ", ".join(f"{n} {_pct(g)}" for n, g in mix.by_load.items())
        lines.append(
            f"- pool of {servers}: {' + '.join(mix.servers)}, predicted {_pct(mix.gain)} aggregate "
            f"tok/s over {servers} x {mix.baseline[0]} (by pool users: {loads})"
        )
    return _section(f"Recommendation for {advice.traffic} traffic", "\n".join(lines), markdown)


def _seed(seed: SeedCheck, markdown: bool) -> str:
    rows = [
        [
            g.label,
            str(g.concurrency),
            g.metric,
            f"{g.published:,.0f}",
            f"{g.measured:,.1f}",
            _pct(g.gap),
        ]
        for g in seed.gaps
    ]
    grid = format_grid(["server", "C", "tok/s", "seed", "measured", "gap"], rows, markdown=markdown)
    caps = ", ".join(f"{lab} {m} (seed {p})" for lab, (m, p) in seed.capacities.items())
    verdict = "within" if seed.within else "OUTSIDE"
    body = (
        f"{grid}\n\nmax_running_requests: {caps}\n"
        f"Worst gap {seed.worst:.1%}: {verdict} {SEED_TOLERANCE:.0%}."
    )
    title = f"The emulated seed workload ({seed.traffic}) against the seed's published figures"
    return _section(title, body, markdown)


def _head(report: TuneReport) -> str:
    kinds = ", ".join(f"{t.name} (temperature {t.temperature:g})" for t in report.traffic)
    engine = _ENGINES[report.engine.engine if report.engine else "sglang"]
    where = (
        f"EMULATED {engine} servers ({report.profile}, time scale {report.time_scale:g}, "
        "figures scaled back to the emulated hardware)"
        if report.emulated
        else engine
    )
    first = report.traffic[0]
    return (
        f"specroute tune: {report.model} on {where}. Traffic: {kinds}; {first.prompts}, "
        f"{first.max_tokens} output tokens{', ignore_eos' if first.ignore_eos else ''}; "
        f"C = {'/'.join(map(str, report.concurrency))}."
    )


def _sections(report: TuneReport, profile: Profile, markdown: bool) -> Sequence[str]:
    parts = [_head(report), _depth_table(report, markdown)]
    for kind in report.traffic:
        parts += [_grid(report, profile, kind.name, m, markdown) for m in _TITLES]
    parts += [_gains(a, markdown) for a in report.advice if a.steps]
    parts += [_advice(a, report.servers, markdown) for a in report.advice]
    if report.command:
        fence = "```\n" if markdown else ""
        body = f"{fence}{report.command}\n{fence}".rstrip()
        body += (
            "\nAdd --reconfigure auto to let the servers' depths follow the load (the default,"
            " advise, only shows the planner's plan at the proxy's /plan and /dashboard)."
        )
        body += "".join(_other_traffic(report, profile))
        parts.append(_section(f"Start it ({report.recommended_for} traffic)", body, markdown))
    if report.seed is not None:
        parts.append(_seed(report.seed, markdown))
    parts += [
        f"! {lab} was not measured: {m.splitlines()[0]}" for lab, m in report.failures.items()
    ]
    if report.engine is not None and report.engine.cannot_tell:
        parts.append(_engine(report.engine, markdown))
    parts.append(f"* best server at this level. The prior for --prior: {report.prior}")
    return parts


def _other_traffic(report: TuneReport, profile: Profile) -> list[str]:
    """A line for each other traffic kind for which `launch --prior --expected-traffic KIND`
    starts another pool than plain `launch --prior` does (`launch_depths` says which: the
    report's own mix may hold adaptive servers, which launch never starts from a prior)."""

    def started(kind: str | None) -> tuple[int, ...] | None:
        try:
            return launch_depths(steps=None, allowed=None, prior=profile,
                                 servers=report.servers, traffic=kind).steps  # fmt: skip
        except PlanError:
            return None

    plain = started(None)
    lines = []
    for kind in (a.traffic for a in report.advice if a.traffic != report.recommended_for):
        steps = started(kind)
        if steps is not None and steps != plain:
            lines.append(
                f"\nMostly {kind} requests? `specroute launch --prior {report.prior} "
                f"--expected-traffic {kind}` (no --steps) starts "
                f"{','.join(map(str, steps))}, the pool for {kind} traffic."
            )
    return lines


def _engine(facts: EngineFacts, markdown: bool) -> str:
    depths = ", ".join(f"{label} K={k}" for label, k in facts.depths.items())
    lines = [f"{facts.engine}, method {facts.method}: {depths} (from the {facts.source})"]
    lines += [f"- {note}" for note in facts.cannot_tell]
    return _section(f"What {facts.engine} does not report", "\n".join(lines), markdown)


def render(report: TuneReport, profile: Profile, *, markdown: bool = False) -> str:
    """The whole report for a terminal, or as Markdown."""
    parts = list(_sections(report, profile, markdown))
    if markdown:
        parts[0] = "## " + parts[0]
    return "\n\n".join(parts) + "\n"

"""The bound the latency-lanes targets leave (issue 30), computed: every pool of three fixed
depths (k0-k7, any mix) with lanes at each reserve, on the lanes trace in virtual time
(`lanes_sim.LanesSim`: the product's routing, lane reserve and admission order), beside the
alternatives `lanes_sim.py` compares (every fixed pool and the adaptive pools, without lanes).

Per phase it finds the best deep pool's interactive median (the best of k3..k7 and adaptive),
whether any configuration meets the speed target for 95% of interactive requests, and the lanes
pools that match both. Then the envelope: the aggregate a lanes pool would reach if it moved,
free of charge, to the best such pool in every phase, against the best alternative's aggregate
over the whole trace. That envelope is an upper bound on any depth plan for this routing (no
restart costs anything in it); where it is more than the issue's 2% behind, no pool of three
servers meets the targets together on this trace. The frontier below it says how much of the
interactive median each share of the aggregate costs.

    nice -n 5 .venv/bin/python benchmarks/lanes_bound.py --jobs 2 --share 0.2 --scale 5

Runs are kept under results/lanes-bound/ by a digest of what they depend on; a rerun of the
same code prints at once.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
from depth_bound import SOURCES
from depth_pools import ROOT, PoolSpec, pools
from lanes_sim import SCENARIO, _deep, _median, _nan_low, run

from specroute.logs import configure_logging
from specroute.planner import Setting

CACHE = ROOT / "results" / "lanes-bound"
DEPENDS = (*SOURCES, "benchmarks/lanes_sim.py", "specroute/lanes.py")
"""What a run depends on; this file's summary of a run enters the digest by `Cell`'s fields, so
the report can change without running everything again."""
MAX_K = 7
MET = 0.95
"""The issue's share of interactive requests at the target, wherever any pool reaches it."""
AGGREGATE_GAP = 0.02
"""The issue's bar: aggregate within 2% of the best alternative's."""
Ask = tuple[float | None, bool]
"""What a phase asks of the interactive lane: its median as a fraction of the best deep pool's
(None: nothing), and whether 95% at the target (where any pool reaches it)."""
TARGETS: Ask = (1.0, True)
"""The issue's."""
FRONTIER: tuple[Ask, ...] = (
    TARGETS,
    *((fraction, False) for fraction in (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)),
    (None, True),
)
"""The issue's ask, the median alone asked for less and less, the target's share alone."""


class Cell(msgspec.Struct, frozen=True):
    """One phase of one run."""

    phase: str
    seconds: float
    aggregate: float
    """tok/s of every request."""
    median: float
    """The interactive lane's median per-request tok/s (NaN: no interactive request)."""
    met: float
    """The share of interactive requests at the target (NaN: none)."""


class Summary(msgspec.Struct, frozen=True):
    name: str
    lanes: bool
    cells: list[Cell]
    batch_p99_wait: float

    @property
    def aggregate(self) -> float:
        return _whole([c.aggregate for c in self.cells], [c.seconds for c in self.cells])


Job = tuple[str, tuple[int, ...] | str, bool, int]
"""(name, the mix's depths or a `depth_pools` pool, lanes, reserve)."""


def _whole(rates: Sequence[float], seconds: Sequence[float]) -> float:
    return sum(r * s for r, s in zip(rates, seconds, strict=True)) / sum(seconds)


def jobs(reserves: Sequence[int]) -> list[Job]:
    """Every mix of three depths with lanes at each reserve, then the alternatives."""
    out: list[Job] = []
    for mix in itertools.combinations_with_replacement(range(MAX_K + 1), 3):
        label = "/".join(f"k{k}" for k in mix)
        out += [(f"lanes {label} r{r}", mix, True, r) for r in reserves]
    out += [(f"3 x k{k}", f"k{k}", False, 0) for k in range(MAX_K + 1)]
    out += [(f"3 x {n}", n, False, 0) for n in ("adaptive<=3", "adaptive<=7")]
    return out


def decode(data: bytes) -> Summary:
    """A kept run: JSON has no NaN (msgspec writes it as null), so a phase without an
    interactive request comes back as null and is read as NaN again."""
    raw = msgspec.json.decode(data)
    for cell in raw["cells"]:
        for key in ("median", "met"):
            cell[key] = math.nan if cell[key] is None else cell[key]
    return msgspec.convert(raw, Summary)


def _spec(pool: tuple[int, ...] | str) -> PoolSpec:
    if isinstance(pool, str):
        return pools()[pool]
    return PoolSpec(tuple(Setting(steps=k) for k in pool), "throughput")


def _path(job: Job, args: argparse.Namespace) -> Path:
    name, pool, lanes, reserve = job
    key = f"{name} {pool} {lanes} {reserve} {args.profile} {args.share} {args.target} " \
          f"{args.scale} {args.seed} {Cell.__struct_fields__} {MET}"  # fmt: skip
    digest = hashlib.sha256(key.encode())
    digest.update(SCENARIO.read_bytes())
    for path in sorted(p for pattern in DEPENDS for p in ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    slug = name.replace(" ", "_").replace("/", "-").replace("<=", "le")
    return CACHE / f"{args.profile}__{args.share:g}__{slug}__{digest.hexdigest()[:12]}.json"


def _run(item: tuple[Job, Path, argparse.Namespace]) -> Summary:
    (name, pool, lanes, reserve), path, args = item
    if path.exists():
        return decode(path.read_bytes())
    r = run(name, _spec(pool), lanes, argparse.Namespace(**{**vars(args), "reserve": reserve}))
    cells = []
    for phase, start, end in r.result.phases:
        speeds = r.interactive(start, end)
        met = sum(v >= args.target for v in speeds) / len(speeds) if speeds else math.nan
        cells.append(Cell(phase, end - start, r.result.window(start, end)[0], _median(speeds), met))
    summary = Summary(name, lanes, cells, r.batch_p99_wait())
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(summary))
    return summary


def measure(args: argparse.Namespace) -> list[Summary]:
    """Every job, `--jobs` at a time, with progress on stderr."""
    todo = [(job, _path(job, args), args) for job in jobs(args.reserve)]
    fresh = sum(not path.exists() for _, path, _ in todo)
    print(f"{len(todo)} runs, {fresh} to run (the rest kept in {CACHE})", file=sys.stderr)
    began, out = time.monotonic(), []
    with multiprocessing.get_context("fork").Pool(args.jobs) as workers:
        for i, summary in enumerate(workers.imap(_run, todo), 1):
            out.append(summary)
            if i % 10 == 0 or i == len(todo):
                print(f"[{i}/{len(todo)}] {time.monotonic() - began:.0f} s", file=sys.stderr)
    return out


class Phase(msgspec.Struct, frozen=True):
    """What one phase asks of a lanes pool."""

    name: str
    deep: str
    deep_median: float
    met_reachable: bool
    best_alternative: float
    """The phase's aggregate in the best alternative over the whole trace."""


def phases(runs: Sequence[Summary]) -> list[Phase]:
    alternatives = [r for r in runs if not r.lanes]
    deep = [r for r in alternatives if _deep(r.name)]
    best = max(alternatives, key=lambda r: r.aggregate)
    out = []
    for i, cell in enumerate(runs[0].cells):
        fastest = max(deep, key=lambda r: _nan_low(r.cells[i].median))
        reachable = any(r.cells[i].met >= MET for r in runs)
        out.append(Phase(cell.phase, fastest.name, fastest.cells[i].median, reachable,
                         best.cells[i].aggregate))  # fmt: skip
    return out


def meets(cell: Cell, phase: Phase, ask: Ask = TARGETS) -> bool:
    """A lanes pool's phase against `ask` (by default the issue's: its interactive median at
    least the best deep pool's, and 95% at the target where any pool reaches that). A phase
    with no interactive request asks nothing of the lane."""
    fraction, share = ask
    if math.isnan(phase.deep_median):
        return True
    if fraction is not None and not cell.median >= phase.deep_median * fraction:
        return False  # NaN: no interactive request of its own there
    return not share or not phase.met_reachable or cell.met >= MET


def envelope(
    runs: Sequence[Summary], asked: Sequence[Phase], ask: Ask = TARGETS
) -> tuple[float, list[Summary | None]]:
    """The most aggregate a lanes pool reaches moving freely to the best pool meeting `ask`
    in each phase (NaN where some phase has none), and the pool picked per phase."""
    lanes = [r for r in runs if r.lanes]
    picks: list[Summary | None] = []
    for i, phase in enumerate(asked):
        fit = [r for r in lanes if meets(r.cells[i], phase, ask)]
        picks.append(max(fit, key=lambda r: r.cells[i].aggregate) if fit else None)
    if any(p is None for p in picks):
        return math.nan, picks
    rates = [p.cells[i].aggregate for i, p in enumerate(picks) if p is not None]
    return _whole(rates, [c.seconds for c in lanes[0].cells]), picks


def _phase_row(runs: Sequence[Summary], i: int, phase: Phase, pick: Summary | None) -> str:
    meeting = sum(meets(r.cells[i], phase) for r in runs if r.lanes)
    if math.isnan(phase.deep_median):
        deep = "no interactive request"
    else:
        deep = f"{phase.deep} {phase.deep_median:.1f}"
    top = "none"
    if pick is not None:
        cell = pick.cells[i]
        top = f"{pick.name}: {cell.aggregate:.0f} tok/s, median {cell.median:.1f}"
        top += f", {cell.met:.0%} met"
    fastest = max((r for r in runs if r.lanes), key=lambda r: _nan_low(r.cells[i].median))
    quickest = f"{fastest.name} {fastest.cells[i].median:.1f}"
    reachable = "yes" if phase.met_reachable else "no"
    return f"| {phase.name} | {deep} | {quickest} | {reachable} | {meeting} | {top} | " \
           f"{phase.best_alternative:.0f} |"  # fmt: skip


def _frontier_row(runs: Sequence[Summary], asked: Sequence[Phase], ask: Ask,
                  best: float) -> str:  # fmt: skip
    bound, picks = envelope(runs, asked, ask)
    fraction, share = ask
    parts = [] if fraction is None else [f"median {fraction:.0%} of the deep pool's"]
    parts += ["95% at the target"] if share else []
    label = " and ".join(parts)
    if math.isnan(bound):
        missing = ", ".join(p.name for p, k in zip(asked, picks, strict=True) if k is None)
        return f"| {label} | none meets {missing} | - | - |"
    gap = bound / best - 1
    return f"| {label} | {bound:.0f} | {gap:+.1%} | {'yes' if gap >= -AGGREGATE_GAP else 'NO'} |"


def report(runs: Sequence[Summary], share: float) -> list[str]:
    """The phases' asks and the best lanes pool meeting each, the envelope's frontier, and
    the best lanes pools never moved."""
    asked = phases(runs)
    best = max((r for r in runs if not r.lanes), key=lambda r: r.aggregate)
    lanes = [r for r in runs if r.lanes]
    lines = [
        f"interactive share {share:.0%}: {len(lanes)} lanes pools, best alternative "
        f"{best.name} {best.aggregate:.0f} tok/s",
        "",
        "| phase | best deep pool (interactive median) | fastest lanes pool | 95% reachable | "
        "lanes pools meeting both | the most aggregate among them | the best alternative there |",
        "|---|---|---|---|---|---|---|",
    ]
    picks = envelope(runs, asked)[1]
    lines += [_phase_row(runs, i, p, k) for i, (p, k) in enumerate(zip(asked, picks, strict=True))]
    lines += [
        "",
        "| asked of the interactive lane in every phase | envelope tok/s | against the best "
        "alternative | within 2% |",
        "|---|---|---|---|",
    ]
    lines += [_frontier_row(runs, asked, ask, best.aggregate) for ask in FRONTIER]
    whole = [r for r in lanes if all(meets(c, p) for c, p in zip(r.cells, asked, strict=True))]
    fixed = max(whole, key=lambda r: r.aggregate, default=None)
    top = max(lanes, key=lambda r: r.aggregate)
    met = sum(meets(c, p) for c, p in zip(top.cells, asked, strict=True))
    never_moved = "none"
    if fixed is not None:
        never_moved = f"{fixed.name} {fixed.aggregate:.0f} tok/s"
        never_moved += f" ({fixed.aggregate / best.aggregate - 1:+.1%})"
    return [
        *lines,
        "",
        f"the best lanes pool meeting every phase, never moved: {never_moved}",
        f"the lanes pool with the most aggregate: {top.name} {top.aggregate:.0f} tok/s "
        f"({top.aggregate / best.aggregate - 1:+.1%}), phases met: {met} of {len(asked)}",
        f"batch p99 wait, worst lanes pool: {max(r.batch_p99_wait for r in lanes):.2f} s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--share", type=float, default=0.2, help="interactive share")
    parser.add_argument("--target", type=float, default=100.0, help="interactive tok/s")
    parser.add_argument("--reserve", type=int, action="append", default=[],
                        help="a reserve to try (repeat; default 0, 8 and 16)")  # fmt: skip
    parser.add_argument("--scale", type=float, default=5.0, help="multiply phase durations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    args.reserve = args.reserve or [0, 8, 16]
    if not 0 < args.share < 1:
        parser.error("--share must be between 0 and 1")
    if min(args.reserve) < 0 or args.jobs < 1:
        parser.error("--reserve must be 0 or more, --jobs 1 or more")
    configure_logging("warning")
    runs = measure(args)
    reserves = ", ".join(map(str, args.reserve))
    print(f"profile {args.profile}, target {args.target:.0f} tok/s, reserves {reserves}, "
          f"phases x{args.scale:g}, seed {args.seed}")  # fmt: skip
    for line in report(runs, args.share):
        print(line)


if __name__ == "__main__":
    main()

"""`specroute calibrate`: the seed table measured over HTTP against three emulated servers.

Starts emulated servers at steps 1, 2 and 3, runs the bench's sweep with the seed's workload
(greedy, `ignore_eos`, 256-word prompts, 256 output tokens, 2 x C requests per level) and
prints the measured figures beside the published ones. `--virtual` prints what the profile
predicts for the same workload in virtual time, without HTTP, in a second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from specroute.bench import (
    PromptSettings,
    Reference,
    Sampling,
    SweepResult,
    SweepSettings,
    Target,
    reference_from_mapping,
    render_table,
    run_sweep,
)
from specroute.cmdline import Subcommands, UsageError, parse_ints
from specroute.emulator.fleet import emulated_fleet
from specroute.emulator.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from specroute.emulator.seed import SEED_AGGREGATE_TOK_S, SEED_PER_REQUEST_TOK_S, SEED_TOLERANCE
from specroute.emulator.simulate import run_closed_loop
from specroute.helpformat import DefaultsHelp
from specroute.logs import configure_logging

__all__ = ["TOLERANCE", "calibration_settings", "register", "run_calibration", "seed_reference"]

TOLERANCE = SEED_TOLERANCE
PROMPT_WORDS = 256
OUTPUT_TOKENS = 256
STEPS = (1, 2, 3)


def seed_reference() -> Reference:
    """The published seed figures, keyed as the calibration labels its targets."""
    per_request: dict[str, dict[int, float]] = {}
    aggregate: dict[str, dict[int, float]] = {}
    for (k, c), value in SEED_PER_REQUEST_TOK_S.items():
        per_request.setdefault(f"steps{k}", {})[c] = value
    for (k, c), value in SEED_AGGREGATE_TOK_S.items():
        aggregate.setdefault(f"steps{k}", {})[c] = value
    return reference_from_mapping(
        {"per_request_tok_s": per_request, "aggregate_tok_s": aggregate},
        source="seed table (Qwen3.5-122B-A10B, 4x RTX PRO 6000)",
    )


def calibration_settings(urls: dict[str, str], concurrency: Sequence[int]) -> SweepSettings:
    return SweepSettings(
        targets=[Target(label=label, url=url) for label, url in urls.items()],
        concurrency=list(concurrency),
        requests_per_concurrency=2.0,
        min_requests=3,
        warmup=1,
        prompts=PromptSettings(words=PROMPT_WORDS),
        mix=[Sampling(name="greedy", temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)],
        seed=0,
    )


async def run_calibration(
    profile: str, concurrency: Sequence[int], time_scale: float = 1.0
) -> SweepResult:
    """Start the emulators, sweep them, stop them. With `time_scale` X the emulated GPUs run X
    times faster, so every measured rate is X times the profile's (tests divide it back)."""
    extra = ("--time-scale", str(time_scale))
    async with emulated_fleet(STEPS, profile=profile, extra_args=extra) as servers:
        urls = {s.label: s.url for s in servers}
        return await run_sweep(calibration_settings(urls, concurrency))


def worst_deviation(result: SweepResult, reference: Reference) -> tuple[float, str]:
    """The largest relative gap between a measured figure and its published one."""
    worst, where = 0.0, "no published figure measured"
    for level in result.levels:
        point = reference.lookup(level.target, level.concurrency)
        if point is None:
            continue
        pairs = (
            ("per-request", point.per_request_tok_s, level.summary.per_request_tok_s),
            ("aggregate", point.aggregate_tok_s, level.summary.aggregate_tok_s),
        )
        for name, published, measured in pairs:
            if published:
                gap = abs(measured / published - 1)
                if gap >= worst:
                    worst, where = gap, f"{level.target} C={level.concurrency} {name}"
    return worst, where


def virtual_table(profile_name: str, concurrency: Sequence[int]) -> str:
    """What the profile predicts for the calibration workload, from the engine alone."""
    profile = get_profile(profile_name)
    lines = [
        f"{profile.name} in virtual time (model prediction, no HTTP), "
        "per-request / aggregate tok/s:",
        "   C  " + "".join(f"{f'steps{k}':>22}" for k in STEPS),
    ]
    for c in concurrency:
        cells = []
        for k in STEPS:
            r = run_closed_loop(
                profile, steps=k, concurrency=c, requests=max(3, 2 * c),
                output_tokens=OUTPUT_TOKENS, prompt_tokens=PROMPT_WORDS,
            )  # fmt: skip
            cells.append(f"{r.per_request_tok_s:9.1f} / {r.aggregate_tok_s:8.1f}")
        lines.append(f"{c:4d}  " + "".join(f"{cell:>22}" for cell in cells))
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    configure_logging("warning")
    try:
        levels = list(parse_ints(args.concurrency, "--concurrency", minimum=1))
    except UsageError as exc:
        print(f"specroute calibrate: {exc}", file=sys.stderr)
        return 2
    if args.virtual:
        print(virtual_table(args.profile, levels))
        return 0
    print(
        f"Calibration: emulated SGLang servers (profile {args.profile}, no GPU) at steps 1/2/3; "
        f"greedy, ignore_eos, {PROMPT_WORDS}-word prompts, {OUTPUT_TOKENS} output tokens, "
        "2 x C requests per level.",
        flush=True,
    )
    result = asyncio.run(run_calibration(args.profile, levels))
    reference = seed_reference() if args.profile == DEFAULT_PROFILE else None
    print(render_table(result, reference))
    if reference is None:
        return 0
    worst, where = worst_deviation(result, reference)
    verdict = "within" if worst <= TOLERANCE else "OUTSIDE"
    print(f"\nWorst gap to the seed's published figures: {worst:.1%} ({where}), {verdict} 7%.")
    return 0 if worst <= TOLERANCE or not args.check else 1


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        description=__doc__,
        formatter_class=DefaultsHelp,
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    parser.add_argument("--concurrency", default="1,4,16,32,64", help="comma-separated levels")
    parser.add_argument("--virtual", action="store_true", help="model prediction only, no HTTP")
    parser.add_argument("--check", action="store_true", help="exit 1 if any figure is off by >7%%")
    parser.set_defaults(run=_run)

"""How far the planner's reading of a tune's measured iteration times lies from the emulated
engine's own, at every batch a depth can run: `speculation.measured_time` between the points
of the committed tune priors (`benchmarks/results/depth-bound/tune/`, tune measures 1, 4, 16
and 32 users and the slots' limit) against the profile's `iteration_time`.

    .venv/bin/python benchmarks/iteration_read.py
    .venv/bin/python benchmarks/iteration_read.py --profile h200-qwen35-122b-shape --batches

The points are what tune measured: mean gaps between stream chunks, so a prefill that stalls
a decode is in them and not in the engine's `iteration_time`; where the profile's curve is
near straight (the seed, costly-drafts), the gap between the two is mostly those stalls, and
the reading can do no better. Each cell is the largest and the mean error over every batch
from 1 to the depth's limit, read / engine - 1 in %: negative reads the iteration fast, so
forecasts the pool high.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specroute.emulator.profiles import PROFILES
from specroute.profile_format import decode_profile, depth_curves
from specroute.speculation import measured_time

TUNES = Path(__file__).parent / "results" / "depth-bound" / "tune"


def errors(profile: str) -> dict[int, list[tuple[int, float]]]:
    """Per depth the prior measured, (batch, read / engine - 1) at every batch to its limit."""
    prior = decode_profile((TUNES / f"{profile}.json").read_bytes(), source=profile)
    engine = PROFILES[profile]
    out = {}
    for steps, points in depth_curves(prior.targets).items():
        out[steps] = [
            (b, measured_time(points, b * (steps + 1), 0.0) / engine.iteration_time(b, steps) - 1)
            for b in range(1, engine.capacity(steps) + 1)
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", choices=sorted(PROFILES))
    parser.add_argument("--batches", action="store_true", help="every batch's error too")
    args = parser.parse_args()
    for profile in args.profile or sorted(PROFILES):
        by_depth = errors(profile)
        print(f"\n{profile}: read / engine - 1 in %, largest / mean |error| over every batch")
        print("  ".join(f"k{k}".rjust(11) for k in by_depth))
        print("  ".join(
            f"{100 * max((e for _, e in es), key=abs):+.1f}/{100 * statistics.fmean(abs(e) for _, e in es):.1f}".rjust(11)  # noqa: E501
            for es in by_depth.values()
        ))  # fmt: skip
        if args.batches:
            for k, es in by_depth.items():
                print(f"  k{k}: " + " ".join(f"{b}:{100 * e:+.1f}" for b, e in es))


if __name__ == "__main__":
    main()

"""How far the planner's iteration time for a depth no server runs lies from the emulator's
own T(b, k), read from each tune prior of the depth evaluation
(`benchmarks/results/depth-bound/tune/P.json`) two ways: along the line fitted to tune's points
(`DepthFit`, what the planner read before) and between the points themselves (`measured`, what
`readings.estimates` hands it now). Prints, per profile, the largest relative error of each over
depths 0-7 and the batches given, and where it is; with `--by-depth`, read between the points,
each depth's largest and mean error (estimate / truth - 1) over every batch up to its limit.

    .venv/bin/python benchmarks/prior_time_error.py            # batches 1,2,8,16,24
    .venv/bin/python benchmarks/prior_time_error.py --batch 1,4,12,20
    .venv/bin/python benchmarks/prior_time_error.py --by-depth

tune's points are mean gaps between stream chunks, so a prefill that stalls a decode is in
them and not in the emulator's T(b, k): where the profile's T is near straight (the seed,
costly-drafts) the error left between the points is mostly those stalls.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specroute.emulator.profiles import PROFILES
from specroute.planner import DepthEstimate
from specroute.pool.prior import load_prior

TUNE = Path(__file__).resolve().parent / "results" / "depth-bound" / "tune"


def errors(
    profile: str, batches: list[int] | None, read_between: bool
) -> dict[int, list[tuple[int, float]]]:
    """Per depth of the prior, (batch, estimate / truth - 1) at each batch given (at most the
    depth's limit), or at every batch up to its limit (None)."""
    truth = PROFILES[profile]
    prior = load_prior(TUNE / f"{profile}.json")
    out = {}
    for k, (a, s) in sorted(prior.iteration.items()):
        est = DepthEstimate(
            steps=k, capacity=truth.capacity(k), intercept_s=a, per_token_s=s,
            measured=prior.curves.get(k, ()) if read_between else (),
        )  # fmt: skip
        limit = truth.capacity(k)
        at = sorted({min(b, limit) for b in batches}) if batches else range(1, limit + 1)
        out[k] = [(b, est.iteration_time(b) / truth.iteration_time(b, k) - 1) for b in at]
    return out


def worst(profile: str, batches: list[int], read_between: bool) -> tuple[float, int, int]:
    """(largest |estimate / truth - 1|, its depth, its batch) over the prior's depths."""
    return max(
        (abs(e), k, b) for k, es in errors(profile, batches, read_between).items() for b, e in es
    )


def by_depth(profile: str) -> str:
    """Each depth's largest and mean |error| over every batch, read between the points."""
    cells = []
    for k, es in errors(profile, None, True).items():
        big = max((e for _, e in es), key=abs)
        cells.append(f"k{k} {big:+.1%}/{statistics.fmean(abs(e) for _, e in es):.1%}")
    return "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,2,8,16,24", help="running requests (comma list)")
    parser.add_argument("--by-depth", action="store_true", help="every batch, depth by depth")
    args = parser.parse_args()
    if args.by_depth:
        print("T(b, k) read between tune's points against the emulator, every b to k's limit:")
        print("largest / mean |error| per depth")
        for path in sorted(TUNE.glob("*.json")):
            print(f"{path.stem:24} {by_depth(path.stem)}")
        return
    batches = [int(b) for b in args.batch.split(",")]
    print(f"largest error of T(b, k) against the emulator, b in {batches}, k in 0-7")
    for path in sorted(TUNE.glob("*.json")):
        line, between = worst(path.stem, batches, False), worst(path.stem, batches, True)
        print(f"{path.stem:24} line {line[0]:6.1%} (k{line[1]}, b={line[2]})   "
              f"between the points {between[0]:6.1%} (k{between[1]}, b={between[2]})")  # fmt: skip


if __name__ == "__main__":
    main()

"""How far the planner's iteration time for a depth no server runs lies from the emulator's
own T(b, k), read from each tune prior of the depth evaluation
(`benchmarks/results/depth-bound/tune/P.json`) two ways: along the line fitted to tune's points
(`DepthFit`, what the planner read before) and between the points themselves (`measured`, what
`readings.estimates` hands it now). Prints, per profile, the largest relative error of each over
depths 0-7 and the batches given, and where it is.

    .venv/bin/python benchmarks/prior_time_error.py            # batches 1,2,8,16,24
    .venv/bin/python benchmarks/prior_time_error.py --batch 1,4,12,20
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specroute.emulator.profiles import PROFILES
from specroute.planner import DepthEstimate
from specroute.pool.prior import load_prior

TUNE = Path(__file__).resolve().parent / "results" / "depth-bound" / "tune"


def worst(profile: str, batches: list[int], read_between: bool) -> tuple[float, int, int]:
    """(largest |estimate / truth - 1|, its depth, its batch) over the prior's depths."""
    truth = PROFILES[profile]
    prior = load_prior(TUNE / f"{profile}.json")
    found = (0.0, 0, 0)
    for k, (a, s) in sorted(prior.iteration.items()):
        est = DepthEstimate(
            steps=k, capacity=truth.capacity(k), intercept_s=a, per_token_s=s,
            measured=prior.curves.get(k, ()) if read_between else (),
        )  # fmt: skip
        for b in batches:
            b = min(b, truth.capacity(k))
            error = abs(est.iteration_time(b) / truth.iteration_time(b, k) - 1)
            found = max(found, (error, k, b))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,2,8,16,24", help="running requests (comma list)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    print(f"largest error of T(b, k) against the emulator, b in {batches}, k in 0-7")
    for path in sorted(TUNE.glob("*.json")):
        line, between = worst(path.stem, batches, False), worst(path.stem, batches, True)
        print(f"{path.stem:24} line {line[0]:6.1%} (k{line[1]}, b={line[2]})   "
              f"between the points {between[0]:6.1%} (k{between[1]}, b={between[2]})")  # fmt: skip


if __name__ == "__main__":
    main()

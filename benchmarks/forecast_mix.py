"""How far the planner's forecast of each fixed pool lies from what the simulator measures that
pool doing, phase by phase, two ways: holding the mix of users in flight that the launched pool
shows (what the planner did before `held_under`), and holding the mix of requests
(`forecast_seen`, what it does now). A deeper pool finishes a greedy request sooner relative to a
sampled one, so fewer of its users are in greedy requests at any moment; holding the in-flight
mix overstated deep pools on mixed loads.

    .venv/bin/python benchmarks/forecast_mix.py --profile h200-qwen35-122b-shape \\
        --trace depth-diurnal

The forecasts read the estimates the loop reads when it starts from the profile's tune prior
(`rule_bound.Rule`). The users in flight on the launched pool are its phase's users split by
each class's requests times their mean length over the class's tokens per verify at the
launched depth, from the emulator profile itself (what the proxy would count on an unqueued
pool). The measured rates are `depth_bound.py`'s kept runs of three servers at one depth
(run it first with the same `--profile`, `--trace` and `--pool k0` ... `--pool k7`); each
phase's first five minutes are left out, as a regime settles before the planner acts on it.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys

import msgspec
from depth_bound import PROFILES, TRACES, _job_path
from depth_pools import pools
from rule_bound import rule_of
from sim_results import SimResult

from specroute.bench.trace import Scenario, load_scenario
from specroute.emulator.profiles import PROFILES as EMULATED
from specroute.emulator.profiles import Profile, sampling_class
from specroute.planner import Setting, forecast, forecast_seen, user_counts
from specroute.speculation import is_greedy

SETTLE_S = 300.0
BIN_S = 5.0  # `SimResult.bins`: tokens per five seconds


def mean_length(profile: Profile, max_tokens: int, ignore_eos: bool, draws: int = 4000) -> float:
    """A request's mean output: `max_tokens` with `ignore_eos`, else the emulator's log-normal
    natural length (sigma 0.6, `engine._draw_length`) cut at `max_tokens`."""
    if ignore_eos:
        return float(max_tokens)
    rng = random.Random(1)
    mu = math.log(profile.mean_output_tokens) - 0.18
    return statistics.fmean(
        min(max_tokens, max(1, round(rng.lognormvariate(mu, 0.6)))) for _ in range(draws)
    )


def in_flight(profile: Profile, scenario: Scenario, i: int, depth: int, model: str) -> dict:
    """Phase `i`'s users in flight per class on servers at `depth`, as the proxy names them."""
    shares: dict[str, float] = {}
    for s in scenario.phases[i].mix or scenario.mix:
        name = f"{model}:{'greedy' if is_greedy(s.temperature) else 'sampled'}"
        tokens = profile.expected_tokens(sampling_class(s.temperature), depth)
        share = s.weight * mean_length(profile, s.max_tokens, s.ignore_eos) / tokens
        shares[name] = shares.get(name, 0.0) + share
    return user_counts(float(scenario.phases[i].concurrency), shares)


def measured(profile: str, trace: str, pool: str, seed: int) -> SimResult:
    job = (profile, trace, pool, 1.0, seed, False, None, None)
    path = _job_path(job)
    if not path.exists():
        sys.exit(
            f"no kept run of {pool} on {profile} {trace}: run depth_bound.py --profile "
            f"{profile} --trace {trace} --pool {pool} first"
        )
    return msgspec.json.decode(path.read_bytes(), type=SimResult)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", choices=PROFILES)
    parser.add_argument("--trace", action="append", choices=sorted(TRACES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    depths = range(8)
    for profile in args.profile or PROFILES:
        rule, emulated = rule_of(profile), EMULATED[profile]
        launched = pools(profile)["launched"].settings
        model = next(iter(rule.phys.est.classes)).split(":")[0]
        for trace in args.trace or ["depth-diurnal"]:
            scenario = load_scenario(TRACES[trace])
            runs = {k: measured(profile, trace, f"k{k}", args.seed) for k in depths}
            labels = "/".join(s.label for s in launched)
            print(f"\n{profile} {trace}: forecast / measured - 1 in %, users seen on {labels}")
            print("each cell: the users' mix held / the requests' mix held (forecast_seen)")
            print("phase".ljust(14) + "".join(f"k{k}".rjust(13) for k in depths))
            errors: dict[int, tuple[list[float], list[float]]] = {k: ([], []) for k in depths}
            start = 0.0
            for i, phase in enumerate(scenario.phases):
                users = in_flight(emulated, scenario, i, launched[0].steps, model)
                a, z = int((start + SETTLE_S) / BIN_S), int((start + phase.duration) / BIN_S)
                start += phase.duration
                if z <= a or not users:
                    continue
                row = phase.name.ljust(14)
                for k in depths:
                    pool = tuple(Setting(steps=k) for _ in launched)
                    real = sum(runs[k].bins[a:z]) / ((z - a) * BIN_S)
                    held = forecast(pool, users, rule.phys).tok_s / real - 1
                    seen = forecast_seen(pool, users, launched, rule.phys).tok_s / real - 1
                    errors[k][0].append(abs(held))
                    errors[k][1].append(abs(seen))
                    row += f"{100 * held:+.1f}/{100 * seen:+.1f}".rjust(13)
                print(row)
            print("median |error|".ljust(14) + "".join(
                f"{100 * statistics.median(o):.1f}/{100 * statistics.median(n):.1f}".rjust(13)
                for o, n in errors.values()
            ))  # fmt: skip
            print("largest".ljust(14) + "".join(
                f"{100 * max(o):.1f}/{100 * max(n):.1f}".rjust(13) for o, n in errors.values()
            ))  # fmt: skip


if __name__ == "__main__":
    main()

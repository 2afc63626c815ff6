"""How much any class-aware router can gain over least_loaded on a heterogeneous pool, from the
emulator profile itself (an oracle that knows T(b, k) and every class's acceptance exactly).

For each phase of the policy-eval trace (N users, half greedy, half sampled at temperature
0.8), it searches every integer placement of the greedy and sampled requests over the
backends (capacities respected) for the highest steady-state throughput
`sum_k (sum_c n_ck E_ck) / T_k(n_k)`, and compares it with least_loaded's placement (in
proportion to capacity, classes mixed). Prefill and the spread between requests are ignored.

A router that obeys the policies' rule (never a full backend while another has room) has no
choice once the users fill every slot: each request that ends frees one slot, and the next
request must take it. The `rule` column is that ceiling: the oracle's placement below total
capacity, least_loaded's at or above it.

    .venv/bin/python benchmarks/policy_bound.py
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

from specroute.emulator.profiles import PROFILES, Profile

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "policy-eval.toml"
DEPTHS = (1, 2, 3)


def throughput(p: Profile, k: int, greedy: float, sampled: float) -> float:
    b = greedy + sampled
    if b <= 0:
        return 0.0
    tokens = greedy * p.expected_tokens("greedy", k) + sampled * p.expected_tokens("high", k)
    return tokens / p.iteration_time(round(b) or 1, k)


def splits(total: int, parts: int) -> list[tuple[int, ...]]:
    return [c for c in itertools.product(range(total + 1), repeat=parts - 1) if sum(c) <= total]


def oracle(p: Profile, users: int) -> tuple[float, float]:
    """(best placement's tok/s, least_loaded's tok/s) for `users` closed-loop users."""
    greedy = max(1, users // 2) if users > 1 else 1
    sampled = users - greedy
    cap = {k: p.capacity(k) for k in DEPTHS}
    best = 0.0
    for g in splits(greedy, len(DEPTHS)):
        g_all = (*g, greedy - sum(g))
        for s in splits(sampled, len(DEPTHS)):
            s_all = (*s, sampled - sum(s))
            if any(g_all[i] + s_all[i] > cap[k] for i, k in enumerate(DEPTHS)):
                continue
            value = sum(throughput(p, k, g_all[i], s_all[i]) for i, k in enumerate(DEPTHS))
            best = max(best, value)
    total = sum(cap.values())
    spread = sum(
        throughput(p, k, greedy * cap[k] / total, sampled * cap[k] / total) for k in DEPTHS
    )
    return best, spread


def main() -> None:
    phases = tomllib.loads(SCENARIO.read_text())["phases"]
    for name, profile in PROFILES.items():
        slots = sum(profile.capacity(k) for k in DEPTHS)
        best_tokens = rule_tokens = spread_tokens = 0.0
        print(f"{name} ({slots} slots): users  oracle  rule  least_loaded  gain  rule gain")
        for phase in phases:
            best, spread = oracle(profile, phase["concurrency"])
            rule = spread if phase["concurrency"] >= slots else best
            best_tokens += best * phase["duration"]
            rule_tokens += rule * phase["duration"]
            spread_tokens += spread * phase["duration"]
            print(
                f"  {phase['name']:14} {best:7.0f} {rule:7.0f} {spread:7.0f} "
                f"{best / spread - 1:+6.1%} {rule / spread - 1:+6.1%}"
            )
        print(
            f"  whole trace    {best_tokens / spread_tokens - 1:+6.1%} (oracle), "
            f"{rule_tokens / spread_tokens - 1:+6.1%} (within the rule)"
        )


if __name__ == "__main__":
    main()

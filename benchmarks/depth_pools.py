"""What the depth evaluation compares and what the planner is told before the trace starts:
the pools (fixed depths, SGLang-adaptive, the 1/2/3 mix with and without the planner) and the
tune session that measures each depth's capacity and iteration time (`specroute tune`'s prior).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from policy_sim import PROMPT_TOKENS

from specroute.bench.stats import mean
from specroute.emulator.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveConfig
from specroute.emulator.adaptive_config import load_adaptive_config
from specroute.emulator.engine import Engine
from specroute.emulator.profiles import Profile
from specroute.planner import Setting
from specroute.pool.prior import PROFILE_SCHEMA, priors_from_profile
from specroute.pool.telemetry import IterationPrior

ROOT = Path(__file__).resolve().parent.parent
CAPPED_CONFIG = ROOT / "examples" / "adaptive-capped-3.json"
MAX_STEPS = 7


def adaptive_configs() -> dict[str, AdaptiveConfig]:
    """SGLang's default tiers (deepest 7) and the capped file (deepest 3), by pool label."""
    return {"adaptive<=7": DEFAULT_ADAPTIVE_CONFIG, "adaptive<=3": load_adaptive_config(
        str(CAPPED_CONFIG))}  # fmt: skip


def setting_of(config: AdaptiveConfig, steps: int = 3) -> Setting:
    tiers = tuple((t.smallest_batch, tuple(t.candidate_steps)) for t in config.tiers)
    return Setting(steps=steps, tiers=tiers)


@dataclass(frozen=True)
class PoolSpec:
    settings: tuple[Setting, ...]
    policy: str
    planner: bool = False


def pools() -> dict[str, PoolSpec]:
    """Every configuration the evaluation compares; fixed and adaptive pools behind
    least_loaded, as an operator would run them without specroute."""
    mix = (Setting(steps=1), Setting(steps=2), Setting(steps=3))
    throughput = "throughput:objective=throughput"
    out = {"auto": PoolSpec(mix, throughput, planner=True), "mix-1-2-3": PoolSpec(mix, throughput)}
    for k in range(MAX_STEPS + 1):
        out[f"k{k}"] = PoolSpec((Setting(steps=k),) * 3, "least_loaded")
    for label, config in adaptive_configs().items():
        out[label] = PoolSpec((setting_of(config),) * 3, "least_loaded")
    return out


def tune(profile: Profile) -> tuple[dict[int, IterationPrior], dict[int, int]]:
    """What `specroute tune` measures before the pool starts: each depth's capacity and its
    iteration time at a few batch sizes, fitted per depth as a bench profile is."""
    targets = []
    capacity: dict[int, int] = {}
    for k in range(MAX_STEPS + 1):
        engine = Engine(profile, steps=k)
        capacity[k] = r = engine.max_running_requests
        points = []
        for c in sorted({1, max(1, r // 2), r}):
            probe = Engine(profile, steps=k, seed=c)
            for i in range(c):
                probe.submit(f"t{i}", prompt_tokens=PROMPT_TOKENS, max_new_tokens=4096,
                             klass="greedy", ignore_eos=True)  # fmt: skip
            times = [it.duration for it in (probe.step() for _ in range(60))
                     if it is not None and not it.prefilled]  # fmt: skip
            points.append({"concurrency": c, "iteration_time_s": mean(times)})
        targets.append({"steps": k, "max_running_requests": r, "points": points})
    data = json.dumps({"schema": PROFILE_SCHEMA, "targets": targets}).encode()
    return priors_from_profile(data), capacity

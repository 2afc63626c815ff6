"""What the depth evaluation compares and what the planner is told before the trace starts:
the pools (fixed depths, SGLang-adaptive, the 1/2/3 mix with and without the planner, and the
pool `specroute launch --prior` starts from a `specroute tune --emulate` prior, with and without
the planner) and what the proxy knows of each depth before the trace (the prior).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specroute.emulator.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveConfig
from specroute.emulator.adaptive_config import load_adaptive_config
from specroute.launch.defaults import LaunchDepths, launch_depths
from specroute.planner import Setting
from specroute.pool.prior import Prior, prior_from_profile
from specroute.profile_format import decode_profile

ROOT = Path(__file__).resolve().parent.parent
CAPPED_CONFIG = ROOT / "examples" / "adaptive-capped-3.json"
MAX_STEPS = 7
TUNED = ROOT / "benchmarks" / "results" / "depth-bound" / "tune"
"""`prior.json` of `specroute tune --emulate --profile P --steps 0,1,2,3,4,5,6,7`, as `P.json`
(`benchmarks/results/depth-bound/tune/README.md` has the commands)."""
SERVERS = 3


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
    allowed: tuple[int, ...] | None = None
    """The depths the loop may assign (None: the loop's options say)."""
    prior: Path | None = None
    """The profile the proxy starts from (None: `tune`'s iteration fits only)."""


def prior_path(profile: str) -> Path:
    return TUNED / f"{profile}.json"


def launched(
    profile: str,
    path: Path | None = None,
    users: int | None = None,
    tables: bool = False,
    servers: int = SERVERS,
) -> LaunchDepths | None:
    """What `specroute launch --prior P.json --servers N [--expected-users U]` starts and lets
    the planner use, by launch's own rule (`path`: the prior, by default the profile's SGLang
    tune; `tables`: vLLM's K-per-batch tables, `--allow-adaptive`); None when no prior was
    tuned."""
    path = path or prior_path(profile)
    if not path.exists():
        return None
    prior = decode_profile(path.read_bytes(), source=path.name)
    return launch_depths(steps=None, allowed=None, prior=prior, prior_name=path.name,
                         servers=servers, users=users, tables=tables)  # fmt: skip


def tuned(
    profile: str,
    path: Path | None = None,
    users: int | None = None,
    tables: bool = False,
    servers: int = SERVERS,
) -> dict[str, PoolSpec]:
    """`auto`, what `specroute launch --prior P.json [--expected-users U] --reconfigure auto`
    runs (the prior's pool and depths, launch's default policy; with `tables`, vLLM's
    K-per-batch tables as `--allow-adaptive` starts them), and `launched`, the same never
    reconfigured; none without a prior."""
    depths = launched(profile, path, users, tables, servers)
    if depths is None:
        return {}
    chosen = tuple(Setting(steps=k, table=depths.tables.get(k, ())) for k in depths.steps)
    prior = path or prior_path(profile)
    return {"auto": PoolSpec(chosen, "throughput", planner=True, allowed=depths.allowed,
                             prior=prior),
            "launched": PoolSpec(chosen, "throughput", prior=prior)}  # fmt: skip


def load_prior(path: Path) -> Prior:
    return prior_from_profile(path.read_bytes(), source=path.name)


def pools(profile: str | None = None) -> dict[str, PoolSpec]:
    """Every configuration the evaluation compares; fixed and adaptive pools behind
    least_loaded, as an operator would run them without specroute. With a tuned `profile`,
    `auto` is what `specroute launch --prior --reconfigure auto` runs (the prior's pool and
    depths, launch's default policy) and `launched` the same never reconfigured; else `auto`
    is the 1/2/3 mix at depths 0-3."""
    mix = (Setting(steps=1), Setting(steps=2), Setting(steps=3))
    throughput = "throughput:objective=throughput"
    out = {"auto": PoolSpec(mix, throughput, planner=True), "mix-1-2-3": PoolSpec(mix, throughput)}
    if profile is not None:
        out.update(tuned(profile))
    for k in range(MAX_STEPS + 1):
        out[f"k{k}"] = PoolSpec((Setting(steps=k),) * 3, "least_loaded")
    for label, config in adaptive_configs().items():
        out[label] = PoolSpec((setting_of(config),) * 3, "least_loaded")
    return out

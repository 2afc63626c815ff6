"""A launched server's command line at another speculative setting: the same name, port and
GPUs (and weight cache), the depth flags SGLang or vLLM needs (or the emulator's), SGLang's
adaptive tiers in a JSON file, vLLM's K per batch size in its speculative config. Pure."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from specroute.launch.argv import LaunchOptions, ProcessPlan, server_argv
from specroute.planner import Setting, Tier

__all__ = ["DEFAULT_TIERS", "adaptive_config", "capped_tiers", "server_at"]

DEFAULT_TIERS: tuple[Tier, ...] = ((1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))
"""SGLang 0.5.23's built-in adaptive tiers (`DEFAULT_ADAPTIVE_CONFIG`)."""


def capped_tiers(allowed: tuple[int, ...]) -> tuple[Tier, ...]:
    """SGLang's default tiers with only the allowed depths (each tier keeps at least the
    shallowest allowed one)."""
    out = []
    for smallest, candidates in DEFAULT_TIERS:
        kept = tuple(k for k in candidates if k in allowed) or (min(allowed),)
        out.append((smallest, kept))
    return tuple(out)


def adaptive_config(tiers: tuple[Tier, ...]) -> str:
    """`--speculative-adaptive-config`'s JSON: tiers keyed by their smallest batch size."""
    return json.dumps({str(b): {"candidate_steps": list(ks)} for b, ks in tiers}, indent=1)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def server_at(
    options: LaunchOptions, base: ProcessPlan, setting: Setting, config_path: Path | None = None
) -> ProcessPlan:
    """`base` (a planned server) restarted at `setting`; an adaptive setting reads its tiers
    from `config_path` (written by the caller with `adaptive_config`), a table setting has
    vLLM's K per batch size on its command line. PlanError for a setting the engine lacks."""
    steps, port = setting.steps, _port(base.url)
    adaptive: list[str] = []
    if setting.tiers:
        adaptive = ["--speculative-adaptive"]
        if config_path is not None:
            adaptive += ["--speculative-adaptive-config", str(config_path)]
    argv = server_argv(options, steps, port, adaptive, setting.table)
    return msgspec.structs.replace(base, argv=(*argv, *base.cache_args), steps=steps)

"""What a tune's report says about the engine it measured: which engine, each server's depth
and speculative method, where those figures come from, and what the engine cannot tell.

SGLang reports its depth, algorithm and `max_running_requests` on `/server_info`, and the tune
checks them. vLLM has no `/server_info` outside its developer mode
(vllm/entrypoints/serve/instrumentator/server_info.py), so K (`num_speculative_tokens`), the
method (`speculative_config.method`) and `--max-num-seqs` are the launch's own, not read back;
the tune checks K against vLLM's per-position counters and reads the batch limit the server
held under load (`vllm_facts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from specroute.launch.vllm_argv import VLLM_METHODS
from specroute.tune.layout import ServerPlan, TuneOptions

__all__ = ["VLLM_CANNOT_TELL", "EngineFacts", "engine_facts"]

VLLM_CANNOT_TELL = (
    "K and method: vLLM serves no /server_info, so they are the launch's "
    "(num_speculative_tokens in --speculative-config); K is checked against the draft "
    "positions its /metrics counts",
    "capacity: vLLM reports no max_num_seqs; the column shows the most requests it ran "
    "while others waited (vllm:num_requests_running), else the launch's --max-num-seqs",
    "per-request acceptance: none unless the server runs with --per-request-spec-decode-metrics; "
    "the counters' accept length is a window over all requests",
    "depth changes: vLLM cannot change K on a running server (a new depth is a restart)",
)
"""What a vLLM server does not say, as the report lists it."""


class EngineFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The measured engine and where each server's figures come from."""

    engine: str
    method: str | None
    """vLLM's `speculative_config.method` (`mtp`, `eagle`, `eagle3`); SGLang's algorithm."""
    depths: dict[str, int]
    """Each server's K (`num_speculative_tokens` / `speculative_num_steps`) by label."""
    capacity: dict[str, int]
    """Each server's batch limit as launched (`--max-num-seqs` / `--max-running-requests`)."""
    source: str
    """Where depth and capacity were read: the server's `/server_info`, or the launch checked
    and measured through vLLM's /metrics (`vllm_facts`)."""
    cannot_tell: list[str] = []


def engine_facts(options: TuneOptions, plans: Sequence[ServerPlan]) -> EngineFacts:
    """The facts of a tune of `plans` under `options`."""
    launch = options.launch
    vllm = launch.engine == "vllm"
    capacity = {
        p.label: launch.max_running_by_depth.get(p.steps, launch.max_running_requests)
        for p in plans
    }
    return EngineFacts(
        engine=launch.engine,
        method=VLLM_METHODS[launch.algorithm] if vllm else launch.algorithm,
        depths={p.label: p.steps for p in plans},
        capacity=capacity,
        source="launch and /metrics under load" if vllm else "/server_info",
        cannot_tell=list(VLLM_CANNOT_TELL) if vllm else [],
    )

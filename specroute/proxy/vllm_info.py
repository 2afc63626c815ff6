"""A vLLM backend's part of the proxy's `/server_info`: vLLM serves none outside its developer
mode (vllm/entrypoints/serve/instrumentator/server_info.py), so the proxy answers for it from
what the pool knows, in the SGLang fields that SGLang's tools read."""

from __future__ import annotations

from typing import Any

from specroute.pool import Backend

__all__ = ["vllm_server_info"]


def vllm_server_info(backend: Backend) -> dict[str, Any]:
    """SGLang's `/server_info` fields for one vLLM backend: model, depth (`num_speculative_tokens`
    as `speculative_num_steps`), method, capacity (`max_num_seqs` where configured or found) and,
    in `internal_states[0]`, the lifetime accept length of its spec-decode counters at the last
    scrape (1 + accepted / drafts). Unknown figures are null, never guessed."""
    metrics = backend.metrics
    drafts, accepted = metrics.verify_calls, metrics.accepted_tokens
    state: dict[str, Any] = {}
    if drafts and accepted is not None:
        state["avg_spec_accept_length"] = 1.0 + accepted / drafts
    return {
        "engine": "vllm",
        "model_path": backend.model,
        "served_model_name": backend.model,
        "speculative_algorithm": backend.algorithm,
        "speculative_num_steps": backend.steps,
        "max_running_requests": backend.capacity,
        "internal_states": [state],
    }

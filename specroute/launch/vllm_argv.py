"""vLLM's command line for one server of the launcher's plan: `vllm serve MODEL` with the depth
as `--speculative-config` JSON and the batch limit as `--max-num-seqs`. Pure.

Flags from vLLM's own argument code (vllm/engine/arg_utils.py, `EngineArgs.add_cli_args`, and
vllm/entrypoints/openai/cli_args.py for `--host`/`--port`); methods from
vllm/config/speculative.py (`SpeculativeMethod`: "mtp", "eagle", "eagle3"; a draft model for
EAGLE goes in the same JSON as `model`). vLLM has no flag for the depth alone and cannot change
it on a running server, so a new depth is a restart, as with SGLang.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = [
    "PER_REQUEST_SPEC_METRICS",
    "VLLM_METHODS",
    "VLLM_READY_PATH",
    "VllmServer",
    "speculative_config",
    "vllm_ranges",
    "vllm_server_args",
]

VLLM_METHODS = {"NEXTN": "mtp", "EAGLE": "eagle", "EAGLE3": "eagle3"}
"""The launcher's `--algorithm` as vLLM's `speculative_config.method`."""
PER_REQUEST_SPEC_METRICS = "summary"
"""`--per-request-spec-decode-metrics` on every speculative server (vLLM refuses it without
speculation): each reply then says what it accepted, and the pool learns each class's
acceptance exactly (vllm/config/observability.py). `--vllm-arg` can set it back to `none`."""
VLLM_READY_PATH = "/health"
"""vLLM has no /ready; its /health answers 200 once the engine runs."""


class VllmServer:
    """What one vLLM server's command line says: model, address, GPUs, depth, method, limit."""

    __slots__ = (
        "algorithm", "draft_model", "host", "max_num_seqs", "model", "port", "steps", "table", "tp",
    )  # fmt: skip

    def __init__(
        self,
        *,
        model: str,
        host: str,
        port: int,
        tp: int,
        steps: int,
        algorithm: str,
        draft_model: str | None,
        max_num_seqs: int,
        table: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.model, self.host, self.port, self.tp = model, host, port, tp
        self.steps, self.algorithm, self.draft_model = steps, algorithm, draft_model
        self.max_num_seqs = max_num_seqs
        self.table = tuple(table)
        """(first batch size, K) ranges: K per batch size, `steps` the most (empty: fixed)."""


def vllm_ranges(table: Sequence[tuple[int, int]], max_num_seqs: int) -> list[list[int]]:
    """`num_speculative_tokens_per_batch_size` for (first batch size, K) ranges: [first, last,
    K] each, the last range up to `max_num_seqs` (vllm/v1/spec_decode/dynamic/utils.py wants
    them sorted, without overlap, the first from 1)."""
    ends = [first - 1 for first, _ in table[1:]] + [max(max_num_seqs, table[-1][0])]
    return [[first, end, k] for (first, k), end in zip(table, ends, strict=True)]


def speculative_config(server: VllmServer) -> str:
    """The `--speculative-config` JSON for the server's depth (> 0), with its K per batch size
    when it has a table (`SpeculativeConfig.num_speculative_tokens_per_batch_size`)."""
    config: dict[str, object] = {
        "method": VLLM_METHODS[server.algorithm],
        "num_speculative_tokens": server.steps,
    }
    if server.table:
        config["num_speculative_tokens_per_batch_size"] = vllm_ranges(
            server.table, server.max_num_seqs
        )
    if server.draft_model is not None:
        config["model"] = server.draft_model
    return json.dumps(config, separators=(", ", ": "))


def vllm_server_args(server: VllmServer, extra: Sequence[str] = ()) -> list[str]:
    """`serve MODEL` and its flags (depth 0: no speculation), then `extra` (which wins)."""
    args = ["serve", server.model, "--host", server.host, "--port", str(server.port)]
    args += ["--tensor-parallel-size", str(server.tp)]
    if server.steps > 0:
        args += ["--speculative-config", speculative_config(server)]
        args += ["--per-request-spec-decode-metrics", PER_REQUEST_SPEC_METRICS]
    args += ["--max-num-seqs", str(server.max_num_seqs)]
    return [*args, *extra]

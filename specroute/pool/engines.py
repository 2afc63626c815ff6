"""What each engine a backend may run (SGLang or vLLM) exposes, read into one shape: which engine
answers, its depth, capacity and load, and its acceptance. Pure functions; the pool does the I/O.

vLLM facts, from its source: `/server_info` exists only with `VLLM_SERVER_DEV_MODE=1` and then
holds `vllm_config` (vllm/entrypoints/serve/instrumentator/server_info.py, registered in that
package's `__init__.py`); `/health` answers 200 once the engine runs (`.../health.py`). Its
speculative metrics are counters (vllm/v1/spec_decode/metrics.py, `SpecDecodingProm`):
`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
`..._num_accepted_tokens_per_pos{position}` (one child per position 0..K-1, made at start-up),
the mean accept length over a window being 1 + accepted / drafts. Load comes from the gauges
`vllm:num_requests_running` and `vllm:num_requests_waiting` (vllm/v1/metrics/loggers.py).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from specroute.pool.promtext import BackendMetrics
from specroute.prometheus import VLLM_PREFIX, read_samples

__all__ = [
    "MIN_WINDOW_DRAFTS",
    "PROBE_PATH",
    "STREAM_FRAMING",
    "VLLM_GAUGE_LAG_S",
    "Engine",
    "VllmSettings",
    "engine_of_metrics",
    "engine_of_server_info",
    "parse_vllm_metrics",
    "vllm_settings",
]

Engine = Literal["sglang", "vllm"]

PROBE_PATH: dict[Engine, str] = {"sglang": "/ready", "vllm": "/health"}
"""Each engine's cheap readiness check (SGLang's /health runs a generation; vLLM's does not)."""

STREAM_FRAMING: dict[Engine, int] = {"sglang": 3, "vllm": 2}
"""Chat stream events that are not decode iterations: SGLang sends a role event, the prefill's
token and a finish event of its own; vLLM (vllm/entrypoints/openai/chat_completion/serving.py)
puts the finish reason on the last content event."""

VLLM_GAUGE_LAG_S = 6.0
"""How late vLLM's running and waiting gauges may be: 3 to 6 s (vllm-project/vllm#49538); the
proxy takes its own count at its peak over this long when it reads a scrape of them."""

_VLLM = VLLM_PREFIX
_DRAFTS = "vllm:spec_decode_num_drafts_total"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "queued",
    "vllm:generation_tokens_total": "generation_tokens",
    _DRAFTS: "verify_calls",
    _ACCEPTED: "accepted_tokens",
}


def engine_of_server_info(info: dict[str, Any]) -> Engine:
    """vLLM's developer-mode /server_info holds `vllm_config`; SGLang's holds its arguments."""
    return "vllm" if "vllm_config" in info else "sglang"


def engine_of_metrics(text: str) -> Engine | None:
    """The engine whose metric prefix the scrape carries; None when neither shows."""
    for line in text.splitlines():
        if line.startswith(_VLLM):
            return "vllm"
        if line.startswith(("sglang:", "sglang_")):
            return "sglang"
    return None


class VllmSettings:
    """What a vLLM server's developer-mode `/server_info?config_format=json` says."""

    __slots__ = ("capacity", "dynamic", "method", "steps")

    def __init__(
        self, steps: int | None, capacity: int | None, method: str | None, dynamic: bool = False
    ) -> None:
        self.steps = steps
        self.capacity = capacity
        self.method = method
        self.dynamic = dynamic
        """K follows the batch size (`num_speculative_tokens_per_batch_size`): `steps` is the
        most it drafts, and no accept length belongs to one depth."""


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def vllm_settings(info: dict[str, Any]) -> VllmSettings:
    """Depth, method and `max_num_seqs` from `vllm_config` (a JSON object only when asked with
    `config_format=json`; a text dump otherwise, which says nothing here)."""
    config = info.get("vllm_config")
    if not isinstance(config, dict):
        return VllmSettings(None, None, None)
    spec = config.get("speculative_config")
    capacity = _int(_section(config, "scheduler_config").get("max_num_seqs"))
    if spec is None:
        return VllmSettings(0, capacity, None)
    spec = spec if isinstance(spec, dict) else {}
    method = spec.get("method")
    return VllmSettings(
        _int(spec.get("num_speculative_tokens")),
        capacity,
        method if isinstance(method, str) else None,
        dynamic=bool(spec.get("num_speculative_tokens_per_batch_size")),
    )


def parse_vllm_metrics(text: str, previous: BackendMetrics | None = None) -> BackendMetrics:
    """One vLLM scrape: load gauges and counters summed over engines (data-parallel ranks), the
    depth from the per-position counters, and the accept length over the window that ended with
    this scrape (1 + accepted / drafts; the last window's figure while too few drafts were
    verified since, `MIN_WINDOW_DRAFTS`); `previous` is the backend's last scrape."""
    lines = [ln for ln in text.splitlines() if ln.startswith(_VLLM)]
    samples = read_samples("\n".join(ln for ln in lines if ln.startswith((*_GAUGES, _PER_POS))))
    if samples is None:
        return BackendMetrics()
    found: dict[str, float] = {}
    positions: set[str] = set()
    for sample in samples:
        if sample.name == _PER_POS:
            positions.add(sample.labels.get("position", ""))
            continue
        field = _GAUGES.get(sample.name)
        if field is not None and math.isfinite(sample.value):
            found[field] = found.get(field, 0.0) + float(sample.value)
    metrics = BackendMetrics(**found)
    if positions:
        metrics.steps = float(len(positions))
    elif lines and metrics.verify_calls is None:
        metrics.steps = 0.0  # vLLM registers no speculative counter without speculation
    metrics.accept_length = _window_accept_length(metrics, previous)
    return metrics


MIN_WINDOW_DRAFTS = 256.0
"""Drafts an accept length is read over: a scrape that lands a few drafts after the last reads
1 or `steps + 1` by chance, and every reply that ends before the next scrape learns it
(`Telemetry.observe`); fewer drafts than this keep the last figure and the window goes on.
256 drafts put it within about 3% (one draft's accepted tokens vary by about 1); a server
verifying one request at depth 3 passes that many in about 5 s, the default scrape interval."""


def _window_accept_length(now: BackendMetrics, before: BackendMetrics | None) -> float | None:
    """1 + accepted / drafts since the window began (the server's start, its restart or the
    last figure), once at least `MIN_WINDOW_DRAFTS` were verified in it; else the last figure.
    Sets where the next window begins on `now`."""
    drafts, accepted = now.verify_calls, now.accepted_tokens
    if drafts is None or accepted is None:
        return None
    last, base_drafts, base_accepted = None, 0.0, 0.0
    if before is not None and before.verify_calls is not None:
        last = before.accept_length
        base_drafts = _first(before.window_drafts, before.verify_calls)
        base_accepted = _first(before.window_accepted, before.accepted_tokens, 0.0)
    if drafts < base_drafts or accepted < base_accepted:
        # The server restarted: its counters began again, and its depth may have changed.
        last, base_drafts, base_accepted = None, 0.0, 0.0
    d_drafts = drafts - base_drafts
    if d_drafts < MIN_WINDOW_DRAFTS:
        now.window_drafts, now.window_accepted = base_drafts, base_accepted
        return last
    now.window_drafts, now.window_accepted = drafts, accepted
    return 1.0 + (accepted - base_accepted) / d_drafts


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)

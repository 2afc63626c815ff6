"""What the bench asks a server besides completions: its model, `/server_info`, and the
Prometheus counters that give the accept length as deltas over a run (`sglang:` or `sglang_`;
vLLM's `vllm:spec_decode_*` counters, vllm/v1/spec_decode/metrics.py, where SGLang's are absent).
"""

from __future__ import annotations

from typing import Any

import msgspec

from specroute.bench.client import BenchClient
from specroute.prometheus import sglang_values, vllm_values

__all__ = ["Counters", "ServerFacts", "fetch_counters", "fetch_facts", "parse_counters"]

_GENERATION = "generation_tokens_total"
_VERIFY = "spec_verify_calls_total"
_VLLM_GENERATION = "generation_tokens_total"
_VLLM_DRAFTS = "spec_decode_num_drafts_total"
_VLLM_ACCEPTED = "spec_decode_num_accepted_tokens_total"


class Counters(msgspec.Struct, frozen=True):
    """Lifetime token and verify counters (summed over label sets): SGLang's, or vLLM's with
    its drafts as the verifies and its accepted draft tokens."""

    generation_tokens: float
    verify_calls: float
    accepted_drafts: float | None = None

    def accept_length_since(self, before: Counters) -> float | None:
        """SGLang: tokens per verify; vLLM: 1 + accepted / drafts (its own formula)."""
        verifies = self.verify_calls - before.verify_calls
        if verifies <= 0:
            return None
        if self.accepted_drafts is not None and before.accepted_drafts is not None:
            return 1.0 + (self.accepted_drafts - before.accepted_drafts) / verifies
        return (self.generation_tokens - before.generation_tokens) / verifies


class ServerFacts(msgspec.Struct, kw_only=True):
    """The target as it describes itself (None where it does not say)."""

    model: str | None = None
    steps: int | None = None
    algorithm: str | None = None
    max_running_requests: int | None = None
    avg_spec_accept_length: float | None = None
    version: str | None = None


def parse_counters(text: str) -> Counters | None:
    """Sum `generation_tokens_total` and `spec_verify_calls_total` over their label sets (else
    vLLM's generation tokens, drafts and accepted tokens); None when the server reports none
    (or its text does not parse)."""
    values = sglang_values(text, (_GENERATION, _VERIFY)) or {}
    if _GENERATION not in values and _VERIFY not in values:
        return _vllm_counters(text)
    return Counters(sum(values.get(_GENERATION, ())), sum(values.get(_VERIFY, ())))


def _vllm_counters(text: str) -> Counters | None:
    values = vllm_values(text, (_VLLM_GENERATION, _VLLM_DRAFTS, _VLLM_ACCEPTED)) or {}
    if _VLLM_GENERATION not in values and _VLLM_DRAFTS not in values:
        return None
    accepted = values.get(_VLLM_ACCEPTED)
    return Counters(
        sum(values.get(_VLLM_GENERATION, ())),
        sum(values.get(_VLLM_DRAFTS, ())),
        None if accepted is None else sum(accepted),
    )


async def fetch_counters(client: BenchClient, url: str) -> Counters | None:
    body = await client.get(url + "/metrics")
    return parse_counters(body.decode(errors="replace")) if body else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def fetch_facts(client: BenchClient, url: str) -> ServerFacts:
    """Model from `/v1/models`; steps, capacity and lifetime accept length from `/server_info`."""
    facts = ServerFacts()
    models = await client.get(url + "/v1/models")
    if models:
        data = msgspec.json.decode(models).get("data") or []
        if data and isinstance(data[0], dict):
            facts.model = data[0].get("id")
    info_body = await client.get(url + "/server_info")
    if info_body:
        info = msgspec.json.decode(info_body)
        if isinstance(info, dict):
            steps = _number(info.get("speculative_num_steps"))
            facts.steps = int(steps) if steps is not None else None
            facts.algorithm = info.get("speculative_algorithm")
            capacity = _number(info.get("max_running_requests"))
            facts.max_running_requests = int(capacity) if capacity is not None else None
            facts.version = info.get("version")
            states = info.get("internal_states") or []
            if states and isinstance(states[0], dict):
                facts.avg_spec_accept_length = _number(states[0].get("avg_spec_accept_length"))
    return facts

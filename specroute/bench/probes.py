"""What the bench asks a server besides completions: its model, `/server_info`, and the
Prometheus counters that give the accept length as deltas over a run (`sglang:` or `sglang_`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from specroute.bench.client import BenchClient
from specroute.prometheus import sglang_values

__all__ = ["Counters", "ServerFacts", "fetch_counters", "fetch_facts", "parse_counters"]

_GENERATION = "generation_tokens_total"
_VERIFY = "spec_verify_calls_total"


class Counters(msgspec.Struct, frozen=True):
    """SGLang's lifetime token and verify counters (summed over label sets)."""

    generation_tokens: float
    verify_calls: float

    def accept_length_since(self, before: Counters) -> float | None:
        verifies = self.verify_calls - before.verify_calls
        tokens = self.generation_tokens - before.generation_tokens
        return tokens / verifies if verifies > 0 else None


class ServerFacts(msgspec.Struct, kw_only=True):
    """The target as it describes itself (None where it does not say)."""

    model: str | None = None
    steps: int | None = None
    algorithm: str | None = None
    max_running_requests: int | None = None
    avg_spec_accept_length: float | None = None
    version: str | None = None


def parse_counters(text: str) -> Counters | None:
    """Sum `generation_tokens_total` and `spec_verify_calls_total` over their label sets; None
    when the server reports neither (or its text does not parse)."""
    values = sglang_values(text, (_GENERATION, _VERIFY)) or {}
    if _GENERATION not in values and _VERIFY not in values:
        return None
    return Counters(sum(values.get(_GENERATION, ())), sum(values.get(_VERIFY, ())))


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

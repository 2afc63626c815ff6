"""What a vLLM server shows of its depth and batch limit while the tune loads it.

vLLM serves no `/server_info` outside its developer mode, so a tune of vLLM cannot read K or the
batch limit back the way it reads SGLang's. Two things it can read while it sweeps:
- the depth: vLLM registers one `vllm:spec_decode_num_accepted_tokens_per_pos` series per draft
  position (vllm/v1/spec_decode/metrics.py, `SpecDecodingProm`), none without speculation;
- the batch limit: `vllm:num_requests_running` stops rising where the scheduler admits no more,
  `--max-num-seqs` or the KV blocks, whichever binds first (vllm/v1/core/sched/scheduler.py:
  a waiting request stays waiting when `allocate_slots` finds no free block). Where requests waited,
  the peak of running requests is that limit; where none waited, the launch's `--max-num-seqs`.

The gauges lag by seconds (vllm-project/vllm#49538); a peak held through a whole level of
waiting requests still shows.
"""

from __future__ import annotations

import asyncio

import msgspec

from specroute.bench.client import BenchClient
from specroute.bench.probes import ServerFacts
from specroute.pool.engines import parse_vllm_metrics

__all__ = ["POLL_S", "LoadWatch", "as_launched"]

POLL_S = 0.2
"""Seconds between two reads of the server's `/metrics` during the sweeps."""


class LoadWatch:
    """The peak of running requests, whether any request waited, and the depth the
    per-position counters show, over the reads `watch` makes until it is cancelled."""

    def __init__(self) -> None:
        self.peak = 0
        self.waited = False
        self.steps: int | None = None

    def read(self, text: str) -> None:
        metrics = parse_vllm_metrics(text)
        if metrics.running is not None:
            self.peak = max(self.peak, int(metrics.running))
        if metrics.queued:
            self.waited = True
        if metrics.steps is not None:
            self.steps = int(metrics.steps)

    async def watch(self, client: BenchClient, url: str) -> None:
        while True:
            body = await client.get(url + "/metrics")
            if body:
                self.read(body.decode(errors="replace"))
            await asyncio.sleep(POLL_S)

    def limit(self, launched: int) -> int:
        """The batch limit the server held: the peak where requests waited, else the launch's."""
        return min(self.peak, launched) if self.waited and self.peak > 0 else launched


def as_launched(
    facts: ServerFacts, *, steps: int, method: str, limit: int, watch: LoadWatch
) -> ServerFacts:
    """A vLLM server's facts as the tune knows them: K and method from the launch (None at depth
    0, as SGLang reports it), the batch limit it held (`LoadWatch.limit`); what the server
    reported itself is kept."""
    return msgspec.structs.replace(
        facts,
        steps=facts.steps if facts.steps is not None else (steps or None),
        algorithm=facts.algorithm or (method if steps else None),
        max_running_requests=facts.max_running_requests or watch.limit(limit),
    )

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
from specroute.prometheus import VLLM_PREFIX, read_samples, vllm_values

__all__ = ["POLL_S", "LoadWatch", "as_launched"]

_RUNNING, _WAITING = "num_requests_running", "num_requests_waiting"
_PER_POS = VLLM_PREFIX + "spec_decode_num_accepted_tokens_per_pos_total"
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
        """One scrape: the gauges summed over engines (data-parallel ranks), and K as the
        number of distinct `position` labels (each engine repeats them)."""
        values = vllm_values(text, (_RUNNING, _WAITING)) or {}
        if _RUNNING in values:
            self.peak = max(self.peak, int(sum(values[_RUNNING])))
        if sum(values.get(_WAITING, ())) > 0:
            self.waited = True
        lines = "\n".join(ln for ln in text.splitlines() if ln.startswith(_PER_POS))
        positions = {s.labels.get("position") for s in read_samples(lines) or ()}
        if positions:
            self.steps = len(positions)

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

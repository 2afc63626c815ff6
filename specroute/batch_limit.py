"""A vLLM server's batch limit where nothing states it, read from its load gauges.

vLLM serves no `/server_info` outside its developer mode, and its limit is whichever binds
first of `--max-num-seqs` and the KV blocks (vllm/v1/core/sched/scheduler.py: a waiting request
stays waiting when `allocate_slots` finds no free block). While requests wait, the requests
running are that limit. One read is not enough: a request that arrived between two scheduler
steps shows as waiting beside a batch with room. A read counts only in a run of at least two
reads at the same depth with requests waiting; the limit at a depth is the most requests such
reads showed running (not the least of a run: a request that just finished leaves its slot
empty until the next step, and the batch is full again then). The proxy reads it from its
scrapes of a vLLM server that neither the server, the operator nor a prior gives a figure for
(`pool/backend.py`).

The tune reads the plain peak where requests waited (`tune/vllm_facts.py`): its sweeps push
each level past the limit, while the two-read rule missed a short sweep's limit under CI load
(a sweep of seconds read between scheduler steps). The proxy sees hours of ordinary load, where
one stray read would set a limit far too low and keep it.

Tried first without `policies.predict.loads` (2026-12-02): three k2 servers lost 22% in the hot
hour (4381 to 3410 tok/s, virtual time), the first server to show its limit taking twice its
share, because least_loaded compared its requests per slot with its twins' raw counts.
"""

from __future__ import annotations

__all__ = ["BatchLimit"]


class BatchLimit:
    """The most requests a server ran, per depth, in runs of reads with requests waiting."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self._last: tuple[int, int] | None = None
        """The previous read, where requests waited: (depth, running)."""

    def read(self, steps: int | None, running: float | None, waiting: float | None) -> bool:
        """One read of the gauges (summed over data-parallel engines) at depth `steps`; True
        when it raised the limit seen there."""
        if steps is None or running is None or waiting is None or waiting <= 0 or running < 1:
            self._last = None
            return False
        now = int(running)
        raised = False
        if self._last is not None and self._last[0] == steps:
            before = self.seen.get(steps, 0)
            self.seen[steps] = max(before, now, self._last[1])
            raised = self.seen[steps] > before
        self._last = (steps, now)
        return raised

    def at(self, steps: int | None) -> int | None:
        """The limit seen at `steps`, or None where requests never waited twice running."""
        return None if steps is None else self.seen.get(steps)

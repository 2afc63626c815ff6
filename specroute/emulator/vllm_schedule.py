"""vLLM's in-engine alternative to routing by depth: `num_speculative_tokens_per_batch_size`, a
table of (first batch size, last batch size, K) ranges (vllm-project/vllm#32374).

Rules from vllm/v1/spec_decode/dynamic/utils.py (`validate_and_normalize_dynamic_sd_schedule`,
`build_dynamic_sd_schedule_lookup`): ranges positive, start <= end, sorted without overlap, the
first starting at 1, K >= 0; a batch size in a gap or past the last range keeps the K before
it; K never exceeds `num_speculative_tokens`. The scheduler looks K up by the number of requests
it schedules in a step (vllm/v1/core/sched/scheduler.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["DynamicSchedule"]


class DynamicSchedule:
    """K per batch size, as vLLM's scheduler picks it; pure."""

    def __init__(self, ranges: Sequence[Sequence[int]], max_k: int) -> None:
        if max_k <= 0:
            raise ValueError("num_speculative_tokens_per_batch_size needs --steps 1 or more")
        if not ranges:
            raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
        parsed = sorted((int(r[0]), int(r[1]), int(r[2])) for r in ranges if len(r) == 3)
        if len(parsed) != len(ranges):
            raise ValueError("each range must be (range_start, range_end, num_speculative_tokens)")
        previous_end = 0
        for start, end, k in parsed:
            if start <= 0 or end <= 0 or start > end or k < 0:
                raise ValueError(f"bad range ({start}, {end}, {k})")
            if start <= previous_end:
                raise ValueError("batch-size ranges must not overlap")
            previous_end = end
        if parsed[0][0] != 1:
            raise ValueError("the first batch-size range must start at 1")
        self._starts = [start for start, _, _ in parsed]
        self._ks = [min(max_k, k) for _, _, k in parsed]

    def __call__(self, batch: int) -> int:
        """K for a step that schedules `batch` requests (an empty step: the first range's)."""
        index = bisect.bisect_right(self._starts, max(1, batch)) - 1
        return self._ks[index]

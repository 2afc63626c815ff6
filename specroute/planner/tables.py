"""vLLM's K per batch size (`num_speculative_tokens_per_batch_size`, vllm-project/vllm#32374) as
the planner writes it: for a server whose `num_speculative_tokens` is D (memory sized for D, so
D's capacity), at every batch size it can run, the depth up to D with the most tok/s for the
regime's class mix, from the same E_k, T(b, k) and first-token waits its forecasts read. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from specroute.planner.forecast import Physics, Setting, Table

__all__ = ["best_table", "table_settings"]


def best_table(phys: Physics, shares: Mapping[str, float], deepest: int) -> Table:
    """(first batch size, K) ranges for `num_speculative_tokens` = `deepest`, K among the
    depths `phys` knows up to it, for users split by `shares` (a mix's rate at one batch size is
    its classes' rates weighted: the iteration time does not depend on the class)."""
    total = sum(shares.values())
    weights = {c: s / total for c, s in shares.items() if s > 0} if total > 0 else {}
    ks = [k for k in sorted(phys.depths) if k <= deepest]

    def rate(k: int, batch: int) -> float:
        seconds = phys.time(k, batch)
        if not weights:
            return 1.0 / seconds
        return sum(w * phys.speed(c, k, seconds, batch) for c, w in weights.items())

    ranges: list[tuple[int, int]] = []
    for batch in range(1, phys.depths[deepest].capacity + 1):
        k = max(ks, key=lambda d: (rate(d, batch), d))
        if not ranges or ranges[-1][1] != k:
            ranges.append((batch, k))
    return tuple(ranges)


def table_settings(
    phys: Physics, shares: Mapping[str, float], deepests: Iterable[int]
) -> list[Setting]:
    """A table setting for each of `deepests` (> 0, known to `phys`) whose table is not that
    one depth throughout (a fixed setting already is)."""
    out = []
    for deepest in deepests:
        if deepest <= 0 or deepest not in phys.depths:
            continue
        table = best_table(phys, shares, deepest)
        if table != ((1, deepest),):
            out.append(Setting(steps=deepest, table=table))
    return out

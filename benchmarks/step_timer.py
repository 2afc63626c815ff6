"""How the decode-step benchmark times a step: CUDA-graph replays between CUDA events.

Also a kernel-level profile of one eager step (torch.profiler), to see where its time goes:
how many kernels, how much of the step they fill, and which ones dominate.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch


class Timer:
    """Milliseconds per run of a step: CUDA-graph replays between CUDA events, else wall clock."""

    def __init__(self, device: torch.device, warmup: int, repeats: int, graphs: bool) -> None:
        self.device, self.warmup, self.repeats = device, warmup, repeats
        self.graphs = graphs and device.type == "cuda"

    def __call__(self, step: Callable[[], object]) -> tuple[list[float], bool]:
        if self.device.type != "cuda":
            return self._wall(step), False
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # compiles kernels and creates library handles outside capture
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        if not self.graphs:
            return self._events(step), False
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        try:
            return self._events(graph.replay), True
        finally:
            del graph

    def _wall(self, step: Callable[[], object]) -> list[float]:
        for _ in range(self.warmup):
            step()
        samples = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            step()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples

    def _events(self, run: Callable[[], object]) -> list[float]:
        for _ in range(self.warmup):
            run()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(self.repeats)]  # fmt: skip
        for start, end in pairs:
            start.record()
            run()
            end.record()
        torch.cuda.synchronize(self.device)
        return [start.elapsed_time(end) for start, end in pairs]

    def median_ms(self, step: Callable[[], object]) -> float:
        return statistics.median(self(step)[0])


def kernel_profile(step: Callable[[], object], replay_ms: float, top: int = 12) -> dict[str, Any]:
    """The CUDA kernels one eager run of `step` launches: count, busy time, the largest."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if "CUDA" not in str(event.device_type):
            continue
        entry = totals[event.name]
        entry[0] += 1
        entry[1] += event.time_range.elapsed_us() / 1e3
    busy = sum(ms for _, ms in totals.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "kernels": int(sum(n for n, _ in totals.values())), "busy_ms": round(busy, 4),
        "graph_replay_ms": round(replay_ms, 4),
        "largest": [{"name": name[:120], "count": int(n), "ms": round(ms, 4)}
                    for name, (n, ms) in ranked],
    }  # fmt: skip

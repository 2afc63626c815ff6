"""The `num_speculative_tokens_per_batch_size` table an operator writes for a vLLM pool
(vllm-project/vllm#32374) from tune's measurements: each depth's tok/s at a few batch sizes
for each class, on one emulated server (what `specroute tune` measures per concurrency)."""

from __future__ import annotations

import bisect
import math

from policy_sim import PROMPT_TOKENS

from specroute.bench.trace import Phase, Scenario
from specroute.bench.workload import Sampling
from specroute.emulator.engine import Engine
from specroute.emulator.options import VLLM_DEFAULT_MAX_NUM_SEQS
from specroute.emulator.profiles import Profile, sampling_class
from specroute.speculation import is_greedy

MAX_K = 7
TABLE_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
"""Batch sizes tune measures at each depth (and the depth's capacity)."""
Table = tuple[tuple[int, int, int], ...]


def measured_rate(profile: Profile, k: int, batch: int, shape: Sampling) -> float:
    """tok/s of one server at depth `k` with `batch` users sending requests of one class of
    the trace, each the next as soon as one ends (what tune measures at a concurrency, the
    prefills and the lengths EOS draws included)."""
    engine = Engine(profile, steps=k, max_running_requests=batch, seed=batch * 31 + k)
    sent = 0

    def send() -> None:
        nonlocal sent
        sent += 1
        klass = sampling_class(shape.temperature)
        engine.submit(f"t{sent}", prompt_tokens=PROMPT_TOKENS, max_new_tokens=shape.max_tokens,
                      klass=klass, ignore_eos=shape.ignore_eos)  # fmt: skip

    for _ in range(batch):
        send()
    tokens, seconds = 0, 0.0
    for _ in range(max(300, 8000 // batch)):
        it = engine.step()
        if it is None:
            break
        seconds += it.duration
        for e in it.emissions:
            tokens += e.tokens
            if e.finish_reason is not None:
                send()
    return tokens / seconds if seconds else 0.0


def shapes(scenario: Scenario) -> tuple[Sampling, Sampling]:
    """The trace's greedy and sampled requests: of each, its most used setting."""
    used: dict[Sampling, float] = {}
    for p in scenario.phases:
        for s in p.mix or scenario.mix:
            used[s] = used.get(s, 0.0) + s.weight * p.concurrency * p.duration
    greedy = [s for s in used if is_greedy(s.temperature)] or [Sampling(temperature=0.0)]
    sampled = [s for s in used if not is_greedy(s.temperature)] or [Sampling(temperature=1.0)]
    return max(greedy, key=lambda s: used.get(s, 0.0)), max(sampled, key=lambda s: used.get(s, 0.0))


def _greedy(scenario: Scenario, phase: Phase) -> float:
    mix = phase.mix or scenario.mix
    total = sum(s.weight for s in mix) or 1.0
    return sum(s.weight for s in mix if is_greedy(s.temperature)) / total


class Measurements:
    """Each depth's measured tok/s for the trace's greedy and sampled requests at tune's batch
    sizes, interpolated between."""

    def __init__(self, profile: Profile, scenario: Scenario) -> None:
        greedy, sampled = shapes(scenario)
        self.caps = {k: min(VLLM_DEFAULT_MAX_NUM_SEQS, profile.capacity(k))
                     for k in range(MAX_K + 1)}  # fmt: skip
        self.sizes = {k: sorted({b for b in TABLE_BATCHES if b < cap} | {cap})
                      for k, cap in self.caps.items()}  # fmt: skip
        self.rates = {(k, b): (measured_rate(profile, k, b, greedy),
                               measured_rate(profile, k, b, sampled))
                      for k, sizes in self.sizes.items() for b in sizes}  # fmt: skip

    def rate(self, k: int, batch: int, greedy: float) -> float:
        """tok/s at depth `k` with `batch` running (at most its capacity), `greedy` share."""
        sizes = self.sizes[k]
        b = max(1, min(batch, self.caps[k]))
        j = bisect.bisect_left(sizes, b)
        hi = self.rates[k, sizes[j]]
        if sizes[j] == b:
            g, s = hi
        else:
            lo, w = self.rates[k, sizes[j - 1]], (b - sizes[j - 1]) / (sizes[j] - sizes[j - 1])
            g, s = lo[0] + w * (hi[0] - lo[0]), lo[1] + w * (hi[1] - lo[1])
        return greedy * g + (1 - greedy) * s


def operator_table(
    profile: Profile, scenario: Scenario, servers: int = 3, max_k: int | None = None
) -> tuple[int, Table]:
    """(num_speculative_tokens, table) as an operator who knows the trace writes them: each
    phase puts `concurrency / servers` requests on a server, of its class mix. At each batch
    size, the best K for the mix of the phases whose load is nearest (the iteration time does
    not depend on the class: a mix's rate is its classes' rates weighted); as
    `num_speculative_tokens` (which sizes the memory, so caps the batch) the deepest K whose
    table gives the most tokens over the trace, at most `max_k`."""
    tune = Measurements(profile, scenario)
    loads = [(max(1, math.ceil(p.concurrency / servers)), _greedy(scenario, p), p.duration)
             for p in scenario.phases]  # fmt: skip

    def mix_at(batch: int) -> float:
        near = min(abs(math.log(b / batch)) for b, _, _ in loads)
        picked = [(g, d) for b, g, d in loads if abs(math.log(b / batch)) <= near + 1e-9]
        return sum(g * d for g, d in picked) / sum(d for _, d in picked)

    def best(deepest: int, batch: int) -> int:
        running = min(batch, tune.caps[deepest])
        return max(range(deepest + 1), key=lambda k: tune.rate(k, running, mix_at(batch)))

    def value(deepest: int) -> float:
        cap = tune.caps[deepest]
        return sum(d * tune.rate(best(deepest, b), min(b, cap), g) for b, g, d in loads)

    deepest = max(range((MAX_K if max_k is None else max_k) + 1), key=value)
    ranges: list[list[int]] = []
    for b in range(1, tune.caps[deepest] + 1):
        k = best(deepest, b)
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, k])
    ranges[-1][1] = VLLM_DEFAULT_MAX_NUM_SEQS
    return max(r[2] for r in ranges), tuple((a, b, k) for a, b, k in ranges)

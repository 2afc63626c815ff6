"""SGLang's `--speculative-adaptive`: per batch-size tier, an EMA of accepted drafts sets depth.

Follows `srt/speculative/adaptive_spec_params.py` (`AdaptiveStepSlot`, `DEFAULT_ADAPTIVE_CONFIG`)
and `adaptive_step_router.py`: each tier keeps its own depth, EMA and batch count; a batch goes to
the tier with the largest key at or under its CUDA-graph-padded size. The file format is
`--speculative-adaptive-config`'s (read by `specroute.emulator.adaptive_config`).
"""

from __future__ import annotations

import bisect
import math
from typing import Annotated

import msgspec

__all__ = [
    "DEFAULT_ADAPTIVE_CONFIG",
    "AdaptiveConfig",
    "AdaptiveSteps",
    "AdaptiveTier",
    "Tuning",
    "check_initial_steps",
]

MAX_DEPTH = 16
"""The deepest depth the emulator runs (as `--steps`)."""

GRAPH_BATCH_SIZES = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))
"""CUDA-graph batch sizes SGLang captures for speculative decoding (`server_args.py`,
`_generate_cuda_graph_batch_sizes`); a batch is padded up to the next one before routing."""

Depth = Annotated[int, msgspec.Meta(ge=0, le=MAX_DEPTH)]


class Tuning(msgspec.Struct, frozen=True, kw_only=True):
    """A tier's controller parameters; SGLang's defaults where a file leaves them out."""

    ema_alpha: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.2
    update_interval: Annotated[int, msgspec.Meta(ge=1)] = 5
    warmup_batches: Annotated[int, msgspec.Meta(ge=0)] = 10
    up_hysteresis: float = 0.0
    down_hysteresis: float = -0.25
    ceiling_coeff: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0


class AdaptiveTier(Tuning, frozen=True, kw_only=True):
    """Batches of `smallest_batch` or more (up to the next tier) choose among `candidate_steps`."""

    smallest_batch: Annotated[int, msgspec.Meta(ge=0)]
    candidate_steps: Annotated[tuple[Depth, ...], msgspec.Meta(min_length=1)]


class AdaptiveConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The tiers of one adaptive server, and the file they came from (None: SGLang's defaults)."""

    tiers: tuple[AdaptiveTier, ...]
    source: str | None = None

    @property
    def candidates(self) -> list[int]:
        """Every tier's depths: SGLang sizes memory and CUDA graphs for all of them."""
        return sorted({k for tier in self.tiers for k in tier.candidate_steps})

    @property
    def max_steps(self) -> int:
        """The deepest candidate: it sets an adaptive server's memory and so its capacity."""
        return max(self.candidates)


DEFAULT_ADAPTIVE_CONFIG = AdaptiveConfig(
    tiers=(
        AdaptiveTier(smallest_batch=1, candidate_steps=(1, 3, 5, 7)),
        AdaptiveTier(smallest_batch=8, candidate_steps=(0, 1, 3), down_hysteresis=0.0),
        AdaptiveTier(smallest_batch=32, candidate_steps=(0, 1), down_hysteresis=0.0),
        AdaptiveTier(smallest_batch=64, candidate_steps=(0,), down_hysteresis=0.0),
    )
)
"""SGLang 0.5.23's tiers: 1-7 -> {1,3,5,7}; 8-31 -> {0,1,3}; 32-63 -> {0,1}; 64+ -> {0}."""


def check_initial_steps(steps: int, config: AdaptiveConfig) -> None:
    """SGLang refuses a `--speculative-num-steps` that no tier has (`server_args.py`)."""
    if steps not in config.candidates:
        raise ValueError(
            f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps "
            f"{config.candidates}. Pass one of those values."
        )


class _TierState:
    """One tier's controller: its depth, its EMA of accepted drafts, its batch count."""

    __slots__ = ("batches", "candidates", "ema", "steps", "tier")

    def __init__(self, tier: AdaptiveTier, initial_steps: int) -> None:
        self.tier = tier
        self.candidates = sorted(set(tier.candidate_steps))
        middle = self.candidates[len(self.candidates) // 2]
        self.steps = initial_steps if initial_steps in self.candidates else middle
        self.ema = float(self.steps - 1)
        """Started at `steps - 1`: neutral, neither up nor down at the first decision."""
        self.batches = 0

    def update(self, accepted_per_verify: float) -> None:
        tier = self.tier
        if self.steps > 0:
            self.ema = (1 - tier.ema_alpha) * self.ema + tier.ema_alpha * accepted_per_verify
        self.batches += 1
        past_warmup = self.batches - tier.warmup_batches
        if past_warmup > 0 and past_warmup % tier.update_interval == 0:
            self.steps = self._target()

    def _target(self) -> int:
        """SGLang's rule: step down while the EMA is under the lower depth's threshold, else up."""
        c, old = self.candidates, self.candidates.index(self.steps)
        if self.steps == 0:
            # No drafts, no acceptance to learn from: probe the next depth up.
            target = c[min(old + 1, len(c) - 1)]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)
            return target
        i = old
        while i > 0 and self.ema <= self._drop_threshold(c[i - 1]):
            i -= 1
        if i == old:
            while i < len(c) - 1 and self.ema > c[i] - 0.5 + self.tier.up_hysteresis:
                i += 1
        if self.tier.ceiling_coeff > 0 and c[i] <= self.steps:
            # The ceiling only holds depth down; it never blocks a step up.
            ceiling = max(1, math.ceil(self.ema * self.tier.ceiling_coeff))
            while i > 0 and c[i] > ceiling:
                i -= 1
        return c[i]

    def _drop_threshold(self, lower: int) -> float:
        # Dropping to no speculation needs the EMA near zero accepted drafts.
        return (0.5 if lower == 0 else lower - 0.5) + self.tier.down_hysteresis


class AdaptiveSteps:
    """Chooses each batch's depth from its tier and learns from its verify; one per engine."""

    def __init__(
        self, initial_steps: int, config: AdaptiveConfig = DEFAULT_ADAPTIVE_CONFIG
    ) -> None:
        check_initial_steps(initial_steps, config)
        self.config = config
        tiers = sorted(config.tiers, key=lambda t: t.smallest_batch)
        self._keys = [t.smallest_batch for t in tiers]
        self._slots = [_TierState(t, initial_steps) for t in tiers]

    def steps_for(self, batch_size: int) -> int:
        """The depth a decode batch of `batch_size` runs at now."""
        return self._slot(batch_size).steps

    def observe(self, batch_size: int, accepted_per_verify: float) -> None:
        """Feed one verified batch to its tier; every few batches that tier may switch depth."""
        self._slot(batch_size).update(accepted_per_verify)

    def tier(self, batch_size: int) -> tuple[int, ...]:
        """The candidate depths a batch of this size chooses among."""
        return tuple(self._slot(batch_size).candidates)

    def _slot(self, batch_size: int) -> _TierState:
        graph = bisect.bisect_left(GRAPH_BATCH_SIZES, batch_size)
        if graph < len(GRAPH_BATCH_SIZES):
            batch_size = GRAPH_BATCH_SIZES[graph]
        return self._slots[max(0, bisect.bisect_right(self._keys, batch_size) - 1)]

"""SGLang's `--speculative-adaptive`: pick the draft depth per batch-size tier from an EMA.

Tiers by running batch size (SGLang 0.5.23 defaults): 1-7 -> {1,3,5,7}; 8-31 -> {0,1,3};
32-63 -> {0,1}; 64+ -> {0}. An EMA (weight 0.2) of accepted drafts per verify, 10 warm-up
batches, and a decision every 5 batches: the smallest candidate that covers the accepted
drafts plus one, so depth follows acceptance up and down within the tier.
"""

from __future__ import annotations

__all__ = ["DEFAULT_TIERS", "AdaptiveSteps"]

DEFAULT_TIERS: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1, (1, 3, 5, 7)),
    (8, (0, 1, 3)),
    (32, (0, 1)),
    (64, (0,)),
)
"""(smallest batch size of the tier, candidate depths)."""


class AdaptiveSteps:
    """Tracks acceptance and chooses the next batch's depth; one per engine."""

    MAX_STEPS = 7
    EMA_WEIGHT = 0.2
    WARMUP_BATCHES = 10
    DECIDE_EVERY = 5

    def __init__(self, initial_steps: int) -> None:
        candidates = {k for _, tier in DEFAULT_TIERS for k in tier}
        if initial_steps not in candidates:
            raise ValueError(
                f"--speculative-num-steps {initial_steps} is not one of the adaptive tiers' "
                f"depths {sorted(candidates)}"
            )
        self.steps = initial_steps
        self.ema_accepted: float | None = None
        self.batches = 0

    def observe(self, batch_size: int, accepted_per_verify: float) -> None:
        """Record one verified batch; every few batches, move to the depth its tier wants."""
        self.batches += 1
        if self.steps > 0:
            if self.ema_accepted is None:
                self.ema_accepted = accepted_per_verify
            else:
                w = self.EMA_WEIGHT
                self.ema_accepted = (1 - w) * self.ema_accepted + w * accepted_per_verify
        if self.batches < self.WARMUP_BATCHES or self.batches % self.DECIDE_EVERY:
            return
        self.steps = self.choose(batch_size)

    def choose(self, batch_size: int) -> int:
        tier = self.tier(batch_size)
        if self.ema_accepted is None:
            return max(tier) if self.steps > 0 else min(tier)
        # A depth whose drafts are all accepted is probing too little: ask for one more.
        wanted = self.ema_accepted + 1.0
        fitting = [k for k in tier if k >= wanted]
        return min(fitting) if fitting else max(tier)

    @staticmethod
    def tier(batch_size: int) -> tuple[int, ...]:
        chosen = DEFAULT_TIERS[0][1]
        for smallest, candidates in DEFAULT_TIERS:
            if batch_size >= smallest:
                chosen = candidates
        return chosen

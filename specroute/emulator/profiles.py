"""Performance profiles: the calibrated stand-ins for a GPU, a model and its draft head.

Each profile gives the iteration time `T(b, k) = t0 + k * t_draft(b) + t_verify(b * (k + 1))`,
the capacity `R(k) = floor(C / (r + k + 1))`, prefill cost, output lengths, per-position draft
acceptance for each sampling class, and how long a real server takes to start. Their sources
are in `docs/emulator-profiles.md`.
"""

from __future__ import annotations

import math

import msgspec

from specroute.speculation import expected_tokens_of_rates, is_greedy

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "SAMPLING_CLASSES",
    "Profile",
    "get_profile",
    "sampling_class",
]

SAMPLING_CLASSES = ("greedy", "low", "high")
"""greedy: as SGLang decides it (`is_greedy`); low: temperature up to 0.7; high: hotter."""


def sampling_class(temperature: float | None, top_k: int | None = None) -> str:
    """The acceptance class of a request's sampling settings (SGLang's default is 1.0)."""
    if is_greedy(temperature, top_k):
        return "greedy"
    t = 1.0 if temperature is None else temperature
    return "low" if t <= 0.7 else "high"


class Profile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one emulated model/GPU combination behaves; all times in seconds."""

    name: str
    description: str
    model_name: str
    t0: float
    """Fixed cost of one decode iteration (weights read, launch overheads)."""
    t_draft: float
    """Cost of one draft step at batch size 0."""
    t_draft_per_request: float
    """Extra cost of one draft step per running request."""
    t_token: float
    """Verify cost per token in the batch while memory-bound."""
    experts: int = 0
    """MoE experts per layer (0: dense); with `experts_per_token`, distinct experts read."""
    experts_per_token: int = 0
    t_expert: float = 0.0
    """Cost of reading one distinct expert's weights (summed over layers)."""
    knee_tokens: int
    """Tokens in the verify batch past which the step turns compute-bound."""
    t_token_compute: float
    """Extra verify cost per token past the knee."""
    prefill_base: float
    """Fixed cost of a prefill pass."""
    prefill_per_token: float
    """Prefill cost per prompt token."""
    capacity_c: float
    capacity_r: float
    acceptance: dict[str, tuple[float, ...]]
    """Per-position draft acceptance by sampling class; the last value repeats past the end."""
    spread: float
    """Beta concentration of a request's acceptance around its class mean (larger: tighter)."""
    mean_output_tokens: int
    """Mean length at which a request without `ignore_eos` ends on its own (log-normal)."""
    context_length: int = 262144
    startup_s: float
    """Seconds from launch to ready on real hardware (weights, CUDA graphs, warm-up)."""

    def __post_init__(self) -> None:
        missing = set(SAMPLING_CLASSES) - set(self.acceptance)
        if missing:
            raise ValueError(f"profile {self.name!r} lacks acceptance for {sorted(missing)}")
        for klass, rates in self.acceptance.items():
            if not rates or not all(0.0 <= a <= 1.0 for a in rates):
                raise ValueError(f"profile {self.name!r}: acceptance[{klass}] must be in [0, 1]")

    def capacity(self, steps: int) -> int:
        """Max running requests at depth `steps`: drafts reserve memory per request."""
        return max(1, math.floor(self.capacity_c / (self.capacity_r + steps + 1)))

    def iteration_time(self, batch: int, steps: int) -> float:
        """Seconds for one decode iteration of `batch` requests drafting `steps` tokens each."""
        if batch <= 0:
            return 0.0
        tokens = batch * (steps + 1)
        verify = self.t_token * tokens + self.t_token_compute * max(0, tokens - self.knee_tokens)
        if self.experts:
            # Expected distinct experts touched by `tokens` top-k routings: each read once.
            miss = 1.0 - self.experts_per_token / self.experts
            verify += self.t_expert * self.experts * (1.0 - miss**tokens)
        draft = steps * (self.t_draft + self.t_draft_per_request * batch)
        return self.t0 + draft + verify

    def prefill_time(self, prompt_tokens: int) -> float:
        return self.prefill_base + self.prefill_per_token * prompt_tokens

    def rates(self, klass: str, steps: int) -> tuple[float, ...]:
        """Per-position acceptance for the first `steps` draft positions of a class."""
        base = self.acceptance[klass]
        return tuple(base[min(i, len(base) - 1)] for i in range(steps))

    def expected_tokens(self, klass: str, steps: int) -> float:
        """E_k: tokens per verify, `1 + a1 + a1*a2 + ...` for the class mean."""
        return expected_tokens_of_rates(self.rates(klass, steps))


SEED_QWEN35_122B = Profile(
    name="seed-qwen35-122b",
    description=(
        "Qwen3.5-122B-A10B with its MTP head on 4x RTX PRO 6000 (TP 4), fitted to the seed "
        "measurement: drafts nearly free, verify memory-bound, greedy acceptance near 1."
    ),
    model_name="Qwen/Qwen3.5-122B-A10B",
    t0=0.0155,
    t_draft=0.0,
    t_draft_per_request=0.0,
    t_token=0.000146,
    experts=256,
    experts_per_token=8,
    t_expert=0.0000287,
    knee_tokens=1_000_000,
    t_token_compute=0.0,
    prefill_base=0.004,
    prefill_per_token=0.00004,
    capacity_c=106,
    capacity_r=2,
    acceptance={
        "greedy": (0.995,),
        "low": (0.88, 0.80, 0.72, 0.65),
        "high": (0.84, 0.60, 0.39, 0.27),
    },
    spread=40.0,
    mean_output_tokens=400,
    startup_s=88.0,
)

COSTLY_DRAFTS = Profile(
    name="costly-drafts",
    description=(
        "A dense model whose draft head costs real time (5% of t0 per step, growing with the "
        "batch) and whose verify turns compute-bound past 192 tokens; acceptance decays with "
        "draft position. Sampled traffic: deep speculation wins alone, shallow or none at 64."
    ),
    model_name="emulated/costly-drafts-32b",
    t0=0.020,
    t_draft=0.0010,
    t_draft_per_request=0.00004,
    t_token=0.00012,
    knee_tokens=192,
    t_token_compute=0.00045,
    prefill_base=0.004,
    prefill_per_token=0.00005,
    capacity_c=192,
    capacity_r=2,
    acceptance={
        "greedy": (0.92, 0.85, 0.78, 0.70),
        "low": (0.80, 0.62, 0.45, 0.33),
        "high": (0.70, 0.45, 0.28, 0.18),
    },
    spread=20.0,
    mean_output_tokens=300,
    startup_s=88.0,
)

H200_QWEN35_122B_SHAPE = Profile(
    name="h200-qwen35-122b-shape",
    description=(
        "Qwen3.5-122B-A10B's shapes (bf16, random weights) on one NVIDIA H200: the iteration "
        "time measured and fitted (benchmarks/results/h200-qwen35-122b); every distinct expert "
        "read costs, so each extra draft token does; acceptance, capacity and prefill are the "
        "seed's."
    ),
    model_name="Qwen/Qwen3.5-122B-A10B",
    t0=0.0133,
    t_draft=0.000935,
    t_draft_per_request=0.0000587,
    t_token=0.0000994,
    experts=256,
    experts_per_token=8,
    t_expert=0.000326,
    knee_tokens=1_000_000,
    t_token_compute=0.0,
    prefill_base=SEED_QWEN35_122B.prefill_base,
    prefill_per_token=SEED_QWEN35_122B.prefill_per_token,
    capacity_c=SEED_QWEN35_122B.capacity_c,
    capacity_r=SEED_QWEN35_122B.capacity_r,
    acceptance=SEED_QWEN35_122B.acceptance,
    spread=SEED_QWEN35_122B.spread,
    mean_output_tokens=SEED_QWEN35_122B.mean_output_tokens,
    startup_s=SEED_QWEN35_122B.startup_s,
)
"""Fitted by `benchmarks/gpu_fit.py` (hybrid layers, context 512); `docs/emulator-profiles.md`."""

PROFILES: dict[str, Profile] = {
    p.name: p for p in (SEED_QWEN35_122B, COSTLY_DRAFTS, H200_QWEN35_122B_SHAPE)
}
DEFAULT_PROFILE = SEED_QWEN35_122B.name


def get_profile(name: str) -> Profile:
    """A built-in profile by name, with the choices in the error when it is unknown."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}") from None

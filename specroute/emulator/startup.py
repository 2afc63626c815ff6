"""Start-up as SGLang does it, in parts: the port stays closed while the weights load, the
server initialises and CUDA graphs are captured, then a warm-up; a weight cache client's weight
load drops to about a second while its daemon lives.

SGLang's `launch_server` (`srt/entrypoints/http_server.py`) starts the scheduler, which loads the
weights and captures CUDA graphs, before uvicorn binds the port: connections are refused until
then. Once listening, a warm-up thread sleeps a second, reads `/get_model_info`, sends one
8-token `/generate`, and only then marks the server up; meanwhile `/health` answers 503.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "CACHED_WEIGHTS_S",
    "WARMUP_POLL_S",
    "WARMUP_PROMPT_TOKENS",
    "WARMUP_TOKENS",
    "StartupParts",
    "StartupPlan",
]

WARMUP_POLL_S = 1.0
"""SGLang's warm-up thread sleeps this long before its first poll of the listening server."""
WARMUP_TOKENS = 8
"""`max_new_tokens` of SGLang's warm-up `/generate`."""
WARMUP_PROMPT_TOKENS = 6
"""Its prompt, "The capital city of France is", one token a word as the emulator counts."""
CACHED_WEIGHTS_S = 1.0
"""A weight cache client's weight load: CUDA IPC handles mapped from the daemon (SGLang #27139:
306-327 s from disk to under 1 s for Qwen3-235B FP8; its IPC path measured 1.3 s in all)."""
_SPLIT = {"init": 22.0, "graphs": 20.0, "warmup": 3.4}
"""Seconds of an 88-s warm start that are not the weight load: server init, tokenizer and torch
distributed (~22 s) and the ready warm-up (~3.4 s) as SGLang's fast-recovery work measured them
(lmsys blog 2026-08-21, SGLang #27139); CUDA graph capture is this emulator's assumption."""
_SPLIT_TOTAL_S = 88.0


@dataclass(frozen=True, slots=True)
class StartupParts:
    """Emulated seconds of each part of a start-up, before `--time-scale`."""

    weights_s: float
    """Weight load: from disk, or mapped from a weight cache daemon."""
    init_s: float
    """Server init: tokenizer, torch distributed, KV cache allocation."""
    graphs_s: float
    """CUDA graph capture."""
    warmup_s: float
    """Listening, not ready: SGLang's warm-up request."""

    @classmethod
    def split(cls, total_s: float) -> StartupParts:
        """`total_s` in the proportions of the 88-s warm start (`_SPLIT`); sums to `total_s`."""
        init, graphs, warmup = (total_s * _SPLIT[k] / _SPLIT_TOTAL_S for k in _SPLIT)
        return cls(total_s - init - graphs - warmup, init, graphs, warmup)

    @property
    def total_s(self) -> float:
        return self.weights_s + self.init_s + self.graphs_s + self.warmup_s

    def through_cache(self, cached_weights_s: float = CACHED_WEIGHTS_S) -> StartupParts:
        """The same start-up as a weight cache client whose daemon answers."""
        return replace(self, weights_s=min(self.weights_s, cached_weights_s))

    def closed(self) -> tuple[tuple[str, float], ...]:
        """The parts with the port closed, in order, by name."""
        return (("weights", self.weights_s), ("init", self.init_s), ("graphs", self.graphs_s))


@dataclass(frozen=True, slots=True)
class StartupPlan:
    """Wall-clock seconds of each phase of an emulated start-up of `startup_s` seconds."""

    load_s: float
    """Port closed: weights, init and CUDA graphs (and the warm-up past its first poll)."""
    warmup_wait_s: float
    """Listening, not ready, before the warm-up request (which then takes engine time)."""
    parts: tuple[tuple[str, float], ...] = ()
    """`load_s` by part, wall seconds, in order (logged one by one as they pass)."""

    @classmethod
    def of(cls, startup_s: float, time_scale: float) -> StartupPlan:
        """`startup_s` emulated seconds to ready, run `time_scale` times faster."""
        return cls.of_parts(StartupParts.split(startup_s), time_scale)

    @classmethod
    def of_parts(cls, parts: StartupParts, time_scale: float) -> StartupPlan:
        """`parts` to ready, run `time_scale` times faster."""
        wait = min(parts.warmup_s, WARMUP_POLL_S)
        closed = [*parts.closed(), ("warmup", parts.warmup_s - wait)]
        walls = tuple((name, s / time_scale) for name, s in closed if s > 0)
        return cls(load_s=sum(s for _, s in walls), warmup_wait_s=wait / time_scale, parts=walls)

    @property
    def instant(self) -> bool:
        """No start-up to emulate: listen and be ready at once."""
        return self.load_s == 0 and self.warmup_wait_s == 0

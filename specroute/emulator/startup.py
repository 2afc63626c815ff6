"""Start-up as SGLang does it: the port stays closed while the model loads, then a warm-up.

SGLang's `launch_server` (`srt/entrypoints/http_server.py`) starts the scheduler, which loads the
weights and captures CUDA graphs, before uvicorn binds the port: connections are refused until
then. Once listening, a warm-up thread sleeps a second, reads `/get_model_info`, sends one
8-token `/generate`, and only then marks the server up; meanwhile `/health` answers 503.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WARMUP_POLL_S", "WARMUP_PROMPT_TOKENS", "WARMUP_TOKENS", "StartupPlan"]

WARMUP_POLL_S = 1.0
"""SGLang's warm-up thread sleeps this long before its first poll of the listening server."""
WARMUP_TOKENS = 8
"""`max_new_tokens` of SGLang's warm-up `/generate`."""
WARMUP_PROMPT_TOKENS = 6
"""Its prompt, "The capital city of France is", one token a word as the emulator counts."""


@dataclass(frozen=True, slots=True)
class StartupPlan:
    """Wall-clock seconds of each phase of an emulated start-up of `startup_s` seconds."""

    load_s: float
    """Port closed: weights and CUDA graphs."""
    warmup_wait_s: float
    """Listening, not ready, before the warm-up request (which then takes engine time)."""

    @classmethod
    def of(cls, startup_s: float, time_scale: float) -> StartupPlan:
        """`startup_s` emulated seconds to ready, run `time_scale` times faster."""
        wait = min(startup_s, WARMUP_POLL_S)
        return cls(load_s=(startup_s - wait) / time_scale, warmup_wait_s=wait / time_scale)

    @property
    def instant(self) -> bool:
        """No start-up to emulate: listen and be ready at once."""
        return self.load_s == 0 and self.warmup_wait_s == 0

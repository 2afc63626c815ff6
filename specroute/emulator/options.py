"""The emulated server's settings: one frozen Struct, checked once, passed to `create_app`."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from specroute.emulator.adaptive import (
    DEFAULT_ADAPTIVE_CONFIG,
    AdaptiveConfig,
    check_initial_steps,
)
from specroute.emulator.profiles import DEFAULT_PROFILE, PROFILES
from specroute.emulator.startup import CACHED_WEIGHTS_S, StartupParts
from specroute.emulator.vllm_request_metrics import SpecMetricsLevel
from specroute.emulator.vllm_schedule import DynamicSchedule

__all__ = ["SGLANG_PORT", "SPEC_ALGORITHMS", "VLLM_DEFAULT_MAX_NUM_SEQS", "EmulatorOptions"]

SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
"""Algorithms the emulator accepts; NEXTN resolves to EAGLE, as in SGLang."""

Share = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Count = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0)]


SGLANG_PORT = 30000
"""SGLang's default `--port`."""
VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's `--max-num-seqs` default for its OpenAI server (vllm/engine/arg_utils.py)."""


class EmulatorOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything `specroute emulate` accepts; defaults match SGLang's where it has one."""

    steps: Annotated[int, msgspec.Meta(ge=0, le=16)]
    """`--speculative-num-steps`; 0 runs without speculation."""
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = SGLANG_PORT
    profile: str = DEFAULT_PROFILE
    max_running_requests: Count | None = None
    """A cap under the memory-bound capacity; None: SGLang's default (48 when speculative)."""
    model_name: str | None = None
    """Served model name; None: the profile's model."""
    speculative_algorithm: Literal["EAGLE", "EAGLE3", "NEXTN"] | None = None
    """None with steps > 0 means NEXTN (the MTP head), reported as EAGLE."""
    speculative_adaptive: bool = False
    speculative_adaptive_config: AdaptiveConfig | None = None
    """The tiers of `--speculative-adaptive-config` (its path in `source`); None: SGLang's."""
    startup_s: Annotated[float, msgspec.Meta(ge=0.0)] | Literal["profile"] = 0.0
    """Emulated seconds from launch to ready; "profile": the profile's real-hardware figure."""
    startup_weights_s: Seconds | None = None
    """The weight-load part of the start-up; None: its share of `startup_s` (`StartupParts`)."""
    startup_init_s: Seconds | None = None
    startup_graphs_s: Seconds | None = None
    startup_warmup_s: Seconds | None = None
    weight_cache_socket: str | None = None
    """A weight cache daemon's socket (`specroute emulate-weight-cache`): while it answers at
    start-up, the weight load takes `startup_cached_weights_s`; absent, the disk's time."""
    startup_cached_weights_s: Seconds = CACHED_WEIGHTS_S
    api_key: str | None = None
    enable_response_store: bool = False
    """`--enable-response-store`: keep responses for retrieval and `previous_response_id`."""
    seed: int = 0
    time_scale: Annotated[float, msgspec.Meta(gt=0.0, le=1000.0)] = 1.0
    decode_log_interval: Count = 40
    fail_rate: Share = 0.0
    exit_after_requests: Count | None = None
    exit_mid_stream_after_tokens: Count | None = None
    stall_after_tokens: Count | None = None
    not_ready_for: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    malformed_sse_rate: Share = 0.0
    engine: Literal["sglang", "vllm"] = "sglang"
    """The dialect it speaks: SGLang's, or vLLM's (`emulator.vllm_server`); one physics."""
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    """vLLM's dynamic K table: (first batch size, last batch size, K) ranges (`vllm_schedule`)."""
    per_request_spec_decode_metrics: SpecMetricsLevel = "none"
    """vLLM's `--per-request-spec-decode-metrics`: `metrics.speculative_decoding` on replies."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; choose one of {sorted(PROFILES)}")
        if self.steps == 0 and self.speculative_algorithm is not None:
            raise ValueError("--speculative-algorithm needs --steps 1 or more")
        if self.num_speculative_tokens_per_batch_size is not None:
            if self.engine != "vllm":
                raise ValueError("--num-speculative-tokens-per-batch-size needs --engine vllm")
            DynamicSchedule(self.num_speculative_tokens_per_batch_size, self.steps)  # checks it
        if self.per_request_spec_decode_metrics != "none" and (
            self.engine != "vllm" or self.steps == 0
        ):  # vLLM refuses the flag without speculative decoding (vllm/config/vllm.py)
            raise ValueError("--per-request-spec-decode-metrics needs --engine vllm and --steps")
        if self.engine == "vllm" and (self.speculative_adaptive or self.speculative_algorithm):
            raise ValueError("--engine vllm takes --steps only (num_speculative_tokens)")
        if self.weight_cache_socket is not None and self.engine == "sglang" and self.steps > 0:
            # SGLang's own check (arg_groups, `_handle_load_format`): the daemon holds no draft.
            raise ValueError(
                "--weight-cache-mode is not supported together with speculative decoding "
                "(--speculative-algorithm): the weight cache daemon does not export the draft "
                "model's weights"
            )
        if self.speculative_adaptive:
            if self.steps == 0:
                raise ValueError("--speculative-adaptive needs --steps 1 or more")
            check_initial_steps(self.steps, self.adaptive_config)

    @property
    def adaptive_config(self) -> AdaptiveConfig:
        return self.speculative_adaptive_config or DEFAULT_ADAPTIVE_CONFIG

    @property
    def startup_parts(self) -> StartupParts:
        """The start-up by part, before `--time-scale` and before any weight cache: each part
        given, else its share of `--startup-s`."""
        split = StartupParts.split(self._startup_total_s)
        return StartupParts(
            weights_s=_given(self.startup_weights_s, split.weights_s),
            init_s=_given(self.startup_init_s, split.init_s),
            graphs_s=_given(self.startup_graphs_s, split.graphs_s),
            warmup_s=_given(self.startup_warmup_s, split.warmup_s),
        )

    @property
    def _startup_total_s(self) -> float:
        return PROFILES[self.profile].startup_s if self.startup_s == "profile" else self.startup_s

    @property
    def startup_seconds(self) -> float:
        """Emulated start-up time, before `--time-scale`: `--startup-s`, or the parts' sum
        where a part is given."""
        given = (self.startup_weights_s, self.startup_init_s, self.startup_graphs_s,
                 self.startup_warmup_s)  # fmt: skip
        if all(part is None for part in given):
            return self._startup_total_s
        return self.startup_parts.total_s

    @property
    def algorithm(self) -> str | None:
        """The resolved `speculative_algorithm` SGLang reports (NEXTN is an alias of EAGLE)."""
        if self.steps == 0:
            return None
        chosen = self.speculative_algorithm or "NEXTN"
        return "EAGLE" if chosen == "NEXTN" else chosen

    @property
    def served_model_name(self) -> str:
        return self.model_name or PROFILES[self.profile].model_name


def _given(value: float | None, default: float) -> float:
    return default if value is None else value

"""The emulated server's self-description: `/server_info`, `/model_info` and `/v1/models`.

`/server_info` carries the resolved launch arguments at top level, as SGLang's does, so tools
that read `speculative_num_steps` or `max_running_requests` from a real server work unchanged;
an `emulator` section says what is behind it.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from specroute.emulator.engine import Engine
from specroute.emulator.metrics import SGLANG_VERSION, Stats
from specroute.emulator.options import EmulatorOptions
from specroute.emulator.profiles import get_profile

__all__ = ["launch_command", "model_card", "model_info", "server_info"]


def launch_command(options: EmulatorOptions) -> str:
    """The SGLang command line this emulator stands in for."""
    args = ["python", "-m", "sglang.launch_server", "--model-path", options.served_model_name]
    args += ["--host", options.host, "--port", str(options.port)]
    if options.algorithm is not None:
        k = options.steps
        args += ["--speculative-algorithm", options.speculative_algorithm or "NEXTN"]
        args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
        args += ["--speculative-num-draft-tokens", str(k + 1)]
        if options.speculative_adaptive:
            args.append("--speculative-adaptive")
        path = _config_path(options)
        if path is not None:
            args += ["--speculative-adaptive-config", path]
    if options.max_running_requests is not None:
        args += ["--max-running-requests", str(options.max_running_requests)]
    args += ["--enable-metrics", "--decode-log-interval", str(options.decode_log_interval)]
    return shlex.join(args)


def server_info(
    options: EmulatorOptions,
    engine: Engine,
    stats: Stats,
    *,
    startup_time: float,
    max_total_num_tokens: int,
) -> dict[str, Any]:
    """Resolved arguments at top level, then scheduler facts and `internal_states`."""
    state: dict[str, Any] = {
        "world_size": 1,
        "startup_time": startup_time,
        "effective_max_running_requests_per_dp": engine.max_running_requests,
        "last_gen_throughput": stats.last_gen_throughput,
    }
    accept_length = stats.avg_spec_accept_length
    if accept_length is not None:
        state["avg_spec_accept_length"] = accept_length
    context = get_profile(options.profile).context_length
    return {
        **_server_args(options, engine.max_running_requests, context),
        "launch_command": launch_command(options),
        "max_total_num_tokens": max_total_num_tokens,
        "max_req_input_len": context - 1,
        "startup_time": startup_time,
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "frontend": "python",
        "emulator": {
            "note": "specroute emulator: no GPU and no model; timings come from the profile",
            "profile": options.profile,
            "time_scale": options.time_scale,
            "active_speculative_num_steps": engine.active_steps if options.algorithm else None,
            "memory_capacity": engine.memory_capacity,
            "memory_sized_for_steps": engine.deepest_steps,
            "startup_s": options.startup_seconds,
        },
    }


def _server_args(options: EmulatorOptions, max_running: int, context: int) -> dict[str, Any]:
    """The launch arguments as SGLang resolves them (NEXTN reads EAGLE, draft tokens k + 1)."""
    spec = options.algorithm is not None
    return {
        "model_path": options.served_model_name,
        "tokenizer_path": options.served_model_name,
        "served_model_name": options.served_model_name,
        "host": options.host,
        "port": options.port,
        "context_length": context,
        "random_seed": options.seed,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "enable_metrics": True,
        "decode_log_interval": options.decode_log_interval,
        "weight_version": "default",
        "max_running_requests": max_running,
        "speculative_algorithm": options.algorithm,
        "speculative_draft_model_path": None,
        "speculative_num_steps": options.steps if spec else None,
        "speculative_eagle_topk": 1 if spec else None,
        "speculative_num_draft_tokens": options.steps + 1 if spec else None,
        "speculative_adaptive": options.speculative_adaptive,
        "speculative_adaptive_config": _config_path(options),
    }


def _config_path(options: EmulatorOptions) -> str | None:
    config = options.speculative_adaptive_config
    return config.source if config is not None else None


def model_info(options: EmulatorOptions) -> dict[str, Any]:
    return {
        "model_path": options.served_model_name,
        "served_model_name": options.served_model_name,
        "tokenizer_path": options.served_model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": None,
        "architectures": None,
    }


def model_card(name: str, context_length: int) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": context_length,
    }

"""The launcher: a pure plan (one SGLang or vLLM server per speculative depth, the proxy in
front), the supervisor that keeps each process running, and each engine's own check of every
command line (`sglang_check`; `vllm_check`, run by `make vllm-check`).

`specroute launch` (`specroute.launch.command`) runs it; `python -m specroute.launch.sglang_check`
and `python -m specroute.launch.sglang_matrix` are the checks' entry points.
"""

from specroute.launch.argv import (
    ALGORITHMS,
    EMULATED_MODEL,
    LaunchOptions,
    LaunchPlan,
    PlanError,
    ProcessPlan,
    build_plan,
    format_plan,
    parse_gpus,
    parse_steps,
    sglang_server_args,
    vllm_args,
)
from specroute.launch.launcher import (
    Launcher,
    LaunchError,
    LaunchSettings,
    detect_gpus,
    validate_with_sglang,
)
from specroute.launch.supervisor import Backoff, Supervised

__all__ = [
    "ALGORITHMS",
    "EMULATED_MODEL",
    "Backoff",
    "LaunchError",
    "LaunchOptions",
    "LaunchPlan",
    "LaunchSettings",
    "Launcher",
    "PlanError",
    "ProcessPlan",
    "Supervised",
    "build_plan",
    "detect_gpus",
    "format_plan",
    "parse_gpus",
    "parse_steps",
    "sglang_server_args",
    "validate_with_sglang",
    "vllm_args",
]

"""The server flags `specroute launch` and `specroute tune` share: one definition, with
LaunchOptions' defaults, and the LaunchOptions they make. A flag means the same in both."""

from __future__ import annotations

import argparse
from typing import Any

from specroute.launch.argv import (
    ALGORITHMS,
    EMULATED_MODEL,
    LaunchOptions,
    PlanError,
    parse_gpus,
    parse_per_depth_args,
    parse_per_depth_counts,
    parse_steps,
)
from specroute.launch.launcher import detect_gpus

__all__ = ["add_server_arguments", "host_gpus", "server_options"]

_DEFAULTS = LaunchOptions(model=EMULATED_MODEL, steps=(1,))


# Flag tables read best one flag to a call; the formatter would explode each call.
# fmt: off
def add_server_arguments(parser: argparse.ArgumentParser, *, base_port_help: str) -> None:
    """What every server is: model, speculative algorithm, GPUs, address, capacity, extra
    flags, and whether it is SGLang or the emulator."""
    add = parser.add_argument
    add("--model", default=None, help="model path or Hugging Face id (required unless --emulate)")
    add("--algorithm", choices=ALGORITHMS, default=_DEFAULTS.algorithm,
        help="NEXTN: the model's built-in MTP head; EAGLE/EAGLE3 need --draft-model")
    add("--draft-model", default=None, help="draft model path (EAGLE, EAGLE3)")
    add("--tp", type=int, default=_DEFAULTS.tp, help="GPUs per server (tensor parallel size)")
    add("--gpus", default="all", help="GPU indices to share out in order, or 'all'")
    add("--server-host", default=_DEFAULTS.host,
        help="address the SGLang servers listen on; they take no keys, so keep it private")
    add("--base-port", type=int, default=_DEFAULTS.base_port, help=base_port_help)
    add("--max-running-requests", default=str(_DEFAULTS.max_running_requests),
        metavar="N|K=N,...",
        help="per server: one N for all, or per depth, 1=26,2=21,3=17 (a bare N for the rest); "
        f"SGLang resets an unset value to {_DEFAULTS.max_running_requests} under speculation")
    add("--sglang-arg", action="append", default=[], metavar="[K:]ARG",
        help="extra SGLang flag, repeatable: --sglang-arg=--mem-fraction-static=0.8 for every "
        "server, --sglang-arg=3:--mem-fraction-static=0.85 for the depth-3 one")
    add("--emulator-arg", action="append", default=[], metavar="[K:]ARG",
        help="extra `specroute emulate` flag with --emulate, e.g. --emulator-arg=--time-scale=5 "
        "(K: as for --sglang-arg)")
    add("--emulate", action="store_true",
        help="run emulated servers (`specroute emulate`) instead of SGLang: no GPU needed")
    add("--engine", choices=("sglang", "vllm"), default=_DEFAULTS.engine,
        help="the servers' engine: SGLang (`sglang.launch_server`) or vLLM (`vllm serve "
        "--speculative-config ...`); with --emulate, the dialect the emulator speaks")
    add("--vllm-arg", action="append", default=[], metavar="[K:]ARG",
        help="extra vLLM flag with --engine vllm, e.g. --vllm-arg=--gpu-memory-utilization=0.85 "
        "(K: as for --sglang-arg)")
    add("--no-sglang-check", action="store_true",
        help="skip checking the command lines with SGLang's resolver")
# fmt: on


def server_options(
    args: argparse.Namespace, *, steps: tuple[int, ...] | None = None, **proxy: Any
) -> LaunchOptions:
    """LaunchOptions from the shared flags and `steps` (else `--steps`); `proxy` adds the
    proxy's fields (`launch` only). PlanError names the flag at fault."""
    model = args.model or (EMULATED_MODEL if args.emulate else None)
    if model is None:
        raise PlanError("--model PATH is required (or --emulate)")
    every, by_depth = parse_per_depth_counts(args.max_running_requests, "--max-running-requests")
    sglang_args, sglang_by_depth = parse_per_depth_args(args.sglang_arg)
    emulator_args, emulator_by_depth = parse_per_depth_args(args.emulator_arg)
    vllm_args, vllm_by_depth = parse_per_depth_args(args.vllm_arg)
    return LaunchOptions(
        model=model,
        steps=steps if steps is not None else parse_steps(args.steps),
        algorithm=args.algorithm,
        draft_model=args.draft_model,
        tp=args.tp,
        gpus=parse_gpus(args.gpus),
        host=args.server_host,
        base_port=args.base_port,
        max_running_requests=every or _DEFAULTS.max_running_requests,
        max_running_by_depth=by_depth,
        sglang_args=sglang_args,
        sglang_args_by_depth=sglang_by_depth,
        emulator_args=emulator_args,
        emulator_args_by_depth=emulator_by_depth,
        emulate=args.emulate,
        engine=args.engine,
        vllm_args=vllm_args,
        vllm_args_by_depth=vllm_by_depth,
        **proxy,
    )


def host_gpus(*, emulate: bool, gpus: tuple[int, ...] | None) -> tuple[int, ...]:
    """The GPUs `--gpus all` shares out: every one this host has (none needed for --emulate or
    an explicit list). PlanError when there are none to find."""
    if emulate or gpus is not None:
        return ()
    detected = detect_gpus()
    if not detected:
        raise PlanError(
            "--gpus all: no GPU found (CUDA_VISIBLE_DEVICES unset, nvidia-smi absent or silent); "
            "pass --gpus 0,1,... explicitly, or --emulate"
        )
    return detected

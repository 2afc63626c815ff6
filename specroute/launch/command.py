"""`specroute launch`: one SGLang server per speculative depth and the proxy in front of them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from specroute.launch.plan import (
    ALGORITHMS,
    EMULATED_MODEL,
    LaunchOptions,
    LaunchPlan,
    PlanError,
    build_plan,
    format_plan,
    parse_gpus,
    parse_steps,
)
from specroute.logs import configure_logging

__all__ = ["options_from_args", "register", "run"]

DESCRIPTION = (
    "Start one SGLang server per speculative depth (--steps 1,2,3), each on its own GPUs and "
    "port with the flags SGLang needs, wait until every one answers /ready, then run the "
    "routing proxy in front of them. Servers that die are restarted with backoff; Ctrl-C stops "
    "the proxy first (its streams drain), then the servers. With the sglang package installed, "
    "every command line is checked by SGLang's own argument resolver before anything starts."
)


# Flag tables read best one flag to a call; the formatter would explode each call.
# fmt: off
def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "launch", help="start a pool of SGLang servers (one per depth) and the proxy",
        description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--model", default=None, help="model path or Hugging Face id (required unless --emulate)")
    add("--steps", required=True, help="comma-separated depths, one server each, e.g. 1,2,3")
    add("--algorithm", choices=ALGORITHMS, default="NEXTN",
        help="NEXTN: the model's built-in MTP head; EAGLE/EAGLE3 need --draft-model")
    add("--draft-model", default=None, help="draft model path (EAGLE, EAGLE3)")
    add("--tp", type=int, default=1, help="GPUs per server (tensor parallel size)")
    add("--gpus", default="all", help="GPU indices to share out in order, or 'all'")
    add("--host", default="127.0.0.1", help="address the proxy and servers listen on")
    add("--port", type=int, default=8000, help="the proxy's port")
    add("--base-port", type=int, default=30000, help="first server's port; the next get +1, +2")
    add("--max-running-requests", type=int, default=48,
        help="passed to every server (SGLang resets an unset value to 48 under speculation)")
    add("--sglang-arg", action="append", default=[], metavar="ARG",
        help="extra SGLang flag, repeatable: --sglang-arg=--mem-fraction-static=0.8")
    add("--emulator-arg", action="append", default=[], metavar="ARG",
        help="extra `specroute emulate` flag with --emulate, e.g. --emulator-arg=--time-scale=5")
    add("--policy", default="throughput", help="the proxy's routing policy")
    add("--log-dir", type=Path, default=Path("specroute-logs"), help="one log file per process")
    add("--ready-timeout", type=float, default=900.0, metavar="SECONDS",
        help="how long servers may take to load before the launch fails")
    add("--drain", type=float, default=30.0, metavar="SECONDS",
        help="on stop, how long each process may take to finish its requests")
    add("--dry-run", action="store_true", help="print the commands and environment, start nothing")
    add("--emulate", action="store_true",
        help="run emulated servers (`specroute emulate`) instead of SGLang: no GPU needed")
    add("--no-sglang-check", action="store_true",
        help="skip checking the command lines with SGLang's resolver")
    parser.set_defaults(run=run, parser=parser)
# fmt: on


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """The launch options; raises PlanError naming the flag at fault."""
    model = args.model or (EMULATED_MODEL if args.emulate else None)
    if model is None:
        raise PlanError("--model PATH is required (or --emulate)")
    return LaunchOptions(
        model=model,
        steps=parse_steps(args.steps),
        algorithm=args.algorithm,
        draft_model=args.draft_model,
        tp=args.tp,
        gpus=parse_gpus(args.gpus),
        host=args.host,
        port=args.port,
        base_port=args.base_port,
        max_running_requests=args.max_running_requests,
        sglang_args=tuple(args.sglang_arg),
        emulator_args=tuple(args.emulator_arg),
        policy=args.policy,
        emulate=args.emulate,
    )


def _plan(args: argparse.Namespace) -> LaunchPlan:
    from specroute.launch.launcher import detect_gpus

    options = options_from_args(args)
    detected = () if options.emulate or options.gpus is not None else detect_gpus()
    if not options.emulate and options.gpus is None and not detected:
        raise PlanError(
            "--gpus all: no GPU found (CUDA_VISIBLE_DEVICES unset, nvidia-smi absent or silent); "
            "pass --gpus 0,1,... explicitly, or --emulate"
        )
    return build_plan(options, detected)


def _sglang_verdict(plan: LaunchPlan, args: argparse.Namespace) -> list[str | None] | None:
    """SGLang's rejections, or None when the check does not apply or cannot run here."""
    from specroute.launch.sglang_check import sglang_installed

    if args.emulate or args.no_sglang_check or not sglang_installed():
        return None
    from specroute.launch.launcher import validate_with_sglang

    return validate_with_sglang([s.argv for s in plan.servers])


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except (PlanError, ValueError) as exc:
        print(f"specroute launch: {exc}", file=sys.stderr)
        return 2
    verdicts = _sglang_verdict(plan, args)
    rejected = [(s, m) for s, m in zip(plan.servers, verdicts or (), strict=False) if m]
    for server, message in rejected:
        print(f"specroute launch: SGLang rejects {server.name}: {message}", file=sys.stderr)
    if rejected:
        return 2
    if args.dry_run:
        sys.stdout.write(format_plan(plan))
        if verdicts is not None:
            print("# every server's command line was accepted by SGLang's resolver")
        elif not args.emulate:
            print("# not checked by SGLang (the sglang package is not installed here)")
        return 0
    from specroute.launch.launcher import Launcher, LaunchSettings

    configure_logging()
    settings = LaunchSettings(
        log_dir=args.log_dir, ready_timeout_s=args.ready_timeout, drain_s=args.drain
    )
    return asyncio.run(Launcher(plan, settings).run())

"""`specroute tune`: the seed session, unattended. Each depth's server is launched in turn
through the launcher's plan, waited for, swept with the user's traffic (greedy and sampled by
default), stopped and saved; the report recommends depths and a pool mix, and the profile it
writes is the prior `specroute serve --prior` and `specroute launch --prior` load."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec

from specroute.bench.dataset import DatasetError, read_prompts
from specroute.bench.workload import PromptSettings
from specroute.cmdline import Subcommands, int_list
from specroute.emulator.profiles import DEFAULT_PROFILE, PROFILES
from specroute.helpformat import DefaultsHelp
from specroute.launch.argv import PlanError
from specroute.launch.flags import add_server_arguments, host_gpus, server_options
from specroute.launch.launcher import validate_with_sglang
from specroute.launch.sglang_check import sglang_installed
from specroute.logs import configure_logging
from specroute.plotting import plots_missing
from specroute.tune.files import write_outputs
from specroute.tune.layout import (
    ServerPlan,
    TuneLayout,
    TuneOptions,
    measurement,
    server_plans,
    traffic_kinds,
)
from specroute.tune.progress import TuneProgress
from specroute.tune.run import Tuner

__all__ = ["register", "run"]

DESCRIPTION = (
    "Find the best speculative depths for a model, GPUs and traffic. For each depth in "
    "--steps (and an SGLang-adaptive server with --adaptive), one at a time: launch the server "
    "as `specroute launch` would (command lines checked by SGLang's resolver when sglang is "
    "installed), wait for /ready, read max_running_requests and the depth from /server_info, "
    "warm up, sweep every concurrency level under each traffic kind, stop it and save the "
    "result in --out. A rerun skips the depths saved with the same settings (--force redoes "
    "them); Ctrl-C stops the running server and keeps what is saved. The report (printed, and "
    "report.md, report.json, tune.png in --out) gives the seed write-up's tables, capacity per "
    "depth, the gain of each extra step, the best depths, a pool mix for --servers N and the "
    "`specroute launch` command to start it; prior.json is the profile the proxy starts from."
)
PROMPT_LIMIT = 2000
"""Prompts taken from the start of --dataset (a sweep reuses them in turn)."""


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


# Flag tables read best one flag to a call; the formatter would explode each call.
# fmt: off
def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "tune",
        description=DESCRIPTION, formatter_class=DefaultsHelp,
    )
    add = parser.add_argument
    add("--steps", default="0,1,2,3,4", help="comma-separated depths (0: no speculation)")
    add_server_arguments(parser, base_port_help="the port every server takes in turn")
    add("--host", dest="server_host", help=argparse.SUPPRESS)  # before --server-host existed
    add("--adaptive", action="store_true", help="also measure an SGLang-adaptive server")
    add("--adaptive-config", default=None, metavar="JSON", help="its --speculative-adaptive-config")
    add("--concurrency", type=int_list, default=(1, 4, 16, 32, 64), help="comma-separated levels")
    add("--temperature", type=_floats, default=[0.0, 1.0],
        help="one traffic kind per value: 0 is greedy (the seed's upper bound), 1 SGLang's default")
    add("--top-p", type=float, default=1.0)
    add("--max-tokens", type=int, default=256, help="output tokens per request")
    add("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
        help="fixed output lengths, as the seed measured")
    add("--prompt-words", type=int, default=256, help="synthetic prompt length")
    add("--dataset", default=None, metavar="FILE",
        help="prompts: JSONL of OpenAI chat requests, or ShareGPT conversations (JSONL or JSON)")
    add("--requests-per-concurrency", type=float, default=2.0, help="requests per level: this x C")
    add("--min-requests", type=int, default=3, help="at least this many requests per level")
    add("--warmup", type=int, default=2, help="unrecorded requests before each sweep")
    add("--servers", type=int, default=3, help="pool size the recommended mix is for")
    add("--out", type=Path, default=Path("specroute-tune"), help="results, logs, report, prior")
    add("--force", action="store_true", help="measure again the depths already saved")
    add("--dry-run", action="store_true", help="print every server's command line, start nothing")
    add("--ready-timeout", type=float, default=1800.0, metavar="SECONDS",
        help="how long a server may take to load")
    add("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE, help="with --emulate")
    add("--time-scale", type=float, default=1.0,
        help="with --emulate: emulated GPUs X times faster; figures are scaled back")
    add("--seed", type=int, default=0, help="seeds prompts and sampling")
    parser.set_defaults(run=run, parser=parser)
# fmt: on


def options_from_args(args: argparse.Namespace) -> TuneOptions:
    """The tune's options; raises PlanError or ValueError naming the flag at fault."""

    launch = server_options(args)
    if args.adaptive and launch.engine == "vllm":
        raise PlanError("--adaptive measures SGLang's adaptive mode; vLLM has none (--engine vllm)")
    traffic = traffic_kinds(
        args.temperature, max_tokens=args.max_tokens, top_p=args.top_p, ignore_eos=args.ignore_eos
    )
    return TuneOptions(
        launch=launch,
        adaptive=args.adaptive,
        adaptive_config=args.adaptive_config,
        profile=args.profile if args.emulate else None,
        time_scale=args.time_scale,
        concurrency=args.concurrency,
        traffic=traffic,
        prompts=PromptSettings(words=args.prompt_words),
        dataset=args.dataset,
        requests_per_concurrency=args.requests_per_concurrency,
        min_requests=args.min_requests,
        warmup=args.warmup,
        servers=args.servers,
        seed=args.seed,
        ready_timeout_s=args.ready_timeout,
    )


def _plans(options: TuneOptions) -> list[ServerPlan]:
    launch = options.launch
    return server_plans(options, host_gpus(emulate=launch.emulate, gpus=launch.gpus))


def _sglang_rejections(plans: list[ServerPlan], args: argparse.Namespace) -> list[str] | None:
    """SGLang's rejections (empty: all accepted), None when the check cannot run here."""
    if args.emulate or args.engine == "vllm" or args.no_sglang_check or not sglang_installed():
        return None
    verdicts = validate_with_sglang([p.process.argv for p in plans])
    return [f"{p.label}: {v}" for p, v in zip(plans, verdicts, strict=True) if v]


def _dry_run(plans: list[ServerPlan], checked: bool, emulate: bool, engine: str) -> str:
    lines = [f"# {p.label}: {p.process.url}\n{p.process.shell()}" for p in plans]
    if checked:
        lines.append("# every server's command line was accepted by SGLang's resolver")
    elif engine == "vllm" and not emulate:
        lines.append("# not checked here: `make vllm-check` runs vLLM's own parser on such lines")
    elif not emulate:
        lines.append("# not checked by SGLang (the sglang package is not installed here)")
    return "\n".join(lines) + "\n"


def _prompts(args: argparse.Namespace, out: Path) -> tuple[PromptSettings, str]:
    """The prompt settings and their description for the saved measurement: synthetic, or the
    dataset's first prompts copied into `out` (a bad record fails here, before any launch)."""

    if args.dataset is None:
        return PromptSettings(words=args.prompt_words), f"synthetic, {args.prompt_words} words"
    prompts = read_prompts(args.dataset, PROMPT_LIMIT)
    data = b"".join(msgspec.json.encode({"prompt": p}) + b"\n" for p in prompts)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "prompts.jsonl"
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()[:16]
    return PromptSettings(source="jsonl", path=str(path)), f"{args.dataset} ({digest})"


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
        plans = _plans(options)
    except (PlanError, ValueError, msgspec.ValidationError) as exc:
        print(f"specroute tune: {exc}", file=sys.stderr)
        return 2
    rejected = _sglang_rejections(plans, args)
    for message in rejected or ():
        print(f"specroute tune: SGLang rejects {message}", file=sys.stderr)
    if rejected:
        return 2
    if args.dry_run:
        sys.stdout.write(_dry_run(plans, rejected is not None, args.emulate, args.engine))
        return 0
    try:
        prompts, described = _prompts(args, args.out)
    except DatasetError as exc:
        print(f"specroute tune: {exc}", file=sys.stderr)
        return 2
    options = msgspec.structs.replace(options, prompts=prompts)
    return _run_loop(_tune(options, plans, args.out, described, force=args.force))


def _run_loop(coro: Any) -> int:
    """On uvloop where installed: the sweep's client then costs the least CPU."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[no-any-return]
    return uvloop.run(coro)  # type: ignore[no-any-return]


async def _tune(
    options: TuneOptions, plans: list[ServerPlan], out: Path, prompts: str, *, force: bool
) -> int:
    configure_logging("warning")
    layout = TuneLayout(out)
    progress = TuneProgress()
    if (missing := plots_missing()) is not None:
        progress.say(f"specroute tune: {missing}; the report and prior come without tune.png")
    tuner = Tuner(options, plans, layout, measurement(options, prompts), progress, force=force)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    interrupted: list[bool] = []

    def interrupt() -> None:
        if not interrupted and task is not None:  # once: the server's stop must not be cut
            interrupted.append(True)
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt)
    try:
        await tuner.run()
    except asyncio.CancelledError:
        if not interrupted:
            raise
        progress.say(
            f"specroute tune: interrupted; the server it started is stopped. {len(tuner.results)}"
            f" of {len(plans)} depths are saved in {out}: run the same command to resume."
        )
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if not tuner.results:
        progress.say("specroute tune: no depth was measured")
        return 1
    text = write_outputs(options, plans, tuner.results, tuner.failures, layout)
    sys.stdout.write(text)
    return 1 if tuner.failures else 0

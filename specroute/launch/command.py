"""`specroute launch`: one SGLang server per speculative depth and the proxy in front of them."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from specroute.config import Config, load_config
from specroute.errors import ConfigError
from specroute.exposure import is_loopback, keyless_proxy_warning
from specroute.helpformat import DefaultsHelp
from specroute.launch import reconfigure_flags
from specroute.launch.plan import (
    ALGORITHMS,
    DEFAULT_MAX_RUNNING_REQUESTS,
    EMULATED_MODEL,
    LaunchOptions,
    LaunchPlan,
    PlanError,
    build_plan,
    format_plan,
    parse_gpus,
    parse_per_depth_args,
    parse_per_depth_counts,
    parse_steps,
)
from specroute.logs import configure_logging
from specroute.policies import UnknownPolicyError, create, pinned_depth

__all__ = ["options_from_args", "register", "run"]

DESCRIPTION = (
    "Start one SGLang server per speculative depth (--steps 1,2,3), each on its own GPUs and "
    "port with the flags SGLang needs, wait until every one answers /ready, then run the "
    "routing proxy in front of them. Servers that die are restarted with backoff; Ctrl-C stops "
    "the proxy first (its streams drain), then the servers. With the sglang package installed, "
    "every command line is checked by SGLang's own argument resolver before anything starts. "
    "The proxy's settings come from --config, SPECROUTE_* variables and these flags, as for "
    "`specroute serve`; its keys reach it in its environment, never on its command line."
)


# Flag tables read best one flag to a call; the formatter would explode each call.
# fmt: off
def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "launch", help="start a pool of SGLang servers (one per depth) and the proxy",
        description=DESCRIPTION, formatter_class=DefaultsHelp,
    )
    add = parser.add_argument
    add("--model", default=None, help="model path or Hugging Face id (required unless --emulate)")
    add("--steps", required=True, help="comma-separated depths, one server each, e.g. 1,2,3")
    add("--algorithm", choices=ALGORITHMS, default="NEXTN",
        help="NEXTN: the model's built-in MTP head; EAGLE/EAGLE3 need --draft-model")
    add("--draft-model", default=None, help="draft model path (EAGLE, EAGLE3)")
    add("--tp", type=int, default=1, help="GPUs per server (tensor parallel size)")
    add("--gpus", default="all", help="GPU indices to share out in order, or 'all'")
    add("--host", default=None,
        help="address the proxy listens on (default: the config's host, else 127.0.0.1)")
    add("--port", type=int, default=None,
        help="the proxy's port (default: the config's port, else 8000)")
    add("--server-host", default="127.0.0.1",
        help="address the SGLang servers listen on; they take no keys, so keep it private")
    add("--base-port", type=int, default=30000, help="first server's port; the next get +1, +2")
    add("--max-running-requests", default=str(DEFAULT_MAX_RUNNING_REQUESTS), metavar="N|K=N,...",
        help="per server: one N for all, or per depth, 1=26,2=21,3=17 (a bare N for the rest); "
        "SGLang resets an unset value to 48 under speculation")
    add("--sglang-arg", action="append", default=[], metavar="[K:]ARG",
        help="extra SGLang flag, repeatable: --sglang-arg=--mem-fraction-static=0.8 for every "
        "server, --sglang-arg=3:--mem-fraction-static=0.85 for the depth-3 one")
    add("--emulator-arg", action="append", default=[], metavar="[K:]ARG",
        help="extra `specroute emulate` flag with --emulate, e.g. --emulator-arg=--time-scale=5 "
        "(K: as for --sglang-arg)")
    add("--config", default=None, metavar="FILE",
        help="the proxy's TOML settings (`specroute config example`); its backends are replaced "
        "by the launched servers")
    add("--policy", default=None,
        help="the proxy's routing policy (default: the config's, else throughput)")
    add("--api-key", action="append", default=None, metavar="KEY",
        help="client key the proxy accepts (repeatable); replaces the config's api_keys")
    add("--admin-key", default=None, metavar="KEY", help="the proxy's key for PUT /policy")
    add("--prior", default=None, metavar="FILE",
        help="profile the proxy starts routing from (`specroute tune` writes prior.json)")
    add("--log-dir", type=Path, default=Path("specroute-logs"), help="one log file per process")
    add("--ready-timeout", type=float, default=900.0, metavar="SECONDS",
        help="how long servers may take to load before the launch fails")
    add("--drain", type=float, default=30.0, metavar="SECONDS",
        help="on stop, and before a depth change (--reconfigure auto), how long a process may "
        "take to finish its requests")
    add("--dry-run", action="store_true", help="print the commands and environment, start nothing")
    add("--emulate", action="store_true",
        help="run emulated servers (`specroute emulate`) instead of SGLang: no GPU needed")
    add("--no-sglang-check", action="store_true",
        help="skip checking the command lines with SGLang's resolver")
    reconfigure_flags.add_arguments(parser)
    parser.set_defaults(run=run, parser=parser)
# fmt: on


def proxy_config(args: argparse.Namespace) -> Config:
    """The proxy's settings as `specroute serve` will read them (file, SPECROUTE_* variables,
    these flags), so that a bad one stops the launch before any server starts."""
    overrides = {
        "host": args.host,
        "port": args.port,
        "policy": args.policy,
        "api_keys": args.api_key,
        "admin_key": args.admin_key,
        "prior": {"path": args.prior} if args.prior else None,
        "backends": [{"url": "http://127.0.0.1:1"}],  # stands in for the launched servers
    }
    config = load_config(args.config, environ=os.environ, overrides=overrides)
    if config.prior.path is not None:
        from specroute.pool.prior import load_prior  # the pool loads slowly; --help need not

        load_prior(config.prior.path)  # a bad prior stops the launch before any server starts
    try:
        create(config.policy)
    except UnknownPolicyError as exc:
        raise ConfigError(f"invalid configuration: {exc} - at `$.policy`") from exc
    return config


def _proxy_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.api_key:
        env["SPECROUTE_API_KEYS"] = ",".join(args.api_key)
    if args.admin_key:
        env["SPECROUTE_ADMIN_KEY"] = args.admin_key
    return env


def options_from_args(args: argparse.Namespace, config: Config | None = None) -> LaunchOptions:
    """The launch options; raises PlanError naming the flag at fault."""
    model = args.model or (EMULATED_MODEL if args.emulate else None)
    if model is None:
        raise PlanError("--model PATH is required (or --emulate)")
    config = config or proxy_config(args)
    every, by_depth = parse_per_depth_counts(args.max_running_requests, "--max-running-requests")
    sglang_args, sglang_by_depth = parse_per_depth_args(args.sglang_arg)
    emulator_args, emulator_by_depth = parse_per_depth_args(args.emulator_arg)
    return LaunchOptions(
        model=model,
        steps=parse_steps(args.steps),
        algorithm=args.algorithm,
        draft_model=args.draft_model,
        tp=args.tp,
        gpus=parse_gpus(args.gpus),
        host=args.server_host,
        proxy_host=config.host,
        port=config.port,
        base_port=args.base_port,
        max_running_requests=every or DEFAULT_MAX_RUNNING_REQUESTS,
        max_running_by_depth=by_depth,
        sglang_args=sglang_args,
        sglang_args_by_depth=sglang_by_depth,
        emulator_args=emulator_args,
        emulator_args_by_depth=emulator_by_depth,
        policy=config.policy,
        proxy_config=str(args.config) if args.config is not None else None,
        proxy_env=_proxy_env(args),
        prior=str(Path(args.prior).resolve()) if args.prior else None,
        emulate=args.emulate,
    )


def _check_policy_depth(config: Config, options: LaunchOptions) -> None:
    """A policy pinned to a depth no launched server runs is an error: the depths are known."""
    wanted = pinned_depth(create(config.policy))
    if wanted is not None and wanted not in options.steps:
        launched = ",".join(map(str, options.steps))
        raise PlanError(
            f"the policy {config.policy} sends every request to depth {wanted}, but --steps "
            f"{launched} starts no server at that depth"
        )


def _exposure_notes(config: Config, options: LaunchOptions) -> list[str]:
    """Warnings for addresses beyond this machine: servers without keys, a proxy without."""
    notes = []
    if not is_loopback(options.host):
        notes.append(
            f"warning: the SGLang servers listen on {options.host} and take no keys: keep that "
            "network private, or leave --server-host at 127.0.0.1"
        )
    if (keyless := keyless_proxy_warning(config.host, config.api_keys)) is not None:
        notes.append(keyless)
    return notes


def _plan(args: argparse.Namespace) -> LaunchPlan:
    from specroute.launch.launcher import detect_gpus

    config = proxy_config(args)
    options = options_from_args(args, config)
    _check_policy_depth(config, options)
    for note in _exposure_notes(config, options):
        print(f"specroute launch: {note}", file=sys.stderr)
    if options.emulate:
        _check_as_real(options, args)
    detected = () if options.emulate or options.gpus is not None else detect_gpus()
    if not options.emulate and options.gpus is None and not detected:
        raise PlanError(
            "--gpus all: no GPU found (CUDA_VISIBLE_DEVICES unset, nvidia-smi absent or silent); "
            "pass --gpus 0,1,... explicitly, or --emulate"
        )
    return build_plan(options, detected)


def _check_as_real(options: LaunchOptions, args: argparse.Namespace) -> None:
    """`--emulate` checks what a real pool would (PlanError), says what it leaves out."""
    from specroute.launch.preflight import emulation_notes, real_plan

    real = real_plan(options)
    for note in emulation_notes(options):
        print(f"specroute launch: --emulate: {note}", file=sys.stderr)
    verdicts = _sglang_verdict(real, args, emulated=False) or ()
    rejected = [f"{s.name}: {m}" for s, m in zip(real.servers, verdicts, strict=False) if m]
    if rejected:
        raise PlanError("SGLang rejects the real pool's " + "; ".join(rejected))


def _sglang_verdict(
    plan: LaunchPlan, args: argparse.Namespace, *, emulated: bool | None = None
) -> list[str | None] | None:
    """SGLang's rejections, or None when the check does not apply or cannot run here."""
    from specroute.launch.sglang_check import sglang_installed

    if (args.emulate if emulated is None else emulated) or args.no_sglang_check:
        return None
    if not sglang_installed():
        return None
    from specroute.launch.launcher import validate_with_sglang

    return validate_with_sglang([s.argv for s in plan.servers])


def _with_depth_loop(plan: LaunchPlan, args: argparse.Namespace) -> tuple[LaunchPlan, str]:
    """The plan and the admin key the depth loop calls the proxy with (`--reconfigure`)."""
    if reconfigure_flags.reconfigure_options(args).mode == "off":
        return plan, ""
    return reconfigure_flags.with_admin_key(plan, proxy_config(args).admin_key)


def _cannot_start(plan: LaunchPlan) -> bool:
    """Print why a server cannot possibly start (warnings for a dry run); True if one cannot."""
    from specroute.launch.preflight import cannot_start

    problems = [(s.name, p) for s in plan.servers for p in cannot_start(s.argv)]
    for name, problem in problems:
        print(f"specroute launch: {name} cannot start: {problem}", file=sys.stderr)
    return bool(problems)


def run(args: argparse.Namespace) -> int:
    try:
        plan, admin_key = _with_depth_loop(_plan(args), args)
    except (PlanError, ConfigError, ValueError) as exc:
        print(f"specroute launch: {exc}", file=sys.stderr)
        return 2
    verdicts = _sglang_verdict(plan, args)
    rejected = [(s, m) for s, m in zip(plan.servers, verdicts or (), strict=False) if m]
    for server, message in rejected:
        print(f"specroute launch: SGLang rejects {server.name}: {message}", file=sys.stderr)
    if rejected:
        return 2
    if _cannot_start(plan) and not args.dry_run:
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
    launcher = Launcher(plan, settings)
    if admin_key:
        reconfigure_flags.attach(launcher, args, admin_key)
    return asyncio.run(launcher.run())

"""`specroute launch`: one SGLang server per speculative depth and the proxy in front of them."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import structlog

from specroute.cmdline import Subcommands
from specroute.config import Config, load_config
from specroute.errors import ConfigError
from specroute.exposure import is_loopback, keyless_proxy_warning
from specroute.helpformat import DefaultsHelp
from specroute.launch.argv import (
    LaunchOptions,
    LaunchPlan,
    PlanError,
    build_plan,
    format_plan,
    parse_gpus,
    parse_steps,
)
from specroute.launch.defaults import LaunchDepths, launch_depths
from specroute.launch.flags import add_server_arguments, host_gpus, server_options
from specroute.launch.restarts import attach, with_admin_key
from specroute.launch.weight_cache import DEFAULT_DIR
from specroute.logs import configure_logging
from specroute.policies import UnknownPolicyError, create, pinned_depth
from specroute.reconfigure import options as reconfigure_flags
from specroute.reconfigure.loop import ReconfigureOptions
from specroute.reconfigure.options import allowed_steps

log = structlog.get_logger()

__all__ = ["launch_depths_of", "options_from_args", "register", "run"]

DESCRIPTION = (
    "Start one SGLang server (vLLM with --engine vllm) per speculative depth (--steps 1,2,3), "
    "each on its own GPUs and port with the flags the engine needs, wait until every one is "
    "ready (SGLang's /ready, vLLM's /health), then run the routing proxy in front of them. "
    "Servers that die are restarted with backoff; Ctrl-C stops the proxy first (its streams "
    "drain), then the servers. With the sglang package installed, every SGLang command line "
    "is checked by SGLang's own argument resolver before anything starts (vLLM's lines by "
    'vLLM\'s parser, in its own environment: docs/operators.md, "vLLM servers"). '
    "The proxy's settings come from --config, SPECROUTE_* variables and these flags, as for "
    "`specroute serve`; its keys reach it in its environment, never on its command line."
)


# Flag tables read best one flag to a call; the formatter would explode each call.
# fmt: off
def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "launch",
        description=DESCRIPTION, formatter_class=DefaultsHelp,
    )
    add = parser.add_argument
    add("--steps", default=None,
        help="comma-separated depths, one server each, e.g. 1,2,3; default with --prior: the "
        "pool it recommends (`specroute tune`'s rule) among --allowed-steps")
    add("--servers", type=int, default=None, metavar="N",
        help="with --prior and no --steps, the pool's size (default: what --gpus hold at --tp; "
        "3 with --emulate)")
    add("--expected-users", type=int, default=None, metavar="N",
        help="with --prior and no --steps, the requests the pool should expect at once: its "
        "pool is the one best at that load (default: the best over every load the tune "
        "measured)")
    add("--expected-traffic", default=None, metavar="KIND",
        help="with --prior and no --steps, the traffic the pool should expect: a kind the tune "
        "measured (greedy: temperature 0, as coding agents send; sampled); its pool is the "
        "one best for it (default: sampled, as SGLang samples unless asked not to)")
    add_server_arguments(parser, base_port_help="first server's port; the next get +1, +2")
    add("--host", default=None,
        help="address the proxy listens on (default: the config's host, else 127.0.0.1)")
    add("--port", type=int, default=None,
        help="the proxy's port (default: the config's port, else 8000)")
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
    add("--weight-cache", nargs="?", const="", default=None, metavar="DIR",
        help="keep one weight cache daemon per GPU set alive across its servers' restarts and "
        "start the servers as its clients (a restart maps the weights instead of loading them); "
        "sockets under DIR (default: LOG_DIR/weight-cache). Needs an engine that has it: vLLM "
        "with Fast Start (vllm-project/vllm#54921), or SGLang after 0.5.23 (#27139; no release "
        "verified) at depth 0 only; --emulate runs emulated daemons")
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


def _pool_size(args: argparse.Namespace, detected: tuple[int, ...]) -> int:
    """How many servers a prior's pool has: --servers, else what the GPUs hold at --tp."""
    if args.servers is not None:
        if args.servers < 1:
            raise PlanError(f"--servers must be at least 1, not {args.servers}")
        return int(args.servers)
    gpus = parse_gpus(args.gpus)
    count = len(gpus if gpus is not None else detected) // max(1, args.tp)
    return 3 if args.emulate or count < 1 else count


def launch_depths_of(args: argparse.Namespace, detected: tuple[int, ...] = ()) -> LaunchDepths:
    """The servers' depths and the planner's, from the flags and the prior (see defaults)."""
    from specroute.profile_format import ProfileFormatError, decode_profile

    for flag, value in (
        ("--servers", args.servers),
        ("--expected-users", args.expected_users),
        ("--expected-traffic", args.expected_traffic),
    ):
        if value is not None and args.steps is not None:
            raise PlanError(
                f"{flag} is for the pool --prior recommends; --steps names every server"
            )
    if args.expected_users is not None and args.expected_users < 1:
        raise PlanError(f"--expected-users must be at least 1, not {args.expected_users}")
    prior = None
    if args.prior:
        try:
            prior = decode_profile(Path(args.prior).read_bytes(), source=args.prior)
        except (OSError, ProfileFormatError) as exc:
            raise ConfigError(f"invalid prior: {exc}") from exc
    return launch_depths(
        steps=parse_steps(args.steps) if args.steps is not None else None,
        allowed=None if args.allowed_steps is None else allowed_steps(args.allowed_steps),
        prior=prior,
        prior_name=args.prior or "",
        servers=_pool_size(args, detected),
        users=args.expected_users,
        tables=args.engine == "vllm" and getattr(args, "allow_adaptive", False),
        traffic=args.expected_traffic,
    )


def options_from_args(
    args: argparse.Namespace, config: Config | None = None, depths: LaunchDepths | None = None
) -> LaunchOptions:
    """The launch options; raises PlanError naming the flag at fault."""
    config = config or proxy_config(args)
    depths = depths or launch_depths_of(args)
    return server_options(
        args,
        steps=depths.steps,
        proxy_host=config.host,
        port=config.port,
        policy=config.policy,
        proxy_config=str(args.config) if args.config is not None else None,
        proxy_env=_proxy_env(args),
        prior=str(Path(args.prior).resolve()) if args.prior else None,
        weight_cache=_weight_cache_dir(args),
        tables=depths.tables,
    )


def _weight_cache_dir(args: argparse.Namespace) -> str | None:
    """`--weight-cache [DIR]`: DIR, else the log directory's `weight-cache`; None when off."""
    given: str | None = getattr(args, "weight_cache", None)
    if given is None:
        return None
    return str((Path(given) if given else Path(args.log_dir) / DEFAULT_DIR).resolve())


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
    """Warnings for addresses beyond this machine (servers without keys, a proxy without) and
    for a vLLM pool whose batch limits nothing tells the proxy."""
    notes = []
    if not is_loopback(options.host):
        notes.append(
            f"warning: the SGLang servers listen on {options.host} and take no keys: keep that "
            "network private, or leave --server-host at 127.0.0.1"
        )
    if (keyless := keyless_proxy_warning(config.host, config.api_keys)) is not None:
        notes.append(keyless)
    if options.engine == "vllm" and options.prior is None:
        notes.append(
            "warning: vLLM reports no batch limit: the proxy has none to route or plan by "
            "until requests wait at a server (then it reads the limit from the server's "
            "gauges), and none for a depth no server has run (its memory may hold fewer than "
            "--max-num-seqs); run `specroute tune --engine vllm` and pass its prior.json with "
            "--prior: it measured each depth's limit"
        )
    return notes


def _lanes_note(config: Config, depths: LaunchDepths) -> list[str]:
    """A note when `[lanes]` sets the interactive lane a target and the pool started is the
    prior's, every server at one depth: the prior's pool is chosen for throughput, and the
    lane has no deeper server to go to until the depth loop moves one."""
    lanes = config.lanes
    if lanes.target_tok_s <= 0 and lanes.target_tpot_ms is None:
        return []
    if depths.steps_from == "given" or len(depths.steps) < 2 or len(set(depths.steps)) > 1:
        return []
    steps = ",".join(map(str, depths.steps))
    return [
        f"note: [lanes] sets the interactive lane a target, and the pool the prior recommends "
        f"({steps}) is chosen for throughput, every server at one depth: interactive requests "
        "have no deeper server until the depth loop (--reconfigure auto) moves one where the "
        "lane falls short of its target; --steps naming a mixed pool, one server deeper, serves "
        'the lane from the start (docs/operators.md, "Latency lanes")'
    ]


def _plan(args: argparse.Namespace) -> tuple[LaunchPlan, LaunchDepths]:
    config = proxy_config(args)
    detected = host_gpus(emulate=args.emulate, gpus=parse_gpus(args.gpus))
    depths = launch_depths_of(args, detected)
    options = options_from_args(args, config, depths)
    _check_policy_depth(config, options)
    for note in [*_exposure_notes(config, options), *_lanes_note(config, depths)]:
        print(f"specroute launch: {note}", file=sys.stderr)
    if options.emulate:
        _check_as_real(options, args)
    return build_plan(options, detected), depths


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

    if (
        (args.emulate if emulated is None else emulated)
        or args.engine == "vllm"
        or args.no_sglang_check
    ):
        return None
    if not sglang_installed():
        return None
    from specroute.launch.launcher import validate_with_sglang

    return validate_with_sglang([s.argv for s in plan.servers])


def _with_depth_loop(
    plan: LaunchPlan, args: argparse.Namespace, reconfigure: ReconfigureOptions
) -> tuple[LaunchPlan, str]:
    """The plan and the admin key the depth loop calls the proxy with (`--reconfigure`)."""
    if reconfigure.mode == "off":
        for flag in _loop_only_flags(args):
            print(f"specroute launch: note: {flag} has no effect with --reconfigure off "
                  "(no planner runs)", file=sys.stderr)  # fmt: skip
        return plan, ""
    return with_admin_key(plan, proxy_config(args).admin_key)


def _loop_only_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that only the depth loop reads (`--allowed-steps` and
    `--allow-adaptive` also choose the pool a prior recommends, so they are not among them)."""
    defaults = ReconfigureOptions()
    given = [f"--planner-option {item}" for item in args.planner_option]
    if args.min_dwell != defaults.min_dwell_s:
        given.append("--min-dwell")
    if args.max_unavailable != defaults.max_unavailable:
        given.append("--max-unavailable")
    return given


def _cannot_start(plan: LaunchPlan) -> bool:
    """Print why a server cannot possibly start (warnings for a dry run); True if one cannot."""
    from specroute.launch.preflight import cannot_start

    problems = [(s.name, p) for s in plan.servers for p in cannot_start(s.argv)]
    for name, problem in problems:
        print(f"specroute launch: {name} cannot start: {problem}", file=sys.stderr)
    return bool(problems)


def _ports_taken(plan: LaunchPlan) -> bool:
    """Print each address that is taken before anything starts; True if one is."""
    from specroute.launch.preflight import ports_taken

    taken = ports_taken(plan)
    for name, problem in taken:
        print(f"specroute launch: {name} cannot start: {problem}", file=sys.stderr)
    return bool(taken)


def run(args: argparse.Namespace) -> int:
    try:
        plan, depths = _plan(args)
        reconfigure = reconfigure_flags.reconfigure_options(args, depths.allowed)
        plan, admin_key = _with_depth_loop(plan, args, reconfigure)
    except (PlanError, ConfigError, ValueError) as exc:
        print(f"specroute launch: {exc}", file=sys.stderr)
        return 2
    verdicts = _sglang_verdict(plan, args)
    rejected = [(s, m) for s, m in zip(plan.servers, verdicts or (), strict=False) if m]
    for server, message in rejected:
        print(f"specroute launch: SGLang rejects {server.name}: {message}", file=sys.stderr)
    if rejected:
        return 2
    blocked = [_cannot_start(plan), _ports_taken(plan)]
    if any(blocked) and not args.dry_run:
        return 2
    if args.dry_run:
        sys.stdout.writelines(f"# {note}\n" for note in depths.notes())
        sys.stdout.write(format_plan(plan))
        if verdicts is not None:
            print("# every server's command line was accepted by SGLang's resolver")
        elif args.engine == "vllm" and not args.emulate:
            print("# not checked here: `make vllm-check` runs vLLM's own parser on such lines")
        elif not args.emulate:
            print("# not checked by SGLang (the sglang package is not installed here)")
        return 0
    from specroute.launch.launcher import Launcher, LaunchSettings

    configure_logging()
    log.info("launch_depths", steps=list(depths.steps), steps_from=depths.steps_from,
             allowed_steps=list(depths.allowed), allowed_from=depths.allowed_from)  # fmt: skip
    settings = LaunchSettings(
        log_dir=args.log_dir, ready_timeout_s=args.ready_timeout, drain_s=args.drain
    )
    launcher = Launcher(plan, settings)
    if admin_key:
        attach(
            launcher,
            options_from_args(args, depths=depths),
            reconfigure,
            admin_key,
        )
    return asyncio.run(launcher.run())

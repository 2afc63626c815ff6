"""`specroute launch --reconfigure off|advise|auto` and its options: the flags, their checks
(status 2 before anything starts), and the depth loop attached to the launcher."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import msgspec

from specroute.launch.plan import LaunchPlan, PlanError, parse_steps
from specroute.launch.reconfigure import ReconfigureOptions

if TYPE_CHECKING:
    from specroute.launch.launcher import Launcher

__all__ = ["add_arguments", "attach", "planner_fields", "reconfigure_options", "with_admin_key"]

HELP = (
    "depth follows load: 'advise' (the default) runs the planner and shows its plan at the "
    "proxy's GET /plan, /metrics and /dashboard without touching a server; 'auto' carries it "
    "out (drain, restart at the new depth, wait /ready, readmit; a failed start falls back to "
    "the last good flags); 'off' runs no planner"
)


# Flag tables read best one flag to a call.
# fmt: off
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--reconfigure", choices=("off", "advise", "auto"), default="advise", help=HELP)
    add("--allowed-steps", default="0,1,2,3", metavar="K,K,...",
        help="depths the planner may give a server (0: no speculation)")
    add("--allow-adaptive", action="store_true",
        help="the planner may also choose SGLang's --speculative-adaptive, tiers capped to "
        "--allowed-steps")
    add("--min-dwell", type=float, default=900.0, metavar="SECONDS",
        help="least time between two depth changes of one server")
    add("--max-unavailable", type=int, default=1, metavar="N",
        help="servers draining or restarting at once, at most")
    add("--planner-option", action="append", default=[], metavar="KEY=VALUE",
        help="any other planner setting, e.g. objective=latency, settle_s=60, "
        "regime_prior_s=600 (repeatable)")
# fmt: on


def planner_fields(items: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(f"--planner-option takes KEY=VALUE, not {item!r}")
        fields[key.strip()] = value.strip()
    return fields


def reconfigure_options(args: argparse.Namespace) -> ReconfigureOptions:
    """The loop's options from the flags; PlanError names the flag at fault."""
    allowed = parse_steps(args.allowed_steps)
    if not allowed or min(allowed) < 0:
        raise PlanError(f"--allowed-steps needs depths >= 0, not {args.allowed_steps!r}")
    options = ReconfigureOptions(
        mode=args.reconfigure,
        allowed_steps=tuple(sorted(set(allowed))),
        allow_adaptive=args.allow_adaptive,
        min_dwell_s=args.min_dwell,
        max_unavailable=args.max_unavailable,
        drain_s=args.drain,
        planner=planner_fields(args.planner_option),
    )
    try:
        options.planner_options()
    except (msgspec.ValidationError, ValueError) as exc:
        raise PlanError(f"--planner-option / --max-unavailable: {exc}") from exc
    return options


def with_admin_key(plan: LaunchPlan, admin_key: str | None) -> tuple[LaunchPlan, str]:
    """The plan with an admin key the proxy and the loop share: the operator's, else a fresh
    random one in the proxy's environment (hidden like every key)."""
    from specroute.launch.restarts import admin_key_for

    key, env = admin_key_for(admin_key)
    if not env:
        return plan, key
    proxy = msgspec.structs.replace(
        plan.proxy,
        env={**plan.proxy.env, **env},
        secrets=tuple(sorted({*plan.proxy.secrets, *env})),
    )
    return msgspec.structs.replace(plan, proxy=proxy), key


def attach(launcher: Launcher, args: argparse.Namespace, admin_key: str) -> None:
    """Run the depth loop beside the launched pool (nothing with `--reconfigure off`)."""
    from specroute.launch.command import options_from_args
    from specroute.launch.restarts import depth_loop

    options = reconfigure_options(args)
    if options.mode == "off":
        return

    async def loop(stop: Any) -> None:
        reconfigurer = depth_loop(launcher, options_from_args(args), options, admin_key)
        try:
            await reconfigurer.run(stop)
        finally:
            await reconfigurer.link.aclose()

    launcher.background.append(loop)

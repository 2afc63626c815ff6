"""The depth loop's flags (`specroute launch --reconfigure off|advise|auto`, the advisor) and
their checks: a UsageError names the flag, and the command exits 2 before anything starts."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Mapping
from typing import Any

import msgspec
import msgspec.inspect

from specroute.cmdline import UsageError, parse_ints
from specroute.planner import PlannerOptions
from specroute.reconfigure.loop import ReconfigureOptions
from specroute.structdoc import describe_type

__all__ = [
    "LAUNCH_FLAGGED",
    "add_arguments",
    "add_planner_arguments",
    "allowed_steps",
    "planner_fields",
    "reconfigure_options",
]

HELP = (
    "depth follows load: 'advise' (the default) runs the planner and shows its plan at the "
    "proxy's GET /plan, /metrics and /dashboard without touching a server; 'auto' carries it "
    "out (drain, restart at the new depth, wait /ready, readmit; a failed start falls back to "
    "the last good flags); 'off' runs no planner"
)


_DEFAULTS = ReconfigureOptions()


def _steps_text(steps: tuple[int, ...]) -> str:
    return ",".join(map(str, steps))


# Flag tables read best one flag to a call.
# fmt: off
def add_planner_arguments(
    parser: argparse.ArgumentParser,
    allowed_default: str | None = _steps_text(_DEFAULTS.allowed_steps),
    allowed_help: str = "",
) -> None:
    """What the planner may assign and how often: shared by `launch` and the advisor, with the
    defaults of ReconfigureOptions (`launch` leaves --allowed-steps unset: its prior decides)."""
    add = parser.add_argument
    add("--allowed-steps", default=allowed_default, metavar="K,K,...",
        help="depths the planner may give a server (0: no speculation)" + allowed_help)
    add("--min-dwell", type=float, default=_DEFAULTS.min_dwell_s, metavar="SECONDS",
        help="least time between two depth changes of one server in one load regime")
    add("--planner-option", action="append", default=[], metavar="KEY=VALUE",
        help="any other planner setting, e.g. objective=latency, settle_s=60, "
        "regime_prior_s=600 (repeatable)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`specroute launch`'s depth-loop flags."""
    add = parser.add_argument
    add("--reconfigure", choices=("off", "advise", "auto"), default=_DEFAULTS.mode, help=HELP)
    add_planner_arguments(parser, None, "; default: the depths --prior measured, else "
                          + _steps_text(_DEFAULTS.allowed_steps))
    add("--allow-adaptive", action="store_true",
        help="the planner may also choose the engine's own adaptive depth: SGLang's "
        "--speculative-adaptive, tiers capped to --allowed-steps; vLLM's K per batch size "
        "(num_speculative_tokens_per_batch_size), a table it writes from its estimates, and "
        "with --prior the servers it recommends start with theirs")
    add("--max-unavailable", type=int, default=_DEFAULTS.max_unavailable, metavar="N",
        help="servers draining or restarting at once, at most")
# fmt: on


_FLAGGED = {
    "max_steps": "--allowed-steps",
    "min_dwell_s": "--min-dwell",
    "adaptive": "--allow-adaptive",
    "tables": "--allow-adaptive",
}
"""Planner settings every command with `--planner-option` sets from a flag of its own."""

LAUNCH_FLAGGED = {**_FLAGGED, "max_unavailable": "--max-unavailable", "drain_s": "--drain"}
"""... and those `launch` sets from its own flags besides."""


def planner_fields(items: list[str], flagged: Mapping[str, str] = _FLAGGED) -> dict[str, Any]:
    """`--planner-option KEY=VALUE`s as fields of `PlannerOptions`; UsageError for a key that
    is no setting (naming those that are) and for one a flag sets (`flagged`): given both, the
    option won over the flag unseen (`--min-dwell 60 --planner-option min_dwell_s=900` held
    900 s)."""
    fields: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--planner-option takes KEY=VALUE, not {item!r}")
        if key in flagged:
            raise UsageError(f"--planner-option {key}: set it with {flagged[key]}")
        if key not in PlannerOptions.__struct_fields__:
            known = [f for f in PlannerOptions.__struct_fields__ if f not in flagged]
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"the settings: {', '.join(known)}"
            raise UsageError(f"--planner-option {key}: no such planner setting; {hint}")
        fields[key] = value.strip()
    return fields


def _flag_error(message: str, options: ReconfigureOptions) -> str:
    """`PlannerOptions`' refusal said of the flag that gave the value: a value of the wrong
    kind with what its setting takes (msgspec's `Expected `float`, got `str` - at
    `$.settle_s`` as `--planner-option settle_s=abc: expected number`), a check of its own
    (which names the setting) with the flag at fault."""
    at = re.search(r" - at `\$\.(\w+)`$", message)
    key = at.group(1) if at else ""
    if key in options.planner:
        info = msgspec.inspect.type_info(PlannerOptions)
        assert isinstance(info, msgspec.inspect.StructType)
        wanted = describe_type({f.name: f.type for f in info.fields}[key])
        return f"--planner-option {key}={options.planner[key]}: expected {wanted} ({message})"
    unavailable = key == "max_unavailable" or options.max_unavailable < 1
    return f"{'--max-unavailable' if unavailable else '--planner-option'}: {message}"


def allowed_steps(text: str) -> tuple[int, ...]:
    """`--allowed-steps`: distinct depths >= 0, sorted; UsageError names the flag."""
    allowed = parse_ints(text, "--allowed-steps", minimum=0)
    if not allowed:
        raise UsageError(f"--allowed-steps needs at least one depth, not {text!r}")
    return tuple(sorted(set(allowed)))


def reconfigure_options(
    args: argparse.Namespace, allowed: tuple[int, ...] | None = None
) -> ReconfigureOptions:
    """The loop's options from `launch`'s flags, with the depths `allowed` as launch resolved
    them (else --allowed-steps, else the default); UsageError names the flag at fault."""
    if allowed is None:
        allowed = (
            _DEFAULTS.allowed_steps
            if args.allowed_steps is None
            else allowed_steps(args.allowed_steps)
        )
    options = ReconfigureOptions(
        mode=args.reconfigure,
        allowed_steps=allowed,
        allow_adaptive=args.allow_adaptive,
        min_dwell_s=args.min_dwell,
        max_unavailable=args.max_unavailable,
        drain_s=args.drain,
        planner=planner_fields(args.planner_option, LAUNCH_FLAGGED),
    )
    try:
        options.planner_options()
    except (msgspec.ValidationError, ValueError) as exc:
        raise UsageError(_flag_error(str(exc), options)) from exc
    return options

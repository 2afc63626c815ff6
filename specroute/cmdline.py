"""What every command line shares: the usage error that exits with status 2, and the one parser of
comma-separated integers (`--steps 1,2,3`, `--allowed-steps`, `-c 1,4,16`, `--gpus 0,1`)."""

from __future__ import annotations

import argparse
from typing import Any, Protocol

__all__ = ["Subcommands", "UsageError", "int_list", "parse_ints"]


class UsageError(ValueError):
    """A flag or option the command cannot use; its message names the flag. Exit status 2."""


def parse_ints(text: str, flag: str, *, minimum: int | None = None) -> tuple[int, ...]:
    """`"1,2,3"` -> (1, 2, 3); blank items are skipped. UsageError names `flag` when an item is not
    an integer or is below `minimum`."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise UsageError(f"{flag} must be comma-separated integers, not {text!r}") from exc
    if minimum is not None and any(v < minimum for v in values):
        raise UsageError(f"{flag} needs integers >= {minimum}, not {text!r}")
    return values


def int_list(text: str) -> tuple[int, ...]:
    """argparse `type=` for a list of counts (`-c 1,4,16`): integers >= 1; argparse names the
    flag in its error."""
    try:
        return parse_ints(text, "the value", minimum=1)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Subcommands(Protocol):
    """What a command module's `register(subcommands)` adds its parser to (`specroute.cli`)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...

"""`specroute policies`: every routing policy that can be chosen by name, its whole description,
and each option's type, allowed values, default and documentation, read from the policy itself."""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap

from specroute.cmdline import Subcommands
from specroute.helpformat import first_paragraph
from specroute.policies.registry import (
    PolicyFactory,
    available,
    option_help,
    options_of,
)

__all__ = ["describe", "register"]

_WIDTH = 100
_INDENT = "    "


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "policies",
        description=first_paragraph(__doc__),
    )
    parser.add_argument("name", nargs="?", help="show only this policy")
    parser.set_defaults(run=run)


def _paragraphs(text: str, indent: str) -> list[str]:
    lines: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        flat = " ".join(paragraph.split())
        lines += textwrap.wrap(flat, _WIDTH, initial_indent=indent, subsequent_indent=indent)
        lines.append("")
    return lines


def describe(name: str, factory: PolicyFactory) -> str:
    """One policy's help: its docstring in full, then its options, if it takes any."""
    lines = [name]
    lines += _paragraphs(inspect.getdoc(factory) or "(no description)", _INDENT)
    options = option_help(factory)
    if options:
        lines.append(f"{_INDENT}options ({name}:key=value,key=value):")
        kind = options_of(factory)
        if kind is not None and kind.__doc__:
            lines += _paragraphs(kind.__doc__, _INDENT * 2)
        width = max(len(o.name) for o in options)
        for option in options:
            head = f"{_INDENT * 2}{option.name:<{width}}  {option.kind}, default {option.default}"
            lines.append(head)
            if option.doc:
                pad = _INDENT * 2 + " " * (width + 2)
                lines += textwrap.wrap(
                    option.doc, _WIDTH, initial_indent=pad, subsequent_indent=pad
                )
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    policies = available()
    if args.name is not None and args.name not in policies:
        choices = ", ".join(sorted(policies))
        print(
            f"specroute policies: no policy {args.name!r}; choose one of: {choices}",
            file=sys.stderr,
        )
        return 2
    for name, factory in sorted(policies.items()):
        if args.name in (None, name):
            print(describe(name, factory))
    print("Choose with --policy NAME or NAME:key=value,key=value (also PUT /policy).")
    return 0

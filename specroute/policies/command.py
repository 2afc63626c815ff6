"""`specroute policies`: list the routing policies that can be chosen by name, with options."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import msgspec

from specroute.policies.registry import available, options_of

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "policies", help="list routing policies", description=__doc__.splitlines()[0]
    )
    parser.set_defaults(run=run)


def _options(factory: Any) -> str:
    kind = options_of(factory)
    if kind is None:
        return ""
    defaults = msgspec.to_builtins(kind())
    return " ".join(f"{name}={value}" for name, value in defaults.items())


def run(args: argparse.Namespace) -> int:
    for name, factory in sorted(available().items()):
        doc = (inspect.getdoc(factory) or "").splitlines()
        print(f"{name:16} {doc[0] if doc else ''}")
        options = _options(factory)
        if options:
            print(f"{'':16}   options: {options}")
    print("\nChoose with --policy NAME or NAME:key=value,key=value (also PUT /policy).")
    return 0

"""`specroute policies`: list the routing policies that can be chosen by name."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from specroute.policies.registry import available

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "policies", help="list routing policies", description=__doc__.splitlines()[0]
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for name, factory in sorted(available().items()):
        doc = (inspect.getdoc(factory) or "").splitlines()
        print(f"{name:16} {doc[0] if doc else ''}")
    return 0

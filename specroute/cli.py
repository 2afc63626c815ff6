"""The `specroute` command: one entry point whose subcommands live beside the code they run.

A subcommand's module is imported only when that subcommand runs (or its `--help` is asked), so
`specroute --version` and `specroute emulate --help` do not pay for Litestar, the pool and the
planner."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from specroute import __version__

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "specroute.demo",
        "the proxy on localhost in front of three emulated servers, until Ctrl-C",
    ),
    "calibrate": (
        "specroute.calibrate",
        "measure emulated servers at steps 1/2/3 and print them beside the seed table",
    ),
    "emulate": (
        "specroute.emulator.command",
        "run an emulated SGLang or vLLM server (no GPU, no model)",
    ),
    "emulate-weight-cache": (
        "specroute.emulator.weight_cache",
        "run an emulated weight cache daemon that emulated servers restart through",
    ),
    "bench": (
        "specroute.bench.command",
        "benchmark OpenAI-compatible servers (SGLang, vLLM, the proxy)",
    ),
    "serve": ("specroute.proxy.command", "run the routing proxy"),
    "config": (
        "specroute.proxy.config_example",
        "the proxy's settings: print the example configuration",
    ),
    "launch": (
        "specroute.launch.command",
        "start a pool of SGLang or vLLM servers (one per depth) and the proxy",
    ),
    "tune": (
        "specroute.tune.command",
        "measure every depth of a model and recommend depths and a pool mix",
    ),
    "policies": ("specroute.policies.command", "list routing policies with their options"),
}
"""Each subcommand: the module whose `register(subparsers)` adds it, and its one-line summary."""


class _Summarised:
    """The subparsers as a command's `register` sees them: its summary comes from COMMANDS, so
    the listing is the same whether or not the command's module was imported."""

    def __init__(self, subparsers: argparse._SubParsersAction[Any]) -> None:
        self._subparsers = subparsers

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["help"] = COMMANDS[name][1]
        parser: argparse.ArgumentParser = self._subparsers.add_parser(name, **kwargs)
        return parser


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (with `command`) one in which only that subcommand is real and the
    others are listed by name and summary."""
    parser = argparse.ArgumentParser(
        prog="specroute",
        description=(
            "Route OpenAI-compatible requests across SGLang or vLLM servers running different "
            "speculative depths, emulate such servers, and benchmark them."
        ),
    )
    parser.add_argument("--version", action="version", version=f"specroute {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, summary) in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module).register(_Summarised(subparsers))
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The subcommand named on the line ('' when none is, as with `--version`)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; its return value is the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = _command(argv)
    parser = build_parser(name if name in COMMANDS else "")
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())

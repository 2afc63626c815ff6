"""The `specroute` command: one entry point whose subcommands live beside the code they run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specroute import __version__, calibrate, demo
from specroute.bench import command as bench_command
from specroute.emulator import command as emulator_command
from specroute.launch import command as launch_command
from specroute.launch import tune as tune_command
from specroute.policies import command as policies_command
from specroute.proxy import command as proxy_command
from specroute.proxy import config_example

__all__ = ["build_parser", "main"]

COMMANDS = (
    demo,
    calibrate,
    emulator_command,
    bench_command,
    proxy_command,
    config_example,
    launch_command,
    tune_command,
    policies_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specroute",
        description=(
            "Route OpenAI-compatible requests across SGLang servers running different "
            "speculative depths, emulate such servers, and benchmark them."
        ),
    )
    parser.add_argument("--version", action="version", version=f"specroute {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; its return value is the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())

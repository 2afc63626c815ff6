"""Check launcher command lines with SGLang's own server-argument code, before anything starts.

`ServerArgs.add_cli_args(parser)`, `ServerArgs.from_cli_args(...)`, then `.resolve_once()`: the
same parsing and resolution `sglang.launch_server` runs, so a rejection carries SGLang's own
message. It needs the `sglang` package (the `sglang` extra) and torch, not a GPU. Run as
`python -m specroute.launch.sglang_check` it reads a JSON list of argument lists on stdin and
writes one verdict per list (null when accepted, else the message) on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["SglangRejected", "check_args", "sglang_installed"]


class SglangRejected(Exception):
    """SGLang's argument parser or resolver refused a command line; the message is SGLang's."""


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise SglangRejected(message)


def sglang_installed() -> bool:
    """True when `import sglang` would find the package in this interpreter."""
    return importlib.util.find_spec("sglang") is not None


def _without_launcher(argv: Sequence[str]) -> list[str]:
    """Drop `python -m sglang.launch_server` (or `sglang serve`) from a full command line."""
    args = list(argv)
    for marker in ("sglang.launch_server", "serve"):
        if marker in args:
            return args[args.index(marker) + 1 :]
    return args


def check_args(argv: Sequence[str], *, device: str | None = "cuda") -> dict[str, Any]:
    """Parse and resolve one server's arguments as SGLang does; return the resolved fields that
    matter to routing, or raise SglangRejected with SGLang's message.

    `device` is added as `--device` unless the command line has one: without a GPU, SGLang
    would otherwise resolve for the CPU, which is not what the real server will do.
    """
    # Imported by name: SGLang is an optional extra that the type checker's environment lacks.
    ServerArgs: Any = importlib.import_module("sglang.srt.server_args").ServerArgs

    args = _without_launcher(argv)
    if device is not None and "--device" not in args:
        args += ["--device", device]
    parser = _RaisingParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            server_args = ServerArgs.from_cli_args(parser.parse_args(args))
            server_args.resolve_once()
    except SglangRejected:
        raise
    except SystemExit as exc:  # some checks print and exit
        raise SglangRejected(captured.getvalue().strip() or f"exit status {exc.code}") from exc
    except Exception as exc:  # any resolver failure is a rejection; keep its words
        raise SglangRejected(f"{type(exc).__name__}: {exc}") from exc
    resolved = server_args.resolved_dict()
    keys = (
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "max_running_requests",
        "tp_size",
        "port",
        "enable_metrics",
    )
    return {key: resolved.get(key) for key in keys}


def main() -> int:
    """Verdicts for a JSON list of command lines on stdin, as JSON on stdout."""
    argvs = json.load(sys.stdin)
    verdicts: list[dict[str, Any]] = []
    for argv in argvs:
        try:
            verdicts.append({"ok": True, "resolved": check_args(argv)})
        except SglangRejected as exc:
            verdicts.append({"ok": False, "message": str(exc)})
    json.dump(verdicts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

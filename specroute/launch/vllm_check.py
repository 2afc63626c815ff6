"""Check launcher command lines for vLLM with vLLM's own argument code, before anything starts.

`make_arg_parser(FlexibleArgumentParser())` and `validate_parsed_serve_args` from
vllm/entrypoints/common/cli_args.py (vllm/entrypoints/openai/cli_args.py in older releases;
what vllm/entrypoints/cli/serve.py parses `vllm serve` with: the `model_tag` positional,
the frontend flags and `AsyncEngineArgs.add_cli_args` from vllm/engine/arg_utils.py), then
`AsyncEngineArgs.from_cli_args`: a rejection carries vLLM's own message. It needs the `vllm`
package (installed without its GPU dependencies, see deploy/vllm-check/), not a GPU. Run as
`python -m specroute.launch.vllm_check` it reads a JSON list of argument lists on stdin and
writes one verdict per list on stdout, as `sglang_check` does.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["VllmRejected", "check_args", "vllm_installed"]


class VllmRejected(Exception):
    """vLLM's argument parser or its engine arguments refused a command line (vLLM's words)."""


def vllm_installed() -> bool:
    """True when `import vllm` would find the package in this interpreter."""
    return importlib.util.find_spec("vllm") is not None


def _after_serve(argv: Sequence[str]) -> list[str]:
    """The arguments after `serve` (`python -m vllm.entrypoints.cli.main serve ...`)."""
    args = list(argv)
    return args[args.index("serve") + 1 :] if "serve" in args else args


_CLI_ARGS = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.openai.cli_args")
"""Where `make_arg_parser` lives: vllm/entrypoints/common/ since 0.2x, openai/ before."""


def _cli_args() -> Any:
    for name in _CLI_ARGS:
        if importlib.util.find_spec(name) is not None:
            return importlib.import_module(name)
    raise VllmRejected(f"this vllm has none of {', '.join(_CLI_ARGS)}")


def _parser() -> Any:
    # vLLM infers its platform when its argument defaults are built; without a GPU it finds
    # none unless told (vllm/platforms/__init__.py, `cpu_platform_plugin`). Only defaults
    # depend on it: every flag the launcher writes is given explicitly.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # Imported by name: vLLM is an optional environment that the type checker's lacks.
    cli_args = _cli_args()
    try:
        flexible = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser
    except (ImportError, AttributeError):  # releases before vllm.utils became a package
        flexible = importlib.import_module("vllm.utils").FlexibleArgumentParser
    return cli_args, cli_args.make_arg_parser(flexible(prog="vllm serve"))


def check_args(argv: Sequence[str]) -> dict[str, Any]:
    """Parse and validate one `vllm serve` line as vLLM does; return the fields that matter to
    routing, or raise VllmRejected with vLLM's message."""
    cli_args, parser = _parser()
    engine_args: Any = importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            args = parser.parse_args(_after_serve(argv))
            if getattr(args, "model_tag", None):
                args.model = args.model_tag
            cli_args.validate_parsed_serve_args(args)
            engine = engine_args.from_cli_args(args)
    except SystemExit as exc:  # argparse prints its complaint and exits
        raise VllmRejected(captured.getvalue().strip() or f"exit status {exc.code}") from exc
    except Exception as exc:  # any validation failure is a rejection; keep its words
        raise VllmRejected(f"{type(exc).__name__}: {exc}") from exc
    spec = engine.speculative_config
    spec = spec if isinstance(spec, dict) else {}
    table = spec.get("num_speculative_tokens_per_batch_size")
    if table is not None:
        # SpeculativeConfig checks the table only once it has a model config (a download), so
        # the check calls the same validator it does (vllm/v1/spec_decode/dynamic/utils.py).
        try:
            dynamic: Any = importlib.import_module("vllm.v1.spec_decode.dynamic.utils")
            table = dynamic.validate_and_normalize_dynamic_sd_schedule(table)
        except (ImportError, ValueError, TypeError) as exc:
            raise VllmRejected(f"num_speculative_tokens_per_batch_size: {exc}") from exc
    return {
        "model": engine.model,
        "method": spec.get("method"),
        "num_speculative_tokens": spec.get("num_speculative_tokens"),
        "draft_model": spec.get("model"),
        "num_speculative_tokens_per_batch_size": table,
        "max_num_seqs": engine.max_num_seqs,
        "per_request_spec_decode_metrics": engine.per_request_spec_decode_metrics,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "port": args.port,
    }


def main() -> int:
    """Verdicts for a JSON list of command lines on stdin, as JSON on stdout."""
    verdicts: list[dict[str, Any]] = []
    for argv in json.load(sys.stdin):
        try:
            verdicts.append({"ok": True, "resolved": check_args(argv)})
        except VllmRejected as exc:
            verdicts.append({"ok": False, "message": str(exc)})
    json.dump(verdicts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

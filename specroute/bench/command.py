"""`specroute bench`: sweep, trace, compare and profile subcommands (argument parsing only)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from specroute.cmdline import Subcommands, int_list
from specroute.helpformat import DefaultsHelp
from specroute.logs import configure_logging

__all__ = ["register"]

T = TypeVar("T")
PROGRESS_EVERY_S = 10.0
"""Off a terminal (CI, nohup), a progress line this often, besides one per finished level."""


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where installed: paced 22k chunks/s cost 66-74% of a core on it (see
    benchmarks/bench_client_throughput.py)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _json_object(text: str) -> dict[str, Any]:
    value = msgspec.json.decode(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--extra-body must be a JSON object")
    return value


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--prompt-words", type=int, default=256, help="synthetic prompt length")
    g.add_argument("--dataset", help="prompts file (JSONL, or ShareGPT JSON with --dataset-format)")
    g.add_argument(
        "--dataset-format",
        choices=["jsonl", "sharegpt"],
        default="jsonl",
        help="--dataset's format",
    )
    g.add_argument("--max-tokens", type=int, default=256, help="tokens per reply")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replies run to --max-tokens",
    )
    g.add_argument(
        "--api",
        choices=["chat", "completions", "responses", "messages"],
        default="chat",
        help="the route: OpenAI chat or completions, OpenAI Responses, Anthropic Messages",
    )
    g.add_argument("--model", help="model name (default: the first of /v1/models)")
    g.add_argument("--extra-body", type=_json_object, default={}, help="JSON merged into bodies")
    g.add_argument("--api-key")
    g.add_argument(
        "--no-continuous-usage", action="store_true", help="do not ask for usage on every chunk"
    )
    g.add_argument(
        "--no-spec-details", action="store_true", help="do not ask for sglext.spec_tokens_details"
    )
    g.add_argument("--seed", type=int, default=0, help="prompts and sampling mix")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per request")


def _add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", dest="json_out", help="write every setting and request here")
    g.add_argument("--csv", dest="csv_out")
    g.add_argument("--markdown", dest="markdown_out")
    g.add_argument("--plots", dest="plots_dir", help="directory for PNG plots")
    g.add_argument("--reference", help="published figures to print beside (seed-table JSON)")
    g.add_argument("--no-chunks", action="store_true", help="leave per-chunk timings out of JSON")
    g.add_argument("--log-level", default="warning", help="the bench's own log")


def _add_sweep(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="targets x concurrency levels: the seed write-up's table",
        formatter_class=DefaultsHelp,
    )
    p.add_argument("targets", nargs="+", help="URL or label=URL, e.g. steps1=http://h:30000")
    p.add_argument(
        "-c",
        "--concurrency",
        type=int_list,
        default=(1, 4, 16, 32, 64),
        help="closed-loop levels: users in flight, comma-separated",
    )
    p.add_argument(
        "--rates",
        type=_floats,
        default=[],
        help="open-loop Poisson levels (requests/s) instead of concurrency",
    )
    p.add_argument("--max-concurrency", type=int, help="cap on in-flight requests (Poisson)")
    p.add_argument("-n", "--requests", type=int, help="requests per level (default 2*C, min 3)")
    p.add_argument(
        "--requests-per-concurrency", type=float, default=2.0, help="requests per level per user"
    )
    p.add_argument("--min-requests", type=int, default=3, help="fewest requests per level")
    p.add_argument("--duration", type=float, help="seconds of sending per level")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests per target")
    p.add_argument("--workers", type=int, default=1, help="client processes per level")
    _add_workload_args(p)
    _add_output_args(p)
    p.set_defaults(run=_run_sweep)


def _add_trace(sub: Any) -> None:
    p = sub.add_parser(
        "trace", help="replay a scenario's phases against one target", formatter_class=DefaultsHelp
    )
    p.add_argument("scenario", help="scenario TOML (see scenarios/policy-eval.toml)")
    p.add_argument("target", help="URL of the target (a proxy or one backend)")
    p.add_argument(
        "--duration-scale",
        type=float,
        default=1.0,
        help="multiply every phase's duration (e.g. 0.1 against a fast emulator)",
    )
    p.add_argument("--model")
    p.add_argument("--api-key")
    p.add_argument("--seed", type=int, default=0)
    _add_output_args(p)
    p.set_defaults(run=_run_trace)


def _add_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="saved results side by side, with ratios to the first")
    p.add_argument("results", nargs="+", help="JSON results of sweep or trace")
    p.add_argument("--baseline", help="the column the ratios are against (default: the first)")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(run=_run_compare)


def _add_profile(sub: Any) -> None:
    p = sub.add_parser("profile", help="a sweep's results as a routing prior (profile JSON)")
    p.add_argument("result", help="JSON written by `bench sweep --json`")
    p.add_argument("-o", "--output", help="profile file (default: stdout)")
    p.set_defaults(run=_run_profile)


def register(subparsers: Subcommands) -> None:
    """Add `bench` and its subcommands to the `specroute` parser."""
    bench = subparsers.add_parser(
        "bench",
    )
    sub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)
    _add_sweep(sub)
    _add_trace(sub)
    _add_compare(sub)
    _add_profile(sub)


def _sweep_settings(args: argparse.Namespace) -> Any:
    from specroute.bench.level import SweepSettings, parse_target
    from specroute.bench.workload import ApiSettings, PromptSettings, Sampling

    source: Literal["synthetic", "jsonl", "sharegpt"] = (
        args.dataset_format if args.dataset else "synthetic"
    )
    return SweepSettings(
        targets=[parse_target(t, i) for i, t in enumerate(args.targets)],
        concurrency=list(args.concurrency),
        rates=args.rates,
        max_concurrency=args.max_concurrency,
        requests=args.requests,
        requests_per_concurrency=args.requests_per_concurrency,
        min_requests=args.min_requests,
        duration=args.duration,
        warmup=args.warmup,
        prompts=PromptSettings(source=source, path=args.dataset, words=args.prompt_words),
        mix=[
            Sampling(
                temperature=args.temperature,
                top_p=args.top_p,
                max_tokens=args.max_tokens,
                ignore_eos=args.ignore_eos,
            )
        ],
        api=ApiSettings(
            api=args.api,
            model=args.model,
            extra_body=args.extra_body,
            api_key=args.api_key,
            continuous_usage=not args.no_continuous_usage,
            spec_details=not args.no_spec_details,
            timeout=args.timeout,
        ),
        seed=args.seed,
        workers=args.workers,
        keep_chunks=not args.no_chunks,
    )


def _write_outputs(args: argparse.Namespace, result: Any, reference: Any) -> None:
    from specroute.bench import report

    if args.json_out:
        report.save_result(result, args.json_out)
    if args.csv_out:
        Path(args.csv_out).write_text(report.render_csv(result))
    if args.markdown_out:
        Path(args.markdown_out).write_text(report.render_markdown(result, reference))
    if args.plots_dir:
        from specroute.bench.plots import save_plots

        for path in save_plots(result, args.plots_dir):
            print(f"wrote {path}", file=sys.stderr)


def _plots_ready(args: argparse.Namespace, command: str) -> bool:
    """Asked for plots without matplotlib: say which extra to install before any work."""
    from specroute.plotting import plots_missing

    if args.plots_dir and (missing := plots_missing()) is not None:
        print(f"specroute bench {command}: --plots: {missing}", file=sys.stderr)
        return False
    return True


def _exit_status(command: str, result: Any) -> int:
    """Print how many requests failed; 1 when none succeeded (a dead target is no result)."""
    succeeded = sum(lv.summary.succeeded for lv in result.levels)
    failed = sum(lv.summary.errors for lv in result.levels)
    if failed:
        print(
            f"specroute bench {command}: {failed} of {succeeded + failed} requests failed",
            file=sys.stderr,
        )
    if succeeded == 0:
        print(f"specroute bench {command}: no request succeeded", file=sys.stderr)
        return 1
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    from specroute.bench.progress import Progress
    from specroute.bench.reference import load_reference
    from specroute.bench.report import render_table
    from specroute.bench.sweep import run_sweep

    configure_logging(args.log_level)
    if not _plots_ready(args, "sweep"):
        return 2
    try:
        settings = _sweep_settings(args)
    except (ValueError, msgspec.ValidationError) as exc:
        print(f"specroute bench sweep: {exc}", file=sys.stderr)
        return 2
    reference = load_reference(args.reference) if args.reference else None
    result = _run(run_sweep(settings, progress=Progress(every_s=PROGRESS_EVERY_S)))
    print(render_table(result, reference))
    _write_outputs(args, result, reference)
    return _exit_status("sweep", result)


def _run_trace(args: argparse.Namespace) -> int:
    from specroute.bench.progress import Progress
    from specroute.bench.report import render_table
    from specroute.bench.trace import load_scenario, run_trace

    configure_logging(args.log_level)
    if not _plots_ready(args, "trace"):
        return 2
    try:
        scenario = load_scenario(args.scenario)
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        print(f"specroute bench trace: {exc}", file=sys.stderr)
        return 2
    result = _run(
        run_trace(
            scenario,
            args.target,
            duration_scale=args.duration_scale,
            model=args.model,
            api_key=args.api_key,
            seed=args.seed,
            progress=Progress(every_s=PROGRESS_EVERY_S),
        )
    )
    print(render_table(result))
    _write_outputs(args, result, None)
    return _exit_status("trace", result)


def _run_compare(args: argparse.Namespace) -> int:
    from specroute.bench.compare import render_comparison
    from specroute.bench.report import load_result

    try:
        results = [(path, load_result(path)) for path in args.results]
        text = render_comparison(results, baseline=args.baseline, markdown=args.markdown)
    except (OSError, msgspec.DecodeError, ValueError) as exc:  # ValueError: an unknown baseline
        print(f"specroute bench compare: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _run_profile(args: argparse.Namespace) -> int:
    from specroute.bench.profile import encode_profile, profile_from_result
    from specroute.bench.report import load_result

    try:
        profile = profile_from_result(load_result(args.result), source=args.result)
    except (OSError, msgspec.DecodeError) as exc:
        print(f"specroute bench profile: {exc}", file=sys.stderr)
        return 2
    if not any(target.points for target in profile.targets):
        print(
            f"specroute bench profile: {args.result} has no closed-loop level with a successful "
            "request: no profile written",
            file=sys.stderr,
        )
        return 1
    data = encode_profile(profile)
    if args.output:
        Path(args.output).write_bytes(data + b"\n")
    else:
        print(data.decode())
    return 0

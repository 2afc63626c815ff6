"""`specroute emulate`: run an emulated SGLang server (no GPU, no model) on one uvicorn worker."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from types import FrameType

import msgspec
import structlog
import uvicorn

from specroute.cmdline import Subcommands
from specroute.emulator.adaptive_config import load_adaptive_config
from specroute.emulator.faults import EXIT_STATUS
from specroute.emulator.options import (
    SGLANG_PORT,
    SPEC_ALGORITHMS,
    VLLM_DEFAULT_MAX_NUM_SEQS,
    EmulatorOptions,
)
from specroute.emulator.profiles import DEFAULT_PROFILE, PROFILES
from specroute.emulator.startup import CACHED_WEIGHTS_S
from specroute.emulator.weight_cache import through_weight_cache
from specroute.helpformat import DefaultsHelp
from specroute.logs import configure_logging
from specroute.speculation import SPECULATIVE_DEFAULT_MAX_RUNNING

__all__ = ["options_from_args", "register", "run"]

log = structlog.get_logger()

DESCRIPTION = (
    "Run an EMULATED SGLang 0.5.23 server: there is no GPU and no model behind it. A calibrated "
    "profile decides how long each batch iteration takes and how many draft tokens each "
    "request accepts; the text is deterministic filler, one word per token. It answers the "
    "OpenAI routes, /generate, /server_info, /metrics and the rest as SGLang does, so proxies, "
    "benchmarks and SGLang's own client can be tested on a laptop. With --engine vllm it speaks "
    "vLLM's dialect instead (vLLM's routes, vllm: metrics, its stream chunks and errors)."
)
GRACEFUL_SHUTDOWN_SECONDS = 3


class _Server(uvicorn.Server):
    """uvicorn's server, telling the emulator first so open streams end instead of hanging."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "emulate",
        description=DESCRIPTION,
        formatter_class=DefaultsHelp,
    )
    _server_flags(parser.add_argument_group("server (SGLang's flags)"))
    _emulation_flags(parser.add_argument_group("emulation"))
    _fault_flags(parser.add_argument_group("faults (for testing clients and proxies)"))
    parser.set_defaults(run=run, parser=parser)


# Flag tables read best one flag to a call; the formatter would explode each call.
# fmt: off
def _server_flags(group: argparse._ArgumentGroup) -> None:
    add = group.add_argument
    add("--steps", type=int, required=True, default=argparse.SUPPRESS,
        help="--speculative-num-steps (vLLM: num_speculative_tokens); 0 runs without speculation")
    add("--engine", choices=("sglang", "vllm"), default="sglang",
        help="the dialect: SGLang 0.5.23's, or vLLM's OpenAI server (same physics)")
    add("--num-speculative-tokens-per-batch-size", type=json.loads, default=None, metavar="JSON",
        help="with --engine vllm: vLLM's dynamic K table, [[first, last, K], ...] batch sizes")
    add("--per-request-spec-decode-metrics", choices=("none", "summary", "detailed"),
        default="none", help="with --engine vllm: each reply's speculative figures under "
        "metrics.speculative_decoding (streams: on the usage chunk), as vLLM 0.33")
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=SGLANG_PORT, help="SGLang's default port")
    add("--fd", type=int, default=None, metavar="N",
        help="listen on inherited socket N, bound by the parent to --host:--port (tests do so, "
        "so that no other process can take the port first)")
    add("--max-running-requests", "--max-num-seqs", type=int, default=None,
        help="a cap: the server runs at most this and what memory holds at its deepest depth "
        f"(default: SGLang's {SPECULATIVE_DEFAULT_MAX_RUNNING} for a speculative server; "
        f"vLLM's {VLLM_DEFAULT_MAX_NUM_SEQS} with --engine vllm)")
    add("--model-name", default=None, help="served model name (default: the profile's model)")
    add("--speculative-algorithm", choices=SPEC_ALGORITHMS, default=None,
        help="default NEXTN when --steps > 0 (reported as EAGLE, as SGLang does)")
    add("--speculative-adaptive", action="store_true",
        help="switch depth per batch-size tier, as SGLang's adaptive mode")
    add("--speculative-adaptive-config", default=None, metavar="PATH",
        help="SGLang's JSON tiers for --speculative-adaptive (default: SGLang's built-in tiers)")
    add("--api-key", default=None,
        help="require 'Authorization: Bearer KEY' (not on /health, /ready, /metrics)")
    add("--enable-response-store", action="store_true",
        help="keep /v1/responses results for retrieval, cancel and previous_response_id")
    add("--decode-log-interval", type=int, default=40,
        help="decode iterations between refreshes of the /metrics gauges")


def _emulation_flags(group: argparse._ArgumentGroup) -> None:
    add = group.add_argument
    add("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE,
        help="calibrated model/GPU behaviour")
    add("--seed", type=int, default=0,
        help="seeds acceptance draws, output lengths, text and faults")
    add("--time-scale", type=float, default=1.0,
        help="the emulated GPU runs X times faster; reported times stay wall-clock")
    add("--startup-s", type=_startup, default=0.0, metavar="S|profile",
        help="emulated seconds to ready, port closed while 'loading', scaled by --time-scale; "
        "'profile': the profile's real-hardware figure")
    for part, what in (("weights", "weight load"), ("init", "server init"),
                       ("graphs", "CUDA graph capture"), ("warmup", "warm-up, listening")):
        add(f"--startup-{part}-s", type=float, default=None, metavar="S",
            help=f"emulated seconds of the {what} (default: its share of --startup-s)")
    add("--weight-cache-socket", default=None, metavar="PATH",
        help="start as the client of a weight cache daemon (`specroute emulate-weight-cache`): "
        "while it answers, the weight load takes --startup-cached-weights-s")
    add("--startup-cached-weights-s", type=float, default=CACHED_WEIGHTS_S, metavar="S",
        help="a weight cache client's weight load (mapped from the daemon)")


def _fault_flags(group: argparse._ArgumentGroup) -> None:
    add = group.add_argument
    add("--fail-rate", type=float, default=0.0, metavar="F",
        help="share of generation requests answered HTTP 500")
    add("--exit-after-requests", type=int, default=None, metavar="N",
        help=f"exit hard (status {EXIT_STATUS}) on receiving generation request N+1")
    add("--exit-mid-stream-after-tokens", type=int, default=None, metavar="N",
        help=f"exit hard (status {EXIT_STATUS}) once a stream has sent N tokens "
        "(a non-streamed request: once it has generated N)")
    add("--stall-after-tokens", type=int, default=None, metavar="N",
        help="streams go silent after N tokens but keep the connection open "
        "(a non-streamed request is never answered)")
    add("--not-ready-for", type=float, default=0.0, metavar="SECONDS",
        help="/ready (and /health) answer 503 this long after start")
    add("--malformed-sse-rate", type=float, default=0.0, metavar="F",
        help="share of streams that emit one broken 'data:' line mid-stream")
# fmt: on


def _startup(value: str) -> float | str:
    if value == "profile":
        return value
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'profile', got {value!r}") from None


def options_from_args(args: argparse.Namespace) -> EmulatorOptions:
    """Build and check the options; raises ValueError naming the flag (or file) at fault."""
    fields = {f.name for f in msgspec.structs.fields(EmulatorOptions)}
    raw = {k: v for k, v in vars(args).items() if k in fields}
    path = raw.get("speculative_adaptive_config")
    if path is not None:
        raw["speculative_adaptive_config"] = load_adaptive_config(path)
    try:
        return msgspec.convert(raw, EmulatorOptions)
    except msgspec.ValidationError as exc:
        message = str(exc)
        for name in fields:
            message = message.replace(f"`$.{name}`", "--" + name.replace("_", "-"))
        raise ValueError(message) from exc


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
    except ValueError as exc:
        args.parser.error(str(exc))  # exits with status 2
    from specroute.children import inherited_socket
    from specroute.emulator.server import build
    from specroute.emulator.vllm_server import build_vllm

    configure_logging()
    options = through_weight_cache(options)
    app, emulator = build_vllm(options) if options.engine == "vllm" else build(options)
    log.info(
        "emulator_starting",
        note="EMULATED server: no GPU, no model",
        engine=options.engine,
        url=f"http://{options.host}:{options.port}",
        model=options.served_model_name,
        profile=options.profile,
        steps=options.steps,
        speculative_algorithm=options.algorithm,
        adaptive=options.speculative_adaptive,
        max_running_requests=emulator.engine.max_running_requests,
        time_scale=options.time_scale,
        startup_s=options.startup_seconds,
    )
    if not _load(emulator.startup.parts):
        return 0
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        loop="uvloop",
        http="httptools",
        workers=1,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    sockets = None if args.fd is None else [inherited_socket(args.fd)]
    _Server(config, on_exit=emulator.begin_shutdown).run(sockets=sockets)
    return 0


def _load(parts: tuple[tuple[str, float], ...]) -> bool:
    """Stand in for SGLang's start-up before it listens (weight load, init, CUDA graphs), part
    by part, each logged: the port stays closed. False if interrupted."""
    for part, seconds in parts:
        log.info("emulator_loading", part=part, wall_s=round(seconds, 3))
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            log.info("emulator_stopped", during=part)
            return False
    return True

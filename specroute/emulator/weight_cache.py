"""An emulated weight cache daemon and its client side: `specroute emulate-weight-cache` takes
its weight load (port closed), then answers on a Unix socket until stopped, as SGLang's
`python -m sglang.srt.weight_cache.daemon` (sgl-project/sglang#27139) and vLLM's
`vllm.model_executor.model_loader.weight_cache.daemon` keep post-quantized weights for their
engines. An emulated server started with `--weight-cache-socket` asks it once at start-up:
while it answers, the server's weight load is the cached one (about a second)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
from pathlib import Path

import msgspec
import structlog

from specroute.cmdline import Subcommands
from specroute.emulator.options import EmulatorOptions
from specroute.emulator.profiles import DEFAULT_PROFILE, PROFILES
from specroute.emulator.startup import StartupParts
from specroute.helpformat import DefaultsHelp
from specroute.logs import configure_logging

__all__ = ["DaemonHello", "daemon_answers", "register", "run", "serve", "through_weight_cache"]

log = structlog.get_logger()

CONNECT_TIMEOUT_S = 5.0


class DaemonHello(msgspec.Struct, frozen=True, kw_only=True):
    """What the emulated daemon answers every connection with, one JSON line."""

    status: str
    pid: int
    profile: str


_hello = msgspec.json.Decoder(DaemonHello)


def daemon_answers(path: str, timeout_s: float = CONNECT_TIMEOUT_S) -> DaemonHello | None:
    """The daemon's hello at `path`, or None where nothing answers (no socket, a stale one)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            line = sock.makefile("rb").readline()
        return _hello.decode(line)
    except (OSError, msgspec.DecodeError):
        return None


def through_weight_cache(options: EmulatorOptions) -> EmulatorOptions:
    """`options` with the weight load the server will take: the cached one while its daemon
    answers, the disk's otherwise (SGLang's client mode falls back to disk when no socket is
    there); logged either way."""
    path = options.weight_cache_socket
    if path is None:
        return options
    parts = options.startup_parts
    hello = daemon_answers(path)
    if hello is None:
        log.warning("weight_cache_absent", socket=path, weights_s=round(parts.weights_s, 1))
        return options
    cached = parts.through_cache(options.startup_cached_weights_s)
    log.info("weight_cache_client", socket=path, daemon_pid=hello.pid,
             weights_s=round(cached.weights_s, 1),
             disk_weights_s=round(parts.weights_s, 1))  # fmt: skip
    return msgspec.structs.replace(options, startup_weights_s=cached.weights_s)


# fmt: off
def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "emulate-weight-cache", formatter_class=DefaultsHelp,
        description="Run an EMULATED weight cache daemon (no GPU): it takes the profile's weight "
        "load, then answers on --socket until stopped; emulated servers started with "
        "--weight-cache-socket load their weights from it in about a second.",
    )
    add = parser.add_argument
    add("--socket", required=True, metavar="PATH", help="the Unix socket to answer on")
    add("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE,
        help="whose weight load it takes (its share of the profile's start-up)")
    add("--load-s", type=float, default=None, metavar="S",
        help="emulated seconds of the weight load (default: the profile's)")
    add("--time-scale", type=float, default=1.0, help="run X times faster, as `emulate` does")
    parser.set_defaults(run=run, parser=parser)
# fmt: on


def run(args: argparse.Namespace) -> int:
    configure_logging()
    load_s = args.load_s
    if load_s is None:
        load_s = StartupParts.split(PROFILES[args.profile].startup_s).weights_s
    if load_s < 0 or args.time_scale <= 0:
        args.parser.error("--load-s must be >= 0 and --time-scale > 0")
    return asyncio.run(serve(Path(args.socket), args.profile, load_s / args.time_scale))


async def serve(path: Path, profile: str, load_wall_s: float) -> int:
    """Load, answer on `path` until SIGTERM or SIGINT, then remove the socket."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("weight_cache_loading", socket=str(path), wall_s=round(load_wall_s, 3))
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), load_wall_s)
    if stop.is_set():
        log.info("weight_cache_stopped", during="loading")
        return 0
    hello = msgspec.json.encode(DaemonHello(status="ok", pid=os.getpid(), profile=profile))

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(hello + b"\n")
            await writer.drain()
        except ConnectionError:
            pass  # a probe that only connects (`serving_sockets`) is gone before the hello
        finally:
            writer.close()

    await asyncio.to_thread(_clear, path)  # a stale socket of a daemon that died
    server = await asyncio.start_unix_server(answer, path=str(path))
    log.info("weight_cache_ready", socket=str(path), pid=os.getpid())
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.to_thread(path.unlink, missing_ok=True)
        log.info("weight_cache_stopped", socket=str(path))
    return 0


def _clear(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)

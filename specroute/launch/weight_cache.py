"""`specroute launch --weight-cache`: one weight cache daemon per GPU set, kept alive across that
set's server restarts, and the flags that make each server its client, so a restart maps the
daemon's weights instead of reading them from disk. The command lines are pure; the one wait
(until the daemon serves) polls its sockets.

Engines (each flag read in the engine's own source, sgl-project/sglang and vllm-project/vllm):
- SGLang (#27139, on main after 0.5.23; no release verified to carry it): the daemon is
  `python -m sglang.srt.weight_cache.daemon` with the server's own flags (it parses them with
  `prepare_server_args` and starts one process per local TP rank: weight_cache/daemon.py); the
  server takes `--weight-cache-mode client` (arg_groups/fields/model.py). Both find the sockets
  through `SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE` / `..._READY_TEMPLATE`, which must keep
  `{device_uuid}` (environ.py): one path per GPU, which `--weight-cache-socket` (one path, not a
  template) cannot give a TP > 1 server. SGLang refuses the cache with
  `--speculative-algorithm` (the daemon does not export draft weights): depth 0 only.
- vLLM (#54921 "Fast Start"): the daemon is
  `python -m vllm.model_executor.model_loader.weight_cache.daemon --model M
  --tensor-parallel-size N --weight-cache-socket-dir DIR`; the server takes `--load-format
  ipc_cache --model-loader-extra-config '{"socket_dir": DIR, "mode": "zero_copy", "fallback":
  false}'` (model_loader/weight_cache/ipc_loader.py reads exactly those keys).
- Emulated: `specroute emulate-weight-cache --socket DIR/emulated.sock`; the emulated server
  takes `--weight-cache-socket` (emulator/weight_cache.py).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from specroute.children import ChildExited, NotReady

__all__ = [
    "DEFAULT_DIR",
    "WeightCache",
    "cache_daemon",
    "client_flags",
    "set_name",
    "wait_cache_ready",
]

DEFAULT_DIR = "weight-cache"
"""`--weight-cache` without a directory: this one under `--log-dir`."""
SGLANG_SOCKET = "sglang_weight_cache_{device_uuid}.sock"
SGLANG_READY = "sglang_weight_cache_{device_uuid}.ready"
EMULATED_SOCKET = "emulated.sock"
_EMULATOR_FLAGS = ("--time-scale", "--profile")
"""`--emulator-arg` flags the emulated daemon shares with the servers it serves."""


class WeightCache(msgspec.Struct, frozen=True, kw_only=True):
    """Where one GPU set's daemon answers: `sockets` Unix sockets matching `pattern` in
    `socket_dir` (one per GPU; one for the emulated daemon) once it serves."""

    socket_dir: str
    pattern: str
    sockets: int


def set_name(index: int, gpus: Sequence[int]) -> str:
    """A GPU set's name: its GPUs (`gpus0-1`), or its position where none (emulated)."""
    return "gpus" + "-".join(map(str, gpus)) if gpus else f"set{index}"


def _sglang_env(socket_dir: str) -> dict[str, str]:
    return {
        "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE": str(Path(socket_dir) / SGLANG_SOCKET),
        "SGLANG_WEIGHT_CACHE_READY_TEMPLATE": str(Path(socket_dir) / SGLANG_READY),
    }


def client_flags(
    engine: str, *, emulate: bool, socket_dir: str
) -> tuple[list[str], dict[str, str]]:
    """What makes a server the client of the daemon at `socket_dir`: flags and environment."""
    if emulate:
        return ["--weight-cache-socket", str(Path(socket_dir) / EMULATED_SOCKET)], {}
    if engine == "vllm":
        extra = {"socket_dir": socket_dir, "mode": "zero_copy", "fallback": False}
        return ["--load-format", "ipc_cache", "--model-loader-extra-config",
                json.dumps(extra)], {}  # fmt: skip
    return ["--weight-cache-mode", "client"], _sglang_env(socket_dir)


def cache_daemon(
    engine: str,
    *,
    emulate: bool,
    model: str,
    tp: int,
    socket_dir: str,
    extra: Sequence[str] = (),
) -> tuple[list[str], dict[str, str], WeightCache]:
    """One GPU set's daemon: its command line, environment (beside the set's GPUs) and where it
    answers. `extra`: the servers' own extra flags (SGLang's daemon takes the same; the
    emulated one the servers' `--time-scale` and `--profile`)."""
    if emulate:
        path = str(Path(socket_dir) / EMULATED_SOCKET)
        argv = [sys.executable, "-m", "specroute", "emulate-weight-cache", "--socket", path]
        shared = [a for a in extra if a.split("=", 1)[0] in _EMULATOR_FLAGS and "=" in a]
        return [*argv, *shared], {}, WeightCache(socket_dir=socket_dir, pattern=EMULATED_SOCKET,
                                                 sockets=1)  # fmt: skip
    if engine == "vllm":
        argv = [sys.executable, "-m", "vllm.model_executor.model_loader.weight_cache.daemon",
                "--model", model, "--tensor-parallel-size", str(tp),
                "--weight-cache-socket-dir", socket_dir]  # fmt: skip
        cache = WeightCache(socket_dir=socket_dir, pattern="vllm_weight_cache_*.sock", sockets=tp)
        return argv, {}, cache
    argv = [sys.executable, "-m", "sglang.srt.weight_cache.daemon", "--model-path", model,
            "--tp-size", str(tp), *extra]  # fmt: skip
    cache = WeightCache(socket_dir=socket_dir, pattern="sglang_weight_cache_*.sock", sockets=tp)
    return argv, _sglang_env(socket_dir), cache


def serving_sockets(cache: WeightCache) -> int:
    """How many of the cache's sockets accept a connection now (a stale one refuses)."""
    count = 0
    for path in Path(cache.socket_dir).glob(cache.pattern):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            try:
                sock.connect(str(path))
            except OSError:
                continue
        count += 1
    return count


async def wait_cache_ready(
    cache: WeightCache,
    process: subprocess.Popen[bytes] | None,
    *,
    name: str,
    within: float,
    poll_s: float = 0.5,
) -> None:
    """Until the daemon serves every socket it should; ChildExited if it dies meanwhile (the
    supervisor restarts it: the caller may wait again), NotReady after `within` seconds."""
    deadline = time.monotonic() + within
    while await asyncio.to_thread(serving_sockets, cache) < cache.sockets:
        if process is not None and process.poll() is not None:
            status = process.returncode
            raise ChildExited(f"{name} exited with status {status} while loading", status)
        if time.monotonic() >= deadline:
            raise NotReady(f"{name} not serving after {within:.0f} s")
        await asyncio.sleep(poll_s)

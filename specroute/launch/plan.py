"""The launcher's plan: one SGLang (or emulated) server per speculative depth, each with its
command line, environment, port and GPUs, and the proxy in front. Pure: no processes, no I/O."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Literal

import msgspec

__all__ = [
    "ALGORITHMS",
    "EMULATED_MODEL",
    "LaunchOptions",
    "LaunchPlan",
    "PlanError",
    "ProcessPlan",
    "build_plan",
    "format_plan",
    "parse_gpus",
    "parse_steps",
    "sglang_server_args",
]

ALGORITHMS = ("NEXTN", "EAGLE", "EAGLE3")
# Every speculative algorithm resets an unset --max-running-requests to 48: say it explicitly.
DEFAULT_MAX_RUNNING_REQUESTS = 48
# `--emulate` without `--model`: the emulator serves its profile's model name.
EMULATED_MODEL = "emulated"
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Count = Annotated[int, msgspec.Meta(ge=1)]
Depth = Annotated[int, msgspec.Meta(ge=0, le=16)]


class PlanError(ValueError):
    """The options cannot make a plan (too few GPUs, a missing draft model, ...)."""


class LaunchOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What `specroute launch` was asked for. `gpus` None means every GPU found on the host."""

    model: str
    steps: tuple[Depth, ...]
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = "NEXTN"
    draft_model: str | None = None
    tp: Count = 1
    gpus: tuple[int, ...] | None = None
    host: str = "127.0.0.1"
    port: Port = 8000
    base_port: Port = 30000
    max_running_requests: Count = DEFAULT_MAX_RUNNING_REQUESTS
    sglang_args: tuple[str, ...] = ()
    emulator_args: tuple[str, ...] = ()
    policy: str = "least_loaded"
    emulate: bool = False

    def __post_init__(self) -> None:
        if not self.steps:
            raise PlanError("--steps needs at least one depth")
        if len(set(self.steps)) != len(self.steps):
            raise PlanError(f"--steps lists a depth twice: {self.steps}")
        if self.algorithm != "NEXTN" and self.draft_model is None and not self.emulate:
            raise PlanError(f"--algorithm {self.algorithm} needs --draft-model PATH")
        if self.base_port + len(self.steps) > 65536:
            raise PlanError(f"--base-port {self.base_port} leaves no room for every server")


class ProcessPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One child process: its name, command line, the environment it adds, and its address."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str
    steps: int | None = None
    gpus: tuple[int, ...] = ()

    def shell(self) -> str:
        """The command as one line a shell would run, environment first."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    servers: tuple[ProcessPlan, ...]
    proxy: ProcessPlan


def parse_steps(text: str) -> tuple[int, ...]:
    """`"1,2,3"` -> (1, 2, 3)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise PlanError(f"--steps must be comma-separated integers, not {text!r}") from exc


def parse_gpus(text: str) -> tuple[int, ...] | None:
    """`"0,1,2"` -> (0, 1, 2); `"all"` -> None (every GPU the host has)."""
    if text.strip().lower() == "all":
        return None
    try:
        gpus = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise PlanError(f"--gpus must be 'all' or comma-separated indices, not {text!r}") from exc
    if len(set(gpus)) != len(gpus):
        raise PlanError(f"--gpus lists a GPU twice: {text}")
    return gpus


def sglang_server_args(options: LaunchOptions, steps: int, port: int) -> list[str]:
    """SGLang's flags for the server at depth `steps` (0 runs without speculation)."""
    args = ["--model-path", options.model, "--host", options.host, "--port", str(port)]
    args += ["--tp-size", str(options.tp)]
    if steps > 0:
        args += ["--speculative-algorithm", options.algorithm]
        if options.draft_model is not None:
            args += ["--speculative-draft-model-path", options.draft_model]
        # Steps, topk and draft tokens go together: steps alone crashes resolution, topk
        # alone fails an assertion, and with topk 1 draft tokens must be steps + 1.
        args += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1"]
        args += ["--speculative-num-draft-tokens", str(steps + 1)]
    args += ["--max-running-requests", str(options.max_running_requests), "--enable-metrics"]
    return args + list(options.sglang_args)


def _partition(options: LaunchOptions, available: tuple[int, ...]) -> list[tuple[int, ...]]:
    need = len(options.steps) * options.tp
    if len(available) < need:
        listed = ",".join(map(str, available)) or "none"
        raise PlanError(
            f"{len(options.steps)} servers x --tp {options.tp} need {need} GPUs, "
            f"but only {len(available)} are available ({listed}); "
            "use fewer --steps, a smaller --tp, or more --gpus"
        )
    return [available[i * options.tp : (i + 1) * options.tp] for i in range(len(options.steps))]


def _server(options: LaunchOptions, index: int, steps: int, gpus: tuple[int, ...]) -> ProcessPlan:
    port = options.base_port + index
    name = f"steps{steps}"
    if options.emulate:
        argv = [sys.executable, "-m", "specroute", "emulate", "--steps", str(steps)]
        argv += ["--host", options.host, "--port", str(port)]
        argv += ["--max-running-requests", str(options.max_running_requests)]
        if steps > 0:
            argv += ["--speculative-algorithm", options.algorithm]
        if options.model != EMULATED_MODEL:
            argv += ["--model-name", options.model]
        argv += list(options.emulator_args)
        env: dict[str, str] = {}
    else:
        argv = [sys.executable, "-m", "sglang.launch_server"]
        argv += sglang_server_args(options, steps, port)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    url = f"http://{_connect_host(options.host)}:{port}"
    return ProcessPlan(name=name, argv=tuple(argv), env=env, url=url, steps=steps, gpus=gpus)


def _connect_host(host: str) -> str:
    """Where the proxy reaches a server that listens on `host`."""
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, host)


def build_plan(options: LaunchOptions, detected_gpus: tuple[int, ...] = ()) -> LaunchPlan:
    """The servers (one per depth, GPUs split in order) and the proxy that fronts them.

    `detected_gpus` stands in for `--gpus all`; emulated servers need no GPU.
    """
    if options.emulate:
        partitions: list[tuple[int, ...]] = [() for _ in options.steps]
    else:
        available = options.gpus if options.gpus is not None else detected_gpus
        partitions = _partition(options, available)
    servers = tuple(_server(options, i, k, partitions[i]) for i, k in enumerate(options.steps))
    argv = [sys.executable, "-m", "specroute", "serve", "--host", options.host]
    argv += ["--port", str(options.port), "--policy", options.policy]
    for server in servers:
        argv += ["--backend", server.url]
    proxy = ProcessPlan(
        name="proxy",
        argv=tuple(argv),
        env={},
        url=f"http://{_connect_host(options.host)}:{options.port}",
    )
    return LaunchPlan(servers=servers, proxy=proxy)


def format_plan(plan: LaunchPlan) -> str:
    """What `--dry-run` prints: every command with its environment, one per line."""
    lines = [f"# {s.name}: {s.url}\n{s.shell()}" for s in plan.servers]
    lines.append(f"# proxy: {plan.proxy.url}\n{plan.proxy.shell()}")
    return "\n".join(lines) + "\n"

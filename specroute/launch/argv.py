"""The launcher's plan: one SGLang, vLLM (or emulated) server per speculative depth, each with its
command line, environment, port and GPUs, and the proxy in front. Pure: no processes, no I/O."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from specroute.cmdline import UsageError, parse_ints
from specroute.launch.vllm_argv import (
    PER_REQUEST_SPEC_METRICS,
    VLLM_READY_PATH,
    VllmServer,
    vllm_ranges,
    vllm_server_args,
)
from specroute.launch.weight_cache import WeightCache, cache_daemon, client_flags, set_name
from specroute.speculation import SPECULATIVE_DEFAULT_MAX_RUNNING

__all__ = [
    "ALGORITHMS",
    "EMULATED_MODEL",
    "CacheDaemonPlan",
    "LaunchOptions",
    "LaunchPlan",
    "PlanError",
    "ProcessPlan",
    "build_plan",
    "format_plan",
    "parse_gpus",
    "parse_per_depth_args",
    "parse_per_depth_counts",
    "parse_steps",
    "server_argv",
    "sglang_server_args",
    "vllm_args",
]

ALGORITHMS = ("NEXTN", "EAGLE", "EAGLE3")
# `--emulate` without `--model`: the emulator serves its profile's model name.
EMULATED_MODEL = "emulated"
# The proxy's keys travel in its environment, never on its command line (`ps` shows that).
KEY_VARIABLES = ("SPECROUTE_API_KEYS", "SPECROUTE_ADMIN_KEY")
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Count = Annotated[int, msgspec.Meta(ge=1)]
Depth = Annotated[int, msgspec.Meta(ge=0, le=16)]


class PlanError(UsageError):
    """The options cannot make a plan (too few GPUs, a missing draft model, ...)."""


class LaunchOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What `specroute launch` was asked for. `gpus` None means every GPU found on the host.

    `host` is where the servers listen (`--server-host`: they take no keys, so loopback unless
    asked), `proxy_host` where the proxy does (`--host`). The `*_by_depth` fields add to or
    override, for one depth's servers, what the plain field gives every server. A depth may
    repeat (`3,3,4`: a pool mix); `prior` is the profile the proxy starts from.
    """

    model: str
    steps: tuple[Depth, ...]
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = "NEXTN"
    draft_model: str | None = None
    tp: Count = 1
    gpus: tuple[int, ...] | None = None
    host: str = "127.0.0.1"
    proxy_host: str = "127.0.0.1"
    port: Port = 8000
    base_port: Port = 30000
    max_running_requests: Count = SPECULATIVE_DEFAULT_MAX_RUNNING  # said explicitly
    max_running_by_depth: dict[Depth, Count] = {}
    sglang_args: tuple[str, ...] = ()
    sglang_args_by_depth: dict[Depth, tuple[str, ...]] = {}
    emulator_args: tuple[str, ...] = ()
    emulator_args_by_depth: dict[Depth, tuple[str, ...]] = {}
    policy: str = "least_loaded"
    proxy_config: str | None = None
    proxy_env: dict[str, str] = {}
    prior: str | None = None
    emulate: bool = False
    engine: Literal["sglang", "vllm"] = "sglang"
    """The servers' engine (`vllm_argv` writes vLLM's lines; emulated, its dialect)."""
    vllm_args: tuple[str, ...] = ()
    vllm_args_by_depth: dict[Depth, tuple[str, ...]] = {}
    tables: dict[Depth, tuple[tuple[Count, Depth], ...]] = {}
    """vLLM's K per batch size, as (first batch size, K) ranges, for the servers launched at a
    depth (their `num_speculative_tokens`); `--allow-adaptive` with a prior writes them."""
    weight_cache: str | None = None
    """`--weight-cache`: the directory of the weight cache daemons' sockets (one per GPU set
    under it); None: no daemon, servers load their weights themselves."""

    def __post_init__(self) -> None:
        if not self.steps:
            raise PlanError("--steps needs at least one depth")
        if self.algorithm != "NEXTN" and self.draft_model is None and not self.emulate:
            raise PlanError(f"--algorithm {self.algorithm} needs --draft-model PATH")
        if self.base_port + len(self.steps) > 65536:
            raise PlanError(f"--base-port {self.base_port} leaves no room for every server")
        for flag, port in (("--port", self.port), ("--base-port", self.base_port)):
            if not 1 <= port <= 65535:  # 0, an ephemeral port, is one nothing here could name
                raise PlanError(f"{flag} must be a port from 1 to 65535, not {port}")
        if self.tp < 1:
            raise PlanError(f"--tp is GPUs per server, at least 1, not {self.tp}")
        for flag, given in (
            ("--max-running-requests", self.max_running_by_depth),
            ("--sglang-arg", self.sglang_args_by_depth),
            ("--emulator-arg", self.emulator_args_by_depth),
            ("--vllm-arg", self.vllm_args_by_depth),
            ("a K-per-batch table", self.tables),
        ):
            stray = sorted(set(given) - set(self.steps))
            if stray:
                raise PlanError(f"{flag} names depth {stray[0]}, which --steps does not launch")
        if self.tables and self.engine != "vllm":
            raise PlanError("K-per-batch tables are vLLM's; SGLang adapts with its tiers")
        if self.weight_cache is not None and self.engine == "sglang" and any(self.steps):
            raise PlanError(
                "--weight-cache with SGLang serves depth 0 only: SGLang refuses "
                "--weight-cache-mode with --speculative-algorithm (its daemon does not export "
                "draft weights); use --engine vllm, or --steps 0"
            )

    def running_limit(self, steps: int) -> int:
        """`--max-running-requests` for the server at depth `steps`."""
        return self.max_running_by_depth.get(steps, self.max_running_requests)

    def extra_args(self, steps: int) -> list[str]:
        """The extra flags for the server at depth `steps`: every server's, then its own."""
        if self.emulate:
            return [*self.emulator_args, *self.emulator_args_by_depth.get(steps, ())]
        if self.engine == "vllm":
            return [*self.vllm_args, *self.vllm_args_by_depth.get(steps, ())]
        return [*self.sglang_args, *self.sglang_args_by_depth.get(steps, ())]


class ProcessPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One child process: its name, command line, the environment it adds, and its address."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str
    steps: int | None = None
    gpus: tuple[int, ...] = ()
    secrets: tuple[str, ...] = ()
    """Variables of `env` whose values `shell()` hides (keys: logs and --dry-run show it)."""
    ready_path: str = "/ready"
    """What answers 200 once it serves (a vLLM server's /health; SGLang's and ours /ready)."""
    cache_args: tuple[str, ...] = ()
    """The flags that make it its GPU set's weight cache client (kept across depth changes)."""

    def shell(self) -> str:
        """The command as one line a shell would run, environment first, secrets hidden."""
        env = " ".join(
            f"{k}={'<hidden>' if k in self.secrets else shlex.quote(v)}"
            for k, v in sorted(self.env.items())
        )
        return (env + " " if env else "") + shlex.join(self.argv)


class CacheDaemonPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU set's weight cache daemon and where it answers once loaded."""

    process: ProcessPlan
    cache: WeightCache


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    servers: tuple[ProcessPlan, ...]
    proxy: ProcessPlan
    caches: tuple[CacheDaemonPlan, ...] = ()
    """`--weight-cache`: one daemon per server's GPU set, started before the servers."""


def parse_steps(text: str) -> tuple[int, ...]:
    """`"1,2,3"` -> (1, 2, 3)."""
    return parse_ints(text, "--steps")


def _depth_item(item: str, flag: str) -> tuple[int, str]:
    depth, _, value = item.partition("=")
    try:
        return int(depth), value
    except ValueError as exc:
        raise PlanError(f"{flag}: {item!r} is not DEPTH=VALUE") from exc


def parse_per_depth_counts(text: str, flag: str) -> tuple[int | None, dict[int, int]]:
    """`"48"` -> (48, {}); `"1=26,2=21,3=17"` -> (None, {1: 26, ...}); `"32,3=17"`: 32 for every
    depth but 3."""
    every: int | None = None
    by_depth: dict[int, int] = {}
    try:
        for item in filter(None, (part.strip() for part in text.split(","))):
            if "=" in item:
                depth, value = _depth_item(item, flag)
                by_depth[depth] = int(value)
            else:
                every = int(item)
    except ValueError as exc:
        raise PlanError(f"{flag} takes N or DEPTH=N,DEPTH=N..., not {text!r}") from exc
    return every, by_depth


def parse_per_depth_args(
    values: Sequence[str],
) -> tuple[tuple[str, ...], dict[int, tuple[str, ...]]]:
    """`--foo=1` goes to every server, `3:--foo=1` to the depth-3 server only."""
    every: list[str] = []
    by_depth: dict[int, list[str]] = {}
    for value in values:
        depth, sep, arg = value.partition(":")
        if sep and depth.strip().isdigit():
            by_depth.setdefault(int(depth), []).append(arg)
        else:
            every.append(value)
    return tuple(every), {k: tuple(v) for k, v in by_depth.items()}


def parse_gpus(text: str) -> tuple[int, ...] | None:
    """`"0,1,2"` -> (0, 1, 2); `"all"` -> None (every GPU the host has)."""
    if text.strip().lower() == "all":
        return None
    gpus = parse_ints(text, "--gpus ('all' or indices)", minimum=0)
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
    args += ["--max-running-requests", str(options.running_limit(steps)), "--enable-metrics"]
    return [*args, *options.sglang_args, *options.sglang_args_by_depth.get(steps, ())]


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
    repeat = options.steps[:index].count(steps)
    name = f"steps{steps}" + (f"-{repeat + 1}" if repeat else "")
    argv = server_argv(options, steps, port, table=options.tables.get(steps, ()))
    env = {} if options.emulate else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    cache_args: list[str] = []
    if options.weight_cache is not None:
        socket_dir = str(Path(options.weight_cache) / set_name(index, gpus))
        cache_args, cache_env = client_flags(options.engine, emulate=options.emulate,
                                             socket_dir=socket_dir)  # fmt: skip
        env |= cache_env
    url = f"http://{_connect_host(options.host)}:{port}"
    ready = VLLM_READY_PATH if options.engine == "vllm" else "/ready"
    return ProcessPlan(
        name=name, argv=(*argv, *cache_args), env=env, url=url, steps=steps, gpus=gpus,
        ready_path=ready, cache_args=tuple(cache_args),
    )  # fmt: skip


def _cache_daemon(options: LaunchOptions, server: ProcessPlan, index: int) -> CacheDaemonPlan:
    """The daemon of `server`'s GPU set (a sibling of the server's own environment)."""
    socket_dir = str(Path(options.weight_cache or ".") / set_name(index, server.gpus))
    extra = options.emulator_args if options.emulate else options.sglang_args
    argv, env, cache = cache_daemon(options.engine, emulate=options.emulate, model=options.model,
                                    tp=options.tp, socket_dir=socket_dir, extra=extra)  # fmt: skip
    gpus = {k: v for k, v in server.env.items() if k == "CUDA_VISIBLE_DEVICES"}
    process = ProcessPlan(name=f"cache-{set_name(index, server.gpus)}", argv=tuple(argv),
                          env=gpus | env, url="", gpus=server.gpus)  # fmt: skip
    return CacheDaemonPlan(process=process, cache=cache)


def server_argv(
    options: LaunchOptions,
    steps: int,
    port: int,
    adaptive: Sequence[str] = (),
    table: Sequence[tuple[int, int]] = (),
) -> list[str]:
    """One server's command line at `steps` (an emulator's with `--emulate`, else SGLang's or
    vLLM's), with SGLang's `adaptive` flags added or vLLM's K per batch size from `table`: the
    launcher and the reconfiguration both build it here (PlanError for the other engine's)."""
    if options.engine == "vllm" and adaptive:
        raise PlanError("vLLM has no adaptive tiers; its K per batch size is a table")
    if options.engine == "sglang" and table:
        raise PlanError("SGLang has no K-per-batch table; it adapts with its tiers")
    if not options.emulate and options.engine == "vllm":
        args = vllm_args(options, steps, port, table)
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]
    if not options.emulate:
        argv = [sys.executable, "-m", "sglang.launch_server"]
        return [*argv, *sglang_server_args(options, steps, port), *adaptive]
    argv = [sys.executable, "-m", "specroute", "emulate", "--steps", str(steps)]
    argv += ["--host", options.host, "--port", str(port)]
    argv += ["--max-running-requests", str(options.running_limit(steps))]
    if options.engine == "vllm":
        argv += ["--engine", "vllm"]
        if steps > 0:
            argv += ["--per-request-spec-decode-metrics", PER_REQUEST_SPEC_METRICS]
        if table:
            ranges = vllm_ranges(table, options.running_limit(steps))
            argv += ["--num-speculative-tokens-per-batch-size", json.dumps(ranges)]
    elif steps > 0:
        argv += ["--speculative-algorithm", options.algorithm]
    if options.model != EMULATED_MODEL:
        argv += ["--model-name", options.model]
    return [*argv, *adaptive, *options.extra_args(steps)]


def vllm_args(
    options: LaunchOptions, steps: int, port: int, table: Sequence[tuple[int, int]] = ()
) -> list[str]:
    """vLLM's `serve` arguments for the server at depth `steps`, K per batch size from `table`
    if given (`vllm_argv`)."""
    server = VllmServer(
        model=options.model, host=options.host, port=port, tp=options.tp, steps=steps,
        algorithm=options.algorithm, draft_model=options.draft_model,
        max_num_seqs=options.running_limit(steps), table=table,
    )  # fmt: skip
    return vllm_server_args(server, options.extra_args(steps))


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
    caches: tuple[CacheDaemonPlan, ...] = ()
    if options.weight_cache is not None:
        caches = tuple(_cache_daemon(options, s, i) for i, s in enumerate(servers))
    argv = [sys.executable, "-m", "specroute", "serve"]
    if options.proxy_config is not None:
        argv += ["--config", options.proxy_config]
    argv += ["--host", options.proxy_host, "--port", str(options.port), "--policy", options.policy]
    if options.prior is not None:
        argv += ["--prior", options.prior]
    for server in servers:
        argv += ["--backend", f"{server.name}={server.url}"]
    proxy = ProcessPlan(
        name="proxy",
        argv=tuple(argv),
        env=dict(options.proxy_env),
        url=f"http://{_connect_host(options.proxy_host)}:{options.port}",
        secrets=tuple(k for k in KEY_VARIABLES if k in options.proxy_env),
    )
    return LaunchPlan(servers=servers, proxy=proxy, caches=caches)


def format_plan(plan: LaunchPlan) -> str:
    """What `--dry-run` prints: every command with its environment, one per line."""
    lines = [f"# {c.process.name}: {c.cache.socket_dir}\n{c.process.shell()}" for c in plan.caches]
    lines += [f"# {s.name}: {s.url}\n{s.shell()}" for s in plan.servers]
    lines.append(f"# proxy: {plan.proxy.url}\n{plan.proxy.shell()}")
    return "\n".join(lines) + "\n"

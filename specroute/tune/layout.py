"""`specroute tune`'s plan: the servers it launches one at a time (one per depth, and one
SGLang-adaptive server if asked), the traffic each is swept with, what a saved depth must
match to be reused, and where everything is written. Pure: no processes, no I/O."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from specroute.bench.level import SweepSettings, Target
from specroute.bench.workload import PromptSettings, Sampling
from specroute.launch.argv import LaunchOptions, ProcessPlan, build_plan
from specroute.speculation import is_greedy

__all__ = [
    "ADAPTIVE_LABEL",
    "ADAPTIVE_START_STEPS",
    "Measurement",
    "ServerPlan",
    "TuneLayout",
    "TuneOptions",
    "differences",
    "level_requests",
    "measurement",
    "server_plans",
    "sweep_settings",
    "traffic_kinds",
]

ADAPTIVE_LABEL = "adaptive"
ADAPTIVE_START_STEPS = 3
"""An adaptive server starts at 3: a candidate of SGLang's default tiers, as it requires."""


class TuneOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What `specroute tune` was asked for. `launch.steps` are the fixed depths; `profile` and
    `time_scale` apply to emulated servers only (rates are divided back by `time_scale`)."""

    launch: LaunchOptions
    adaptive: bool = False
    adaptive_config: str | None = None
    profile: str | None = None
    time_scale: float = 1.0
    concurrency: tuple[int, ...] = (1, 4, 16, 32, 64)
    traffic: tuple[Sampling, ...]
    prompts: PromptSettings = PromptSettings()
    dataset: str | None = None
    """The user's dataset file; its prompts are copied into the output directory."""
    requests_per_concurrency: float = 2.0
    min_requests: int = 3
    warmup: int = 2
    servers: int = 3
    seed: int = 0
    ready_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("--concurrency needs levels of at least 1")
        if not self.traffic:
            raise ValueError("--temperature needs at least one value")
        if self.time_scale <= 0 or (self.time_scale != 1.0 and not self.launch.emulate):
            raise ValueError("--time-scale is for emulated servers (--emulate), and must be > 0")
        if self.servers < 1 or self.servers > 16:
            raise ValueError("--servers must be between 1 and 16")
        if self.min_requests < 1 or self.requests_per_concurrency <= 0 or self.warmup < 0:
            raise ValueError(
                "--min-requests must be >= 1, --requests-per-concurrency > 0, --warmup >= 0"
            )


class ServerPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One server of the tune: its label (`steps2`, `adaptive`), depth and process."""

    label: str
    steps: int
    adaptive: bool
    process: ProcessPlan


class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a depth's numbers depend on besides the depth: a saved depth is reused only
    when its measurement equals the current one."""

    model: str
    algorithm: str
    draft_model: str | None
    tp: int
    max_running_requests: int
    server_args: tuple[str, ...]
    max_running_by_depth: dict[int, int] = {}
    server_args_by_depth: dict[int, tuple[str, ...]] = {}
    emulate: bool
    profile: str | None
    time_scale: float
    adaptive_config: str | None
    concurrency: tuple[int, ...]
    traffic: tuple[Sampling, ...]
    prompts: str
    requests_per_concurrency: float
    min_requests: int
    warmup: int
    seed: int


def traffic_kinds(
    temperatures: list[float], *, max_tokens: int, top_p: float, ignore_eos: bool
) -> tuple[Sampling, ...]:
    """One traffic kind per temperature: `greedy`, and `sampled` (or `t0.7`, `t1` when
    several temperatures sample). ValueError (`Sampling`'s) names a value out of range."""
    sampled = [t for t in temperatures if not is_greedy(t)]
    kinds = []
    for t in dict.fromkeys(temperatures):
        name = "greedy" if is_greedy(t) else ("sampled" if len(sampled) == 1 else f"t{t:g}")
        kinds.append(
            Sampling(
                name=name,
                temperature=t,
                top_p=top_p,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
            )
        )
    return tuple(kinds)


def _server(options: TuneOptions, steps: int, adaptive: bool, gpus: tuple[int, ...]) -> ServerPlan:
    launch = options.launch
    extra: list[str] = []
    if adaptive:
        extra = ["--speculative-adaptive"]
        if options.adaptive_config:
            extra += ["--speculative-adaptive-config", options.adaptive_config]
    emulator_args = list(launch.emulator_args)
    if launch.emulate:
        profile = ["--profile", options.profile] if options.profile else []
        emulator_args = [*profile, "--time-scale", f"{options.time_scale:g}", *emulator_args]
    only = {k: v for k, v in launch.max_running_by_depth.items() if k == steps}
    one = msgspec.structs.replace(
        launch,
        steps=(steps,),
        max_running_by_depth=only,
        sglang_args=(*launch.sglang_args, *extra),
        sglang_args_by_depth={k: v for k, v in launch.sglang_args_by_depth.items() if k == steps},
        emulator_args=(*emulator_args, *extra),
        emulator_args_by_depth={
            k: v for k, v in launch.emulator_args_by_depth.items() if k == steps
        },
        vllm_args_by_depth={k: v for k, v in launch.vllm_args_by_depth.items() if k == steps},
        tables={k: v for k, v in launch.tables.items() if k == steps},
    )
    process = build_plan(one, gpus).servers[0]
    label = ADAPTIVE_LABEL if adaptive else process.name
    return ServerPlan(
        label=label,
        steps=steps,
        adaptive=adaptive,
        process=msgspec.structs.replace(process, name=label),
    )


def server_plans(options: TuneOptions, detected_gpus: tuple[int, ...] = ()) -> list[ServerPlan]:
    """The servers in the order they run: each fixed depth, then the adaptive one. Every one
    takes the same GPUs and port in turn (one runs at a time)."""
    plans = [_server(options, k, False, detected_gpus) for k in options.launch.steps]
    if options.adaptive:
        plans.append(_server(options, ADAPTIVE_START_STEPS, True, detected_gpus))
    return plans


def _server_args(launch: LaunchOptions) -> tuple[str, ...]:
    """The extra flags every server got: the emulator's, vLLM's or SGLang's."""
    if launch.emulate:
        return launch.emulator_args
    return launch.vllm_args if launch.engine == "vllm" else launch.sglang_args


def _server_args_by_depth(launch: LaunchOptions) -> dict[int, tuple[str, ...]]:
    if launch.emulate:
        return launch.emulator_args_by_depth
    return launch.vllm_args_by_depth if launch.engine == "vllm" else launch.sglang_args_by_depth


def measurement(options: TuneOptions, prompts: str) -> Measurement:
    """The measurement `options` make; `prompts` describes the prompts (their digest)."""
    launch = options.launch
    return Measurement(
        model=launch.model,
        algorithm=launch.algorithm,
        draft_model=launch.draft_model,
        tp=launch.tp,
        max_running_requests=launch.max_running_requests,
        server_args=_server_args(launch),
        max_running_by_depth=launch.max_running_by_depth,
        server_args_by_depth=_server_args_by_depth(launch),
        emulate=launch.emulate,
        profile=options.profile,
        time_scale=options.time_scale,
        adaptive_config=options.adaptive_config,
        concurrency=options.concurrency,
        traffic=options.traffic,
        prompts=prompts,
        requests_per_concurrency=options.requests_per_concurrency,
        min_requests=options.min_requests,
        warmup=options.warmup,
        seed=options.seed,
    )


def differences(saved: Measurement, current: Measurement) -> list[str]:
    """The fields in which a saved measurement differs from the current one."""
    return [
        f.name
        for f in msgspec.structs.fields(Measurement)
        if getattr(saved, f.name) != getattr(current, f.name)
    ]


def level_requests(options: TuneOptions, concurrency: int) -> int:
    """Requests one level sends (as the sweep counts them)."""
    return max(options.min_requests, math.ceil(options.requests_per_concurrency * concurrency))


def sweep_settings(options: TuneOptions, plan: ServerPlan, kind: Sampling) -> SweepSettings:
    """The bench sweep of one server under one traffic kind."""
    return SweepSettings(
        targets=[Target(label=plan.label, url=plan.process.url)],
        concurrency=list(options.concurrency),
        requests_per_concurrency=options.requests_per_concurrency,
        min_requests=options.min_requests,
        warmup=options.warmup,
        prompts=options.prompts,
        mix=[kind],
        seed=options.seed,
        keep_chunks=False,
    )


class TuneLayout(msgspec.Struct, frozen=True):
    """The output directory: one result per depth as it finishes, logs, the report files."""

    out: Path

    def depth(self, label: str) -> Path:
        return self.out / "depths" / f"{label}.json"

    def log(self, label: str) -> Path:
        return self.out / "logs" / f"{label}.log"

    @property
    def prompts(self) -> Path:
        return self.out / "prompts.jsonl"

    @property
    def prior(self) -> Path:
        return self.out / "prior.json"

    @property
    def report_json(self) -> Path:
        return self.out / "report.json"

    @property
    def report_markdown(self) -> Path:
        return self.out / "report.md"

    @property
    def plot(self) -> Path:
        return self.out / "tune.png"

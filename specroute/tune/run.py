"""`specroute tune` at run time: for each planned server in turn, launch it, wait for /ready
(saying so through a long load), read its depth and capacity from /server_info, sweep it under
each traffic kind (the sweep warms it up first), stop it, and save the depth's result at once.
Saved depths with the same measurement are skipped unless forced; a cancelled run (Ctrl-C)
stops the server it started in `finally` and keeps every depth already saved."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import subprocess
import time
from collections.abc import AsyncIterator

import msgspec
import structlog

from specroute.bench.client import BenchClient
from specroute.bench.probes import ServerFacts, fetch_facts
from specroute.bench.sweep import SweepResult, run_sweep
from specroute.children import ChildFailed, spawn, stop_async, wait_ready
from specroute.launch.vllm_argv import VLLM_METHODS
from specroute.tune.layout import (
    Measurement,
    ServerPlan,
    TuneLayout,
    TuneOptions,
    differences,
    level_requests,
    sweep_settings,
)
from specroute.tune.progress import LevelWork, TuneProgress
from specroute.tune.vllm_facts import LoadWatch, as_launched

__all__ = ["DepthResult", "TuneError", "Tuner", "load_depth", "save_depth"]

log = structlog.get_logger()

STOP_GRACE_S = 30.0
"""How long a server may take to exit on SIGTERM before its whole session is killed."""
LOADING_EVERY_S = 10.0


class TuneError(RuntimeError):
    """One server could not be measured; the message says which and why."""


class DepthResult(msgspec.Struct, kw_only=True):
    """One server's measurement, saved as soon as it finishes."""

    label: str
    steps: int
    adaptive: bool
    measurement: Measurement
    command: str
    startup_s: float
    """Wall seconds from launch to /ready (emulated start-ups are divided by the time scale)."""
    facts: ServerFacts
    sweeps: dict[str, SweepResult]
    """One sweep per traffic kind, by kind name."""
    sweep_s: float
    finished_at: str


def save_depth(layout: TuneLayout, result: DepthResult) -> None:
    """Write the result whole or not at all (a crash mid-write leaves the old file)."""
    path = layout.depth(result.label)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(msgspec.json.encode(result))
    os.replace(tmp, path)


def load_depth(layout: TuneLayout, label: str) -> DepthResult | None:
    """The saved result of `label`, None if there is none or it cannot be read."""
    try:
        return msgspec.json.decode(layout.depth(label).read_bytes(), type=DepthResult)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


async def _answers(url: str) -> bool:
    try:
        await wait_ready(url, within=0.5, connect_only=True)
    except ChildFailed:
        return False
    return True


class Tuner:
    """Runs the plan; `results` holds every depth measured or reused so far, `failures` the
    message of each server that could not be measured."""

    def __init__(
        self,
        options: TuneOptions,
        plans: list[ServerPlan],
        layout: TuneLayout,
        current: Measurement,
        progress: TuneProgress,
        *,
        force: bool = False,
    ) -> None:
        self.options = options
        self.plans = plans
        self.layout = layout
        self.current = current
        self.progress = progress
        self.force = force
        self.results: dict[str, DepthResult] = {}
        self.failures: dict[str, str] = {}

    def _reusable(self, plan: ServerPlan) -> DepthResult | None:
        saved = None if self.force else load_depth(self.layout, plan.label)
        if saved is None:
            return None
        changed = differences(saved.measurement, self.current)
        if changed:
            self.progress.say(
                f"{plan.label}: saved with other settings ({', '.join(changed)}): measuring again"
            )
            return None
        self.progress.say(f"{plan.label}: measured already ({self.layout.depth(plan.label)})")
        return saved

    def _work(self, plans: list[ServerPlan]) -> list[LevelWork]:
        return [
            LevelWork(p.label, kind.name, c, level_requests(self.options, c) * kind.max_tokens)
            for p in plans
            for kind in self.options.traffic
            for c in self.options.concurrency
        ]

    async def run(self) -> None:
        todo = []
        for plan in self.plans:
            saved = self._reusable(plan)
            if saved is not None:
                self.results[plan.label] = saved
            else:
                todo.append(plan)
        self.progress.plan(self._work(todo), len(todo))
        for i, plan in enumerate(todo, 1):
            self.progress.server(plan.label)
            self.progress.say(f"[{i}/{len(todo)}] {plan.label}: {plan.process.shell()}")
            try:
                result = await self._measure(plan)
            except TuneError as exc:
                self.failures[plan.label] = str(exc)
                self.progress.say(f"{plan.label}: FAILED: {exc}")
                continue
            save_depth(self.layout, result)
            self.results[plan.label] = result
            self.progress.say(f"{plan.label}: saved {self.layout.depth(plan.label)}")

    async def _measure(self, plan: ServerPlan) -> DepthResult:
        url = plan.process.url
        if await _answers(url):
            raise TuneError(f"something already listens at {url}: choose another --base-port")
        path = self.layout.log(plan.label)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as logfile:
            logfile.write(f"\n=== start: {plan.process.shell()}\n".encode())
            logfile.flush()
            # Its own session: a terminal's Ctrl-C reaches the tuner, which stops it in order.
            process = spawn(
                plan.process.argv,
                env={"PYTHONUNBUFFERED": "1", **plan.process.env},
                stdout=logfile,
                stderr=subprocess.STDOUT,
                new_session=True,
            )
        self.progress.say(f"{plan.label}: started, pid {process.pid}, log {path}")
        try:
            return await self._measure_running(plan, process)
        finally:
            status = await stop_async(process, grace_s=STOP_GRACE_S, kill_group=True)
            log.info("tune_server_stopped", server=plan.label, pid=process.pid, status=status)

    async def _measure_running(
        self, plan: ServerPlan, process: subprocess.Popen[bytes]
    ) -> DepthResult:
        startup = await self._wait_ready(plan, process)
        facts = await self._facts(plan)
        started = time.monotonic()
        sweeps = {}
        async with self._vllm_watch(plan) as watch:
            for kind in self.options.traffic:
                self.progress.kind(kind.name)
                settings = sweep_settings(self.options, plan, kind)
                sweeps[kind.name] = await run_sweep(settings, progress=self.progress)
        if watch is not None:
            facts = self._vllm_facts(plan, facts, watch)
        return DepthResult(
            label=plan.label,
            steps=plan.steps,
            adaptive=plan.adaptive,
            measurement=self.current,
            command=plan.process.shell(),
            startup_s=startup,
            facts=facts,
            sweeps=sweeps,
            sweep_s=time.monotonic() - started,
            finished_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )

    @contextlib.asynccontextmanager
    async def _vllm_watch(self, plan: ServerPlan) -> AsyncIterator[LoadWatch | None]:
        """A vLLM server's /metrics read through the sweeps (`vllm_facts`); None for SGLang,
        whose /server_info says it all."""
        if self.options.launch.engine != "vllm":
            yield None
            return
        watch = LoadWatch()
        async with BenchClient(connections=1) as client:
            task = asyncio.create_task(watch.watch(client, plan.process.url))
            try:
                yield watch
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _vllm_facts(self, plan: ServerPlan, facts: ServerFacts, watch: LoadWatch) -> ServerFacts:
        """K, method and the batch limit a vLLM server held; a server whose counters show
        another K than planned is an error, as for SGLang's /server_info."""
        launch = self.options.launch
        if watch.steps is not None and watch.steps != plan.steps and not plan.adaptive:
            raise TuneError(
                f"{plan.label}: /metrics counts {watch.steps} draft positions, not {plan.steps}"
            )
        facts = as_launched(
            facts, steps=plan.steps, method=VLLM_METHODS[launch.algorithm],
            limit=launch.running_limit(plan.steps), watch=watch,
        )  # fmt: skip
        self.progress.say(
            f"{plan.label}: held at most {watch.peak} running requests"
            f"{' with others waiting' if watch.waited else ''}; batch limit "
            f"{facts.max_running_requests} (--max-num-seqs {launch.running_limit(plan.steps)})"
        )
        return facts

    async def _wait_ready(self, plan: ServerPlan, process: subprocess.Popen[bytes]) -> float:
        """Seconds until /ready answers, saying every few seconds that the server is loading."""
        started = time.monotonic()
        path = self.layout.log(plan.label)
        ready = asyncio.create_task(
            wait_ready(
                plan.process.url + plan.process.ready_path,
                process=process,
                within=self.options.ready_timeout_s,
                poll_s=0.25,
                name=plan.label,
                output=path,
            )
        )
        try:
            while True:
                done, _ = await asyncio.wait({ready}, timeout=LOADING_EVERY_S)
                if done:
                    break
                self.progress.loading(plan.label, time.monotonic() - started, str(path))
            ready.result()
        except ChildFailed as exc:
            raise TuneError(str(exc)) from exc
        finally:
            ready.cancel()
        seconds = time.monotonic() - started
        self.progress.started(plan.label, seconds)
        return seconds

    async def _facts(self, plan: ServerPlan) -> ServerFacts:
        """Depth and capacity as the server reports them; a server at another depth than
        planned is an error (its numbers would be filed under the wrong depth)."""
        async with BenchClient(connections=2) as client:
            facts = await fetch_facts(client, plan.process.url)
        if facts.steps is not None and facts.steps != plan.steps and not plan.adaptive:
            raise TuneError(
                f"{plan.label}: /server_info reports speculative_num_steps {facts.steps}"
            )
        capacity = facts.max_running_requests
        self.progress.say(
            f"{plan.label}: ready; /server_info: speculative_num_steps {facts.steps}, "
            f"max_running_requests {capacity}"
        )
        return facts

"""`specroute launch` at run time: check the plan with SGLang, start one server per depth, wait
until each answers /ready (showing progress), start the proxy in front, supervise everything,
and on SIGINT/SIGTERM stop the proxy first (its streams drain), then the servers."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog

from specroute.children import ChildExited, NotReady, tail, wait_ready
from specroute.launch.argv import LaunchPlan
from specroute.launch.preflight import answered_by_another
from specroute.launch.supervisor import Supervised
from specroute.launch.weight_cache import wait_cache_ready

__all__ = ["LaunchError", "LaunchSettings", "Launcher", "detect_gpus", "validate_with_sglang"]

log = structlog.get_logger()


class LaunchError(RuntimeError):
    """The pool could not be brought up; the message says which part and why."""


class LaunchSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the launcher waits and stops, apart from what it launches."""

    log_dir: Path
    ready_timeout_s: float = 900.0
    drain_s: float = 30.0
    poll_s: float = 0.5
    progress_every_s: float = 10.0


def detect_gpus(environ: dict[str, str] | None = None) -> tuple[int, ...]:
    """GPU indices for `--gpus all`: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(int(g) for g in visible.split(",") if g.strip().isdigit())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(int(line) for line in out.split() if line.strip().isdigit())


def validate_with_sglang(
    argvs: Sequence[Sequence[str]], python: str = sys.executable
) -> list[str | None]:
    """SGLang's verdict on each command line, checked in a child interpreter (torch and SGLang
    stay out of the launcher): None where accepted, else SGLang's message."""
    proc = subprocess.run(
        [python, "-m", "specroute.launch.sglang_check"],
        input=json.dumps([list(a) for a in argvs]),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        failed = f"the SGLang check itself failed: {proc.stderr.strip()[-2000:]}"
        return [failed for _ in argvs]
    verdicts = json.loads(proc.stdout)
    return [None if v["ok"] else str(v["message"]) for v in verdicts]


class Launcher:
    """The running pool: supervised servers and proxy, and the order they start and stop in."""

    def __init__(self, plan: LaunchPlan, settings: LaunchSettings, out: TextIO = sys.stderr):
        self.plan = plan
        self.settings = settings
        self.out = out
        self.servers = [
            Supervised(p, settings.log_dir, on_crash=self.crashed) for p in plan.servers
        ]
        self.proxy = Supervised(plan.proxy, settings.log_dir, on_crash=self.crashed)
        self.caches = [
            Supervised(c.process, settings.log_dir, on_crash=self.crashed) for c in plan.caches
        ]
        """`--weight-cache`: one daemon per GPU set, up before its servers, down after them."""
        self._stop = asyncio.Event()
        self.ready_after: dict[str, float] = {}
        """Seconds each child took to answer /ready at launch."""
        self.background: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = []
        """Run once the pool is ready, until the stop event (the depth loop)."""
        self._last_crash: dict[str, str] = {}
        self._hopeless = asyncio.Event()
        self._hopeless_why = ""

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def crashed(self, child: Supervised, status: int | None, last_lines: str) -> None:
        """Say so; while the pool starts, the same error twice in a row ends the launch (the
        next try would fail the same way, up to --ready-timeout)."""
        name, error = child.plan.name, _last_error(last_lines)
        if not self.ready_after and error and self._last_crash.get(name) == error:
            self._hopeless_why = (
                f"{name} failed twice the same way (status {status}): {error}\n"
                f"--- last lines of {child.log_path}:\n{last_lines}"
            )
            self._hopeless.set()
            return
        self._last_crash[name] = error
        # A server keeps its launch name across depth changes: say the depth it runs at.
        at = "" if child.plan.steps is None else f" at depth {child.plan.steps}"
        self._say(
            f"specroute launch: {name} exited with status {status}; "
            f"restarting{at} (log: {child.log_path}). Last lines:\n{last_lines}"
        )

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Bring the pool up, serve until asked to stop, take it down; the exit status."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self.start()
        except LaunchError as exc:
            self._say(f"specroute launch: {exc}")
            await self.shutdown()
            return 1
        if not self._stop.is_set():
            self._say(self._summary())
            await self._serve()
        self._say("specroute launch: stopping (draining the proxy's streams first)")
        await self.shutdown()
        return 0

    async def _serve(self) -> None:
        """Until asked to stop; the background tasks are cancelled then (a restart under way
        is cut short: shutdown stops whatever process it left)."""
        tasks = [asyncio.create_task(job(self._stop)) for job in self.background]
        try:
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def start(self) -> None:
        await self._start_caches()
        if self._stop.is_set():
            return
        for server in self.servers:
            await server.start()
        await self._wait_ready(self.servers)
        if self._stop.is_set():
            return
        taken = await asyncio.to_thread(answered_by_another, self.plan.proxy.url, "--port")
        if taken:  # taken while the servers loaded
            raise LaunchError(f"{self.plan.proxy.name}: {taken}")
        await self.proxy.start()
        await self._wait_ready([self.proxy], "/ready")

    async def shutdown(self) -> None:
        await self.proxy.stop(self.settings.drain_s)
        await asyncio.gather(*(s.stop(self.settings.drain_s) for s in self.servers))
        await asyncio.gather(*(c.stop(self.settings.drain_s) for c in self.caches))
        for cache in self.caches:
            log.info("weight_cache_stopped", name=cache.plan.name, restarts=cache.restarts)

    async def _start_caches(self) -> None:
        """Start every weight cache daemon and wait until each serves (its weight load), so
        that no server loads from disk beside a daemon still loading; a daemon that dies
        meanwhile is restarted by its supervisor and waited for again."""
        for cache in self.caches:
            await cache.start()
            log.info("weight_cache_started", name=cache.plan.name, pid=cache.pid)
        started = time.monotonic()
        for cache, planned in zip(self.caches, self.plan.caches, strict=True):
            while not self._stop.is_set():
                if self._hopeless.is_set():
                    raise LaunchError(self._hopeless_why)
                left = max(0.0, self.settings.ready_timeout_s - (time.monotonic() - started))
                try:
                    await wait_cache_ready(planned.cache, cache.process, name=cache.plan.name,
                                           within=left, poll_s=self.settings.poll_s)  # fmt: skip
                except ChildExited:
                    if left <= 0:
                        raise LaunchError(f"{cache.plan.name} kept exiting while loading; "
                                          f"log: {cache.log_path}") from None  # fmt: skip
                    await asyncio.sleep(self.settings.poll_s)  # the supervisor restarts it
                    continue
                except NotReady as exc:
                    raise LaunchError(f"{exc}\n--- last lines of {cache.log_path}:\n"
                                      f"{tail(cache.log_path)}") from exc  # fmt: skip
                log.info("weight_cache_ready", name=cache.plan.name, socket_dir=planned.cache
                         .socket_dir, after_s=round(time.monotonic() - started, 1))  # fmt: skip
                self._say(f"  {cache.plan.name} serving after {time.monotonic() - started:.1f} s")
                break

    async def _wait_ready(self, children: Sequence[Supervised], path: str | None = None) -> None:
        """Wait until every child answers `path` (unset: its plan's `ready_path`, which differs
        between SGLang and vLLM), saying which are still loading; return early
        when asked to stop. No early exit on a crash: the supervisor restarts the child."""
        started = time.monotonic()
        pending = {c.plan.name: c for c in children}
        waits = {asyncio.create_task(self._ready(c, path, pending, started)) for c in children}
        stopping = asyncio.create_task(self._stop.wait())
        hopeless = asyncio.create_task(self._hopeless.wait())
        every = self.settings.progress_every_s
        next_report = started + every
        try:
            while waits and not stopping.done():
                wake = max(0.0, next_report - time.monotonic())
                done, _ = await asyncio.wait(
                    [*waits, stopping, hopeless], timeout=wake, return_when=asyncio.FIRST_COMPLETED
                )
                if hopeless in done:
                    raise LaunchError(self._hopeless_why)
                for task in waits & done:
                    waits.discard(task)
                    if isinstance(task.exception(), NotReady):
                        raise LaunchError(self._timeout_message(list(pending.values())))
                    task.result()
                if waits and time.monotonic() >= next_report:
                    waiting = ", ".join(sorted(pending))
                    self._say(f"  waiting for {waiting} ({time.monotonic() - started:.0f} s)")
                    next_report = time.monotonic() + every
        finally:
            stopping.cancel()
            hopeless.cancel()
            for task in waits:
                task.cancel()

    async def _ready(
        self, child: Supervised, path: str | None, pending: dict[str, Supervised], started: float
    ) -> None:
        await wait_ready(
            child.plan.url + (path or child.plan.ready_path),
            within=self.settings.ready_timeout_s,
            poll_s=self.settings.poll_s,
            name=child.plan.name,
        )
        del pending[child.plan.name]
        self.ready_after[child.plan.name] = time.monotonic() - started
        self._say(f"  {child.plan.name} ready after {time.monotonic() - started:.1f} s")

    def _timeout_message(self, children: Sequence[Supervised]) -> str:
        parts = [
            f"not ready after {self.settings.ready_timeout_s:.0f} s: "
            + ", ".join(c.plan.name for c in children)
        ]
        parts += [f"--- last lines of {c.log_path}:\n{tail(c.log_path)}" for c in children]
        return "\n".join(parts)

    def _summary(self) -> str:
        lines = [f"specroute launch: pool ready; proxy at {self.plan.proxy.url}"]
        for s in self.servers:
            gpus = ",".join(map(str, s.plan.gpus)) or "-"
            lines.append(
                f"  {s.plan.name:<8} {s.plan.url}  pid {s.pid}  gpus {gpus}  log {s.log_path}"
            )
        lines += [f"  {c.plan.name}  pid {c.pid}  log {c.log_path}" for c in self.caches]
        lines.append(
            f"  proxy    {self.plan.proxy.url}  pid {self.proxy.pid}  log {self.proxy.log_path}"
        )
        lines.append("Ctrl-C (or SIGTERM) stops everything.")
        return "\n".join(lines)


def _last_error(last_lines: str) -> str:
    """A crash's signature: its last line that is not the supervisor's own `=== start`."""
    lines = [ln.strip() for ln in last_lines.splitlines() if ln.strip()]
    return next((ln for ln in reversed(lines) if not ln.startswith("=== start")), "")

"""Child processes that come back: start one with its own log file, restart it with backoff when
it dies, show the end of its log when it does, and stop it politely, then firmly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from specroute.children import spawn, stop_async, tail, wait_exit
from specroute.launch.argv import ProcessPlan
from specroute.tasks import cancel

__all__ = ["Backoff", "Supervised"]

log = structlog.get_logger()


class Backoff:
    """Delays of 1, 2, 4, ... seconds up to `max_s`; a child that stayed up `reset_after_s`
    starts over at the first delay."""

    def __init__(self, first_s: float = 1.0, max_s: float = 30.0, reset_after_s: float = 60.0):
        self.first_s = first_s
        self.max_s = max_s
        self.reset_after_s = reset_after_s
        self._next = first_s

    def after_exit(self, uptime_s: float) -> float:
        """The delay before the next start, given how long the last run lasted."""
        if uptime_s >= self.reset_after_s:
            self._next = self.first_s
        delay = self._next
        self._next = min(self.max_s, self._next * 2)
        return delay


class Supervised:
    """One planned process kept running until `stop()`; `restarts` counts its comebacks."""

    def __init__(
        self,
        plan: ProcessPlan,
        log_dir: Path,
        *,
        backoff: Backoff | None = None,
        on_crash: Callable[[Supervised, int | None, str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.log_path = log_dir / f"{plan.name}.log"
        self.backoff = backoff or Backoff()
        self.restarts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._on_crash = on_crash
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        """Start the process and a task that restarts it whenever it exits unasked."""
        self._spawn()
        self._task = asyncio.create_task(self._keep_alive(), name=f"supervise-{self.plan.name}")

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as logfile:
            logfile.write(f"\n=== start: {self.plan.shell()}\n".encode())
            logfile.flush()
            # A new session: Ctrl-C on the terminal reaches the launcher only, which then
            # stops the children in order (proxy first, so streams drain).
            self.process = spawn(
                self.plan.argv,
                env={"PYTHONUNBUFFERED": "1", **self.plan.env},
                stdout=logfile,
                stderr=subprocess.STDOUT,
                new_session=True,
            )
        self._started_at = time.monotonic()
        log.info(
            "process_started", name=self.plan.name, pid=self.process.pid, log=str(self.log_path)
        )

    async def _keep_alive(self) -> None:
        while True:
            assert self.process is not None
            status = await wait_exit(self.process)
            if self._stopping:
                return
            uptime = time.monotonic() - self._started_at
            delay = self.backoff.after_exit(uptime)
            log.warning(
                "process_exited",
                name=self.plan.name,
                status=status,
                uptime_s=round(uptime, 1),
                restart_in_s=delay,
                log=str(self.log_path),
            )
            if self._on_crash is not None:
                self._on_crash(self, status, tail(self.log_path))
            await asyncio.sleep(delay)
            if self._stopping:
                return
            self.restarts += 1
            self._spawn()

    async def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to `grace_s` (SGLang and the proxy drain in that time), then SIGKILL
        the whole session: SGLang's scheduler and detokenizer processes go too."""
        self._stopping = True
        await cancel([self._task])
        if self.process is None:
            return None
        was_running = self.running
        status = await stop_async(self.process, grace_s=grace_s, kill_group=True)
        if was_running and status == -signal.SIGKILL:
            log.warning("process_killed", name=self.plan.name, after_s=grace_s)
        return status

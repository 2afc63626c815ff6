"""The asyncio loop that runs the Engine in wall-clock time and hands tokens to requests.

One task per server: while the engine has work, step it, sleep until the iteration's deadline
(deadlines advance by `duration / time_scale`, so sleep jitter does not accumulate), then
deliver every Emission to its request's `Job`. Idle, it waits for a submission.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from specroute.emulator.engine import Emission, Engine, Req
from specroute.emulator.metrics import Stats
from specroute.tasks import cancel

__all__ = ["Driver", "Job"]

log = structlog.get_logger()


class Job:
    """One request's view of its tokens: the driver pushes, the HTTP handler pulls."""

    __slots__ = (
        "_waiter",
        "created",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "last_token_at",
        "produced",
        "record",
        "rid",
        "seq",
        "stream",
        "taken",
    )

    def __init__(self, seq: Req, *, stream: bool, created: float, record: bool) -> None:
        self.seq = seq
        self.rid = seq.rid
        self.stream = stream
        self.created = created
        self.record = record
        """False for health probes: they stay out of the metrics, as in SGLang."""
        self.produced = 0
        self.taken = 0
        self.finish_reason: str | None = None
        self.first_token_at: float | None = None
        self.last_token_at = created
        self.finished_at: float | None = None
        self._waiter: asyncio.Future[None] | None = None

    def report(self, stats: Stats, now: float) -> None:
        """The finished request's counters and latencies into the server's metrics."""
        stats.observe_finished(
            self.seq,
            stream=self.stream,
            created=self.created,
            first_token_at=self.first_token_at,
            finish_reason=self.finish_reason,
            now=now,
        )

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def push(self, tokens: int, finish_reason: str | None, now: float) -> None:
        self.produced += tokens
        if finish_reason is not None:
            self.finish_reason = finish_reason
            self.finished_at = now
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> int:
        """Tokens produced since the last call (several iterations coalesce); 0 once done."""
        while self.produced == self.taken and self.finish_reason is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        new = self.produced - self.taken
        self.taken = self.produced
        return new

    async def wait_finished(self) -> None:
        while self.finish_reason is None:
            await self.next()


class Driver:
    """Owns the engine and its loop task; the only writer of engine state."""

    def __init__(self, engine: Engine, stats: Stats, *, time_scale: float) -> None:
        self.engine = engine
        self.stats = stats
        self.time_scale = time_scale
        self.jobs: dict[str, Job] = {}
        self.closing = asyncio.Event()
        """Set when the server shuts down: stalled streams end, new work is refused."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._guarded(), name="emulated-gpu")

    @property
    def alive(self) -> bool:
        """False before start and after the loop ended; `/ready` reports it."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        await cancel([self._task])

    def submit(
        self,
        rid: str,
        *,
        prompt_tokens: int,
        max_new_tokens: int,
        klass: str,
        ignore_eos: bool,
        stream: bool,
        record: bool = True,
        stop_at: int | None = None,
    ) -> Job:
        """Queue a request; raises ValueError for a request id already in flight."""
        seq = self.engine.submit(
            rid,
            prompt_tokens=prompt_tokens,
            max_new_tokens=max_new_tokens,
            klass=klass,
            ignore_eos=ignore_eos,
            stop_at=stop_at,
        )
        job = Job(seq, stream=stream, created=time.perf_counter(), record=record)
        self.jobs[rid] = job
        self._wake.set()
        return job

    def abort(self, rid: str) -> bool:
        """Take a request out of the batch now; its job finishes with reason "abort"."""
        job = self.jobs.pop(rid, None)
        if job is None:
            return False
        self.engine.abort(rid)
        now = time.perf_counter()
        job.push(0, "abort", now)
        if job.record:
            self.stats.observe_abort()
            job.report(self.stats, now)
        return True

    def close(self) -> None:
        """Shutting down: abort every request so open responses end now, not at a timeout."""
        self.closing.set()
        for rid in list(self.jobs):
            self.abort(rid)

    def release(self, job: Job) -> None:
        """Called in `finally` by every handler: an unfinished job is aborted."""
        if self.jobs.get(job.rid) is job:
            self.abort(job.rid)

    async def _guarded(self) -> None:
        try:
            await self._run()
        except Exception:
            # A bug here would leave every request hanging: end them and say why.
            log.exception("emulated_gpu_failed")
            self.close()
            raise

    async def _run(self) -> None:
        engine = self.engine
        deadline = time.perf_counter()
        while True:
            if engine.idle:
                self.stats.observe_idle(engine, time.perf_counter())
                self._wake.clear()
                await self._wake.wait()
                deadline = time.perf_counter()
                continue
            begun = engine.clock  # when the requests this iteration admits leave the queue
            it = engine.step()
            if it is None:
                continue
            deadline += it.duration / self.time_scale
            delay = deadline - time.perf_counter()
            # Behind schedule: do not sleep, but let the handlers run.
            await asyncio.sleep(delay if delay > 0 else 0)
            now = time.perf_counter()
            generated = self._deliver(it.emissions, now, begun)
            self.stats.observe_iteration(it, engine, generated, now)

    def _deliver(self, emissions: list[Emission], now: float, started: float) -> int:
        """Hand out one iteration's tokens; `started` is its engine clock (when the requests it
        admitted left the queue)."""
        jobs = self.jobs
        stats = self.stats
        generated = 0
        for emission in emissions:
            tokens = emission.tokens
            generated += tokens
            job = jobs.get(emission.seq.rid)
            if job is None:
                continue  # aborted while the iteration ran
            if job.record:
                if job.first_token_at is None:
                    stats.observe_first_token(now - job.created, job.stream)
                    stats.observe_queue_time((started - emission.seq.arrival) / self.time_scale)
                else:
                    stats.observe_inter_token(now - job.last_token_at, tokens)
            if job.first_token_at is None:
                job.first_token_at = now
            job.last_token_at = now
            job.push(tokens, emission.finish_reason, now)
            if emission.finish_reason is not None:
                del jobs[job.rid]
                if job.record:
                    job.report(stats, now)
        return generated

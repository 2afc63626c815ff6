"""One emulated server's runtime: engine, driver loop, stats, faults, and generation serving.

`Emulator.chat`, `.completions` and `.generate` decode a body with msgspec, plan it
(`admission`), submit it to the driver and answer with `streams.Responder`: a Litestar `Stream`,
or the whole JSON once the job is done (a client that hangs up first aborts it). Errors use the
shape SGLang uses on that route.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import structlog
from litestar import Litestar, Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.response import Stream
from litestar.types import Receive

from specroute.emulator.admission import Plan, Rejected, chat_plan, completion_plan, generate_plan
from specroute.emulator.driver import Driver, Job
from specroute.emulator.engine import Engine
from specroute.emulator.faults import Faults
from specroute.emulator.metrics import Stats
from specroute.emulator.options import EmulatorOptions
from specroute.emulator.profiles import get_profile
from specroute.emulator.startup import WARMUP_PROMPT_TOKENS, WARMUP_TOKENS, StartupPlan
from specroute.emulator.streams import Reply, Responder
from specroute.emulator.text import TextSource
from specroute.emulator.wire import (
    ChatRequest,
    CompletionRequest,
    ErrorResponse,
    GenerateRequest,
    StreamOptions,
    encode,
)

__all__ = ["Emulator", "InjectedEmulator", "json_response", "openai_error"]

log = structlog.get_logger()

FAILED = "Internal server error: emulated failure (--fail-rate)"
NOT_JSON = "Unsupported Media Type: Only 'application/json' is allowed"
CLIENT_GONE = 499
_NOTE = "EMULATED server: no GPU, no model"


def json_response(body: Any, status: int = 200) -> Response[bytes]:
    content = body if isinstance(body, bytes) else encode(body)
    return Response(content=content, status_code=status, media_type="application/json")


def openai_error(message: str, status: int = 400, kind: str = "BadRequestError") -> Response[bytes]:
    """SGLang's error body on the OpenAI routes; `kind` "Bad Request" for schema errors."""
    return json_response(ErrorResponse(message=message, type=kind, code=status), status)


def _usage_flags(options: StreamOptions | None) -> dict[str, bool]:
    return {
        "include_usage": bool(options and options.include_usage),
        "continuous_usage": bool(options and options.continuous_usage_stats),
    }


class Emulator:
    """The runtime objects of one emulated server, shared by its route handlers."""

    def __init__(
        self,
        options: EmulatorOptions,
        *,
        stats: Callable[..., Stats] = Stats,
        responder: Callable[..., Responder] = Responder,
        schedule: Callable[[int], int] | None = None,
    ) -> None:
        """`stats` and `responder` build the dialect's metrics and replies (SGLang's unless an
        app of another dialect, `vllm_server`, passes its own); `schedule` is a depth per batch
        size (vLLM's dynamic K table)."""
        profile = get_profile(options.profile)
        speculative = options.algorithm is not None
        self.options = options
        self.served = options.served_model_name
        self.context_length = profile.context_length
        self.max_total_num_tokens = 4 * profile.context_length
        """A nominal KV pool (no GPU to size it): token usage is relative to it."""
        self.engine = Engine(
            profile,
            steps=options.steps,
            max_running_requests=options.max_running_requests,
            seed=options.seed,
            adaptive=options.speculative_adaptive,
            adaptive_config=options.adaptive_config,
            schedule=schedule,
        )
        self.stats = stats(
            model_name=self.served,
            speculative=speculative,
            decode_log_interval=options.decode_log_interval,
            max_total_num_tokens=self.max_total_num_tokens,
            max_running_requests=self.engine.max_running_requests,
        )
        self.driver = Driver(self.engine, self.stats, time_scale=options.time_scale)
        self.faults = Faults(options)
        self.responder = responder(self.driver, self.faults, speculative=speculative)
        self.startup = StartupPlan.of_parts(options.startup_parts, options.time_scale)
        self.warmed = self.startup.instant
        """False until SGLang's warm-up request has run: `/health` and `/ready` answer 503."""
        self.startup_time = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        self.driver.start()
        self.faults.restart_clock()
        self.startup_time = time.time()
        warmup = None if self.warmed else asyncio.create_task(self._warm_up(), name="warm-up")
        if warmup is None:
            log.info("emulator_ready", note=_NOTE, engine=self.options.engine)
        try:
            yield
        finally:
            if warmup is not None:
                warmup.cancel()
            await self.driver.stop()
            log.info("emulator_stopped")

    async def _warm_up(self) -> None:
        """SGLang's warm-up: a pause, then one short greedy generation, then ready."""
        await asyncio.sleep(self.startup.warmup_wait_s)
        job = self.driver.submit(
            f"WARMUP_{uuid.uuid4().hex}",
            prompt_tokens=WARMUP_PROMPT_TOKENS,
            max_new_tokens=WARMUP_TOKENS,
            klass="greedy",
            ignore_eos=True,
            stream=False,
            record=False,
        )
        try:
            await job.wait_finished()
        finally:
            self.driver.release(job)
        self.warmed = True
        log.info("emulator_ready", note=_NOTE, engine=self.options.engine)

    def begin_shutdown(self) -> None:
        """Safe from a signal handler: end every open response on the loop's next turn."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.driver.close)

    @property
    def ready(self) -> bool:
        return self.warmed and self.faults.ready and self.driver.alive

    # -- generation routes ----------------------------------------------------------------
    async def chat(self, request: Request[Any, Any, Any]) -> Response[Any]:
        req = await self._decode_openai(request, ChatRequest)
        if isinstance(req, Response):
            return req
        started = self._start_openai(req, chat_plan)
        if isinstance(started, Response):
            return started
        plan, job = started
        flags = _usage_flags(req.stream_options)
        reply = self.reply(job, plan, req.model, want_spec=req.return_spec_tokens_details, **flags)
        if req.stream:
            return self.stream(job, self.responder.chat_stream(reply))
        return await self.answer(request, job, lambda: self.responder.chat_body(reply))

    async def completions(self, request: Request[Any, Any, Any]) -> Response[Any]:
        req = await self._decode_openai(request, CompletionRequest)
        if isinstance(req, Response):
            return req
        started = self._start_openai(req, completion_plan)
        if isinstance(started, Response):
            return started
        plan, job = started
        echo = req.prompt if req.echo and isinstance(req.prompt, str) else ""
        flags = _usage_flags(req.stream_options)
        want_spec = req.return_spec_tokens_details
        reply = self.reply(job, plan, req.model, want_spec=want_spec, echo=echo, **flags)
        if req.stream:
            return self.stream(job, self.responder.completion_stream(reply))
        return await self.answer(request, job, lambda: self.responder.completion_body(reply))

    async def generate(self, request: Request[Any, Any, Any]) -> Response[Any]:
        if not self.faults.admit():
            return json_response({"error": {"message": FAILED}}, 500)
        try:
            req = msgspec.json.decode(await request.body(), type=GenerateRequest)
        except msgspec.DecodeError as exc:
            return openai_error(str(exc), kind="Bad Request")
        try:
            plan = generate_plan(req, context=self.context_length, seed=self.options.seed)
            job = self.submit(req.rid, plan, stream=req.stream)
        except ValueError as exc:
            return json_response({"error": {"message": str(exc)}}, 400)
        reply = self.reply(job, plan, self.served)
        if req.stream:
            return self.stream(job, self.responder.generate_stream(reply))
        return await self.answer(request, job, lambda: self.responder.generate_body(reply))

    # -- shared steps ---------------------------------------------------------------------
    async def _decode_openai(self, request: Request[Any, Any, Any], kind: type[Any]) -> Any:
        """The decoded body, or the response SGLang gives before its handler runs."""
        if not self.faults.admit():
            return openai_error(FAILED, 500, "InternalServerError")
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return openai_error(NOT_JSON, kind="Bad Request")
        try:
            return msgspec.json.decode(await request.body(), type=kind)
        except msgspec.DecodeError as exc:
            return openai_error(str(exc), kind="Bad Request")

    def _start_openai(
        self, req: Any, make_plan: Callable[..., Plan]
    ) -> tuple[Plan, Job] | Response[Any]:
        """Plan and queue an OpenAI request, or the OpenAI error that refuses it."""
        try:
            plan = make_plan(
                req, served=self.served, context=self.context_length, seed=self.options.seed
            )
            return plan, self.submit(req.rid, plan, stream=req.stream)
        except Rejected as exc:
            return openai_error(str(exc), kind=exc.type)
        except ValueError as exc:
            return openai_error(str(exc))

    def submit(self, rid: str | None, plan: Plan, *, stream: bool) -> Job:
        return self.driver.submit(
            rid or uuid.uuid4().hex,
            prompt_tokens=plan.prompt_tokens,
            max_new_tokens=plan.max_new_tokens,
            klass=plan.klass,
            ignore_eos=plan.ignore_eos,
            stream=stream,
            stop_at=None if plan.stop is None else plan.stop.tokens,
        )

    def reply(self, job: Job, plan: Plan, model: str, **extra: Any) -> Reply:
        limit = plan.stop.chars if plan.stop else None
        source = TextSource(self.options.seed, plan.prompt_text, limit)
        if plan.skip:
            source.take(plan.skip)  # the words already written, as the first answer wrote them
        return Reply(
            job,
            source,
            model=model,
            stop=plan.stop,
            created=int(time.time()),
            malformed=job.stream and self.faults.malformed_stream(),
            **extra,
        )

    def stream(
        self, job: Job, chunks: AsyncIterator[bytes], media_type: str = "text/event-stream"
    ) -> Stream:
        # The background task releases the job even if the stream never started.
        release = BackgroundTask(self.driver.release, job)
        return Stream(chunks, media_type=media_type, background=release)

    async def answer(
        self, request: Request[Any, Any, Any], job: Job, body: Callable[[], bytes]
    ) -> Response[bytes]:
        """Wait for a non-streaming job; a client that hangs up aborts it."""
        try:
            if not await _finished_or_gone(self.responder.finished(job), request.receive):
                return Response(content=b"", status_code=CLIENT_GONE)
            return json_response(body())
        finally:
            self.driver.release(job)


async def _finished_or_gone(job_finished: Awaitable[bool], receive: Receive) -> bool:
    """Whether the job finished (`job_finished` says True) before its client hung up."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    finished = asyncio.ensure_future(job_finished)
    watcher = asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait((finished, watcher), return_when=asyncio.FIRST_COMPLETED)
        return finished in done and finished.result()
    finally:
        finished.cancel()
        watcher.cancel()


InjectedEmulator = NamedDependency[Emulator]
"""A route handler's `emu` parameter: the app's `Emulator`, injected by name (Litestar 3 drops
inferred dependencies)."""

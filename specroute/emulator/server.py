"""The emulated SGLang server: a Litestar app over the driver loop, built by `create_app`.

Paths, status codes and bodies follow SGLang 0.5.23's `http_server.py`; generation is served by
`runtime.Emulator`, which route handlers receive by dependency injection. Run the app with one
uvicorn worker: the engine lives in this process's event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
from litestar import Controller, Litestar, Request, Response, get, post, route
from litestar.di import Provide

from specroute.emulator import info, ollama, tokenizer_api
from specroute.emulator.agents import AgentApis, InjectedAgents
from specroute.emulator.auth import bearer_auth
from specroute.emulator.options import EmulatorOptions
from specroute.emulator.runtime import Emulator, InjectedEmulator, json_response, openai_error
from specroute.emulator.wire import ErrorResponse
from specroute.prometheus import CONTENT_TYPE
from specroute.raw_path import path_after

__all__ = ["build", "create_app"]

LOAD_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
FLUSHED = (
    b"Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    b"waiting requests, the operation will not be performed.)\n"
)
HEALTH_TIMEOUT = 20.0
NOT_EMBEDDING = (
    "This model does not appear to be an embedding model by default. Please add `--is-embedding` "
    "when launching the server or try another model."
)


class AbortRequest(msgspec.Struct):
    rid: str = ""
    abort_all: bool = False


def _empty(status: int) -> Response[bytes]:
    return Response(content=b"", status_code=status, media_type="text/plain")


class GenerationRoutes(Controller):
    """`/v1/chat/completions`, `/v1/completions` and SGLang's native `/generate`."""

    @post("/v1/chat/completions", status_code=200)
    async def chat(self, request: Request[Any, Any, Any], emu: InjectedEmulator) -> Response[Any]:
        return await emu.chat(request)

    @post("/v1/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[Any]:
        return await emu.completions(request)

    @route("/generate", http_method=["POST", "PUT"], status_code=200)
    async def generate(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[Any]:
        return await emu.generate(request)


class AgentRoutes(Controller):
    """OpenAI's Responses API and Anthropic's Messages API (`agents.AgentApis`)."""

    @post("/v1/responses", status_code=200)
    async def create_response(
        self, request: Request[Any, Any, Any], agents: InjectedAgents
    ) -> Response[Any]:
        return await agents.create_response(request)

    @get("/v1/responses/{response_id:str}", sync_to_thread=False)
    def retrieve_response(self, agents: InjectedAgents, response_id: str) -> Response[bytes]:
        return agents.retrieve_response(response_id)

    @post("/v1/responses/{response_id:str}/cancel", status_code=200, sync_to_thread=False)
    def cancel_response(self, agents: InjectedAgents, response_id: str) -> Response[bytes]:
        return agents.cancel_response(response_id)

    @post("/v1/messages", status_code=200)
    async def messages(
        self, request: Request[Any, Any, Any], agents: InjectedAgents
    ) -> Response[Any]:
        return await agents.messages(request)

    @post("/v1/messages/count_tokens", status_code=200)
    async def count_tokens(
        self, request: Request[Any, Any, Any], agents: InjectedAgents
    ) -> Response[bytes]:
        return await agents.count_tokens(request)


class SideRoutes(Controller):
    """Tokenizer routes and Ollama's API (`tokenizer_api`, `ollama`)."""

    @post(["/v1/tokenize", "/tokenize"], status_code=200)
    async def tokenize(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[bytes]:
        try:
            req = msgspec.json.decode(await request.body(), type=tokenizer_api.TokenizeRequest)
        except msgspec.DecodeError as exc:
            return openai_error(str(exc), kind="Bad Request")
        return json_response(tokenizer_api.tokenize(req, emu.context_length))

    @post(["/v1/detokenize", "/detokenize"], status_code=200)
    async def detokenize(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        try:
            req = msgspec.json.decode(await request.body(), type=tokenizer_api.DetokenizeRequest)
        except msgspec.DecodeError as exc:
            return openai_error(str(exc), kind="Bad Request")
        return json_response(tokenizer_api.detokenize(req))

    @route(
        ["/v1/embeddings", "/v1/classify", "/encode", "/classify"],
        http_method=["POST", "PUT"],
        status_code=400,
        sync_to_thread=False,
    )
    def embeddings(self) -> Response[bytes]:
        """An emulated server is a generative model: SGLang's tokenizer manager refuses
        embedding requests to one (`TokenizerManager._validate_one_request`)."""
        return openai_error(NOT_EMBEDDING)

    @post(["/api/chat", "/api/generate"], status_code=200)
    async def ollama_generation(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[Any]:
        chat = request.url.path == "/api/chat"
        kind: type[ollama.OllamaChat | ollama.OllamaGenerate] = (
            ollama.OllamaChat if chat else ollama.OllamaGenerate
        )
        try:
            req = msgspec.json.decode(await request.body(), type=kind)
        except msgspec.DecodeError as exc:
            return json_response({"detail": str(exc)}, 422)
        plan = ollama.ollama_plan(req, emu.context_length)
        job = emu.submit(None, plan, stream=req.stream)
        reply = emu.reply(job, plan, emu.served)
        if req.stream:
            lines = ollama.ollama_lines(emu.responder, reply, chat)
            return emu.stream(job, lines, media_type=ollama.NDJSON)
        return await emu.answer(request, job, lambda: ollama.chat_line(reply, chat))

    @get("/api/tags", sync_to_thread=False)
    def ollama_tags(self, emu: InjectedEmulator) -> Response[bytes]:
        return json_response(ollama.tags(emu.served))

    @post("/api/show", status_code=200)
    async def ollama_show(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[bytes]:
        try:
            req = msgspec.json.decode(await request.body(), type=ollama.ShowRequest)
        except msgspec.DecodeError as exc:
            return json_response({"detail": str(exc)}, 422)
        return json_response(ollama.show(req.model, emu.context_length))


class InfoRoutes(Controller):
    """What the server says about itself: models, arguments, load and Prometheus metrics."""

    @get("/v1/models")
    async def models(self, emu: InjectedEmulator) -> Response[bytes]:
        card = info.model_card(emu.served, emu.context_length)
        return json_response({"object": "list", "data": [card]})

    @get("/v1/models/{model:path}")
    async def model(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator, model: str
    ) -> Response[bytes]:
        name = path_after(request.scope, "/v1/models/") or model.lstrip("/")
        if name != emu.served:
            error = {
                "message": f"The model '{name}' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
            return json_response({"error": error}, 404)
        return json_response(info.model_card(name, emu.context_length))

    @get(["/model_info", "/get_model_info"])
    async def model_info(self, emu: InjectedEmulator) -> Response[bytes]:
        return json_response(info.model_info(emu.options))

    @get(["/server_info", "/get_server_info"])
    async def server_info(self, emu: InjectedEmulator) -> Response[bytes]:
        body = info.server_info(
            emu.options,
            emu.engine,
            emu.stats,
            startup_time=emu.startup_time,
            max_total_num_tokens=emu.max_total_num_tokens,
        )
        return json_response(body)

    @get("/v1/loads")
    async def loads(
        self, emu: InjectedEmulator, include: str | None = None, format: str | None = None
    ) -> Response[Any]:
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= LOAD_SECTIONS:
            message = f"Invalid include sections: {sorted(sections - LOAD_SECTIONS)}"
            return json_response(ErrorResponse(message=message, type="400", code=400), 400)
        if format == "prometheus":
            text = emu.stats.loads_prometheus(sections)
            return Response(content=text, headers={"content-type": CONTENT_TYPE})
        return json_response(emu.stats.loads(sections))

    @get("/metrics")
    async def metrics(self, emu: InjectedEmulator) -> Response[bytes]:
        # A header, not a media type: Litestar would append a second `; charset=utf-8`.
        return Response(content=emu.stats.render(), headers={"content-type": CONTENT_TYPE})


class ControlRoutes(Controller):
    """Readiness, health, cache flush and aborts."""

    @get("/ready")
    async def ready(self, emu: InjectedEmulator) -> Response[bytes]:
        return _empty(200 if emu.ready else 503)

    @get(["/health", "/health_generate"])
    async def health(self, emu: InjectedEmulator) -> Response[bytes]:
        """SGLang runs a one-token generation here; the emulator does too, when idle."""
        if not emu.ready:
            return _empty(503)
        if not emu.engine.idle:
            return _empty(200)
        job = emu.driver.submit(
            f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt_tokens=1,
            max_new_tokens=1,
            klass="greedy",
            ignore_eos=True,
            stream=False,
            record=False,
        )
        try:
            await asyncio.wait_for(job.wait_finished(), timeout=HEALTH_TIMEOUT)
        except TimeoutError:
            return _empty(503)
        finally:
            emu.driver.release(job)
        return _empty(200)

    @route("/flush_cache", http_method=["GET", "POST"], status_code=200)
    async def flush_cache(self, emu: InjectedEmulator) -> Response[bytes]:
        if emu.engine.idle:
            return Response(content=FLUSHED, status_code=200, media_type="text/plain")
        return Response(content=b"Flush cache failed.\n", status_code=400, media_type="text/plain")

    @post("/abort_request", status_code=200)
    async def abort_request(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[Any]:
        try:
            req = msgspec.json.decode(await request.body(), type=AbortRequest)
        except msgspec.DecodeError as exc:
            return openai_error(str(exc), kind="Bad Request")
        rids = list(emu.driver.jobs) if req.abort_all else [req.rid] if req.rid else []
        for rid in rids:
            emu.driver.abort(rid)
        return _empty(200)


def create_app(options: EmulatorOptions) -> Litestar:
    """An SGLang-compatible app driven by the emulated engine; run it with one uvicorn worker."""
    return build(options)[0]


def build(options: EmulatorOptions) -> tuple[Litestar, Emulator]:
    """The app and its runtime, for callers that must reach the runtime (signal handling)."""
    emu = Emulator(options)
    agents = AgentApis(emu)

    def provide() -> Emulator:
        return emu

    def provide_agents() -> AgentApis:
        return agents

    app = Litestar(
        route_handlers=[GenerationRoutes, AgentRoutes, SideRoutes, InfoRoutes, ControlRoutes],
        dependencies={
            "emu": Provide(provide, use_cache=True, sync_to_thread=False),
            "agents": Provide(provide_agents, use_cache=True, sync_to_thread=False),
        },
        middleware=[bearer_auth(options.api_key)] if options.api_key else [],
        lifespan=[emu.lifespan],
        openapi_config=None,
        logging_config=None,
        # SGLang's FastAPI app on uvicorn reads a body of any size: no 10 MB Litestar default.
        request_max_body_size=None,
    )
    return app, emu

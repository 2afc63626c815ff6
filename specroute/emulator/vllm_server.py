"""The emulated server in vLLM's dialect (`specroute emulate --engine vllm`): the same engine,
profile and driver as the SGLang app, presented as vLLM's OpenAI server presents itself.

Routes follow vLLM's (vllm/entrypoints/openai/api_server.py and the routers of
vllm/entrypoints/serve/instrumentator/): the OpenAI routes, `/v1/models` (with `max_model_len`),
`/health` (200 once the engine runs, no generation), `/ping`, `/version`, `/load` and `/metrics`
with `vllm:` names, `/tokenize` and `/detokenize` (no `/v1/` aliases:
vllm/entrypoints/serve/tokenize/api_router.py); no `/ready`, no `/server_info` (developer mode
only) and no `/generate`. A chat request with `continue_final_message` must also set
`add_generation_prompt: false`: vLLM's default is true and the two together are refused, by
`check_generation_prompt` when both are sent, else by the chat template (transformers'
`apply_chat_template`), each a 400.
Errors carry vLLM's shape, `{"error": {"message", "type", "param", "code"}}`. The batch limit is
`--max-num-seqs` (`--max-running-requests` here), vLLM's default when unset.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import msgspec
from litestar import Controller, Litestar, Request, Response, get, post
from litestar.di import Provide

from specroute.emulator import tokenizer_api
from specroute.emulator.auth import bearer_auth
from specroute.emulator.options import VLLM_DEFAULT_MAX_NUM_SEQS, EmulatorOptions
from specroute.emulator.runtime import Emulator, InjectedEmulator, json_response
from specroute.emulator.vllm_metrics import VllmStats
from specroute.emulator.vllm_schedule import DynamicSchedule
from specroute.emulator.vllm_streams import VllmResponder
from specroute.prometheus import CONTENT_TYPE

__all__ = ["VLLM_VERSION", "build_vllm"]

VLLM_VERSION = "0.11.0"
"""The vLLM release `/version` reports (nominal: the dialect is that of vLLM's V1 engine)."""

_error = msgspec.json.Decoder(dict[str, Any])


def _vllm_error(response: Response[Any]) -> Response[Any]:
    """The shared runtime's error bodies (SGLang's flat shape) in vLLM's nested one."""
    status = response.status_code or 200
    if status < 400 or not isinstance(response.content, bytes):
        return response
    try:
        flat = _error.decode(response.content)
    except msgspec.DecodeError:
        return response
    inner = flat.get("error", flat)
    error = {
        "message": str(inner.get("message", "")),
        "type": str(inner.get("type", "BadRequestError")),
        "param": inner.get("param"),
        "code": status,
    }
    return json_response({"error": error}, status)


class _Prompting(msgspec.Struct):
    continue_final_message: bool = False
    add_generation_prompt: bool | None = None


_prompting = msgspec.json.Decoder(_Prompting)
_tokenize = msgspec.json.Decoder(tokenizer_api.VllmTokenizeRequest)
_detokenize = msgspec.json.Decoder(tokenizer_api.VllmDetokenizeRequest)


def _generation_prompt(body: bytes) -> str:
    """vLLM's refusal of `continue_final_message` with a generation prompt ("" if none)."""
    try:
        req = _prompting.decode(body)
    except msgspec.DecodeError:
        return ""  # the chat route says what is wrong with the body
    if not req.continue_final_message or req.add_generation_prompt is False:
        return ""
    if req.add_generation_prompt:
        return "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    return (
        "continue_final_message and add_generation_prompt are not compatible. Use "
        "continue_final_message when you want the model to continue the final message, and "
        "add_generation_prompt when you want to add a header that will prompt it to start a "
        "new assistant message instead."
    )


def _bad_request(message: str) -> Response[bytes]:
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return json_response({"error": error}, 400)


class VllmRoutes(Controller):
    """vLLM's OpenAI server, as far as a proxy and a benchmark client see it."""

    @post("/v1/chat/completions", status_code=200)
    async def chat(self, request: Request[Any, Any, Any], emu: InjectedEmulator) -> Response[Any]:
        refused = _generation_prompt(await request.body())
        if refused:
            return _bad_request(refused)
        return _vllm_error(await emu.chat(request))

    @post("/v1/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[Any]:
        return _vllm_error(await emu.completions(request))

    @post("/tokenize", status_code=200)
    async def tokenize(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[bytes]:
        try:
            req = _tokenize.decode(await request.body())
        except msgspec.DecodeError as exc:
            return _bad_request(str(exc))
        return json_response(tokenizer_api.vllm_tokenize(req, emu.context_length))

    @post("/detokenize", status_code=200)
    async def detokenize(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        try:
            req = _detokenize.decode(await request.body())
        except msgspec.DecodeError as exc:
            return _bad_request(str(exc))
        return json_response(tokenizer_api.vllm_detokenize(req))

    @get("/v1/models")
    async def models(self, emu: InjectedEmulator) -> Response[bytes]:
        card = {
            "id": emu.served,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": emu.served,
            "parent": None,
            "max_model_len": emu.context_length,
        }
        return json_response({"object": "list", "data": [card]})

    @get(["/health", "/ping"])
    async def health(self, emu: InjectedEmulator) -> Response[bytes]:
        """200 while the engine runs; 503 before it is up (vLLM's port opens only then)."""
        return Response(content=b"", status_code=200 if emu.ready else 503)

    @get("/version")
    async def version(self) -> Response[bytes]:
        return json_response({"version": VLLM_VERSION})

    @get("/load")
    async def load(self, emu: InjectedEmulator) -> Response[bytes]:
        """vLLM's `/load`: the server's requests in progress (`server_load`)."""
        return json_response({"server_load": len(emu.driver.jobs)})

    @get("/metrics")
    async def metrics(self, emu: InjectedEmulator) -> Response[bytes]:
        return Response(content=emu.stats.render(), headers={"content-type": CONTENT_TYPE})


def build_vllm(options: EmulatorOptions) -> tuple[Litestar, Emulator]:
    """The vLLM-dialect app and its runtime; `options.steps` is `num_speculative_tokens`."""
    if options.max_running_requests is None:
        options = msgspec.structs.replace(options, max_running_requests=VLLM_DEFAULT_MAX_NUM_SEQS)
    table = options.num_speculative_tokens_per_batch_size
    emu = Emulator(
        options,
        stats=functools.partial(VllmStats, steps=options.steps),
        responder=functools.partial(
            VllmResponder,
            spec_metrics=options.per_request_spec_decode_metrics,
            num_spec_tokens=options.steps,
        ),
        schedule=DynamicSchedule(table, options.steps) if table else None,
    )
    emu.engine.log_steps = options.per_request_spec_decode_metrics == "detailed"

    def provide() -> Emulator:
        return emu

    app = Litestar(
        route_handlers=[VllmRoutes],
        dependencies={"emu": Provide(provide, use_cache=True, sync_to_thread=False)},
        middleware=[bearer_auth(options.api_key)] if options.api_key else [],
        lifespan=[emu.lifespan],
        openapi_config=None,
        logging_config=None,
        request_max_body_size=None,
    )
    return app, emu

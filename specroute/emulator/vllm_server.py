"""The emulated server in vLLM's dialect (`specroute emulate --engine vllm`): the same engine,
profile and driver as the SGLang app, presented as vLLM's OpenAI server presents itself.

Routes follow vLLM's (vllm/entrypoints/openai/api_server.py and the routers of
vllm/entrypoints/serve/instrumentator/): the OpenAI routes, `/v1/models` (with `max_model_len`),
`/health` (200 once the engine runs, no generation), `/ping`, `/version`, `/load` and `/metrics`
with `vllm:` names; no `/ready`, no `/server_info` (developer mode only) and no `/generate`.
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


class VllmRoutes(Controller):
    """vLLM's OpenAI server, as far as a proxy and a benchmark client see it."""

    @post("/v1/chat/completions", status_code=200)
    async def chat(self, request: Request[Any, Any, Any], emu: InjectedEmulator) -> Response[Any]:
        return _vllm_error(await emu.chat(request))

    @post("/v1/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], emu: InjectedEmulator
    ) -> Response[Any]:
        return _vllm_error(await emu.completions(request))

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

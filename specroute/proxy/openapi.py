"""The proxy's OpenAPI document, served at /openapi/openapi.json. The relayed routes never reach
Litestar (the relay answers them first); they are declared here only so that the document, and
the tools that read it (clients, fuzzers), know their request bodies."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response, post
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.params import JSONBody

from specroute import __version__
from specroute.errors import NotFoundError

__all__ = ["OPENAPI_PATH", "openapi_config", "relay_docs"]

OPENAPI_PATH = "/openapi/openapi.json"


class StreamOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    include_usage: bool | None = None


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """OpenAI's chat completion request: the fields the proxy reads; the rest pass through.
    Without `model` it goes to the pool's model, as SGLang serves it (several models: 400)."""

    model: str | msgspec.UnsetType = msgspec.UNSET
    messages: list[ChatMessage]
    stream: bool | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    stream_options: StreamOptions | None = None


class CompletionRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """OpenAI's (legacy) completion request (`model` optional, as for chat)."""

    model: str | msgspec.UnsetType = msgspec.UNSET
    prompt: str | list[str]
    stream: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stream_options: StreamOptions | None = None


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class GenerateRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """SGLang's native /generate request."""

    text: str | list[str] | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams | None = None
    stream: bool | None = None


def _unreachable() -> Response[bytes]:
    # Only a path the relay does not match exactly (a trailing slash) lands here.
    raise NotFoundError("not found: use the path without a trailing slash")


def relay_docs() -> list[Any]:
    """Handlers that document the relayed routes; the relay answers these requests itself."""

    @post("/v1/chat/completions", sync_to_thread=False, status_code=200)
    def chat_completions(data: JSONBody[ChatCompletionRequest]) -> Response[bytes]:
        """Chat completion, streamed (SSE) or whole, routed to one backend."""
        return _unreachable()

    @post("/v1/completions", sync_to_thread=False, status_code=200)
    def completions(data: JSONBody[CompletionRequest]) -> Response[bytes]:
        """Text completion, streamed (SSE) or whole, routed to one backend."""
        return _unreachable()

    @post("/generate", sync_to_thread=False, status_code=200)
    def generate(data: JSONBody[GenerateRequest]) -> Response[bytes]:
        """SGLang's native generation route, routed to one backend."""
        return _unreachable()

    return [chat_completions, completions, generate]


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="specroute",
        version=__version__,
        description="OpenAI-compatible proxy routing across SGLang speculative-decoding backends.",
        path="/openapi",
        render_plugins=[JsonRenderPlugin()],
    )

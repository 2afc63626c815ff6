"""The proxy's OpenAPI document, served at /openapi/openapi.json. The relayed routes never reach
Litestar (the relay answers them first); they are declared here only so that the document, and
the tools that read it (clients, fuzzers), know their request bodies. Each documents at least
every field the relay decodes for routing (`fields.py`; tests/test_openapi_fields.py holds the
two together)."""

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
    continuous_usage_stats: bool | None = None


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | list[dict[str, Any]] | None = None


class _OpenAIRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What chat and completions requests share: the fields the proxy reads; the rest pass
    through. Without `model` a request goes to the pool's model, as SGLang serves it (a pool
    of several models: 400)."""

    model: str | msgspec.UnsetType = msgspec.UNSET
    stream: bool | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    stream_options: StreamOptions | None = None
    return_spec_tokens_details: bool | None = None
    """SGLang's: per-request speculative statistics in the reply's `sglext`."""
    service_tier: str | None = None
    """OpenAI's: `priority` puts the request in the interactive lane, `flex` in batch."""
    priority: int | None = None
    """SGLang's scheduling priority (with `--enable-priority-scheduling`)."""


class ChatCompletionRequest(_OpenAIRequest, kw_only=True, omit_defaults=True):
    """OpenAI's chat completion request."""

    messages: list[ChatMessage]


class CompletionRequest(_OpenAIRequest, kw_only=True, omit_defaults=True):
    """OpenAI's (legacy) completion request."""

    prompt: str | list[str]


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
    model: str | None = None
    """Read by the proxy only, to pick a backend that serves it in a pool of several models."""
    priority: int | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """OpenAI's Responses API request: the fields the proxy reads; the rest pass through."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    stream: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    previous_response_id: str | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | list[dict[str, Any]]


class MessagesRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Anthropic's Messages API request."""

    model: str
    messages: list[AnthropicMessage]
    max_tokens: int
    stream: bool | None = None
    system: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


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

    @post("/v1/responses", sync_to_thread=False, status_code=200)
    def responses(data: JSONBody[ResponsesRequest]) -> Response[bytes]:
        """OpenAI's Responses API, streamed (`response.*` events) or whole, routed to one
        backend; one continuing a stored response goes to the backend that stores it."""
        return _unreachable()

    @post("/v1/messages", sync_to_thread=False, status_code=200)
    def messages(data: JSONBody[MessagesRequest]) -> Response[bytes]:
        """Anthropic's Messages API, streamed (`message_start`... events) or whole, routed to
        one backend."""
        return _unreachable()

    return [chat_completions, completions, generate, responses, messages]


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="specroute",
        version=__version__,
        description="OpenAI-compatible proxy routing across SGLang speculative-decoding backends.",
        path="/openapi",
        render_plugins=[JsonRenderPlugin()],
    )

"""Every client route of SGLang 0.5.23 the proxy passes on, and how: relayed and routed by the
policy (generation: chat, completions, native generate, OpenAI Responses, Anthropic Messages),
pinned to the backend that stores a response (`/v1/responses/{id}`), or forwarded to any
healthy backend (embeddings, tokenizer, scoring, Ollama's). SGLang's administrative routes
are never forwarded: they are not listed here, so the client port answers them 404.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "FORWARDED",
    "GENERATION",
    "STORED_RESPONSE",
    "Route",
    "find_route",
    "plain_response_id",
    "stored_response_id",
    "upstream_path",
]


class Route(NamedTuple):
    """How one client request is passed on: its kind (`chat`, `responses`, `forward`...),
    the path it takes upstream, and whether it generates (policy, learning) or not."""

    kind: str
    path: str
    generates: bool


GENERATION: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/generate": "generate",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/invocations": "chat",  # SageMaker's chat route
}
"""POST routes that generate: routed by the policy, learned from, retried before the first
byte."""

FORWARDED: dict[tuple[str, str], str] = {
    ("POST", "/v1/messages/count_tokens"): "count_tokens",
    ("POST", "/v1/embeddings"): "embeddings",
    ("POST", "/v1/tokenize"): "tokenize",
    ("POST", "/tokenize"): "tokenize",
    ("POST", "/v1/detokenize"): "detokenize",
    ("POST", "/detokenize"): "detokenize",
    ("POST", "/v1/rerank"): "rerank",
    ("PUT", "/v1/rerank"): "rerank",
    ("POST", "/v1/score"): "score",
    ("POST", "/v1/classify"): "classify",
    ("POST", "/encode"): "encode",
    ("PUT", "/encode"): "encode",
    ("POST", "/classify"): "classify",
    ("PUT", "/classify"): "classify",
    ("POST", "/api/chat"): "ollama",
    ("POST", "/api/generate"): "ollama",
    ("GET", "/api/tags"): "ollama",
    ("POST", "/api/show"): "ollama",
    ("POST", "/v1/decisions"): "score",
    ("POST", "/v1/systemone"): "score",
    ("POST", "/vertex_generate"): "vertex",
    ("POST", "/parse_function_call"): "parse",
    ("POST", "/separate_reasoning"): "parse",
}
"""Inference routes that need no routing decision: any healthy backend serves them, under
the same keys, body limits and admission as generation."""

_VLLM_PATHS = {"/v1/tokenize": "/tokenize", "/v1/detokenize": "/detokenize"}
"""SGLang's versioned tokenizer routes as a vLLM server names them: it serves the unversioned
ones only (`vllm/entrypoints/serve/tokenize/api_router.py`); SGLang serves both."""


def upstream_path(path: str, engine: str | None) -> str:
    """The path a forwarded request takes on a backend of `engine` (None: not known yet)."""
    return _VLLM_PATHS.get(path, path) if engine == "vllm" else path


STORED_RESPONSE = "stored_response"
"""`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: to the response's home."""

_RESPONSES_PREFIX = "/v1/responses/"
_RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A response id as SGLang makes them (`resp_` and hex): it goes into upstream paths, so no
dots, slashes, percent signs or query characters."""


def plain_response_id(given: str) -> bool:
    """Whether `given` may be a response id (and so may go into an upstream path)."""
    return _RESPONSE_ID.fullmatch(given) is not None


def stored_response_id(method: str, path: str) -> str | None:
    """The response id of a retrieval or cancel path, else None."""
    if not path.startswith(_RESPONSES_PREFIX):
        return None
    rest = path[len(_RESPONSES_PREFIX) :]
    if method == "GET":
        response_id = rest
    elif method == "POST" and rest.endswith("/cancel"):
        response_id = rest[: -len("/cancel")]
    else:
        return None
    return response_id if plain_response_id(response_id) else None


def find_route(method: str, path: str) -> Route | None:
    """The route a request takes, or None when the proxy's own app answers it."""
    if method == "POST" or (method == "PUT" and path == "/generate"):
        kind = GENERATION.get(path)
        if kind is not None:
            return Route(kind, path, True)
    kind = FORWARDED.get((method, path))
    if kind is not None:
        return Route(kind, path, False)
    if stored_response_id(method, path) is not None:
        return Route(STORED_RESPONSE, path, False)
    return None

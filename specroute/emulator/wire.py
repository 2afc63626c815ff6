"""Request and response shapes of SGLang 0.5.23's HTTP API, as msgspec Structs and bytes.

Requests decode only what the emulator uses (unknown fields are ignored, as pydantic does in
SGLang). Responses keep SGLang's key order and its null-versus-absent choices, which come from
its pydantic serializers (`protocol.py`) and its msgspec chunk builder (`sse_utils.py`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "ContentPart",
    "ErrorResponse",
    "GenerateRequest",
    "SamplingParams",
    "SpecTokensDetails",
    "StreamOptions",
    "Usage",
    "encode",
    "finish_reason_json",
    "spec_details",
    "usage",
]

encode = msgspec.json.Encoder().encode


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ContentPart(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return " ".join(part.text or "" for part in self.content if part.type == "text")


class ChatRequest(msgspec.Struct):
    """`POST /v1/chat/completions`; `max_tokens` is deprecated for `max_completion_tokens`."""

    messages: list[ChatMessage]
    model: str = "default"
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    return_spec_tokens_details: bool = False
    continue_final_message: bool = False
    """An assistant message last in `messages` is continued, not answered (SGLang's
    `ChatCompletionRequest`)."""
    rid: str | None = None
    lora_path: str | list[str | None] | None = None


class CompletionRequest(msgspec.Struct):
    """`POST /v1/completions`; SGLang's default `max_tokens` is 16, as OpenAI's."""

    prompt: str | list[str | int | list[int]]
    model: str = "default"
    max_tokens: int = 16
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    return_spec_tokens_details: bool = False
    echo: bool = False
    rid: str | None = None
    lora_path: str | list[str | None] | None = None


class SamplingParams(msgspec.Struct):
    """The fields of SGLang's `SamplingParams` the emulator uses (its defaults)."""

    max_new_tokens: int | None = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    ignore_eos: bool = False


class GenerateRequest(msgspec.Struct):
    """`POST /generate`, SGLang's native API."""

    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None
    sampling_params: SamplingParams | None = None
    stream: bool = False
    rid: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """SGLang's OpenAI-route error body (`serving_base.create_error_response`)."""

    object: Literal["error"] = "error"
    message: str
    type: str = "BadRequestError"
    param: str | None = None
    code: int = 400


class Usage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: None = None
    reasoning_tokens: int = 0
    completion_tokens_details: None = None


class SpecTokensDetails(msgspec.Struct):
    spec_accept_rate: float
    spec_accept_length: float
    spec_cap_length: float
    spec_block_accept_length: float
    spec_num_correct_drafts: int
    spec_num_proposed_drafts: int
    spec_verify_ct: int
    spec_correct_drafts_histogram: list[int]
    spec_cap_lens_histogram: list[int]


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        completion_tokens=completion_tokens,
    )


def spec_details(meta: dict[str, Any]) -> SpecTokensDetails | None:
    """`sglext.spec_tokens_details` from a final meta_info; None when it has no spec keys
    (no speculation, or the request ended before its first verify)."""
    if "spec_verify_ct" not in meta:
        return None
    return SpecTokensDetails(
        spec_accept_rate=meta["spec_accept_rate"],
        spec_accept_length=meta["spec_accept_length"],
        spec_cap_length=0.0,
        spec_block_accept_length=0.0,
        spec_num_correct_drafts=meta["spec_num_correct_drafts"],
        spec_num_proposed_drafts=meta["spec_num_proposed_drafts"],
        spec_verify_ct=meta["spec_verify_ct"],
        spec_correct_drafts_histogram=meta.get("spec_correct_drafts_histogram", []),
        spec_cap_lens_histogram=[],
    )


def finish_reason_json(reason: str | None, generated: int, eos_token_id: int) -> Any:
    """SGLang's `meta_info.finish_reason` object for an engine finish reason."""
    if reason is None:
        return None
    if reason == "stop":
        return {"type": "stop", "matched": eos_token_id}
    if reason == "length":
        return {"type": "length", "length": generated}
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}

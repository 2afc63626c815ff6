"""Anthropic's Messages API as SGLang 0.5.23 serves it: the request read into a chat request,
the reply as one `message` object, or as `event:`-named server-sent events from
`message_start` to `message_stop` (no `[DONE]`), and `count_tokens`.

Shapes follow `sglang/srt/entrypoints/anthropic/serving.py` (`handle_messages`,
`_generate_anthropic_stream`, `_convert_response`, `_error_response`, `handle_count_tokens`,
`STOP_REASON_MAP`) and `anthropic/protocol.py` (events dumped with `exclude_none=True`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from specroute.emulator.streams import Reply, Responder
from specroute.emulator.wire import ChatMessage, ChatRequest, encode

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "anthropic_error",
    "chat_request",
    "message_body",
    "message_events",
]

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class Block(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class Message(msgspec.Struct):
    role: str
    content: str | list[Block]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return " ".join(block.text or "" for block in self.content if block.type == "text")


class MessagesRequest(msgspec.Struct):
    """`POST /v1/messages`: `model`, `messages` and `max_tokens` are required."""

    model: str
    messages: list[Message]
    max_tokens: int
    system: str | list[Block] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    ignore_eos: bool = False


class CountTokensRequest(msgspec.Struct):
    """`POST /v1/messages/count_tokens`."""

    model: str
    messages: list[Message]
    system: str | list[Block] | None = None


def anthropic_error(message: str, kind: str = "invalid_request_error") -> bytes:
    """`{"type": "error", "error": {...}}`, the Messages routes' error body."""
    return encode({"type": "error", "error": {"type": kind, "message": message}})


def chat_request(req: MessagesRequest | CountTokensRequest) -> ChatRequest:
    """The chat request a Messages request becomes: the system prompt, then the messages."""
    messages: list[ChatMessage] = []
    system = req.system
    if system:
        text = system if isinstance(system, str) else " ".join(b.text or "" for b in system)
        messages.append(ChatMessage(role="system", content=text))
    messages.extend(ChatMessage(role=m.role, content=m.text()) for m in req.messages)
    if isinstance(req, CountTokensRequest):
        return ChatRequest(messages=messages, model=req.model)
    return ChatRequest(
        messages=messages,
        model=req.model,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_k=req.top_k,
        ignore_eos=req.ignore_eos,
    )


def _stop_reason(reply: Reply) -> str:
    return _STOP_REASON.get(reply.job.finish_reason or "stop", "end_turn")


def _message(reply: Reply, message_id: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": reply.model,
    }


def message_body(reply: Reply) -> dict[str, Any]:
    """`_convert_response`: the whole message once the job is done."""
    text = reply.source.text(reply.job.produced)
    body = _message(reply, f"msg_{uuid.uuid4().hex}", [{"type": "text", "text": text}])
    body["stop_reason"] = _stop_reason(reply)
    body["stop_sequence"] = None
    body["usage"] = {
        "input_tokens": reply.job.seq.prompt_tokens,
        "output_tokens": reply.job.produced,
    }
    return body


def _event(data: dict[str, Any]) -> bytes:
    kind: str = data["type"]
    return b"event: " + kind.encode() + b"\ndata: " + encode(data) + b"\n\n"


async def message_events(responder: Responder, reply: Reply) -> AsyncIterator[bytes]:
    """The stream: `message_start` and the text block opened with the first token, one
    `content_block_delta` per engine iteration, then the block closed, `message_delta` with
    the stop reason and output tokens, and `message_stop`."""
    message_id = f"msg_{uuid.uuid4().hex}"
    started = False
    try:
        async for n in responder.pieces(reply):
            if n <= 0:
                continue
            out = b""
            if not started:
                started = True
                start = _message(reply, message_id, [])
                start["usage"] = {"input_tokens": reply.job.seq.prompt_tokens, "output_tokens": 0}
                out += _event({"type": "message_start", "message": start})
                block = {"type": "text", "text": ""}
                out += _event({"type": "content_block_start", "index": 0, "content_block": block})
            delta = {"type": "text_delta", "text": reply.source.text(n)}
            yield out + _event({"type": "content_block_delta", "index": 0, "delta": delta})
        out = b""
        if not started:  # a reply with no tokens still opens its message and its block
            start = _message(reply, message_id, [])
            start["usage"] = {"input_tokens": reply.job.seq.prompt_tokens, "output_tokens": 0}
            block = {"type": "text", "text": ""}
            out += _event({"type": "message_start", "message": start}) + _event(
                {"type": "content_block_start", "index": 0, "content_block": block}
            )
        end = {"stop_reason": _stop_reason(reply)}
        yield (
            out
            + _event({"type": "content_block_stop", "index": 0})
            + _event(
                {
                    "type": "message_delta",
                    "delta": end,
                    "usage": {"output_tokens": reply.job.produced},
                }
            )
            + _event({"type": "message_stop"})
        )
    finally:
        responder.driver.release(reply.job)

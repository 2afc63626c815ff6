"""OpenAI's Responses API as SGLang 0.5.23 serves it: the request read into a chat request,
the stored responses (`--enable-response-store`), and the reply as one `response` object or
as `event: response.*` server-sent events with no `[DONE]`.

Shapes follow `sglang/srt/entrypoints/openai/serving_responses.py` (`create_responses`,
`_responses_stream_generator_non_harmony`, `retrieve_responses`, `cancel_responses`, the
nested `{"error": {...}}` of `create_error_response`) and `ResponsesResponse` with its usage
serializer in `openai/protocol.py`.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from specroute.emulator.streams import Reply, Responder
from specroute.emulator.wire import ChatMessage, ChatRequest, encode

__all__ = [
    "STORE_DISABLED",
    "ResponseStore",
    "ResponsesRequest",
    "StoredResponse",
    "chat_request",
    "not_found",
    "response_body",
    "response_error",
    "response_events",
    "response_object",
]

STORE_DISABLED = (
    "Response store is disabled. Stateful Responses require --enable-response-store on a "
    "standalone server; response storage is unavailable in PD mode."
)
_STORE_MAX = 4096
"""Responses kept per server; SGLang keeps them all (until restart), the emulator the newest."""


class InputPart(msgspec.Struct):
    type: str = "input_text"
    text: str | None = None


class InputItem(msgspec.Struct):
    role: str = "user"
    content: str | list[InputPart] | None = None
    type: str = "message"

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return " ".join(part.text or "" for part in self.content or () if part.text)


class ResponsesRequest(msgspec.Struct):
    """`POST /v1/responses`: the fields the emulator uses (`ResponsesRequest` in protocol.py)."""

    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    background: bool | None = False
    ignore_eos: bool = False
    request_id: str | None = None


class StoredResponse(msgspec.Struct):
    """A finished response and the conversation it ends, for `previous_response_id`."""

    body: dict[str, Any]
    history: list[ChatMessage]


class ResponseStore:
    """The responses a server made, newest last, bounded."""

    def __init__(self, limit: int = _STORE_MAX) -> None:
        self._limit = limit
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        return self._items.get(response_id)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)


def response_error(message: str, status: int = 400, param: str | None = None) -> bytes:
    """The Responses routes' nested error body (`create_error_response`)."""
    kind = "invalid_request_error"
    return encode({"error": {"message": message, "type": kind, "param": param, "code": status}})


def not_found(response_id: str) -> bytes:
    return response_error(f"Response with id '{response_id}' not found.", 404, param="response_id")


def chat_request(req: ResponsesRequest, history: list[ChatMessage]) -> ChatRequest:
    """The chat request a Responses request becomes: instructions, the stored conversation,
    then the new input."""
    messages: list[ChatMessage] = []
    if req.instructions:
        messages.append(ChatMessage(role="system", content=req.instructions))
    messages.extend(history)
    if isinstance(req.input, str):
        messages.append(ChatMessage(role="user", content=req.input))
    else:
        messages.extend(ChatMessage(role=item.role, content=item.text()) for item in req.input)
    return ChatRequest(
        messages=messages,
        model=req.model or "default",
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_k=req.top_k,
        ignore_eos=req.ignore_eos,
        rid=req.request_id,
    )


def _status(reason: str | None) -> str:
    """`_status_from_finish_reason`."""
    if reason == "length":
        return "incomplete"
    if reason == "abort":
        return "failed"
    return "completed"


def _usage(reply: Reply) -> dict[str, Any]:
    prompt, output = reply.job.seq.prompt_tokens, reply.job.produced
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def response_object(
    req: ResponsesRequest, reply: Reply, *, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    """A `ResponsesResponse` in its field order."""
    finished = status not in ("queued", "in_progress")
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": reply.rid,
        "object": "response",
        "created_at": reply.created,
        "model": reply.model,
        "output": output,
        "status": status,
        "usage": _usage(reply) if finished else None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "reasoning": None,
        "store": req.store,
        "temperature": req.temperature,
        "text": None,
        "top_p": req.top_p,
        "truncation": "disabled",
        "user": None,
        "metadata": None,
    }


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": None,
    }
    return {
        "id": item_id,
        "content": [part] if status == "completed" or text else [],
        "role": "assistant",
        "status": status,
        "type": "message",
    }


def response_body(req: ResponsesRequest, reply: Reply) -> dict[str, Any]:
    """The whole response once the job is done."""
    text = reply.source.text(reply.job.produced)
    output = [_message(f"msg_{uuid.uuid4().hex}", text, "completed")]
    return response_object(req, reply, status=_status(reply.job.finish_reason), output=output)


def _event(kind: str, number: int, **fields: Any) -> bytes:
    payload = encode({"type": kind, "sequence_number": number, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


async def response_events(
    responder: Responder, req: ResponsesRequest, reply: Reply, done: list[dict[str, Any]]
) -> AsyncIterator[bytes]:
    """The stream: lifecycle events, the message item opened with its first text, one
    `response.output_text.delta` per engine iteration, the item closed, then the final
    `response.completed` (or `.incomplete`); the final object is appended to `done`."""
    number = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal number
        number += 1
        return _event(kind, number - 1, **fields)

    initial = response_object(req, reply, status="in_progress", output=[])
    yield event("response.created", response=initial) + event(
        "response.in_progress", response=initial
    )
    item_id = f"msg_{uuid.uuid4().hex}"
    place = {"item_id": item_id, "output_index": 0}
    parts: list[str] = []
    try:
        async for n in responder.pieces(reply):
            if n <= 0:
                continue
            text = reply.source.text(n)
            out = b""
            if not parts:
                out += event("response.output_item.added", output_index=0,
                             item=_message(item_id, "", "in_progress"))  # fmt: skip
                empty = {"type": "output_text", "text": "", "annotations": []}
                out += event("response.content_part.added", **place, content_index=0, part=empty)
            parts.append(text)
            out += event(
                "response.output_text.delta", **place, content_index=0, delta=text, logprobs=[]
            )
            yield out
        whole = "".join(parts)
        part: dict[str, Any] = {
            "type": "output_text",
            "text": whole,
            "annotations": [],
            "logprobs": None,
        }
        final = response_object(
            req,
            reply,
            status=_status(reply.job.finish_reason),
            output=[_message(item_id, whole, "completed")],
        )
        done.append(final)
        yield (
            event("response.output_text.done", **place, content_index=0, text=whole, logprobs=[])
            + event("response.content_part.done", **place, content_index=0, part=part)
            + event("response.output_item.done", output_index=0, item=final["output"][0])
            + event(f"response.{final['status']}", response=final)
        )
    finally:
        responder.driver.release(reply.job)

"""The routes coding agents speak, served by one emulated server: OpenAI's Responses API (with
its stored responses) and Anthropic's Messages API, each planned and run by the same engine as
chat completions (SGLang turns both into chat requests: `serving_responses.py`,
`anthropic/serving.py`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.di import NamedDependency

from specroute.emulator import messages_api, responses_api
from specroute.emulator.admission import Rejected, chat_plan
from specroute.emulator.responses_api import (
    STORE_DISABLED,
    ResponsesRequest,
    ResponseStore,
    StoredResponse,
    not_found,
    response_error,
)
from specroute.emulator.runtime import FAILED, NOT_JSON, Emulator
from specroute.emulator.text import chat_prompt_tokens
from specroute.emulator.wire import ChatMessage, encode

__all__ = ["AgentApis", "InjectedAgents"]


def _json(body: bytes, status: int = 200) -> Response[bytes]:
    return Response(content=body, status_code=status, media_type="application/json")


def _is_json(request: Request[Any, Any, Any]) -> bool:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media == "application/json"


class AgentApis:
    """`/v1/responses` (create, retrieve, cancel) and `/v1/messages` (and `count_tokens`)."""

    def __init__(self, emu: Emulator) -> None:
        self.emu = emu
        self.store = ResponseStore() if emu.options.enable_response_store else None

    # -- Responses ------------------------------------------------------------------------
    async def create_response(self, request: Request[Any, Any, Any]) -> Response[Any]:
        emu = self.emu
        if not emu.faults.admit():
            return _json(response_error(FAILED, 500), 500)
        if not _is_json(request):
            return _json(response_error(NOT_JSON), 400)
        try:
            req = msgspec.json.decode(await request.body(), type=ResponsesRequest)
        except msgspec.DecodeError as exc:
            return _json(response_error(str(exc)), 400)
        history = self._history(req.previous_response_id)
        if isinstance(history, Response):
            return history
        if req.request_id is None:
            req = msgspec.structs.replace(req, request_id=f"resp_{uuid.uuid4().hex}")
        chat = responses_api.chat_request(req, history)
        try:
            plan = chat_plan(chat, served=emu.served, context=emu.context_length)
        except Rejected as exc:
            return _json(response_error(str(exc)), 400)
        job = emu.submit(req.request_id, plan, stream=bool(req.stream))
        reply = emu.reply(job, plan, req.model or emu.served)

        def keep(body: dict[str, Any]) -> None:
            if self.store is not None and req.store:
                text = body["output"][0]["content"][0]["text"] if body["output"] else ""
                said = ChatMessage(role="assistant", content=text)
                self.store.put(body["id"], StoredResponse(body, [*chat.messages, said]))

        if req.stream:
            done: list[dict[str, Any]] = []
            events = responses_api.response_events(emu.responder, req, reply, done)
            return emu.stream(job, _after(events, done, keep))

        def whole() -> bytes:
            body = responses_api.response_body(req, reply)
            keep(body)
            return encode(body)

        return await emu.answer(request, job, whole)

    def _history(self, previous_id: str | None) -> list[ChatMessage] | Response[bytes]:
        """The conversation a request continues, or SGLang's refusal."""
        if previous_id is None:
            return []
        if self.store is None:
            return _json(response_error(STORE_DISABLED, param="previous_response_id"), 400)
        previous = self.store.get(previous_id)
        return _json(not_found(previous_id), 404) if previous is None else previous.history

    def retrieve_response(self, response_id: str) -> Response[bytes]:
        found = self._stored(response_id)
        if isinstance(found, Response):
            return found
        return _json(encode(found.body))

    def cancel_response(self, response_id: str) -> Response[bytes]:
        """A finished response stays as it was (SGLang cancels only background ones)."""
        return self.retrieve_response(response_id)

    def _stored(self, response_id: str) -> StoredResponse | Response[bytes]:
        if self.store is None:
            return _json(response_error(STORE_DISABLED, param="response_id"), 400)
        if not response_id.startswith("resp_"):
            message = (
                f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'."
            )
            return _json(response_error(message, param="response_id"), 400)
        found = self.store.get(response_id)
        return _json(not_found(response_id), 404) if found is None else found

    # -- Messages -------------------------------------------------------------------------
    async def messages(self, request: Request[Any, Any, Any]) -> Response[Any]:
        emu = self.emu
        if not emu.faults.admit():
            return _json(messages_api.anthropic_error(FAILED, "api_error"), 500)
        if not _is_json(request):
            return _json(messages_api.anthropic_error(NOT_JSON), 400)
        try:
            req = msgspec.json.decode(await request.body(), type=messages_api.MessagesRequest)
            plan = chat_plan(
                messages_api.chat_request(req), served=emu.served, context=emu.context_length
            )
        except (msgspec.DecodeError, Rejected) as exc:
            return _json(messages_api.anthropic_error(str(exc)), 400)
        job = emu.submit(None, plan, stream=bool(req.stream))
        reply = emu.reply(job, plan, req.model)
        if req.stream:
            return emu.stream(job, messages_api.message_events(emu.responder, reply))
        body = messages_api.message_body
        return await emu.answer(request, job, lambda: encode(body(reply)))

    async def count_tokens(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        try:
            req = msgspec.json.decode(await request.body(), type=messages_api.CountTokensRequest)
        except msgspec.DecodeError as exc:
            return _json(messages_api.anthropic_error(str(exc)), 400)
        contents = [m.text() or "" for m in messages_api.chat_request(req).messages]
        return _json(encode({"input_tokens": chat_prompt_tokens(contents)}))


async def _after(
    events: AsyncIterator[bytes],
    done: list[dict[str, Any]],
    keep: Callable[[dict[str, Any]], None],
) -> AsyncIterator[bytes]:
    """The stream's events, then the final response stored once it is whole."""
    async for chunk in events:
        yield chunk
    if done:
        keep(done[0])


InjectedAgents = NamedDependency[AgentApis]
"""A route handler's `agents` parameter, injected by name."""

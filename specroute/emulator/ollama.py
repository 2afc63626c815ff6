"""Ollama's API as SGLang 0.5.23 serves it (`sglang/srt/entrypoints/ollama/serving.py` and
`ollama/protocol.py`): `/api/chat` and `/api/generate`, streamed as newline-delimited JSON by
default (one line per engine iteration, then a `done` line), `/api/tags` and `/api/show`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec

from specroute.emulator.admission import Plan
from specroute.emulator.profiles import sampling_class
from specroute.emulator.streams import Reply, Responder
from specroute.emulator.text import chat_prompt_tokens, count_words
from specroute.emulator.wire import encode

__all__ = [
    "NDJSON",
    "OllamaChat",
    "OllamaGenerate",
    "ShowRequest",
    "chat_line",
    "ollama_lines",
    "ollama_plan",
    "show",
    "tags",
]

NDJSON = "application/x-ndjson"
_DEFAULT_NEW_TOKENS = 2048
"""SGLang's default for Ollama clients, who expect longer answers than its usual 128."""


class OllamaMessage(msgspec.Struct):
    role: str
    content: str


class Options(msgspec.Struct):
    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None


class OllamaChat(msgspec.Struct):
    model: str
    messages: list[OllamaMessage]
    stream: bool = True
    options: Options | None = None


class ShowRequest(msgspec.Struct):
    model: str


class OllamaGenerate(msgspec.Struct):
    model: str
    prompt: str = ""
    system: str | None = None
    stream: bool = True
    options: Options | None = None


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ollama_plan(req: OllamaChat | OllamaGenerate, context: int) -> Plan:
    """The engine's work for a chat or generate request (no length checks: SGLang's generate
    path truncates nothing here either)."""
    options = req.options or Options()
    if isinstance(req, OllamaChat):
        tokens = chat_prompt_tokens(m.content for m in req.messages)
        text = "\n".join(f"{m.role}: {m.content}" for m in req.messages)
    else:
        text = f"{req.system}\n\n{req.prompt}" if req.system else req.prompt
        tokens = count_words(text)
    budget = options.num_predict if options.num_predict is not None else _DEFAULT_NEW_TOKENS
    return Plan(
        prompt_tokens=tokens,
        prompt_text=text,
        max_new_tokens=max(0, min(budget, context - tokens)),
        klass=sampling_class(options.temperature, options.top_k),
        ignore_eos=False,
    )


def _line(model: str, chat: bool, text: str, done: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "created_at": _timestamp()}
    if chat:
        body["message"] = {"role": "assistant", "content": text, "images": None}
    else:
        body["response"] = text
    body["done"] = done
    body["done_reason"] = "stop" if done else None
    return body


def chat_line(reply: Reply, chat: bool) -> bytes:
    """The whole (non-streamed) answer, with its token counts."""
    body = _line(reply.model, chat, reply.source.text(reply.job.produced), True)
    body["total_duration"] = None
    body["load_duration"] = None
    body["prompt_eval_count"] = reply.job.seq.prompt_tokens
    body["prompt_eval_duration"] = None
    body["eval_count"] = reply.job.produced
    body["eval_duration"] = None
    return encode(body)


async def ollama_lines(responder: Responder, reply: Reply, chat: bool) -> AsyncIterator[bytes]:
    """One JSON line per engine iteration's text, then the `done` line."""
    try:
        async for n in responder.pieces(reply):
            if n > 0:
                yield encode(_line(reply.model, chat, reply.source.text(n), False)) + b"\n"
        yield encode(_line(reply.model, chat, "", True)) + b"\n"
    finally:
        responder.driver.release(reply.job)


def _family(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def tags(model: str) -> bytes:
    card = {
        "name": model,
        "model": model,
        "modified_at": _timestamp(),
        "size": 0,
        "digest": "sha256:sglang" + "0" * 58,
        "details": {"format": "sglang", "family": _family(model), "parameter_size": "unknown"},
    }
    return encode({"models": [card]})


def show(model: str, context: int) -> bytes:
    family = _family(model)
    for suffix in ("-Instruct", "-Chat", "-Base"):
        family = family.removesuffix(suffix)
    details = {"parent_model": "", "format": "sglang", "family": family, "families": [family]}
    return encode(
        {
            "license": "",
            "modelfile": f"FROM {model}\nPARAMETER num_ctx {context}\n",
            "parameters": f"num_ctx {context}",
            "template": "",
            "modified_at": _timestamp(),
            "details": {**details, "parameter_size": "unknown", "quantization_level": "unknown"},
            "model_info": {"general.architecture": family, "general.context_length": context},
        }
    )

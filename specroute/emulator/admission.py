"""From a decoded request to what the engine needs, with SGLang's validation and messages.

Each `*_plan` function returns a `Plan` (prompt size, output budget, sampling class, the text
that seeds the reply, the stop strings) or raises `Rejected` carrying SGLang's message for that
mistake. The sampling checks are SGLang's `SamplingParams.verify`
(python/sglang/srt/sampling/sampling_params.py), the length checks its OpenAI protocol and
serving code (python/sglang/srt/entrypoints/openai/protocol.py, serving_chat.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specroute.emulator.profiles import sampling_class
from specroute.emulator.text import StopMatch, chat_prompt_tokens, count_words, find_stop
from specroute.emulator.wire import ChatRequest, CompletionRequest, GenerateRequest

__all__ = ["Plan", "Rejected", "chat_plan", "completion_plan", "generate_plan"]


class Rejected(ValueError):
    """A request SGLang answers with 400, in SGLang's wording where it has one.

    `type` is the error body's `type`: "BadRequestError" for SGLang's own checks, "Bad Request"
    for what its pydantic schema rejects before a handler runs.
    """

    def __init__(self, message: str, type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.type = type


@dataclass(frozen=True, slots=True)
class Plan:
    prompt_tokens: int
    prompt_text: str
    max_new_tokens: int
    klass: str
    ignore_eos: bool
    stop: StopMatch | None = None
    """Where one of the request's `stop` strings ends it, if one does."""

    skip: int = 0
    """Tokens of the answer already written (a continued assistant message): the reply's
    text starts after them, so a continuation goes on exactly where the answer stopped."""


def _stop(stop: str | list[str] | None, seed: int, prompt: str, max_new: int) -> StopMatch | None:
    stops = () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
    return find_stop(seed, prompt, stops, max_new)


def _verify_sampling(temperature: float | None, top_p: float | None) -> None:
    """SGLang's `SamplingParams.verify` for the parameters the emulator reads (None: default)."""
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0.0):
        raise Rejected(f"temperature must be a non-negative finite number, got {temperature}.")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise Rejected(f"top_p must be in (0, 1], got {top_p}.")


def _lora_check(model: str, served: str, lora_path: object) -> None:
    adapter = lora_path if isinstance(lora_path, str) else None
    if isinstance(lora_path, list):
        adapter = next((a for a in lora_path if a), None)
    if ":" in model and model != served:
        # SGLang's `_parse_model_parameter`: the served name first, so `s3://b/m:a` names `a`.
        head = f"{served}:"
        rest = model[len(head) :] if model.startswith(head) else model.split(":", 1)[1]
        adapter = rest.strip() or adapter
    if adapter:
        raise Rejected(
            f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch the "
            "server with --enable-lora flag and preload adapters using --lora-paths or "
            "/load_lora_adapter endpoint."
        )


def _budget(prompt_tokens: int, max_new: int | None, context: int) -> int:
    """SGLang's length checks; no budget means whatever context is left."""
    if prompt_tokens >= context:
        raise Rejected(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    if max_new is None:
        return context - prompt_tokens
    if max_new < 0:
        raise Rejected(f"max_new_tokens must be at least 0, got {max_new}.")
    if max_new + prompt_tokens > context:
        raise Rejected(
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {max_new + prompt_tokens} tokens: "
            f"{prompt_tokens} tokens from the input messages and {max_new} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit."
        )
    return max_new


def _single_n(n: int) -> None:
    if n != 1:
        raise Rejected(f"n={n} is not supported by the specroute emulator; send n=1.")


def chat_plan(req: ChatRequest, *, served: str, context: int, seed: int = 0) -> Plan:
    if not req.messages:
        raise Rejected("Messages cannot be empty.")
    _single_n(req.n)
    max_new = req.max_completion_tokens or req.max_tokens
    if max_new and max_new > context:
        raise Rejected(
            f"max_completion_tokens is too large: {max_new}.This model supports at most "
            f"{context} completion tokens."
        )
    _lora_check(req.model, served, req.lora_path)
    _verify_sampling(req.temperature, req.top_p)
    messages = req.messages
    written = ""
    if req.continue_final_message and messages[-1].role == "assistant":
        # The template ends with the open assistant turn and its text: the generation
        # prompt of the messages before it plus the words written so far.
        messages, written = messages[:-1], messages[-1].text()
    contents = [m.text() for m in messages]
    skip = count_words(written)
    prompt_tokens = chat_prompt_tokens(contents) + skip
    prompt_text = "\n".join(f"{m.role}: {c}" for m, c in zip(messages, contents, strict=True))
    budget = _budget(prompt_tokens, max_new, context)
    return Plan(
        prompt_tokens=prompt_tokens,
        prompt_text=prompt_text,
        max_new_tokens=budget,
        klass=sampling_class(req.temperature, req.top_k),
        ignore_eos=req.ignore_eos,
        stop=_stop(req.stop, seed, prompt_text, budget),
        skip=skip,
    )


def _prompt(prompt: object) -> tuple[int, str]:
    """(tokens, seed text) of a single prompt: a string, or a list of token ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return count_words(prompt), prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt), " ".join(map(str, prompt))
    raise Rejected("Batched prompts are not supported by the specroute emulator; send one.")


def completion_plan(req: CompletionRequest, *, served: str, context: int, seed: int = 0) -> Plan:
    if req.max_tokens <= 0:
        raise Rejected("Value error, max_tokens must be positive", type="Bad Request")
    prompt = req.prompt
    if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
        raise Rejected("Prompt cannot be empty")
    _single_n(req.n)
    _lora_check(req.model, served, req.lora_path)
    _verify_sampling(req.temperature, req.top_p)
    tokens, text = _prompt(prompt)
    budget = _budget(tokens, req.max_tokens, context)
    return Plan(
        prompt_tokens=tokens,
        prompt_text=text,
        max_new_tokens=budget,
        klass=sampling_class(req.temperature, req.top_k),
        ignore_eos=req.ignore_eos,
        stop=_stop(req.stop, seed, text, budget),
    )


def generate_plan(req: GenerateRequest, *, context: int, seed: int = 0) -> Plan:
    source: object = req.text if req.text is not None else req.input_ids
    if source is None:
        raise Rejected("Either text, input_ids or input_embeds should be provided.")
    tokens, text = _prompt(source)
    params = req.sampling_params
    max_new = params.max_new_tokens if params else 128
    if params:
        _verify_sampling(params.temperature, params.top_p)
    budget = _budget(tokens, max_new, context)
    return Plan(
        prompt_tokens=tokens,
        prompt_text=text,
        max_new_tokens=budget,
        klass=sampling_class(params.temperature, params.top_k) if params else "high",
        ignore_eos=params.ignore_eos if params else False,
        stop=_stop(params.stop, seed, text, budget) if params else None,
    )

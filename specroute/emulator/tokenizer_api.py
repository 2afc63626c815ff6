"""SGLang 0.5.23's tokenizer routes (`/v1/tokenize`, `/v1/detokenize` and their unversioned
aliases; `openai/serving_tokenize.py`, `TokenizeResponse` in `openai/protocol.py`), and vLLM's
(`/tokenize`, `/detokenize`), over the emulator's one-word-per-token text: a word of the
vocabulary has the id its output would have.
"""

from __future__ import annotations

import hashlib

import msgspec

from specroute.emulator.text import TOKEN_ID_BASE, VOCABULARY
from specroute.emulator.wire import encode

__all__ = [
    "DetokenizeRequest",
    "TokenizeRequest",
    "VllmDetokenizeRequest",
    "VllmTokenizeRequest",
    "detokenize",
    "tokenize",
    "vllm_detokenize",
    "vllm_tokenize",
]

_IDS = {word: TOKEN_ID_BASE + i for i, word in enumerate(VOCABULARY)}
_OTHER_BASE = 200_000
"""Ids of words outside the vocabulary: stable, and clear of the vocabulary's."""


class TokenizeRequest(msgspec.Struct):
    prompt: str | list[str] = ""
    model: str = "default"


class DetokenizeRequest(msgspec.Struct):
    tokens: list[int | list[int]]
    model: str = "default"


def _ids(text: str) -> list[int]:
    out = []
    for word in text.split():
        known = _IDS.get(word)
        if known is None:
            digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
            known = _OTHER_BASE + int.from_bytes(digest, "big") % 100_000
        out.append(known)
    return out


def _text(ids: list[int]) -> str:
    words = [
        VOCABULARY[i - TOKEN_ID_BASE] if 0 <= i - TOKEN_ID_BASE < len(VOCABULARY) else f"<{i}>"
        for i in ids
    ]
    return "".join(" " + word for word in words)


def tokenize(req: TokenizeRequest, context: int) -> bytes:
    if isinstance(req.prompt, str):
        tokens = _ids(req.prompt)
        return encode({"tokens": tokens, "count": len(tokens), "max_model_len": context})
    lists = [_ids(p) for p in req.prompt]
    return encode({"tokens": lists, "count": [len(t) for t in lists], "max_model_len": context})


class VllmTokenizeRequest(msgspec.Struct):
    """vLLM's `TokenizeCompletionRequest` (`entrypoints/serve/tokenize/protocol.py`): one
    prompt, a string."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool = True


class VllmDetokenizeRequest(msgspec.Struct):
    tokens: list[int]
    model: str | None = None


def vllm_tokenize(req: VllmTokenizeRequest, context: int) -> bytes:
    """vLLM's `TokenizeResponse`: `count`, `max_model_len`, `tokens`, `token_strs`."""
    tokens = _ids(req.prompt)
    return encode(
        {"count": len(tokens), "max_model_len": context, "tokens": tokens, "token_strs": None}
    )


def vllm_detokenize(req: VllmDetokenizeRequest) -> bytes:
    """vLLM's `DetokenizeResponse`: the text as `prompt`."""
    return encode({"prompt": _text(req.tokens)})


def detokenize(req: DetokenizeRequest) -> bytes:
    tokens = req.tokens
    if tokens and isinstance(tokens[0], list):
        return encode({"text": [_text(t) for t in tokens if isinstance(t, list)]})
    return encode({"text": _text([t for t in tokens if isinstance(t, int)])})

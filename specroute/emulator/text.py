"""Deterministic stand-in text, one word per token, so clients can count tokens exactly.

Output: every generated token is one word from `VOCABULARY` with a leading space (" the",
" model"), drawn by a PRNG seeded from the server's `--seed` and a hash of the prompt. So
`len(text.split())` equals the completion tokens, and the same seed and prompt always give the
same text (a longer answer extends a shorter one). Token ids are `TOKEN_ID_BASE` + the word's
index; a natural stop matches `EOS_TOKEN_ID` (Qwen's `<|im_end|>`).

Prompts: the number of whitespace-separated words. Chat adds a template overhead of
`CHAT_TOKENS_PER_MESSAGE` per message (role markers) plus `CHAT_GENERATION_PROMPT_TOKENS` for
the assistant header, roughly what a ChatML template costs. Token-id prompts count their ids.

Stop strings: `find_stop` reads the same words as SGLang reads decoded text after each token:
the request ends at the token that completes the first of its `stop` strings, and the reply's
text is cut where that string begins (SGLang's trim); the tokens still count in `usage`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "CHAT_GENERATION_PROMPT_TOKENS",
    "CHAT_TOKENS_PER_MESSAGE",
    "EOS_TOKEN_ID",
    "STOP_SCAN_TOKENS",
    "TOKEN_ID_BASE",
    "VOCABULARY",
    "StopMatch",
    "TextSource",
    "chat_prompt_tokens",
    "count_words",
    "find_stop",
]

CHAT_TOKENS_PER_MESSAGE = 4
CHAT_GENERATION_PROMPT_TOKENS = 3
EOS_TOKEN_ID = 151645
TOKEN_ID_BASE = 1000
STOP_SCAN_TOKENS = 8192
"""How far `find_stop` reads ahead: a stop string not met by then never stops the request."""

_VOCABULARY_TEXT = """
    the of and to in is that for it as with was on be by this are from at or an have not
    which but all were can has more one their will also its other new some than time been
    when there would these two may first into only many after most over such where what
    about through between used each then both under while during well very because those
    system model data token tokens request server batch draft verify accept speculative
    decode length stream queue memory cache layer head expert router policy latency
    throughput step steps depth load value rate output input prompt text word answer
    question result number table list file code function class method module test case
    error state event signal graph node edge path route proxy client backend pool metric
    window average mean median sample class group order level point line plane space
    light sound water fire earth stone river mountain forest city road bridge house
    garden window door room table chair paper book letter story song music voice name
    people person child family friend teacher student worker doctor engineer writer
    morning evening night day week month year season summer winter spring autumn
    quick slow bright dark warm cold large small long short high low early late simple
    clear open close fast strong gentle quiet careful ready steady certain common
    make take give find keep hold bring carry build write read learn teach show tell
    move turn start stop run walk wait watch grow change follow measure compare choose
"""
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(_VOCABULARY_TEXT.split()))

_WORDS: tuple[str, ...] = tuple(" " + word for word in VOCABULARY)
_INDICES: tuple[int, ...] = tuple(range(len(VOCABULARY)))


def count_words(text: str) -> int:
    """Prompt tokens of a plain-text prompt: its whitespace-separated words."""
    return len(text.split())


def chat_prompt_tokens(contents: Iterable[str]) -> int:
    """Prompt tokens of a chat: words in every message plus the template overhead."""
    total = CHAT_GENERATION_PROMPT_TOKENS
    for content in contents:
        total += CHAT_TOKENS_PER_MESSAGE + count_words(content)
    return total


class TextSource:
    """One request's output: successive calls continue a single seeded word sequence, cut at
    `limit_chars` characters in all (a matched stop string's start) when given."""

    __slots__ = ("_choices", "_left")

    def __init__(self, seed: int, prompt: str, limit_chars: int | None = None) -> None:
        digest = hashlib.blake2b(prompt.encode(), digest_size=8, key=str(seed).encode()).digest()
        self._choices = random.Random(int.from_bytes(digest, "big")).choices
        self._left = limit_chars

    def take(self, tokens: int) -> list[int]:
        """Indices into `VOCABULARY` of the next `tokens` words."""
        return self._choices(_INDICES, k=tokens)

    @staticmethod
    def render(indices: list[int]) -> str:
        return "".join([_WORDS[i] for i in indices])

    def text(self, tokens: int) -> str:
        """The next `tokens` words as text, each with its leading space."""
        text = "".join(self._choices(_WORDS, k=tokens))
        if self._left is None:
            return text
        text, self._left = text[: self._left], max(0, self._left - len(text))
        return text

    @staticmethod
    def token_ids(indices: list[int]) -> list[int]:
        return [TOKEN_ID_BASE + i for i in indices]


@dataclass(frozen=True, slots=True)
class StopMatch:
    """Where a stop string ends a request: after `tokens` tokens, its text cut to `chars`."""

    tokens: int
    chars: int
    matched: str


def find_stop(seed: int, prompt: str, stops: Sequence[str], max_tokens: int) -> StopMatch | None:
    """The first token (up to `max_tokens`, at most `STOP_SCAN_TOKENS`) after which one of
    `stops` appears in the request's text; the first such string in the client's order wins,
    as in SGLang's `Req.check_finished`."""
    if not stops:
        return None
    source, text = TextSource(seed, prompt), ""
    longest = max(len(s) for s in stops)
    for tokens in range(1, min(max_tokens, STOP_SCAN_TOKENS) + 1):
        word = source.text(1)
        text += word
        tail = text[-(longest + len(word)) :]
        for stop in stops:
            if stop in tail:
                return StopMatch(tokens=tokens, chars=text.find(stop), matched=stop)
    return None

"""What the bench sends: prompts (synthetic, JSONL, ShareGPT), sampling mixes, request bodies."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

import msgspec

from specroute.speculation import is_greedy

__all__ = [
    "ApiSettings",
    "PreparedRequest",
    "PromptSettings",
    "Sampling",
    "Workload",
    "load_prompts",
]

_VOCABULARY = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy process music market sense nation plan college interest "
    "death experience effect use class control care field development role effort rate heart"
)


class Sampling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One class of traffic: its sampling settings, output length and share of the mix."""

    name: str = "default"
    weight: float = 1.0
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        # What SGLang refuses (`SamplingParams.verify`, srt/sampling/sampling_params.py).
        wrong = [
            f"{name} must be {rule}, not {value:g}"
            for name, value, rule, ok in (
                ("temperature", self.temperature, ">= 0", self.temperature >= 0),
                ("top_p", self.top_p, "in (0, 1]", 0 < self.top_p <= 1),
                ("max_tokens", self.max_tokens, ">= 1", self.max_tokens >= 1),
                ("weight", self.weight, ">= 0", self.weight >= 0),
            )
            if not ok
        ]
        if wrong:
            raise ValueError(f"traffic {self.name!r}: {'; '.join(wrong)}")

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)


class PromptSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where prompts come from: synthetic text of `words` words, or a JSONL / ShareGPT file."""

    source: Literal["synthetic", "jsonl", "sharegpt"] = "synthetic"
    path: str | None = None
    words: int = 256

    def __post_init__(self) -> None:
        if self.source != "synthetic" and not self.path:
            raise ValueError(f"prompt source {self.source!r} needs a path")
        if self.words < 1:
            raise ValueError("synthetic prompts need at least one word")


class ApiSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How requests are shaped on the wire, shared by every request of a run."""

    api: Literal["chat", "completions", "responses", "messages"] = "chat"
    """The route: chat or text completions, OpenAI's Responses API or Anthropic's Messages API
    (what coding agents send)."""
    model: str | None = None
    """None: the first model `/v1/models` lists."""
    extra_body: dict[str, Any] = msgspec.field(default_factory=dict)
    api_key: str | None = None
    continuous_usage: bool = True
    """Ask for `usage` on every chunk (exact tokens per chunk where the server supports it)."""
    spec_details: bool = True
    """Ask SGLang for per-request `sglext.spec_tokens_details`."""
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, not {self.timeout:g}")


class PreparedRequest(msgspec.Struct, frozen=True):
    """One request ready to send: its route, encoded body and traffic class."""

    path: str
    body: bytes
    klass: str
    greedy: bool


def _synthetic(count: int, words: int, rng: random.Random) -> list[str]:
    # A distinct random opening per prompt keeps prefix caches from making later ones free.
    vocabulary = _VOCABULARY.split()
    return [" ".join(rng.choices(vocabulary, k=words)) for _ in range(count)]


def _prompt_of(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return None
    for key in ("prompt", "text", "input", "question"):
        if isinstance(item.get(key), str):
            return str(item[key])
    messages = item.get("messages") or item.get("conversations") or []
    for turn in messages:
        if isinstance(turn, dict) and turn.get("role", turn.get("from")) in ("user", "human"):
            value = turn.get("content", turn.get("value"))
            if isinstance(value, str):
                return value
    return None


def load_prompts(settings: PromptSettings, count: int, seed: int) -> list[str]:
    """`count` prompts (a file's prompts are shuffled by `seed` and reused in turn)."""
    rng = random.Random(seed)
    if settings.source == "synthetic":
        return _synthetic(count, settings.words, rng)
    raw = Path(settings.path or "").read_bytes()
    if settings.source == "jsonl":
        items: list[Any] = [msgspec.json.decode(line) for line in raw.splitlines() if line.strip()]
    else:
        decoded = msgspec.json.decode(raw)
        items = decoded if isinstance(decoded, list) else [decoded]
    prompts = [p for p in (_prompt_of(item) for item in items) if p]
    if not prompts:
        raise ValueError(f"no prompts found in {settings.path}")
    rng.shuffle(prompts)
    return [prompts[i % len(prompts)] for i in range(count)]


class Workload:
    """Turns request numbers into prepared requests: prompt `i`, a class drawn from the mix."""

    def __init__(
        self, prompts: list[str], mix: list[Sampling], api: ApiSettings, model: str, seed: int
    ) -> None:
        if not prompts or not mix or sum(s.weight for s in mix) <= 0:
            raise ValueError("a workload needs prompts and a mix with positive weight")
        self._prompts = prompts
        self._mix = mix
        self._api = api
        self._model = model
        self._rng = random.Random(seed)

    def request(self, index: int) -> PreparedRequest:
        sampling = self._rng.choices(self._mix, weights=[s.weight for s in self._mix])[0]
        prompt = self._prompts[index % len(self._prompts)]
        if self._api.api in ("responses", "messages"):
            return self._agent_request(sampling, prompt)
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stream": True,
            "stream_options": {
                "include_usage": True,
                **({"continuous_usage_stats": True} if self._api.continuous_usage else {}),
            },
        }
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        if self._api.spec_details:
            body["return_spec_tokens_details"] = True
        if self._api.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/v1/completions"
        body.update(self._api.extra_body)
        return PreparedRequest(path, msgspec.json.encode(body), sampling.name, sampling.greedy)

    def _agent_request(self, sampling: Sampling, prompt: str) -> PreparedRequest:
        """A Responses or Messages request: their streams carry usage at their end, and no
        speculative details (SGLang has no field to ask for them there)."""
        body: dict[str, Any] = {"model": self._model}
        if self._api.api == "responses":
            body |= {"input": prompt, "max_output_tokens": sampling.max_tokens}
            path = "/v1/responses"
        else:
            body |= {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": sampling.max_tokens,
            }
            path = "/v1/messages"
        body |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "stream": True}
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        body.update(self._api.extra_body)
        return PreparedRequest(path, msgspec.json.encode(body), sampling.name, sampling.greedy)

"""Request migration: a streamed chat, completions or `/generate` reply whose backend fails
after the client got its first bytes (or drains) continues on another backend, relayed into
the same client stream. This module decides what may move and writes the continuation.

The continuation is exact where SGLang 0.5.23 can continue exactly: a chat request gets the
text relayed so far as a final assistant message with `continue_final_message: true`
(`ChatCompletionRequest` in `srt/entrypoints/openai/protocol.py`: an assistant message last in
`messages` is continued rather than answered); on a vLLM backend the same, with
`add_generation_prompt: false`, since vLLM applies the chat template with its default of true and
the template refuses both (`check_generation_prompt` in vLLM's
`entrypoints/openai/chat_completion/protocol.py`; transformers' `apply_chat_template`); a
completions request gets its prompt plus that text; a `/generate` request its token ids plus the
ids generated (its text plus the text, for a text prompt). A stream that relayed no text yet is
sent again as it was. Requests whose continuation would not be the same answer (tools, `n > 1`,
logprobs, `response_format` or SGLang's constrained decoding, `echo`, `suffix`, token-id
completions prompts, batches, reasoning or tool calls seen in the stream) are not moved: they
end as they did before. The stream relays that feed and replay it are in `continued`."""

from __future__ import annotations

from time import monotonic
from typing import Any

import msgspec

from specroute.pool import BadReply, Holds, Stalled, TimedOut, UpstreamFailure
from specroute.pool.engines import Engine
from specroute.proxy.aborts import BackendAborted

__all__ = [
    "MIGRATING_ROUTES",
    "Migration",
    "Moved",
    "NativeEvent",
    "draining_past",
    "failure_cause",
    "move_due",
    "tokenize_body",
]

MIGRATING_ROUTES = frozenset(("chat", "completions", "generate"))
_NATIVE_MAX_NEW_TOKENS = 128
"""SGLang's `SamplingParams.max_new_tokens` default, the budget of a `/generate` without one."""

_ANY = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.Encoder().encode


class _Blockers(msgspec.Struct):
    """The request fields under which a continuation would not be the same answer."""

    n: int | None = None
    tools: msgspec.Raw = msgspec.Raw()
    functions: msgspec.Raw = msgspec.Raw()
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    response_format: msgspec.Raw = msgspec.Raw()
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None
    structural_tag: msgspec.Raw = msgspec.Raw()
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    continue_final_message: bool | None = None
    prompt: msgspec.Raw = msgspec.Raw()


_blockers = msgspec.json.Decoder(_Blockers)


class _NativeSampling(msgspec.Struct):
    n: int | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None
    structural_tag: str | None = None


class _NativeBlockers(msgspec.Struct):
    """SGLang's `/generate` fields under which a continuation would not be the same answer."""

    text: msgspec.Raw = msgspec.Raw()
    input_ids: list[int] | None = None
    sampling_params: _NativeSampling | None = None
    return_logprob: bool | list[bool] | None = None
    input_embeds: msgspec.Raw = msgspec.Raw()
    image_data: msgspec.Raw = msgspec.Raw()


_native_blockers = msgspec.json.Decoder(_NativeBlockers)


def _native_refusal(body: bytes) -> str | None:
    """Why a `/generate` request cannot be continued exactly: a batch, embeddings or images,
    logprobs, n > 1, constrained decoding."""
    try:
        b = _native_blockers.decode(body)
    except msgspec.DecodeError:
        return "batch_or_undecodable"  # a batch's `input_ids` is a list of lists
    if b.input_ids is None and bytes(b.text)[:1] != b'"':
        return "batch_or_undecodable"
    if _given(b.input_embeds) or _given(b.image_data):
        return "embeds_or_images"
    if b.return_logprob:
        return "logprobs"
    sp = b.sampling_params or _NativeSampling()
    if (sp.n or 1) != 1:
        return "n"
    if sp.regex or sp.ebnf or sp.json_schema or sp.structural_tag:
        return "response_format"
    return None


class NativeMeta(msgspec.Struct):
    id: str | None = None


class NativeEvent(msgspec.Struct):
    """A `/generate` stream's event: the whole text and token ids so far."""

    text: str = ""
    output_ids: list[int] = []
    meta_info: NativeMeta | None = None


_native_event = msgspec.json.Decoder(NativeEvent)


def _given(raw: msgspec.Raw) -> bool:
    """A field present and not null (nor an empty list of tools)."""
    return bytes(raw).strip() not in (b"", b"null", b"[]")


def _refusal(route: str, body: bytes) -> str | None:
    """Why a request cannot be continued exactly, or None when it can."""
    if route == "generate":
        return _native_refusal(body)
    try:
        b = _blockers.decode(body)
    except msgspec.DecodeError:
        return "undecodable"
    if (b.n or 1) != 1 or (b.best_of or 1) != 1:
        return "n"
    if _given(b.tools) or _given(b.functions):
        return "tools"
    if b.logprobs or b.top_logprobs:
        return "logprobs"
    if _given(b.response_format) or _given(b.structural_tag) or b.regex or b.ebnf or b.json_schema:
        return "response_format"
    if b.continue_final_message:
        return "continue_final_message"
    if route == "completions":
        if b.echo or b.suffix:
            return "echo_or_suffix"
        if bytes(b.prompt)[:1] != b'"':
            return "prompt_not_text"
    return None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: msgspec.Raw = msgspec.Raw()


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None


class _Event(msgspec.Struct):
    id: str | None = None
    created: int | None = None
    model: str | None = None
    choices: list[_Choice] = []


_event = msgspec.json.Decoder(_Event)


_HELD_BYTES = 16 * 1024
"""Events a movable stream keeps unread: relaying them costs a list append, and a stream that
ends before this much (most chat replies) is never parsed; a longer one is read in batches."""


class Migration:
    """One request's moves: whether it may move at all (`refusal`), the text relayed so far,
    the first reply's envelope, and how many moves it has made (`moves`, at most `limit`).
    The request and the relayed events are read only when asked (a move, or a drain's check)
    or when `_HELD_BYTES` of events wait: the stream's relay pays no parsing for them."""

    __slots__ = (
        "_body",
        "_checked",
        "_held",
        "_held_bytes",
        "_request_refusal",
        "_stream_refusal",
        "_text",
        "created",
        "id",
        "last",
        "limit",
        "model",
        "moves",
        "relayed",
        "route",
        "ttft",
    )

    def __init__(self, route: str, body: bytes, limit: int) -> None:
        self.route = route
        self.limit = limit
        self._body = body
        self._checked = False
        self._request_refusal: str | None = None
        self._stream_refusal: str | None = None
        self.moves = 0
        self._text: list[str] = []
        self._held: list[bytes] = []
        self._held_bytes = 0
        self.last: bytes | None = None
        """A `/generate` stream's latest event: it carries the whole text and ids so far."""
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.relayed = 0
        """The text so far in tokens, as the backend continuing it counts them."""
        self.ttft: float | None = None
        """The client's first token, from the first backend (a continuation's stream times
        its own first event: its backend's first token, as the estimators learn it)."""

    @property
    def refusal(self) -> str | None:
        """Why the request cannot be continued exactly (a field of its body, or reasoning or
        tool calls in the stream so far), or None when it can."""
        if not self._checked:
            self._checked = True
            self._request_refusal = _refusal(self.route, self._body)
        if self._held:
            self._read_held()
        return self._request_refusal or self._stream_refusal

    @property
    def text(self) -> str:
        if self.route == "generate":
            return self.native().text
        if self._held:
            self._read_held()
        return "".join(self._text)

    def envelope(self) -> tuple[str | None, int | None, str | None]:
        """The first reply's `id`, `created` and `model`."""
        if self._held:
            self._read_held()
        return self.id, self.created, self.model

    def native(self) -> NativeEvent:
        """What a `/generate` stream has produced so far (decoded only when it moves)."""
        if self.last is None:
            return NativeEvent()
        try:
            return _native_event.decode(self.last)
        except msgspec.DecodeError:
            return NativeEvent()

    def token_count(self) -> int | None:
        """The output so far in tokens where the stream says it (`/generate`'s ids; none when
        no text was relayed), else None: the continuing backend's tokenizer counts it."""
        if self.route == "generate":
            return len(self.native().output_ids)
        return None if self.text else 0

    def take(self, payload: bytes) -> None:
        """One relayed event of the reply, kept to be read when asked (`/generate`'s latest
        only: each carries the whole output so far)."""
        if self.route == "generate":
            self.last = payload
            return
        self._held.append(payload)
        self._held_bytes += len(payload)
        if self._held_bytes > _HELD_BYTES:
            self._read_held()

    def _read_held(self) -> None:
        """The events held so far, in order: the envelope (once) and the text."""
        held, self._held, self._held_bytes = self._held, [], 0
        for payload in held:
            try:
                event = _event.decode(payload)
            except msgspec.DecodeError:
                continue
            if self.id is None:
                self.id, self.created, self.model = event.id, event.created, event.model
            for choice in event.choices:
                delta = choice.delta
                if delta is not None:
                    if delta.reasoning_content or _given(delta.tool_calls):
                        self._stream_refusal = "reasoning_or_tool_calls"
                    if delta.content:
                        self._text.append(delta.content)
                elif choice.text:
                    self._text.append(choice.text)

    def body(
        self, upstream: bytes, relayed_tokens: int, engine: Engine | None = None
    ) -> bytes | None:
        """The continuation's body for a backend of `engine`: the request as it went
        upstream, the text so far added, its output budget reduced by `relayed_tokens`; None
        when no budget is left."""
        if self.route != "generate" and not self.text:
            return upstream
        data = _ANY.decode(upstream)
        if self.route == "generate":
            return self._native_body(data, relayed_tokens)
        for key in ("max_completion_tokens", "max_tokens"):
            budget = data.get(key)
            if isinstance(budget, int):
                if budget - relayed_tokens <= 0:
                    return None
                data[key] = budget - relayed_tokens
        if self.route == "chat":
            data["messages"] = [*data["messages"], {"role": "assistant", "content": self.text}]
            data["continue_final_message"] = True
            if engine == "vllm":
                data["add_generation_prompt"] = False
        else:
            data["prompt"] = data["prompt"] + self.text
        return _encode(data)

    def finish_tail(self) -> bytes | None:
        """The end of a chat or completions stream whose whole output budget was relayed
        before its backend failed: the answer is whole, so it ends as the engine would have
        ended it, a last chunk with `finish_reason: "length"` and `[DONE]`, under the first
        reply's id. Its usage chunk is left out (the backend that stopped never said the
        prompt's count). None for `/generate`, whose last event carries the whole output
        and its `meta_info`: that stream keeps its error."""
        if self.route == "generate":
            return None
        id_, created, model = self.envelope()
        if self.route == "chat":
            kind = "chat.completion.chunk"
            choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": "length"}
        else:
            kind = "text_completion"
            choice = {"index": 0, "text": "", "finish_reason": "length", "logprobs": None}
        event = {"id": id_, "object": kind, "created": created, "model": model,
                 "choices": [choice]}  # fmt: skip
        return b"data: " + _encode(event) + b"\n\ndata: [DONE]\n\n"

    def _native_body(self, data: dict[str, Any], relayed_tokens: int) -> bytes | None:
        """`/generate`'s continuation: the token ids so far after the prompt's ids (exact), or
        the text so far after its text."""
        so_far = self.native()
        params = data.get("sampling_params") or {}
        budget = params.get("max_new_tokens")
        budget = _NATIVE_MAX_NEW_TOKENS if budget is None else budget
        if not isinstance(budget, int) or budget - relayed_tokens <= 0:
            return None
        data["sampling_params"] = {**params, "max_new_tokens": budget - relayed_tokens}
        if data.get("input_ids") is not None:
            data["input_ids"] = [*data["input_ids"], *so_far.output_ids]
        else:
            data["text"] = data["text"] + so_far.text
        return _encode(data)


def tokenize_body(model: str | None, text: str) -> bytes:
    """The `/tokenize` request for the text relayed so far (no special tokens: the chat
    template or the prompt around it carries those): SGLang 0.5.23's `TokenizeRequest` and
    vLLM's `TokenizeCompletionRequest` (`entrypoints/serve/tokenize/protocol.py`) alike."""
    body: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
    if model is not None:
        body["model"] = model
    return _encode(body)


class Moved(UpstreamFailure):
    """The stream's backend has drained past `migration.drain_s`: the proxy moves the stream
    itself (no fault of the backend's)."""


def draining_past(holds: Holds, name: str, after_s: float) -> bool:
    """Whether backend `name` has been draining for `after_s` seconds or more."""
    held = holds.get(name)
    return held is not None and held.state == "draining" and monotonic() - held.since >= after_s


def move_due(migration: Migration, holds: Holds, name: str, after_s: float) -> bool:
    """Whether a stream on `name` should move now: its backend drained past `after_s` and the
    stream can still be continued exactly."""
    held = holds.get(name)  # `draining_past`, spelled out: this runs for every chunk
    if held is None or held.state != "draining" or monotonic() - held.since < after_s:
        return False
    return migration.refusal is None


def failure_cause(exc: UpstreamFailure) -> str:
    """The metric's `cause` label of a failure mid-stream."""
    if isinstance(exc, Moved):
        return "drain"
    if isinstance(exc, Stalled | TimedOut):
        return "stalled"
    if isinstance(exc, BadReply):
        return "bad_reply"
    if isinstance(exc, BackendAborted):
        return "aborted"
    return "interrupted"

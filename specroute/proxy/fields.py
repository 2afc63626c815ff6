"""The routing fields of each relayed route's body, decoded from the client's bytes (only what
a policy reads: model, stream, output budget, sampling), the features a policy sees, and the
body to forward with what the proxy adds to learn from the reply."""

from __future__ import annotations

from typing import Any

import msgspec

from specroute.config import LearnConfig
from specroute.errors import BadRequestError
from specroute.lanes import BATCH, Lane
from specroute.policies import RouteRequest
from specroute.speculation import is_greedy

__all__ = [
    "ChatFields",
    "CompletionFields",
    "Extras",
    "Fields",
    "ForwardFields",
    "GenerateFields",
    "MessagesFields",
    "ResponsesFields",
    "RoutingFields",
    "decode_fields",
    "route_request",
    "upstream_body",
]


class Extras(msgspec.Struct, kw_only=True):
    """What the proxy asked for that the client did not: remove it from the reply."""

    strip_usage: bool = False
    strip_sglext: bool = False


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class SamplingParams(msgspec.Struct, kw_only=True):
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class RoutingFields(msgspec.Struct, kw_only=True):
    """OpenAI routes; `messages`/`prompt` are checked for presence only (kept raw). `model`
    may be absent (SGLang serves such a request as its served model) but not null (SGLang's
    schema refuses that too)."""

    model: str | msgspec.UnsetType = msgspec.UNSET
    stream: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = 1
    stream_options: StreamOptions | msgspec.UnsetType | None = msgspec.UNSET
    return_spec_tokens_details: bool | msgspec.UnsetType | None = msgspec.UNSET
    service_tier: str | None = None
    priority: int | msgspec.UnsetType | None = msgspec.UNSET


class ChatFields(RoutingFields, kw_only=True):
    messages: msgspec.Raw


class CompletionFields(RoutingFields, kw_only=True):
    prompt: msgspec.Raw


class GenerateFields(msgspec.Struct, kw_only=True):
    """SGLang's native /generate: no model field, sampling in `sampling_params`."""

    stream: bool | None = False
    model: str | None = None
    sampling_params: SamplingParams | None = None
    priority: int | msgspec.UnsetType | None = msgspec.UNSET


class ResponsesFields(msgspec.Struct, kw_only=True):
    """OpenAI's Responses API: `input` checked for presence only (kept raw); `model` may be
    absent (the server's model)."""

    input: msgspec.Raw
    model: str | None = None
    stream: bool | None = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    previous_response_id: str | None = None


class MessagesFields(msgspec.Struct, kw_only=True):
    """Anthropic's Messages API: `max_tokens` is required, as Anthropic requires it."""

    model: str
    messages: msgspec.Raw
    max_tokens: int
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class ForwardFields(msgspec.Struct, kw_only=True):
    """A forwarded route: only the model, to find a backend that serves it."""

    model: str | None = None


Fields = RoutingFields | GenerateFields | ResponsesFields | MessagesFields | ForwardFields
"""The routing fields of any relayed route."""

_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "chat": msgspec.json.Decoder(ChatFields),
    "completions": msgspec.json.Decoder(CompletionFields),
    "generate": msgspec.json.Decoder(GenerateFields),
    "responses": msgspec.json.Decoder(ResponsesFields),
    "messages": msgspec.json.Decoder(MessagesFields),
}
_forward = msgspec.json.Decoder(ForwardFields)


def decode_fields(route: str, body: bytes) -> Fields:
    """Decode the routing fields; malformed JSON or a missing field is a 400. A forwarded
    route's body is the backend's to judge: only its model is read, when it has one."""
    decoder = _DECODERS.get(route)
    if decoder is None:
        try:
            return _forward.decode(body) if body.strip() else ForwardFields()
        except (msgspec.DecodeError, RecursionError):
            return ForwardFields()
    try:
        fields: Fields = decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise BadRequestError(f"invalid request: {exc}", param=_param(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequestError("request body is nested too deeply") from exc
    return fields


def _param(message: str) -> str | None:
    """The field msgspec blames, as OpenAI's `param`: the path after "at" (`Expected `int |
    null`, got `str` - at `$.max_tokens``), else a missing field's name."""
    at = message.rpartition(" - at `")[2] if " - at `" in message else None
    if at is not None:
        return at.rstrip("`").removeprefix("$.") or None
    if "`" not in message:
        return None
    return message.split("`")[1].removeprefix("$.") or None


def route_request(
    route: str,
    fields: Fields,
    klass: str | None,
    lane: Lane = BATCH,
    target_tok_s: float = 0.0,
) -> RouteRequest:
    """The features a policy sees; the workload class is the client's header or model+sampling
    (the same class whichever API the request came in by); the lane and its speed target as
    `proxy.lanes` resolved them."""
    n: int | None = 1
    if isinstance(fields, RoutingFields):  # first: chat and completions are most requests
        max_tokens = fields.max_completion_tokens or fields.max_tokens
        temperature, top_p, top_k, n = fields.temperature, fields.top_p, fields.top_k, fields.n
    elif isinstance(fields, ForwardFields):
        return RouteRequest(
            route=route, model=fields.model, workload_class=klass or route, stream=False, lane=lane
        )
    elif isinstance(fields, ResponsesFields):
        max_tokens = fields.max_output_tokens
        temperature, top_p, top_k = fields.temperature, fields.top_p, fields.top_k
    elif isinstance(fields, MessagesFields):
        max_tokens = fields.max_tokens
        temperature, top_p, top_k = fields.temperature, fields.top_p, fields.top_k
    else:
        sp = fields.sampling_params or SamplingParams()
        max_tokens, temperature, top_p, top_k = (
            sp.max_new_tokens,
            sp.temperature,
            sp.top_p,
            sp.top_k,
        )
    model = fields.model if isinstance(fields.model, str) else None
    sampling = "greedy" if is_greedy(temperature, top_k) else "sampled"
    return RouteRequest(
        route=route,
        model=model,
        workload_class=klass or f"{model or '-'}:{sampling}",
        stream=bool(fields.stream),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        n=n or 1,
        lane=lane,
        target_tok_s=target_tok_s,
    )


def upstream_body(body: bytes, fields: Fields, learn: LearnConfig) -> tuple[bytes, Extras]:
    """The body to send upstream and what to strip from the reply. Appends to the client's bytes
    when the added keys are absent; re-encodes only if the client set them to something else.
    Responses, Messages and the forwarded routes go as they came: their replies carry their
    usage already and SGLang has no speculative details for them."""
    if not isinstance(fields, RoutingFields):
        return body, Extras()
    opts = fields.stream_options
    want_usage = isinstance(opts, StreamOptions) and bool(
        opts.include_usage or opts.continuous_usage_stats
    )
    want_sglext = fields.return_spec_tokens_details is True
    add_usage = bool(fields.stream) and learn.include_usage and not want_usage
    add_sglext = learn.spec_tokens_details and not want_sglext
    extras = Extras(strip_usage=add_usage, strip_sglext=add_sglext)
    if not (add_usage or add_sglext):
        return body, extras
    absent = (not add_usage or opts is msgspec.UNSET) and (
        not add_sglext or fields.return_spec_tokens_details is msgspec.UNSET
    )
    if absent:
        head = body.rstrip()
        tail = b""
        if add_usage:
            tail += b',"stream_options":{"include_usage":true}'
        if add_sglext:
            tail += b',"return_spec_tokens_details":true'
        return b"".join((memoryview(head)[:-1], tail, b"}")), extras  # one copy of the body
    data = msgspec.json.decode(body)
    if add_usage:
        options = data.get("stream_options") or {}
        data["stream_options"] = {**options, "include_usage": True}
    if add_sglext:
        data["return_spec_tokens_details"] = True
    return msgspec.json.encode(data), extras

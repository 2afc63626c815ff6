"""The OpenAPI document cannot drift from the relay: every field the relay decodes to route a
request is documented for that route, with the same name (nested ones too)."""

from __future__ import annotations

import msgspec
import pytest

from specroute.proxy import fields, openapi


def _names(struct: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(struct)}


@pytest.mark.parametrize(
    ("decoded", "documented"),
    [
        (fields.ChatFields, openapi.ChatCompletionRequest),
        (fields.CompletionFields, openapi.CompletionRequest),
        (fields.GenerateFields, openapi.GenerateRequest),
        (fields.ResponsesFields, openapi.ResponsesRequest),
        (fields.MessagesFields, openapi.MessagesRequest),
        (fields.StreamOptions, openapi.StreamOptions),
        (fields.SamplingParams, openapi.SamplingParams),
    ],
)
def test_every_routing_field_is_documented(
    decoded: type[msgspec.Struct], documented: type[msgspec.Struct]
) -> None:
    missing = _names(decoded) - _names(documented)
    assert not missing, f"{documented.__name__} does not document {sorted(missing)}"

"""Errors render in OpenAI's shape with the right status, type and Retry-After."""

from __future__ import annotations

import json

import pytest

from specroute.errors import (
    AuthenticationError,
    BadRequestError,
    ModelNotFoundError,
    NoHealthyBackendError,
    PayloadTooLargeError,
    QueueFullError,
    SpecrouteError,
    UpstreamError,
    UpstreamTimeoutError,
    error_body,
    error_event,
)


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (BadRequestError("bad"), 400, "invalid_request_error"),
        (AuthenticationError("who"), 401, "invalid_request_error"),
        (ModelNotFoundError("no", param="model"), 404, "invalid_request_error"),
        (PayloadTooLargeError("big"), 413, "invalid_request_error"),
        (QueueFullError("full"), 429, "rate_limit_error"),
        (NoHealthyBackendError("none"), 503, "service_unavailable"),
        (UpstreamTimeoutError("slow"), 504, "timeout"),
        (UpstreamError("teapot", status=418), 418, "upstream_error"),
    ],
)
def test_every_error_renders_openai_shape(exc: SpecrouteError, status: int, kind: str) -> None:
    body = json.loads(error_body(exc))
    assert exc.status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind
    assert body["error"]["message"] == exc.message


def test_model_not_found_carries_its_code_and_param() -> None:
    body = json.loads(error_body(ModelNotFoundError("no such model", param="model")))
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["param"] == "model"


def test_retry_after_header_is_whole_seconds() -> None:
    assert NoHealthyBackendError("x", retry_after=0.2).headers() == [(b"retry-after", b"1")]
    assert BadRequestError("x").headers() == []


def test_stream_error_event_ends_with_done() -> None:
    event = error_event(UpstreamTimeoutError("stalled"))
    first, second, rest = event.split(b"\n\n")
    assert json.loads(first.removeprefix(b"data: "))["error"]["code"] == "upstream_timeout"
    assert second == b"data: [DONE]"
    assert rest == b""

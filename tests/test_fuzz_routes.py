"""Fuzzing every route of a real proxy: hypothesis-made bodies, headers, paths and methods, and
schemathesis cases from the proxy's own OpenAPI document (which declares the relayed routes).
Whatever comes in, the answer is a success or an error in OpenAI's shape, never a 500 of the
proxy's own making, and the proxy's in-flight counts return to zero."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode
from servers import Server, run_server, start_emulator

from specroute.proxy.openapi import OPENAPI_PATH

MODEL = "Qwen/Qwen3.5-122B-A10B"
KEY = "sk-fuzz-test"
AUTH = {"authorization": f"Bearer {KEY}"}
RELAYED = ["/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses", "/v1/messages"]
ROUTES = [
    *RELAYED,
    "/health",
    "/ready",
    "/metrics",
    "/v1/models",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/pool",
    "/policy",
    OPENAPI_PATH,
]
# Errors a proxy may rightly answer with: the backend's own, or no backend free or healthy.
UPSTREAM_TYPES = {"upstream_error", "timeout", "service_unavailable", "rate_limit_error"}
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = tmp_path_factory.mktemp("fuzz") / "proxy.toml"
    config.write_text(f'api_keys = ["{KEY}"]\nmax_body_bytes = 65536\n[health]\ninterval_s = 0.5\n')
    backend_ctx = start_emulator(3, "--time-scale", "1000", "--seed", "9")
    with backend_ctx as backend:
        args = ["serve", "--config", str(config), "--backend", backend.url]
        with run_server(args) as server:
            yield server


@pytest.fixture(scope="module")
def http(proxy: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        yield client


# How each API's streams end: chat's `[DONE]`, the Responses and Messages APIs' last events.
STREAM_ENDS = {
    "/v1/responses": (b'"type":"response.', b'"type":"error"'),
    "/v1/messages": (b'data: {"type":"message_stop"}',),
}


def check_reply(status: int, content: bytes, content_type: str, path: str = "") -> None:
    """A success, or an error in OpenAI's shape (Anthropic's on /v1/messages); a 5xx only
    when it is the backend's or the pool's (never an internal error, never a bare framework
    page)."""
    if status < 400:
        if content_type.startswith("text/event-stream"):
            last = content.rstrip().rsplit(b"\n\n", 1)[-1]
            ends = STREAM_ENDS.get(path, (b"data: [DONE]",))
            assert any(end in last for end in ends), content[-200:]
        return
    body = httpx.Response(status, content=content).json()
    if path == "/v1/messages" and "type" in body:  # a POST: the other methods are not relayed
        assert body["type"] == "error", content[:300]
        assert {"type", "message"} <= set(body["error"]), content[:300]
        assert status != 500, content[:300]
        return
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), content[:300]
    if status >= 500:
        assert error["type"] in UPSTREAM_TYPES, content[:300]


def check(reply: httpx.Response) -> None:
    content_type = reply.headers.get("content-type", "")
    check_reply(reply.status_code, reply.content, content_type, reply.request.url.path)


SCALAR = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
SMALL_OR_ODD_INT = st.integers(-3, 24) | st.sampled_from([2**31, 2**63, 2**64, -(2**63)])
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": JSON}
    ),
    max_size=3,
)


def _request_body() -> st.SearchStrategy[dict[str, Any]]:
    """Request-shaped bodies: the fields routing reads, each of the right type or not."""
    fields = {
        "model": st.sampled_from([MODEL]) | JSON,
        "messages": MESSAGES | JSON,
        "prompt": st.text(max_size=30) | JSON,
        "text": st.text(max_size=30) | JSON,
        "max_tokens": SMALL_OR_ODD_INT | JSON,
        "stream": st.booleans() | JSON,
        "temperature": st.floats(0, 2) | JSON,
        "n": st.sampled_from([1, 2]) | JSON,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
        "sampling_params": st.fixed_dictionaries({"max_new_tokens": SMALL_OR_ODD_INT}) | JSON,
        "return_spec_tokens_details": st.booleans() | JSON,
        "input": st.text(max_size=30) | MESSAGES | JSON,
        "max_output_tokens": SMALL_OR_ODD_INT | JSON,
        "previous_response_id": st.sampled_from(["resp_0", "x"]) | JSON,
    }
    return st.fixed_dictionaries({}, optional=fields)


@FUZZ
@given(path=st.sampled_from(RELAYED), body=_request_body())
def test_request_shaped_bodies_get_an_answer_never_an_internal_error(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    check(http.post(path, json=body, headers=AUTH))


@FUZZ
@given(
    path=st.sampled_from(ROUTES),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    body=st.binary(max_size=512),
)
def test_any_bytes_with_any_method_on_any_route_never_cause_a_500(
    http: httpx.Client, path: str, method: str, body: bytes
) -> None:
    check(http.request(method, path, content=body, headers=AUTH))


HEADER_VALUE = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=300
).map(str.strip)  # the client itself refuses values with spaces at either end


@FUZZ
@given(
    path=st.sampled_from(ROUTES),
    request_id=HEADER_VALUE,
    klass=HEADER_VALUE,
    authorization=HEADER_VALUE,
    content_type=HEADER_VALUE,
)
def test_odd_header_values_never_cause_a_500(
    http: httpx.Client,
    path: str,
    request_id: str,
    klass: str,
    authorization: str,
    content_type: str,
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    headers = {
        "x-request-id": request_id.encode("latin-1"),
        "x-specroute-class": klass.encode("latin-1"),
        "content-type": content_type.encode("latin-1"),
    }
    for auth in (authorization.encode("latin-1"), AUTH["authorization"].encode()):
        reply = http.post(path, json=body, headers={**headers, "authorization": auth})
        check(reply)


@FUZZ
@given(path=st.text(max_size=60), query=st.text(max_size=60))
def test_unknown_paths_and_queries_are_answered_in_openai_shape(
    http: httpx.Client, path: str, query: str
) -> None:
    # percent signs stay raw, so broken escapes (`%zz`, `%c3`) reach the proxy as they are
    raw_path = "/" + urllib.parse.quote(path, safe="/%:@!$&'()*+,;=")
    for method in ("GET", "POST"):
        check(http.request(method, raw_path, params={"q": query}, headers=AUTH))


def test_in_flight_counts_are_zero_after_the_fuzzing(http: httpx.Client) -> None:
    backends = http.get("/pool", headers=AUTH).json()["backends"]
    assert [b["in_flight"] for b in backends] == [0]


def test_schemathesis_cases_from_the_proxys_openapi_document(proxy: Server) -> None:
    """Positive and negative cases for every operation of the document the proxy serves.
    (Driven through hypothesis directly: schemathesis's pytest plugin predates pytest 9.)"""
    schema = schemathesis.openapi.from_url(proxy.url + OPENAPI_PATH, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= set(RELAYED)
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    cases = st.one_of([op.as_strategy(generation_mode=m) for op in operations for m in modes])

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def call(case: Any) -> None:
        note(f"{case.method} {case.path} body={case.body!r} query={case.query!r}")
        reply = case.call(base_url=proxy.url, headers=AUTH, timeout=60)
        content_type = (reply.headers.get("content-type") or [""])[0]  # a list per header
        if reply.is_truncated or reply.stream_cut_short:  # it reads only the start of those
            content_type = "truncated"
        check_reply(reply.status_code, reply.content, content_type, case.path)

    call()


def test_the_openapi_document_declares_the_relayed_routes(http: httpx.Client) -> None:
    paths = http.get(OPENAPI_PATH, headers=AUTH).json()["paths"]
    assert set(RELAYED) <= set(paths)
    assert Path(OPENAPI_PATH).name == "openapi.json"

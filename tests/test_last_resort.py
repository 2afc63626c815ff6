"""What the client and the log get when something outside the expected error tree goes wrong:
a plug-in policy that raises or returns nonsense, a request the HTTP parser cannot read."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import inprocess
from inprocess import Upstream, event, stream_of
from structlog.testing import capture_logs

from specroute.policies import Decision, Outcome, PoolView, RouteRequest

CHAT = {"model": inprocess.MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
_EVENTS = [event({"id": "r", "choices": [{"index": 0, "delta": {"content": "a"}}]})]


class RaisingPolicy:
    """A third-party policy whose `choose` has a bug."""

    name = "raising"

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        raise ZeroDivisionError("no backends to divide among")

    def observe(self, outcome: Outcome) -> None:
        pass


class ListPolicy(RaisingPolicy):
    """A third-party policy that names its backends in a list, which no rule expects."""

    name = "list"

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        return Decision(backend=[b.name for b in view.backends], reason="all")  # type: ignore[arg-type]


async def _post(policy: RaisingPolicy) -> httpx.Response:
    async with (
        Upstream(stream_of([*_EVENTS, b"data: [DONE]\n\n"])).running() as backend,
        inprocess.proxy({"only": backend}) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        app.state.policy = policy  # as a policy registered under `specroute.policies` would be
        return await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "r7"})


def test_a_policy_whose_choose_raises_is_logged_and_the_request_still_routed() -> None:
    with capture_logs() as logs:
        reply = asyncio.run(_post(RaisingPolicy()))
    assert reply.status_code == 200
    assert reply.headers["x-specroute-backend"] == "only"
    failed = [e for e in logs if e["event"] == "policy_choose_failed"]
    assert [(e["policy"], e["log_level"], e["exc_info"]) for e in failed] == [
        ("raising", "error", True)
    ]
    finished = [e for e in logs if e["event"] == "request_finished"]
    assert finished[0]["reason"] == "policy failed (ZeroDivisionError); first"


def test_a_bug_outside_the_error_tree_is_a_500_in_openai_shape_with_the_request_id() -> None:
    with capture_logs() as logs:
        reply = asyncio.run(_post(ListPolicy()))
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-request-id"] == "r7"
    assert reply.json() == {
        "error": {
            "message": "internal error",
            "type": "internal_error",
            "param": None,
            "code": None,
        }
    }
    failed = [e for e in logs if e["event"] == "request_failed"]
    assert [(e["request_id"], e["log_level"], e["exc_info"]) for e in failed] == [
        ("r7", "error", True)
    ]
    assert [e["status"] for e in logs if e["event"] == "request_finished"] == [500]


def test_a_connect_request_gets_a_400_and_logs_no_traceback() -> None:
    errors, head = asyncio.run(_connect())
    assert errors == []  # before: an AttributeError traceback per request, from the event loop
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n")
    assert b'"type":"invalid_request_error"' in head


async def _connect() -> tuple[list[dict[str, Any]], bytes]:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    async with (
        Upstream(stream_of([])).running() as backend,
        inprocess.proxy({"only": backend}) as (url, _),
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n")
        head = await reader.read()  # the proxy closes the connection after its answer
        writer.close()
    return errors, head

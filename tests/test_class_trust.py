"""`x-specroute-class` names a workload class only for keys allowed to: any other client's
header is ignored and counted, so it cannot move another class's acceptance estimate or make
up classes of its own; names are plain, so the `/metrics` label stays bounded and clean."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import inprocess
import pytest
from emulator_support import parse_metrics
from inprocess import Send, Upstream, event

from specroute.config import load_config
from specroute.errors import ConfigError

TRUSTED = "sk-trusted-service"
OTHER = "sk-any-client"
OWN_CLASS = f"{inprocess.MODEL}:sampled"


async def _by_prompt(body: bytes, send: Send) -> None:
    """A backend whose acceptance depends on the prompt: `cold` text drafts well (accept
    length 1.9 at depth 1), `hot` text badly (1.2)."""
    tokens = 39 if b"cold" in body else 25
    details = {"spec_tokens_details": {"spec_verify_ct": 20, "spec_accept_length": tokens / 20}}
    usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}
    parts = [
        event({"id": "r", "choices": [{"index": 0, "delta": {"content": "x " * tokens}}]}),
        event({"id": "r", "choices": [], "usage": None, "sglext": details}),
        event({"id": "r", "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
    for part in parts:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _chat(text: str) -> dict[str, Any]:
    return {"model": inprocess.MODEL, "messages": [{"role": "user", "content": text}],
            "stream": True}  # fmt: skip


async def _send(client: httpx.AsyncClient, key: str | None, klass: str, text: str) -> None:
    headers = {"x-specroute-class": klass}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    reply = await client.post("/v1/chat/completions", json=_chat(text), headers=headers)
    assert reply.status_code == 200, reply.text


async def _keyed_traffic() -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    keys = {"api_keys": [TRUSTED, OTHER], "class_keys": [TRUSTED]}
    auth = {"authorization": f"Bearer {TRUSTED}"}
    async with (
        Upstream(_by_prompt).running() as backend,
        inprocess.proxy({"only": backend}, **keys) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        for _ in range(3):
            await _send(client, TRUSTED, "code", "cold")
        before = (await client.get("/pool", headers=auth)).json()["estimates"]["classes"]
        for _ in range(30):  # hot-sampled traffic passed off as the greedy code class
            await _send(client, OTHER, "code", "hot")
        await _send(client, OTHER, "made-up", "hot")
        await _send(client, TRUSTED, 'bad"name\\', "hot")
        after = (await client.get("/pool", headers=auth)).json()["estimates"]["classes"]
        metrics = parse_metrics((await client.get("/metrics")).text)
    return before, after, metrics


def test_a_client_without_the_class_privilege_cannot_move_another_classs_estimate() -> None:
    before, after, metrics = asyncio.run(_keyed_traffic())
    assert before["code"]["samples"] == 3
    assert after["code"] == before["code"]  # untouched by 30 labelled requests
    assert after["code"]["alpha"] == pytest.approx(0.9, abs=0.01)
    assert after[OWN_CLASS]["samples"] == 32  # the others counted under their own class
    assert after[OWN_CLASS]["alpha"] == pytest.approx(0.2, abs=0.01)
    assert set(after) == {"code", OWN_CLASS}  # no made-up class, no unplain name
    ignored = "specroute_class_header_ignored_total"
    assert metrics[f'{ignored}{{reason="not_allowed"}}'] == 31
    assert metrics[f'{ignored}{{reason="invalid"}}'] == 1
    routed = [k for k in metrics if k.startswith("specroute_routed_requests_total{")]
    assert {k.split('workload_class="')[1].split('"')[0] for k in routed} == {"code", OWN_CLASS}


async def _open_traffic() -> dict[str, Any]:
    async with (
        Upstream(_by_prompt).running() as backend,
        inprocess.proxy({"only": backend}) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        await _send(client, None, "code", "cold")
        classes: dict[str, Any] = (await client.get("/pool")).json()["estimates"]["classes"]
    return classes


def test_without_api_keys_every_client_may_name_its_class() -> None:
    assert set(asyncio.run(_open_traffic())) == {"code"}


def test_class_keys_must_be_api_keys() -> None:
    with pytest.raises(ConfigError, match="class_keys"):
        load_config(environ={}, overrides={"api_keys": ["a"], "class_keys": ["b"]})
    config = load_config(environ={}, overrides={"admin_key": "adm", "class_keys": ["adm"]})
    assert config.class_keys == ("adm",)

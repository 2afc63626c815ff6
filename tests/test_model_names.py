"""Model names as SGLang resolves them, through the proxy: with the official `openai` client, a
one-model pool answers `default`, any name and `name:adapter` as its server does (its LoRA
adapters' cards do not make it a pool of several); a two-model pool routes by the served name
before `:adapter` and answers 404 only to a name it does not serve, listing the names it does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import inprocess
import openai
import pytest
from inprocess import Send, Upstream
from servers import Server, run_server, start_emulator

from specroute.config import BackendConfig, Config
from specroute.pool import Pool, UpstreamClient
from specroute.proxy.intake import served_name

MODEL = "Qwen/Qwen3.5-122B-A10B"
OTHER = "s3://models/beta"
"""A served name with colons of its own, as SGLang allows (an object-storage path)."""
FAST = ("--time-scale", "50", "--seed", "7")
CONFIG = """
[health]
interval_s = 0.2
timeout_s = 1.0
success_threshold = 1
[retry]
backoff_s = 0.01
"""
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "name three rivers"}
]


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[Server, Server]]:
    with (
        start_emulator(1, *FAST) as first,
        start_emulator(3, *FAST, "--model-name", OTHER) as second,
    ):
        yield first, second


def _serve(tmp: Path, *backends: Server) -> Iterator[Server]:
    config = tmp / "proxy.toml"
    config.write_text(CONFIG)
    args = ["serve", "--config", str(config), "--policy", "round_robin"]
    for backend in backends:
        args += ["--backend", backend.url]
    with run_server(args) as server:
        yield server


@pytest.fixture(scope="module")
def one_model(
    backends: tuple[Server, Server], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from _serve(tmp_path_factory.mktemp("one"), backends[0])


@pytest.fixture(scope="module")
def two_models(
    backends: tuple[Server, Server], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from _serve(tmp_path_factory.mktemp("two"), *backends)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _chat(server: Server, model: str) -> openai.types.chat.ChatCompletion:
    with _client(server) as sdk:
        return sdk.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )


def _refusal(server: Server, model: str, *, stream: bool = False) -> openai.APIStatusError:
    with _client(server) as sdk, pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, stream=stream)
    return info.value


@pytest.mark.parametrize("model", ["default", "gpt-4o"])
def test_any_name_reaches_a_one_model_pool_as_it_reaches_sglang(
    backends: tuple[Server, Server], one_model: Server, model: str
) -> None:
    direct, proxied = _chat(backends[0], model), _chat(one_model, model)
    assert proxied.model == direct.model == model
    assert proxied.choices[0].message.content == direct.choices[0].message.content
    assert proxied.usage == direct.usage


@pytest.mark.parametrize("stream", [False, True])
def test_an_adapter_name_gets_the_servers_own_answer_through_the_proxy(
    backends: tuple[Server, Server], one_model: Server, stream: bool
) -> None:
    direct = _refusal(backends[0], f"{MODEL}:sql", stream=stream)
    proxied = _refusal(one_model, f"{MODEL}:sql", stream=stream)
    assert isinstance(direct, openai.BadRequestError)
    assert type(proxied) is type(direct)
    assert proxied.message == direct.message
    assert "LoRA adapter 'sql' was requested" in proxied.message


def test_two_model_pool_routes_by_the_served_name(two_models: Server) -> None:
    with _client(two_models) as sdk:
        for model, steps in [(MODEL, "1"), (MODEL, "1"), (OTHER, "3"), (OTHER, "3")]:
            raw = sdk.chat.completions.with_raw_response.create(
                model=model, messages=MESSAGES, max_tokens=4
            )
            assert raw.headers["x-specroute-steps"] == steps
            assert raw.parse().model == model


@pytest.mark.parametrize(
    ("model", "steps", "adapter"),
    [(f"{MODEL}:sql", "1", "sql"), (f"{OTHER}:code", "3", "code")],
)
def test_two_model_pool_routes_an_adapter_by_the_name_before_it(
    backends: tuple[Server, Server], two_models: Server, model: str, steps: str, adapter: str
) -> None:
    error = _refusal(two_models, model)
    assert error.response.headers["x-specroute-steps"] == steps
    assert isinstance(error, openai.BadRequestError)
    assert f"LoRA adapter '{adapter}' was requested" in error.message
    direct = _refusal(backends[1] if steps == "3" else backends[0], model)
    assert error.message == direct.message


@pytest.mark.parametrize("model", ["default", "gpt-4o:sql"])
def test_two_model_pool_refuses_a_name_it_does_not_serve_listing_what_it_serves(
    two_models: Server, model: str
) -> None:
    error = _refusal(two_models, model)
    assert isinstance(error, openai.NotFoundError)
    assert error.code == "model_not_found"
    assert f"served: {MODEL}, {OTHER}" in error.message


def test_without_model_a_one_model_pool_answers_as_its_server_does(
    backends: tuple[Server, Server], one_model: Server
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    direct = httpx.post(backends[0].url + "/v1/chat/completions", json=body)
    proxied = httpx.post(one_model.url + "/v1/chat/completions", json=body)
    assert direct.status_code == proxied.status_code == 200, proxied.text
    assert proxied.json()["model"] == direct.json()["model"]
    assert proxied.json()["choices"] == direct.json()["choices"]


def test_without_model_a_two_model_pool_asks_for_one_naming_them(two_models: Server) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4}
    reply = httpx.post(two_models.url + "/v1/chat/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["type"]) == ("model", "invalid_request_error")
    assert f"serves several models ({MODEL}, {OTHER})" in error["message"]


@pytest.mark.parametrize("model", [MODEL, OTHER])
def test_models_retrieve_finds_either_through_a_two_model_pool_as_from_its_server(
    backends: tuple[Server, Server], two_models: Server, model: str
) -> None:
    with _client(two_models) as sdk:
        assert sdk.models.retrieve(model).id == model
        with pytest.raises(openai.NotFoundError):
            sdk.models.retrieve("default")
    with _client(backends[0 if model == MODEL else 1]) as direct:
        assert direct.models.retrieve(model).id == model


@pytest.mark.parametrize(
    ("model", "served", "expected"),
    [
        ("a:b:c", {"a", "a:b"}, "a:b"),  # the longest served name before an adapter
        ("a:b", {"a", "b"}, "a"),
        ("c:a", {"a", "b"}, None),
        ("c:a", {"a"}, "a"),
    ],
)
def test_served_name_reads_name_colon_adapter_as_sglang(
    model: str, served: set[str], expected: str | None
) -> None:
    assert served_name(model, served) == expected


class LoraUpstream(Upstream):
    """SGLang with `--enable-lora --lora-paths sql=...`: `/v1/models` lists the adapter too."""

    def __init__(self) -> None:
        super().__init__(_answer)
        base = {"id": inprocess.MODEL, "object": "model", "root": inprocess.MODEL, "parent": None}
        adapter = {"id": "sql", "object": "model", "root": "/loras/sql", "parent": inprocess.MODEL}
        self._info["/v1/models"] = {"object": "list", "data": [base, adapter]}


async def _answer(body: bytes, send: Send) -> None:
    model = json.loads(body)["model"]
    reply = {"id": "r", "object": "chat.completion", "model": model, "choices": []}
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(reply).encode()})


def test_a_lora_servers_adapters_do_not_make_a_pool_of_several_models() -> None:
    sent = [
        json.dumps({"model": name, "messages": [], "max_tokens": 2}).encode()
        for name in ("default", "sql", f"{inprocess.MODEL}:sql", "other:sql")
    ]
    upstream = LoraUpstream()
    statuses = asyncio.run(_post_all(upstream, sent))
    assert statuses == [200] * len(sent)
    assert [b[: len(s) - 1] for b, s in zip(upstream.bodies, sent, strict=True)] == [
        s[:-1] for s in sent
    ]  # forwarded as the client wrote them (the proxy appends only what it learns from)


async def _post_all(upstream: Upstream, bodies: list[bytes]) -> list[int]:
    headers = {"content-type": "application/json"}
    async with (
        upstream.running() as backend,
        inprocess.proxy({"lora": backend}) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        replies = [
            await client.post("/v1/chat/completions", content=b, headers=headers) for b in bodies
        ]
    return [r.status_code for r in replies]


def test_the_pools_names_follow_backends_that_list_new_ones_come_or_go() -> None:
    config = Config(
        backends=tuple(
            BackendConfig(url=f"http://127.0.0.1:{10000 + i}", name=f"b{i}") for i in range(2)
        )
    )
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    for backend in pool.backends:
        backend.apply_server_info({"served_model_name": "qwen"})
    assert pool.known_models() == {"qwen"}
    pool.backends[1].apply_models({"data": [{"id": "qwen"}, {"id": "sql", "parent": "qwen"}]})
    assert pool.known_models() == {"qwen", "sql"}
    assert pool.base_models() == {"qwen"}
    pool.remove_backend("b1")
    assert pool.known_models() == {"qwen"}

"""The official `openai` client consumes the emulator like any OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from servers import Server, start_emulator


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with start_emulator(3, "--time-scale", "8", "--api-key", "k3y") as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="k3y", max_retries=0) as sdk:
        yield sdk


MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "name three rivers"}
]


def test_chat_completion_counts_match_the_words(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="anything", messages=MESSAGES, max_completion_tokens=15, temperature=0.5
    )
    text = reply.choices[0].message.content or ""
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(text.split())
    assert reply.usage.prompt_tokens == 3 + 4 + 3
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="anything",
        messages=MESSAGES,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "length"
    assert usage is not None
    assert usage.completion_tokens == len(text.split()) == 20


def test_completions_stream_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model="anything", prompt="one two three", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 8
    assert len(whole.choices[0].text.split()) == 8
    pieces = client.completions.create(
        model="anything",
        prompt="one two three",
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, usage = "", None
    for chunk in pieces:
        usage = chunk.usage or usage
        text += "".join(c.text for c in chunk.choices)
    assert text == whole.choices[0].text  # same seed and prompt: the same words
    assert usage is not None
    assert usage.completion_tokens == 8


@pytest.mark.parametrize("name", ["default", "anything-at-all"])
def test_any_model_name_is_served_and_echoed_as_sglang_does(
    client: openai.OpenAI, name: str
) -> None:
    reply = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=3)
    assert reply.model == name
    assert reply.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_an_adapter_name_is_refused_as_sglang_refuses_it_without_lora(
    client: openai.OpenAI, stream: bool
) -> None:
    (served,) = client.models.list().data
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=f"{served.id}:sql", messages=MESSAGES, max_tokens=3, stream=stream
        )
    body = info.value.response.json()
    assert body["type"] == "BadRequestError"
    assert body["message"].startswith("LoRA adapter 'sql' was requested, but LoRA is not enabled.")


def test_models_list(client: openai.OpenAI) -> None:
    (model,) = client.models.list().data
    assert model.owned_by == "sglang"


def test_models_retrieve_answers_the_served_model_and_404_for_others(
    client: openai.OpenAI,
) -> None:
    (listed,) = client.models.list().data
    assert client.models.retrieve(listed.id).id == listed.id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_wrong_key_is_an_authentication_error(server: Server) -> None:
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0) as sdk,
        pytest.raises(openai.AuthenticationError),
    ):
        sdk.models.list()


async def _async_chat(url: str) -> int:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k3y", max_retries=0) as sdk:
        reply = await sdk.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=6, extra_body={"ignore_eos": True}
        )
        assert reply.usage is not None
        return reply.usage.completion_tokens


def test_async_client_works_too(server: Server) -> None:
    assert asyncio.run(_async_chat(server.url)) == 6

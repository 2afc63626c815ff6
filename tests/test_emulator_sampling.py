"""The emulator takes and refuses sampling parameters as SGLang 0.5.23 does, one test per
parameter, through the official `openai` client. SGLang's checks: `SamplingParams.verify` in
python/sglang/srt/sampling/sampling_params.py (temperature, top_p, max_new_tokens >= 0),
`CompletionRequest.validate_max_tokens_positive` in
python/sglang/srt/entrypoints/openai/protocol.py (completions' max_tokens > 0; chat passes
`max_completion_tokens or max_tokens` on as max_new_tokens), and `Req.check_finished` with the
detokenizer's trim for `stop` (the first string in the client's order, cut from the text, its
tokens still counted)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from servers import Server, start_emulator

from specroute.emulator.text import TextSource, find_stop

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "name three rivers"}
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with start_emulator(2, "--time-scale", "50", "--seed", "11") as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as sdk:
        yield sdk


def _chat(client: openai.OpenAI, **params: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=params.pop("max_tokens", 24),
        extra_body={"ignore_eos": True}, **params,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("temperature", [-1.0, -0.01])
def test_a_negative_temperature_is_refused_as_sglang_refuses_it(
    client: openai.OpenAI, temperature: float
) -> None:
    expected = f"temperature must be a non-negative finite number, got {temperature}."
    with pytest.raises(openai.BadRequestError, match=expected.replace(".", r"\.")):
        _chat(client, temperature=temperature)
    with pytest.raises(openai.BadRequestError, match="temperature must be a non-negative"):
        client.completions.create(model="default", prompt="x", temperature=temperature)
    assert _chat(client, temperature=0.0).choices[0].message.content  # 0 is greedy


@pytest.mark.parametrize("top_p", [2.0, 0.0, -0.5])
def test_top_p_outside_0_to_1_is_refused(client: openai.OpenAI, top_p: float) -> None:
    with pytest.raises(openai.BadRequestError, match=rf"top_p must be in \(0, 1\], got {top_p}"):
        _chat(client, top_p=top_p)
    with pytest.raises(openai.BadRequestError, match="top_p must be in"):
        client.completions.create(model="default", prompt="x", top_p=top_p)
    assert _chat(client, top_p=1.0).usage.completion_tokens == 24  # type: ignore[union-attr]


def test_max_tokens_0_gives_no_token_in_chat_and_a_400_in_completions(
    client: openai.OpenAI,
) -> None:
    reply = _chat(client, max_tokens=0)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 0
    assert reply.choices[0].message.content == ""
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="max_tokens must be positive"):
        client.completions.create(model="default", prompt="x", max_tokens=0)


def test_a_stop_string_ends_the_reply_before_it_and_counts_its_tokens(
    client: openai.OpenAI,
) -> None:
    full = _chat(client, temperature=0.0).choices[0].message.content or ""
    words = full.split()
    stop = words[7]  # a word the reply reaches; it may also occur earlier, inside or alone
    cut = full.index(stop)
    reply = _chat(client, temperature=0.0, stop=["never-in-the-vocabulary", stop])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra is not None
    assert choice.model_extra["matched_stop"] == stop
    assert choice.message.content == full[:cut]
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(full[: cut + len(stop)].split())
    streamed = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=24, temperature=0.0, stop=stop,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stop_string_the_reply_never_reaches_changes_nothing(client: openai.OpenAI) -> None:
    plain = _chat(client, temperature=0.0)
    stopped = _chat(client, temperature=0.0, stop="never-in-the-vocabulary")
    assert stopped.choices[0].message.content == plain.choices[0].message.content
    assert stopped.choices[0].finish_reason == "length"


def test_find_stop_ends_the_request_where_the_first_string_completes() -> None:
    text = TextSource(3, "p").text(40)
    first, later = text.split()[5], text.split()[2]
    match = find_stop(3, "p", [first, later], 40)
    assert match is not None
    assert match.matched in {first, later}
    ends = {s: text.index(s) + len(s) for s in (first, later)}
    assert text.index(match.matched) + len(match.matched) == min(ends.values())

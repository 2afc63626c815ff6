"""The emulator in vLLM's dialect (`specroute emulate --engine vllm`): vLLM's routes and none of
SGLang's, `vllm:` metrics with vLLM's types, one stream chunk per engine step with the finish
on the last content chunk, usage only on a final chunk when asked, vLLM's error shape, and
`--max-num-seqs` as the batch limit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from emulator_support import parse_metrics, stream_events, wait_for
from servers import Server, start_emulator

from specroute.bench.probes import parse_counters
from specroute.emulator.vllm_schedule import DynamicSchedule

MODEL = "emulated/vllm-model"
STEPS = 3


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    args = ("--engine", "vllm", "--time-scale", "20", "--seed", "4", "--model-name", MODEL)
    with start_emulator(STEPS, *args, ready_path="/health") as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about rivers"}],
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }


def counters(client: httpx.Client) -> dict[str, float]:
    return parse_metrics(client.get("/metrics").text)


def test_vllm_routes_are_served_and_sglang_only_routes_are_not(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/version").json()["version"]
    card = client.get("/v1/models").json()["data"][0]
    assert (card["id"], card["owned_by"]) == (MODEL, "vllm")
    assert card["max_model_len"] > 0
    for path in ("/ready", "/server_info", "/get_server_info", "/v1/loads"):
        assert client.get(path).status_code == 404, path


def test_metrics_have_vllm_names_types_and_one_counter_per_draft_position(
    client: httpx.Client,
) -> None:
    client.post("/v1/chat/completions", json=body()).raise_for_status()
    text = client.get("/metrics").text
    assert "sglang:" not in text
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    assert types["vllm:num_requests_running"] == "gauge"
    assert types["vllm:num_requests_waiting"] == "gauge"
    for name in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos"):
        assert types[f"vllm:spec_decode_num_{name}_total"] == "counter"
    values = parse_metrics(text)
    prefix = "vllm:spec_decode_num_accepted_tokens_per_pos_total{"
    per_pos = [values[k] for k in sorted(values) if k.startswith(prefix)]
    assert len(per_pos) == STEPS
    assert per_pos == sorted(per_pos, reverse=True)  # a draft passes position i only after i-1
    assert sum(per_pos) == values["vllm:spec_decode_num_accepted_tokens_total"]
    drafts = values["vllm:spec_decode_num_drafts_total"]
    assert values["vllm:spec_decode_num_draft_tokens_total"] == STEPS * drafts
    assert 1.0 < 1 + values["vllm:spec_decode_num_accepted_tokens_total"] / drafts <= STEPS + 1


def test_stream_has_one_chunk_per_step_finish_on_the_last_and_usage_only_at_the_end(
    client: httpx.Client,
) -> None:
    before = counters(client)
    events = stream_events(
        client, "/v1/chat/completions", body(stream=True, stream_options={"include_usage": True})
    )
    after = counters(client)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 40
    content = chunks[1:-1]
    assert all("usage" not in c for c in chunks[:-1])
    reasons = [c["choices"][0]["finish_reason"] for c in content]
    assert reasons[:-1] == [None] * (len(content) - 1)
    assert reasons[-1] == "length"
    assert content[-1]["choices"][0]["delta"]["content"]  # the finish carries tokens
    words = sum(len(c["choices"][0]["delta"]["content"].split()) for c in content)
    assert words == 40
    # The prefill's token, then one chunk per verify pass (one draft each).
    drafts = (
        after["vllm:spec_decode_num_drafts_total"] - before["vllm:spec_decode_num_drafts_total"]
    )
    assert len(content) == 1 + drafts
    plain = stream_events(client, "/v1/chat/completions", body(stream=True))
    assert all("usage" not in c for c in plain[:-1])
    assert plain[-2]["choices"][0]["finish_reason"] == "length"


def test_errors_have_vllms_nested_shape(client: httpx.Client) -> None:
    reply = client.post("/v1/chat/completions", json={"model": MODEL, "messages": 3})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == 400
    assert error["message"]


def test_tokenize_is_vllms_unversioned_route_with_its_response(client: httpx.Client) -> None:
    counted = client.post("/tokenize", json={"model": MODEL, "prompt": "the river"})
    assert counted.status_code == 200
    answer = counted.json()
    assert (answer["count"], len(answer["tokens"])) == (2, 2)
    assert answer["max_model_len"] > 0
    text = client.post("/detokenize", json={"model": MODEL, "tokens": answer["tokens"]}).json()
    assert text["prompt"].split() == ["the", "river"]
    assert client.post("/v1/tokenize", json={"prompt": "the"}).status_code == 404


def test_continuing_a_message_needs_the_generation_prompt_off(client: httpx.Client) -> None:
    turns = [{"role": "user", "content": "tell me"}, {"role": "assistant", "content": "the"}]
    both = client.post("/v1/chat/completions", json=body(
        messages=turns, continue_final_message=True, add_generation_prompt=True))  # fmt: skip
    assert both.status_code == 400
    assert "Cannot set both" in both.json()["error"]["message"]
    by_default = client.post("/v1/chat/completions", json=body(
        messages=turns, continue_final_message=True))  # fmt: skip
    assert by_default.status_code == 400  # vLLM's default is true: its chat template refuses
    continued = client.post("/v1/chat/completions", json=body(
        messages=turns, continue_final_message=True, add_generation_prompt=False))  # fmt: skip
    assert continued.status_code == 200, continued.text


def test_max_num_seqs_caps_the_batch_and_queues_the_rest() -> None:
    args = ("--engine", "vllm", "--max-num-seqs", "2", "--seed", "2")
    with (
        start_emulator(2, *args, ready_path="/health") as small,
        httpx.Client(base_url=small.url, timeout=30) as client,
        contextlib.ExitStack() as streams,
    ):
        for _ in range(4):
            long = body(stream=True, max_tokens=20000)
            streams.enter_context(client.stream("POST", "/v1/chat/completions", json=long))

        def full() -> bool:
            values = counters(client)
            return (values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]) == (
                2.0,
                2.0,
            )

        wait_for(full)


def test_bench_reads_vllm_acceptance_from_its_counters(client: httpx.Client) -> None:
    """The bench's counter reading of a vLLM server is vLLM's own 1 + accepted / drafts."""
    before = parse_counters(client.get("/metrics").text)
    first = counters(client)
    for max_tokens in (97, 120, 143, 166):
        reply = client.post("/v1/chat/completions", json=body(max_tokens=max_tokens, temperature=1))
        reply.raise_for_status()
    after = parse_counters(client.get("/metrics").text)
    last = counters(client)
    assert before is not None
    assert after is not None
    drafts = last["vllm:spec_decode_num_drafts_total"] - first["vllm:spec_decode_num_drafts_total"]
    accepted = (
        last["vllm:spec_decode_num_accepted_tokens_total"]
        - first["vllm:spec_decode_num_accepted_tokens_total"]
    )
    assert drafts > 0
    truth = 1 + accepted / drafts
    # Tokens per draft differ from it (each request's prefill token, its last verify's cut).
    tokens = last["vllm:generation_tokens_total"] - first["vllm:generation_tokens_total"]
    assert tokens / drafts != pytest.approx(truth)
    assert after.accept_length_since(before) == pytest.approx(truth)


def test_dynamic_k_table_follows_vllms_rules() -> None:
    """K by the range holding the batch size, the K before a gap or past the last range
    carried on, capped at num_speculative_tokens; tables vLLM refuses are refused."""
    table = DynamicSchedule([(1, 4, 5), (9, 16, 2), (17, 64, 0)], max_k=3)
    assert [table(b) for b in (0, 1, 4, 5, 8, 9, 16, 17, 500)] == [3, 3, 3, 3, 3, 2, 2, 0, 0]
    for bad in ([(2, 4, 1)], [(1, 4, 1), (3, 8, 1)], [(1, 0, 1)], [(1, 4, -1)], []):
        with pytest.raises(ValueError, match=r"start at 1|overlap|bad range|empty"):
            DynamicSchedule(bad, max_k=3)


def test_dynamic_k_table_sets_the_depth_each_step_drafts() -> None:
    """A lone request (batch 1) drafts the first range's K, not num_speculative_tokens; K = 0
    drafts nothing, though the per-position counters still run to num_speculative_tokens."""
    for table, k in (("[[1, 8, 1]]", 1), ("[[1, 8, 0]]", 0)):
        args = ("--engine", "vllm", "--num-speculative-tokens-per-batch-size", table)
        with (
            start_emulator(3, *args, "--time-scale", "20", ready_path="/health") as dynamic,
            httpx.Client(base_url=dynamic.url, timeout=30) as client,
        ):
            client.post("/v1/chat/completions", json=body()).raise_for_status()
            values = counters(client)
            drafts = values["vllm:spec_decode_num_drafts_total"]
            assert values["vllm:spec_decode_num_draft_tokens_total"] == k * drafts
            assert (drafts > 0) == (k > 0)
            positions = [n for n in values if "per_pos_total{" in n]
            assert len(positions) == STEPS

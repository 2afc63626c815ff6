"""The emulator's vLLM dialect with `--per-request-spec-decode-metrics`: each reply's
`metrics.speculative_decoding` as vLLM 0.33 writes it (whole bodies with every field, streams
only on the usage chunk with the nulls left out), and its figures adding up to the server's own
spec-decode counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from emulator_support import parse_metrics, stream_events
from servers import start_emulator

from specroute.emulator.options import EmulatorOptions

MODEL = "emulated/vllm-model"
STEPS = 3
FIELDS = {
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
}


def serve(level: str) -> Any:
    args = ("--engine", "vllm", "--time-scale", "50", "--seed", "7", "--model-name", MODEL)
    return start_emulator(
        STEPS, *args, "--per-request-spec-decode-metrics", level, ready_path="/health"
    )


@pytest.fixture(scope="module")
def detailed() -> Iterator[httpx.Client]:
    with serve("detailed") as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about rivers"}],
        "max_tokens": 60,
        "temperature": 1,
        **extra,
    }


def _spec_counters(client: httpx.Client) -> tuple[float, float, float]:
    values = parse_metrics(client.get("/metrics").text)
    return (
        values["vllm:spec_decode_num_drafts_total"],
        values["vllm:spec_decode_num_accepted_tokens_total"],
        values["vllm:spec_decode_num_draft_tokens_total"],
    )


def _check_consistent(spec: dict[str, Any]) -> None:
    histogram = spec["acceptance_histogram"]
    assert len(histogram) == STEPS + 1
    assert spec["num_spec_tokens"] == STEPS
    assert sum(histogram) == spec["num_spec_steps"] > 0
    accepted = sum(j * n for j, n in enumerate(histogram))
    assert spec["num_accepted_draft_tokens"] == accepted
    assert spec["num_draft_tokens"] == STEPS * spec["num_spec_steps"]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / sum(histogram))
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / spec["num_draft_tokens"])


def test_whole_and_streamed_replies_carry_what_the_counters_counted(
    detailed: httpx.Client,
) -> None:
    before = _spec_counters(detailed)
    whole = detailed.post("/v1/chat/completions", json=body()).json()
    metrics = whole["metrics"]
    assert metrics["time_to_first_token_ms"] is None  # vLLM's timing needs another flag
    first = metrics["speculative_decoding"]
    assert set(first) == FIELDS | {"per_step_accepted", "per_step_drafted"}
    _check_consistent(first)
    assert first["per_step_drafted"] == [STEPS] * first["num_spec_steps"]
    assert sum(first["per_step_accepted"]) == first["num_accepted_draft_tokens"]
    events = stream_events(
        detailed,
        "/v1/completions",
        {"model": MODEL, "prompt": "Once", "max_tokens": 50, "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert all("metrics" not in chunk for chunk in events[:-2])
    assert set(usage_chunk["metrics"]) == {"speculative_decoding"}  # the nulls left out
    second = usage_chunk["metrics"]["speculative_decoding"]
    _check_consistent(second)
    after = _spec_counters(detailed)
    drafts, accepted, draft_tokens = (b - a for a, b in zip(before, after, strict=True))
    assert first["num_spec_steps"] + second["num_spec_steps"] == drafts
    assert first["num_accepted_draft_tokens"] + second["num_accepted_draft_tokens"] == accepted
    assert first["num_draft_tokens"] + second["num_draft_tokens"] == draft_tokens


def test_a_stream_without_usage_has_no_metrics(detailed: httpx.Client) -> None:
    events = stream_events(detailed, "/v1/chat/completions", body(stream=True))
    assert events[-1] == "[DONE]"
    assert all("metrics" not in chunk for chunk in events[:-1])


def test_summary_leaves_the_per_step_arrays_out() -> None:
    with serve("summary") as server, httpx.Client(base_url=server.url, timeout=30) as client:
        whole = client.post("/v1/chat/completions", json=body()).json()
        spec = whole["metrics"]["speculative_decoding"]
        _check_consistent(spec)
        assert spec["per_step_accepted"] is None
        assert spec["per_step_drafted"] is None
        events = stream_events(
            client, "/v1/chat/completions",
            body(stream=True, stream_options={"include_usage": True}),
        )  # fmt: skip
        assert set(events[-2]["metrics"]["speculative_decoding"]) == FIELDS


def test_the_flag_needs_a_speculative_vllm_server() -> None:
    for engine, steps in (("sglang", 3), ("vllm", 0)):
        with pytest.raises(ValueError, match="per-request-spec-decode-metrics"):
            EmulatorOptions(steps=steps, engine=engine, per_request_spec_decode_metrics="summary")

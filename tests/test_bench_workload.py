"""Prompt sources and request bodies: synthetic text of set length, JSONL and ShareGPT files,
greedy and sampled classes, chat and completions shapes."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from specroute.bench.workload import (
    ApiSettings,
    PromptSettings,
    Sampling,
    Workload,
    load_prompts,
)


def test_synthetic_prompts_have_the_set_word_count_and_differ() -> None:
    prompts = load_prompts(PromptSettings(words=256), 5, seed=1)
    assert all(len(p.split()) == 256 for p in prompts)
    assert len(set(prompts)) == 5
    assert prompts == load_prompts(PromptSettings(words=256), 5, seed=1)


def test_jsonl_and_sharegpt_prompts_are_read(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "one"}\n"two"\n{"messages": [{"role": "user", "content": "3"}]}\n')
    assert sorted(load_prompts(PromptSettings(source="jsonl", path=str(jsonl)), 3, 0)) == [
        "3",
        "one",
        "two",
    ]
    share = tmp_path / "sg.json"
    share.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "hello"},
                        {"from": "gpt", "value": "hi"},
                    ]
                }
            ]
        )
    )
    assert load_prompts(PromptSettings(source="sharegpt", path=str(share)), 2, 0) == [
        "hello",
        "hello",
    ]


def test_bodies_ask_for_usage_and_spec_details_and_merge_extra_body() -> None:
    mix = [Sampling(name="sampled", temperature=0.8, top_p=0.9, max_tokens=7, ignore_eos=False)]
    api = ApiSettings(api="completions", extra_body={"top_k": 20})
    request = Workload(["hi"], mix, api, "m", seed=0).request(0)
    body = msgspec.json.decode(request.body)
    assert request.path == "/v1/completions"
    assert not request.greedy
    assert body["prompt"] == "hi"
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["return_spec_tokens_details"] is True
    assert body["top_k"] == 20
    assert "ignore_eos" not in body

"""`--dataset`: OpenAI chat requests or ShareGPT conversations read as a stream, and a bad
record refused with its line number before any server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute.bench.dataset import DatasetError, iter_prompts, read_prompts
from specroute.cli import main


def _lines(tmp_path: Path, *lines: str, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_chat_requests_sharegpt_lines_prompts_and_strings_give_their_user_turn(
    tmp_path: Path,
) -> None:
    chat = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "first question"}]}  # fmt: skip
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "in parts"}]}]}
    share = {"conversations": [{"from": "human", "value": "shared"}, {"from": "gpt", "value": "x"}]}
    path = _lines(tmp_path, json.dumps(chat), "", json.dumps(parts), json.dumps(share),
                  json.dumps({"prompt": "plain"}), '"bare"')  # fmt: skip
    assert read_prompts(path) == ["first question", "in parts", "shared", "plain", "bare"]


def test_a_sharegpt_array_is_read_item_by_item_across_reads(tmp_path: Path) -> None:
    # Over 1 MiB, so items straddle the reader's chunks.
    items = [
        {"id": str(i), "conversations": [{"from": "human", "value": f"question {i} " + "x" * 600},
                                         {"from": "gpt", "value": "y" * 200}]}
        for i in range(2500)
    ]  # fmt: skip
    path = tmp_path / "share.json"
    path.write_text("\n[\n" + ",\n".join(json.dumps(item) for item in items) + "\n]\n")
    prompts = read_prompts(path)
    assert len(prompts) == 2500
    assert [p.split()[1] for p in prompts[:3]] == ["0", "1", "2"]
    assert prompts[-1].startswith("question 2499 ")


def test_a_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = _lines(tmp_path, '{"prompt": "ok"}', "", '{"messages": [', '{"prompt": "later"}')
    with pytest.raises(DatasetError, match=r"data\.jsonl line 3: not valid JSON"):
        read_prompts(path)


def test_a_record_without_a_user_turn_is_named_with_what_was_expected(tmp_path: Path) -> None:
    only_assistant = {"messages": [{"role": "assistant", "content": "hello"}]}
    path = _lines(tmp_path, '{"prompt": "ok"}', json.dumps(only_assistant))
    with pytest.raises(DatasetError) as exc:
        read_prompts(path)
    assert "line 2: no prompt" in str(exc.value)
    assert "ShareGPT" in str(exc.value)


def test_an_array_item_without_a_prompt_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "share.json"
    items = [{"prompt": "a"}, {"conversations": [{"from": "human", "value": "b"}]}, {"id": 3}]
    path.write_text(json.dumps(items, indent=2))  # the third item opens on line 13
    with pytest.raises(DatasetError, match=r"share\.json line 13: no prompt"):
        read_prompts(path)


def test_reading_stops_where_the_caller_stops(tmp_path: Path) -> None:
    path = _lines(tmp_path, '{"prompt": "a"}', '{"prompt": "b"}', "not json at all")
    assert read_prompts(path, limit=2) == ["a", "b"]
    prompts = iter_prompts(path)
    assert next(prompts) == "a"


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"", "no prompts"), (b"\xff\xfe\x00bad", "not UTF-8"), (b'[{"prompt": "a"}', "not closed")],
)
def test_empty_binary_and_truncated_files_are_refused(
    tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "data.json"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=words):
        read_prompts(path)


def test_a_missing_dataset_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"cannot read dataset .*nothing\.jsonl"):
        read_prompts(tmp_path / "nothing.jsonl")


def test_tune_refuses_a_bad_dataset_line_before_starting_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _lines(tmp_path, '{"prompt": "ok"}', '{"conversations": []}')
    out = tmp_path / "out"
    status = main(["tune", "--emulate", "--steps", "1", "--dataset", str(path), "--out", str(out)])
    assert status == 2
    assert "data.jsonl line 2: no prompt" in capsys.readouterr().err
    assert not (out / "logs").exists()

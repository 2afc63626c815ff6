"""Prompts from a dataset file, read as a stream: JSONL with one OpenAI chat request (or a
ShareGPT conversation, a `{"prompt": ...}` record or a bare string) per line, or a ShareGPT
JSON array. A record that holds no prompt stops the read with its line number."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import msgspec

__all__ = ["DatasetError", "iter_prompts", "prompt_of", "read_prompts"]

_CHUNK = 1 << 20
_EXPECTED = (
    "expected an OpenAI chat request (`messages` with a user turn), a ShareGPT conversation "
    "(`conversations` with a human turn), a `prompt` or a string"
)


class DatasetError(ValueError):
    """A dataset file cannot give prompts; the message names the file and the line."""


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of OpenAI's content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p for p in parts if isinstance(p, str)]
        return "\n".join(texts) if texts else None
    return None


def _first_turn(turns: Any, roles: tuple[str, ...]) -> str | None:
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if isinstance(turn, dict) and turn.get("role", turn.get("from")) in roles:
            return _text(turn.get("content", turn.get("value")))
    return None


def prompt_of(record: Any) -> str | None:
    """The prompt a record holds: the first user (human) turn, `prompt`/`text`, or itself."""
    if isinstance(record, str):
        return record or None
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return _first_turn(record["messages"], ("user",)) or None
    if "conversations" in record:
        return _first_turn(record["conversations"], ("human", "user")) or None
    for key in ("prompt", "text"):
        value = record.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _jsonl(fh: TextIO, name: str) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            yield number, msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise DatasetError(f"{name} line {number}: not valid JSON ({exc})") from None


def _skip(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in " \t\r\n,":
        pos += 1
    return pos


def _array(fh: TextIO, name: str, line: int) -> Iterator[tuple[int, Any]]:
    """The items of a top-level JSON array (its `[` already read), decoded one at a time as
    the file is read; `line` is the line the array opens on."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    while True:
        start = _skip(buf, pos)
        line += buf.count("\n", pos, start)
        buf, pos = buf[start:], 0
        if buf.startswith("]"):
            return
        if not buf and eof:
            raise DatasetError(f"{name} line {line}: the JSON array is not closed")
        try:
            item, end = decoder.raw_decode(buf)
        except json.JSONDecodeError as exc:
            if eof:
                raise DatasetError(f"{name} line {line}: not valid JSON ({exc.msg})") from None
            more = fh.read(_CHUNK)  # the item may go on past what was read
            eof, buf = not more, buf + more
            continue
        yield line, item
        line += buf.count("\n", 0, end)
        pos = end


def _records(fh: TextIO, name: str) -> Iterator[tuple[int, Any]]:
    blank_lines = 0
    while (char := fh.read(1)) and char.isspace():
        blank_lines += char == "\n"
    if char == "[":
        return _array(fh, name, 1 + blank_lines)
    fh.seek(0)
    return _jsonl(fh, name)


def iter_prompts(path: str | Path) -> Iterator[str]:
    """Each record's prompt, in file order, reading only as far as the caller iterates."""
    name = str(path)
    try:
        with Path(path).open(encoding="utf-8") as fh:
            for number, record in _records(fh, name):
                prompt = prompt_of(record)
                if prompt is None:
                    raise DatasetError(
                        f"{name} line {number}: no prompt in this record; {_EXPECTED}"
                    )
                yield prompt
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {name!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Up to `limit` prompts from the start of the file (all without a limit)."""
    prompts = list(itertools.islice(iter_prompts(path), limit))
    if not prompts:
        raise DatasetError(f"no prompts in {path}")
    return prompts

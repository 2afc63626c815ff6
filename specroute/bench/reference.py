"""Published numbers to print beside measured ones: per target label and concurrency, the
per-request and aggregate tok/s. Reads the seed table's layout (`per_request_tok_s`,
`aggregate_tok_s`, each `{label: {concurrency: value}}`); labels match loosely
(`steps_1` = `steps1` = `Steps-1`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["Reference", "ReferencePoint", "load_reference", "reference_from_mapping"]


def _key(label: str) -> str:
    return re.sub(r"[^a-z0-9]", "", label.lower())


class ReferencePoint(msgspec.Struct, frozen=True, kw_only=True):
    per_request_tok_s: float | None = None
    aggregate_tok_s: float | None = None


class Reference(msgspec.Struct, kw_only=True):
    """Reference points keyed by normalized label, then concurrency."""

    source: str = ""
    points: dict[str, dict[int, ReferencePoint]] = {}

    def lookup(self, label: str, concurrency: int) -> ReferencePoint | None:
        return self.points.get(_key(label), {}).get(concurrency)


def reference_from_mapping(data: dict[str, Any], source: str = "") -> Reference:
    """From `{"per_request_tok_s": {label: {c: v}}, "aggregate_tok_s": {...}}`."""
    collected: dict[str, dict[int, dict[str, float]]] = {}
    for field in ("per_request_tok_s", "aggregate_tok_s"):
        for label, by_level in (data.get(field) or {}).items():
            for level, value in (by_level or {}).items():
                slot = collected.setdefault(_key(str(label)), {}).setdefault(int(level), {})
                slot[field] = float(value)
    points = {
        label: {level: ReferencePoint(**values) for level, values in levels.items()}
        for label, levels in collected.items()
    }
    return Reference(source=source or str(data.get("source", "")), points=points)


def load_reference(path: str | Path) -> Reference:
    return reference_from_mapping(msgspec.json.decode(Path(path).read_bytes()), str(path))

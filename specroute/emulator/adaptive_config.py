"""Read `--speculative-adaptive-config PATH` as SGLang does, with errors naming the file and field.

The format is SGLang's (`srt/speculative/adaptive_spec_params.py`, `_load_adaptive_config`): a JSON
object keyed by each tier's smallest batch size ("1", "8", ...), each with `candidate_steps` and
optional tuning; tuning at top level applies to every tier; other keys are ignored, as SGLang does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from specroute.emulator.adaptive import MAX_DEPTH, AdaptiveConfig, AdaptiveTier, Tuning

__all__ = ["AdaptiveConfigError", "load_adaptive_config", "parse_adaptive_config"]

TUNING_FIELDS = frozenset(f.name for f in msgspec.structs.fields(Tuning))


class AdaptiveConfigError(ValueError):
    """A config file SGLang would refuse, or one the emulator cannot run; names file and field."""


def load_adaptive_config(path: str) -> AdaptiveConfig:
    """The tiers in the file at `path`; raises AdaptiveConfigError naming it."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AdaptiveConfigError(f"{path}: cannot read it: {exc.strerror}") from exc
    return parse_adaptive_config(data, source=path)


def parse_adaptive_config(data: bytes, *, source: str) -> AdaptiveConfig:
    """Decode one config file's bytes; `source` names it in errors and in `/server_info`."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise AdaptiveConfigError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise AdaptiveConfigError(
            f"{source}: speculative adaptive config must be a JSON object, got {type(raw).__name__}"
        )
    _check_strategy(raw.get("strategy", "ema"), source)
    shared = {k: v for k, v in raw.items() if k in TUNING_FIELDS}
    try:
        msgspec.convert(shared, Tuning)
    except msgspec.ValidationError as exc:
        raise AdaptiveConfigError(f"{source}: {exc}") from exc
    tiers = [_tier(key, entry, shared, source) for key, entry in raw.items() if key.isdigit()]
    if not tiers:
        # SGLang's message, word for word, after the file's name.
        raise AdaptiveConfigError(
            f"{source}: speculative_adaptive_config must contain at least one integer-string "
            'BS key, e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            f"Got keys: {list(raw)}"
        )
    return AdaptiveConfig(tiers=tuple(sorted(tiers, key=lambda t: t.smallest_batch)), source=source)


def _check_strategy(strategy: object, source: str) -> None:
    if strategy == "ema":
        return
    if strategy == "throughput_aware":
        raise AdaptiveConfigError(
            f"{source}: $.strategy: 'throughput_aware' profiles the GPU at start-up; the "
            "emulator runs only SGLang's default 'ema' strategy"
        )
    raise AdaptiveConfigError(
        f"{source}: $.strategy: speculative adaptive config 'strategy' must be 'ema' or "
        f"'throughput_aware', got {strategy!r}"
    )


def _tier(key: str, entry: Any, shared: dict[str, Any], source: str) -> AdaptiveTier:
    field = f'$["{key}"]'
    if not isinstance(entry, dict):
        raise AdaptiveConfigError(f"{source}: {field}: expected an object, got {entry!r}")
    steps = entry.get("candidate_steps")
    if (
        not isinstance(steps, list)
        or not steps
        or not all(type(s) is int and s >= 0 for s in steps)
    ):
        # SGLang's message, after the file and the field.
        raise AdaptiveConfigError(
            f"{source}: {field}.candidate_steps: BS {key}: candidate_steps must be a list of "
            f"non-negative ints, got {steps!r}"
        )
    if max(steps) > MAX_DEPTH:
        raise AdaptiveConfigError(
            f"{source}: {field}.candidate_steps: the emulator runs depths up to {MAX_DEPTH}, "
            f"got {max(steps)}"
        )
    known = {k: v for k, v in entry.items() if k in TUNING_FIELDS or k == "candidate_steps"}
    try:
        return msgspec.convert({**shared, **known, "smallest_batch": int(key)}, AdaptiveTier)
    except msgspec.ValidationError as exc:
        raise AdaptiveConfigError(f"{source}: {str(exc).replace('`$.', f'`{field}.')}") from exc

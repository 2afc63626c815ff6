"""Prometheus text through `prometheus_client`, for every exposition and every scrape: the text
of a registry (without `_created` series, as SGLang's own `/metrics`) and one reader of samples.
A leaf: the proxy, the pool, the emulator and the bench all use it."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = [
    "CONTENT_TYPE",
    "SGLANG_PREFIXES",
    "VLLM_PREFIX",
    "exposition",
    "read_samples",
    "sglang_values",
    "vllm_values",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What `generate_latest` writes and SGLang serves (newer prometheus_client releases point
`CONTENT_TYPE_LATEST` at format 1.0.0, so it is spelled out here)."""
SGLANG_PREFIXES = ("sglang:", "sglang_")
"""SGLang's metric prefix; releases before the colon used an underscore."""
VLLM_PREFIX = "vllm:"
"""vLLM's metric prefix (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py)."""


class _Exposed:
    """A collector's families without their `_created` series (and, with `skip_empty`, without
    families that have no sample yet): how SGLang's multiprocess collector writes them.

    `prometheus_client.disable_created_metrics()` would do the first for the whole process; this
    filter keeps that switch (global state) untouched."""

    def __init__(self, source: Collector, skip_empty: bool) -> None:
        self._source = source
        self._skip_empty = skip_empty

    def collect(self) -> Iterable[Metric]:
        for family in self._source.collect():
            created = family.name + "_created"
            samples = [s for s in family.samples if s.name != created]
            if samples or not self._skip_empty:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept


def exposition(registry: Collector, *, skip_empty: bool = False) -> bytes:
    """The registry's text exposition (format 0.0.4, see `CONTENT_TYPE`), by `generate_latest`."""
    return generate_latest(_Exposed(registry, skip_empty))


def read_samples(text: str) -> list[Sample] | None:
    """Every sample of one scrape, or None when the text is not Prometheus' text format (a
    scrape read halfway would sum over some label sets only)."""
    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError:
        return None


def sglang_values(text: str, names: Collection[str]) -> dict[str, list[float]] | None:
    """SGLang's finite values of `names` (sample names without the `sglang:` or older `sglang_`
    prefix: `num_running_reqs`, `generation_tokens_total`), one per label set; None when those
    samples do not parse."""
    # Only the wanted series go to the parser: a whole SGLang scrape is hundreds of lines, and
    # parsing them all would hold the proxy's event loop for milliseconds on every scrape.
    starts = tuple(prefix + name for prefix in SGLANG_PREFIXES for name in names)
    samples = read_samples("\n".join(ln for ln in text.splitlines() if ln.startswith(starts)))
    if samples is None:
        return None
    out: dict[str, list[float]] = {}
    for sample in samples:
        name = sample.name[len("sglang:") :]
        if name in names and math.isfinite(sample.value):
            out.setdefault(name, []).append(float(sample.value))
    return out


def vllm_values(text: str, names: Collection[str]) -> dict[str, list[float]] | None:
    """vLLM's finite values of `names` (sample names without `vllm:`, counters with `_total`:
    `spec_decode_num_drafts_total`), one per label set; None when those samples do not parse."""
    starts = tuple(VLLM_PREFIX + name for name in names)
    samples = read_samples("\n".join(ln for ln in text.splitlines() if ln.startswith(starts)))
    if samples is None:
        return None
    out: dict[str, list[float]] = {}
    for sample in samples:
        name = sample.name[len(VLLM_PREFIX) :]
        if name in names and math.isfinite(sample.value):
            out.setdefault(name, []).append(float(sample.value))
    return out

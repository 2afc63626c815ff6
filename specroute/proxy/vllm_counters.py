"""The vLLM backends' spec-decode counters on the proxy's own `/metrics`, so that vLLM's tools
measure acceptance through the proxy as they do against one server.

`vllm bench serve` reads `{base_url}/metrics` before and after its run and sums every
`vllm:spec_decode*_total` series it finds: drafts, draft tokens, accepted tokens and accepted
tokens per `position` (vllm/benchmarks/serve.py, `fetch_spec_decode_metrics`, vLLM 0.33); its
acceptance length is 1 + accepted / drafts over the run. Here each vLLM backend's counters are
read fresh whenever `/metrics` is asked for, kept monotonic across a backend's restart (a depth
change restarts it and its counters begin again), and exposed with a `backend` label.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from specroute.pool import Backend, UpstreamClient, UpstreamFailure
from specroute.prometheus import read_samples

__all__ = ["SPEC_COUNTERS", "SpecTotals", "VllmCounters"]

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Accepted tokens per draft position.",
}
"""vLLM's spec-decode counter families (vllm/v1/spec_decode/metrics.py), without `_total`."""
_TOTALS = {name + "_total": name for name in SPEC_COUNTERS}

Series = tuple[str, str, str]
"""(family, backend, position: "" outside the per-position family)."""


class SpecTotals:
    """Each backend's spec-decode counters, summed over its engines and kept monotonic: a value
    below the last one means the server started again, and its last value is carried over."""

    __slots__ = ("_carried", "_last")

    def __init__(self) -> None:
        self._last: dict[Series, float] = {}
        self._carried: dict[Series, float] = {}

    def update(self, backend: str, text: str) -> bool:
        """Take one scrape of `backend`; False when it holds no spec-decode counter (or does not
        parse), and nothing changes."""
        wanted = "\n".join(ln for ln in text.splitlines() if ln.startswith(tuple(_TOTALS)))
        samples = read_samples(wanted) if wanted else None
        if not samples:
            return False
        now: dict[Series, float] = {}
        for sample in samples:
            family = _TOTALS.get(sample.name)
            if family is not None and math.isfinite(sample.value):
                key = (family, backend, sample.labels.get("position", ""))
                now[key] = now.get(key, 0.0) + float(sample.value)
        for key, value in now.items():
            last = self._last.get(key)
            if last is not None and value < last:
                self._carried[key] = self._carried.get(key, 0.0) + last
            self._last[key] = value
        return bool(now)

    def families(self) -> Iterator[Metric]:
        """One counter family per spec-decode counter seen, a series per backend (and
        position)."""
        for family, doc in SPEC_COUNTERS.items():
            keys = sorted(key for key in self._last if key[0] == family)
            if not keys:
                continue
            per_pos = family.endswith("_per_pos")
            labels = ["backend", "position"] if per_pos else ["backend"]
            metric = CounterMetricFamily(family, doc + " (relayed from vLLM)", labels=labels)
            for key in keys:
                values = [key[1], key[2]] if per_pos else [key[1]]
                metric.add_metric(values, self._last[key] + self._carried.get(key, 0.0))
            yield metric


class VllmCounters:
    """A registry collector of the vLLM backends' spec-decode counters, refreshed by `/metrics`
    before it renders; concurrent refreshes share one reading of each backend."""

    def __init__(
        self,
        backends: Callable[[], Sequence[Backend]],
        client: UpstreamClient,
        timeout_s: float,
        interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`interval_s`: readings begin at least this far apart (a flood of `/metrics` costs
        the backends one reading per interval)."""
        self._backends = backends
        self._client = client
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._last_began: float | None = None
        self.totals = SpecTotals()

    async def refresh(self) -> None:
        """Read every vLLM backend's `/metrics` (all at once) in a reading begun no earlier
        than this call: one already begun since is shared, and one comes at most every
        `interval_s`; a backend that does not answer keeps its last figures."""
        if not any(b.engine == "vllm" for b in self._backends()):
            return  # an SGLang pool's /metrics neither waits nor reads anything here
        called = self._clock()
        async with self._lock:
            if self._last_began is not None:
                if self._last_began >= called:
                    return
                wait = self._last_began + self._interval_s - self._clock()
                if wait > 0:  # paced, as the proxy's own rendering (`paced`)
                    await asyncio.sleep(wait)
            self._last_began = self._clock()
            targets = [b for b in self._backends() if b.engine == "vllm"]
            if not targets:
                return
            async with asyncio.TaskGroup() as group:
                reads = [(b, group.create_task(self._read(b))) for b in targets]
            for backend, task in reads:
                text = task.result()
                if text is not None:
                    self.totals.update(backend.name, text)

    async def _read(self, backend: Backend) -> str | None:
        try:
            status, body = await self._client.get(
                backend.url + "/metrics", timeout_s=self._timeout_s, headers=backend.auth_headers
            )
        except UpstreamFailure:
            return None
        return body.decode("utf-8", "replace") if status == 200 else None

    def collect(self) -> Iterator[Metric]:
        return self.totals.families()

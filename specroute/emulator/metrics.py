"""SGLang's statistics for the emulated server: `/metrics` text, `/server_info` and `/v1/loads`.

Gauges follow SGLang's scheduler: running and queued counts refresh on every prefill, the rest
(throughput, token usage, speculative acceptance and the active depth) only every
`decode_log_interval` decode iterations, and an idle server publishes zeros at once. Counters
and histograms follow its tokenizer manager: per request, when it finishes or aborts. All of
them live in a `prometheus_client` registry per server, as SGLang's do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import prometheus_client as prom
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from specroute.emulator.engine import Engine, Iteration
from specroute.prometheus import exposition

if TYPE_CHECKING:
    from specroute.emulator.engine import Req

__all__ = ["Stats"]

SGLANG_VERSION = "0.5.23"
LOAD_REFRESH_ITERATIONS = 15
"""`/v1/loads` lags by up to this many decode iterations."""
THROUGHPUT_STALE_AFTER = 30.0

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
QUEUE_BUCKETS = (
    0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40,
    50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600,
    1800, 2000, 2500, 3000,
)  # fmt: skip
"""SGLang's `sglang:queue_time_seconds` buckets (zero first: most requests never wait)."""
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


class _SchedulerGauges:
    """The scheduler's last published gauges, read when scraped (SGLang sets its gauges at the
    same moments); labelled by rank as SGLang's scheduler labels them."""

    def __init__(self, gauges: dict[str, float], labels: dict[str, str]) -> None:
        self._gauges = gauges
        self._names = tuple(labels)
        self._values = tuple(labels.values())

    def collect(self) -> Iterator[Metric]:
        for name, help_text in GAUGE_HELP.items():
            family = GaugeMetricFamily(f"sglang:{name}", help_text, labels=self._names)
            family.add_metric(self._values, self._gauges[name])
            yield family


class Stats:
    """Everything the server reports about itself, updated by the driver loop."""

    def __init__(
        self,
        *,
        model_name: str,
        speculative: bool,
        decode_log_interval: int,
        max_total_num_tokens: int,
        max_running_requests: int,
    ) -> None:
        self.speculative = speculative
        self.decode_log_interval = decode_log_interval
        self.max_total_num_tokens = max_total_num_tokens
        self.max_running_requests = max_running_requests
        self._labels = {"engine_type": "unified", "model_name": model_name}
        self.gauges: dict[str, float] = dict.fromkeys(GAUGE_HELP, 0.0)
        self.gauges["max_total_num_tokens"] = float(max_total_num_tokens)
        self._decode_ct = 0
        self._last_decode_tic = time.perf_counter()
        self._last_gen_throughput = 0.0
        self._window = [0, 0, 0, 0, 0]  # tokens, accept tokens, correct, verifies, proposed
        self.spec_total_accept_tokens = 0
        self.spec_total_forward_ct = 0
        self.registry = CollectorRegistry()
        ranks = {**self._labels, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
        self.registry.register(_SchedulerGauges(self.gauges, ranks))
        self._counters, self._histograms = _tokenizer_metrics(self.registry)
        # Children by (name, is_streaming or None), made on first use as SGLang's are.
        self._counter_children: dict[tuple[str, bool | None], prom.Counter] = {}
        self._histogram_children: dict[tuple[str, bool | None], prom.Histogram] = {}
        self._loads: dict[str, Any] = {}
        self._refresh_loads(None, time.perf_counter())

    # -- per iteration (driver loop) ------------------------------------------------------
    def observe_iteration(self, it: Iteration, engine: Engine, generated: int, now: float) -> None:
        w = self._window
        w[0] += generated
        if it.verifies:
            w[1] += it.accepted_drafts + it.verifies
            w[2] += it.accepted_drafts
            w[3] += it.verifies
            w[4] += it.verifies * it.steps
        if it.prefilled:
            self.gauges["num_running_reqs"] = float(len(engine.running))
            self.gauges["num_queue_reqs"] = float(len(engine.waiting))
            if now - self._last_decode_tic > THROUGHPUT_STALE_AFTER:
                self.gauges["gen_throughput"] = 0.0
        if it.batch_size:
            self._decode_ct += 1
            if self._decode_ct % self.decode_log_interval == 0:
                self._log_decode(it, engine, now)
            if self._decode_ct % LOAD_REFRESH_ITERATIONS == 0:
                self._refresh_loads(engine, now)
        elif it.prefilled:
            self._refresh_loads(engine, now)

    def observe_idle(self, engine: Engine, now: float) -> None:
        """An idle scheduler publishes its true (empty) state without waiting for a window."""
        g = self.gauges
        g["num_running_reqs"] = g["num_queue_reqs"] = g["gen_throughput"] = 0.0
        g["token_usage"] = g["num_used_tokens"] = 0.0
        self._refresh_loads(engine, now)

    def _log_decode(self, it: Iteration, engine: Engine, now: float) -> None:
        g, w = self.gauges, self._window
        gap = now - self._last_decode_tic
        self._last_decode_tic = now
        g["gen_throughput"] = self._last_gen_throughput = w[0] / gap if gap > 0 else 0.0
        g["num_running_reqs"] = float(it.batch_size)
        g["num_queue_reqs"] = float(len(engine.waiting))
        used = sum(s.prompt_tokens + s.generated for s in engine.running)
        g["num_used_tokens"] = float(used)
        g["token_usage"] = used / self.max_total_num_tokens
        if self.speculative:
            g["spec_accept_length"] = w[1] / w[3] if w[3] else 0.0
            g["spec_accept_rate"] = w[2] / w[4] if w[4] else 0.0
            g["spec_num_steps"] = float(engine.active_steps)
            g["spec_num_draft_tokens"] = float(engine.active_steps + 1)
            self.spec_total_accept_tokens += w[1]
            self.spec_total_forward_ct += w[3]
        self._window = [0, 0, 0, 0, 0]

    # -- per request (driver loop and handlers) -------------------------------------------
    def observe_first_token(self, ttft: float, stream: bool) -> None:
        self._histogram("time_to_first_token_seconds", stream).observe(ttft)

    def observe_queue_time(self, seconds: float) -> None:
        """From entering the scheduler to joining its first batch, as SGLang's scheduler."""
        self._histogram("queue_time_seconds", None).observe(seconds)

    def observe_inter_token(self, interval: float, tokens: int) -> None:
        """SGLang observes a chunk's interval once per token, each time divided by the count."""
        if tokens > 0:
            histogram, per_token = (
                self._histogram("inter_token_latency_seconds", None),
                interval / tokens,
            )
            for _ in range(tokens):
                histogram.observe(per_token)

    def observe_abort(self) -> None:
        self._counter("num_aborted_requests_total", None).inc()

    def observe_finished(
        self,
        seq: Req,
        *,
        stream: bool,
        created: float,
        first_token_at: float | None,
        finish_reason: str | None,
        now: float,
    ) -> None:
        self._counter("prompt_tokens_total", stream).inc(seq.prompt_tokens)
        self._counter("generation_tokens_total", stream).inc(seq.generated)
        self._counter("num_requests_total", stream).inc()
        if seq.verify_ct:
            self._counter("spec_verify_calls_total", None).inc(seq.verify_ct)
        self._histogram("e2e_request_latency_seconds", stream).observe(now - created)
        if finish_reason in ("stop", "length") and first_token_at and seq.generated > 1:
            tpot = (now - first_token_at) / (seq.generated - 1)
            self._histogram("request_time_per_output_token_seconds", stream).observe(tpot)

    def _counter(self, name: str, stream: bool | None) -> prom.Counter:
        key = (name, stream)
        child = self._counter_children.get(key)
        if child is None:
            child = self._counter_children[key] = self._counters[name].labels(
                **self._series_labels(stream)
            )
        return child

    def _histogram(self, name: str, stream: bool | None) -> prom.Histogram:
        key = (name, stream)
        child = self._histogram_children.get(key)
        if child is None:
            child = self._histogram_children[key] = self._histograms[name].labels(
                **self._series_labels(stream)
            )
        return child

    def _series_labels(self, stream: bool | None) -> dict[str, str]:
        if stream is None:
            return self._labels
        return {**self._labels, "is_streaming": "true" if stream else "false"}

    # -- views ----------------------------------------------------------------------------
    @property
    def avg_spec_accept_length(self) -> float | None:
        """Lifetime accept length, folded in at each decode log; None before the first."""
        if not self.speculative or not self.spec_total_forward_ct:
            return None
        return self.spec_total_accept_tokens / self.spec_total_forward_ct

    @property
    def last_gen_throughput(self) -> float:
        """The last decode window's tokens/s; unlike the gauge, idling keeps it (for 30 s)."""
        if time.perf_counter() - self._last_decode_tic > THROUGHPUT_STALE_AFTER:
            return 0.0
        return self._last_gen_throughput

    def loads(self, include: set[str] | None = None) -> dict[str, Any]:
        """The `/v1/loads` body from the last published snapshot; `include` as SGLang's."""
        load = dict(self._loads)
        if include is not None and not include & {"all", "spec"}:
            load.pop("speculative", None)
        return {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": [load],
        }

    def loads_prometheus(self, include: set[str] | None = None) -> str:
        """`/v1/loads?format=prometheus`: every number as a `sglang_` gauge per dp_rank.

        Written by hand on purpose: SGLang's `v1_loads.py` formats this one by hand too (`# TYPE`
        lines only, no `# HELP`, numbers as Python prints them), not through prometheus_client."""
        lines = []
        for key, value in self.loads(include)["loads"][0].items():
            items = value.items() if isinstance(value, dict) else [("", value)]
            prefix = "sglang_spec_" if isinstance(value, dict) else f"sglang_{key}"
            for sub, number in items:
                if key == "dp_rank" or isinstance(number, bool) or number is None:
                    continue
                name = prefix + sub
                lines += [f"# TYPE {name} gauge", f'{name}{{dp_rank="0"}} {number}']
        return "\n".join(lines) + "\n"

    def _refresh_loads(self, engine: Engine | None, now: float) -> None:
        running = engine.running if engine else []
        waiting = engine.waiting if engine else ()
        used = sum(s.prompt_tokens + s.generated for s in running)
        pending = sum(s.prompt_tokens for s in waiting)
        load: dict[str, Any] = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(running),
            "num_waiting_reqs": len(waiting),
            "num_waiting_uncached_tokens": pending,
            "num_used_tokens": used,
            "num_total_tokens": used + pending,
            "num_active_tokens": used + pending,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "token_usage": used / self.max_total_num_tokens,
            "gen_throughput": self.gauges["gen_throughput"],
            "cache_hit_rate": 0.0,
            "utilization": len(running) / self.max_running_requests,
            "total_prefill_uncached_tokens": int(self.counters_total("prompt_tokens_total")),
            "total_prefill_busy_us": 0,
            "decode_moments": None,
        }
        accept_length = self.avg_spec_accept_length
        if accept_length is not None:
            rate = self.gauges["spec_accept_rate"]
            load["speculative"] = {"accept_length": accept_length, "accept_rate": rate}
        self._loads = load

    def counters_total(self, name: str) -> float:
        """A counter summed over its label sets (`prompt_tokens_total`)."""
        return sum(
            s.value
            for family in self._counters[name].collect()
            for s in family.samples
            if s.name.endswith("_total")
        )

    def render(self) -> bytes:
        """Prometheus text (format 0.0.4) as SGLang's multiprocess collector writes it: no
        `_created` series, and no family before its first sample."""
        return exposition(self.registry, skip_empty=True)


def _tokenizer_metrics(
    registry: CollectorRegistry,
) -> tuple[dict[str, prom.Counter], dict[str, prom.Histogram]]:
    """SGLang's tokenizer-manager counters and histograms, registered in `registry`."""
    counters = {
        name: prom.Counter(f"sglang:{name}", doc, _label_names(by_stream), registry=registry)
        for name, (doc, by_stream) in COUNTERS.items()
    }
    histograms = {
        name: prom.Histogram(
            f"sglang:{name}", doc, _label_names(by_stream), registry=registry, buckets=bounds
        )
        for name, (doc, bounds, by_stream) in HISTOGRAMS.items()
    }
    return counters, histograms


def _label_names(by_stream: bool) -> tuple[str, ...]:
    return (
        ("model_name", "engine_type", "is_streaming")
        if by_stream
        else ("model_name", "engine_type")
    )


GAUGE_HELP: dict[str, str] = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "token_usage": "The token usage.",
    "num_used_tokens": "The number of used tokens.",
    "cache_hit_rate": "The prefix cache hit rate.",
    "spec_accept_length": (
        "Mean acceptance length of speculative decoding (accepted drafts + bonus token per "
        "forward)."
    ),
    "spec_accept_rate": (
        "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."
    ),
    "spec_num_steps": "Currently active speculative_num_steps.",
    "spec_num_draft_tokens": "Currently active speculative_num_draft_tokens.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
}
COUNTERS: dict[str, tuple[str, bool]] = {  # help, labelled by is_streaming
    "prompt_tokens_total": ("Number of prefill tokens processed.", True),
    "generation_tokens_total": ("Number of generation tokens processed.", True),
    "spec_verify_calls_total": ("Number of speculative decoding verification calls.", False),
    "num_requests_total": ("Number of requests processed.", True),
    "num_aborted_requests_total": ("Number of requests aborted.", False),
}
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...], bool]] = {  # help, buckets, by is_streaming
    "time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS,
        True,
    ),
    "inter_token_latency_seconds": (
        "Histogram of inter-token latency in seconds.",
        ITL_BUCKETS,
        False,
    ),
    "request_time_per_output_token_seconds": (
        "Per-request TPOT in seconds: (finished_time - first_token_time) / "
        "(completion_tokens - 1).",
        ITL_BUCKETS,
        True,
    ),
    "e2e_request_latency_seconds": (
        "Histogram of End-to-end request latency in seconds",
        E2E_BUCKETS,
        True,
    ),
    "queue_time_seconds": ("Histogram of queueing time in seconds.", QUEUE_BUCKETS, False),
}

"""SGLang's statistics for the emulated server: `/metrics` text, `/server_info` and `/v1/loads`.

Gauges follow SGLang's scheduler: running and queued counts refresh on every prefill, the rest
(throughput, token usage, speculative acceptance and the active depth) only every
`decode_log_interval` decode iterations, and an idle server publishes zeros at once. Counters
and histograms follow its tokenizer manager: per request, when it finishes or aborts.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from specroute.emulator.engine import Engine, Iteration

if TYPE_CHECKING:
    from specroute.emulator.driver import Job

__all__ = ["Histogram", "Stats"]

SGLANG_VERSION = "0.5.23"
LOAD_REFRESH_ITERATIONS = 15
"""`/v1/loads` lags by up to this many decode iterations."""
THROUGHPUT_STALE_AFTER = 30.0

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


class Histogram:
    """A Prometheus histogram: per-bucket counts, summed when rendered."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        """Record `value` `times` times (SGLang's inter-token latency observes a chunk so)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(running)!r}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)!r}")
        out.append(f"{name}_sum{{{labels}}} {self.total!r}")
        return out


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
        base = f'engine_type="unified",model_name="{_quote(model_name)}"'
        self._tokenizer_labels = base
        self._scheduler_labels = f'{base},moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        self.gauges: dict[str, float] = dict.fromkeys(GAUGE_HELP, 0.0)
        self.gauges["max_total_num_tokens"] = float(max_total_num_tokens)
        self._decode_ct = 0
        self._last_decode_tic = time.perf_counter()
        self._last_gen_throughput = 0.0
        self._window = [0, 0, 0, 0, 0]  # tokens, accept tokens, correct, verifies, proposed
        self.spec_total_accept_tokens = 0
        self.spec_total_forward_ct = 0
        self.counters: dict[str, dict[str, float]] = {name: {} for name in COUNTER_HELP}
        self.histograms: dict[str, dict[str, Histogram]] = {name: {} for name in HISTOGRAM_HELP}
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
        self._histogram("time_to_first_token_seconds", _streaming(stream)).observe(ttft)

    def observe_inter_token(self, interval: float, tokens: int) -> None:
        if tokens > 0:
            self._histogram("inter_token_latency_seconds", "").observe(interval / tokens, tokens)

    def observe_abort(self) -> None:
        self._count("num_aborted_requests_total", "", 1)

    def observe_finished(self, job: Job, now: float) -> None:
        seq, labels = job.seq, _streaming(job.stream)
        self._count("prompt_tokens_total", labels, seq.prompt_tokens)
        self._count("generation_tokens_total", labels, seq.generated)
        self._count("num_requests_total", labels, 1)
        if seq.verify_ct:
            self._count("spec_verify_calls_total", "", seq.verify_ct)
        self._histogram("e2e_request_latency_seconds", labels).observe(now - job.created)
        if job.finish_reason in ("stop", "length") and job.first_token_at and seq.generated > 1:
            tpot = (now - job.first_token_at) / (seq.generated - 1)
            self._histogram("request_time_per_output_token_seconds", labels).observe(tpot)

    def _count(self, name: str, labels: str, value: float) -> None:
        series = self.counters[name]
        series[labels] = series.get(labels, 0.0) + value

    def _histogram(self, name: str, labels: str) -> Histogram:
        series = self.histograms[name]
        found = series.get(labels)
        if found is None:
            found = series[labels] = Histogram(HISTOGRAM_HELP[name][1])
        return found

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
        """`/v1/loads?format=prometheus`: every number as a `sglang_` gauge per dp_rank."""
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
        return sum(self.counters[name].values())

    def render(self) -> str:
        """Prometheus text exposition (format 0.0.4), SGLang's names and labels."""
        lines: list[str] = []
        for name, help_text in GAUGE_HELP.items():
            full = f"sglang:{name}"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} gauge"]
            lines.append(f"{full}{{{self._scheduler_labels}}} {float(self.gauges[name])!r}")
        for name, help_text in COUNTER_HELP.items():
            series = self.counters[name]
            if not series:
                continue
            full = f"sglang:{name}"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} counter"]
            for extra, value in sorted(series.items()):
                lines.append(f"{full}{{{self._labels(extra)}}} {float(value)!r}")
        for name, (help_text, _) in HISTOGRAM_HELP.items():
            hists = self.histograms[name]
            if not hists:
                continue
            full = f"sglang:{name}"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
            for extra, hist in sorted(hists.items()):
                lines += hist.lines(full, self._labels(extra))
        return "\n".join(lines) + "\n"

    def _labels(self, extra: str) -> str:
        return f"{self._tokenizer_labels},{extra}" if extra else self._tokenizer_labels


def _streaming(stream: bool) -> str:
    return 'is_streaming="true"' if stream else 'is_streaming="false"'


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
COUNTER_HELP: dict[str, str] = {
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "spec_verify_calls_total": "Number of speculative decoding verification calls.",
    "num_requests_total": "Number of requests processed.",
    "num_aborted_requests_total": "Number of requests aborted.",
}
HISTOGRAM_HELP: dict[str, tuple[str, tuple[float, ...]]] = {
    "time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "request_time_per_output_token_seconds": (
        "Per-request TPOT in seconds: (finished_time - first_token_time) / "
        "(completion_tokens - 1).",
        ITL_BUCKETS,
    ),
    "e2e_request_latency_seconds": (
        "Histogram of End-to-end request latency in seconds",
        E2E_BUCKETS,
    ),
}

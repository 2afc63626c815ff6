"""vLLM's `/metrics` for the emulated server in vLLM's dialect, fed by the same driver loop.

Names, types and labels follow vLLM's own: the scheduler gauges and token counters of
vllm/v1/metrics/loggers.py (`PrometheusStatLogger`: labels `model_name` and `engine`, gauges set
at every engine step, tokens counted per step, `request_success` per finish reason) and the
speculative counters of vllm/v1/spec_decode/metrics.py (`SpecDecodingProm`: drafts, draft
tokens, accepted tokens, and accepted tokens per position 0..K-1, all made at start-up and
absent without speculation).
"""

from __future__ import annotations

import prometheus_client as prom
from prometheus_client import CollectorRegistry

from specroute.emulator.engine import Engine, Iteration, Req
from specroute.emulator.metrics import Stats
from specroute.prometheus import exposition

__all__ = ["VLLM_BLOCK_SIZE", "VllmStats"]

VLLM_BLOCK_SIZE = 16
"""vLLM's default KV block size (tokens per block) on CUDA."""
_FINISH_REASONS = ("stop", "length", "abort")
"""vLLM's `FinishReason` values (vllm/v1/engine/__init__.py), one success series each."""


class VllmStats(Stats):
    """SGLang's statistics (kept: the runtime reads them) plus vLLM's registry, which `render`
    writes; a speculative server (`steps` > 0) registers the spec-decode counters."""

    def __init__(
        self,
        *,
        model_name: str,
        speculative: bool,
        decode_log_interval: int,
        max_total_num_tokens: int,
        max_running_requests: int,
        steps: int = 0,
    ) -> None:
        super().__init__(
            model_name=model_name,
            speculative=speculative,
            decode_log_interval=decode_log_interval,
            max_total_num_tokens=max_total_num_tokens,
            max_running_requests=max_running_requests,
        )
        self.vllm_registry = CollectorRegistry()
        r, names, values = self.vllm_registry, ["model_name", "engine"], (model_name, "0")

        def counter(name: str, doc: str) -> prom.Counter:
            return prom.Counter(name, doc, names, registry=r).labels(*values)

        def gauge(name: str, doc: str) -> prom.Gauge:
            return prom.Gauge(name, doc, names, registry=r).labels(*values)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = prom.Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in _FINISH_REASONS}
        info = prom.Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "engine"],
            registry=r,
        )
        info.labels(str(VLLM_BLOCK_SIZE), str(max_total_num_tokens // VLLM_BLOCK_SIZE), "0").set(1)
        self.spec_positions: list[prom.Counter] = []
        if steps > 0:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            )
            self.accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            )
            per_pos = prom.Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*names, "position"],
                registry=r,
            )
            self.spec_positions = [per_pos.labels(*values, str(i)) for i in range(steps)]

    def observe_iteration(self, it: Iteration, engine: Engine, generated: int, now: float) -> None:
        """SGLang's bookkeeping, then vLLM's: every engine step sets the scheduler gauges and
        counts its tokens and drafts (one draft per request verified, of `steps` tokens)."""
        super().observe_iteration(it, engine, generated, now)
        self.running.set(len(engine.running))
        self.waiting.set(len(engine.waiting))
        used = sum(s.prompt_tokens + s.generated for s in engine.running)
        self.kv_usage.set(used / self.max_total_num_tokens)
        self.generation_tokens.inc(generated)
        if self.spec_positions and it.verifies:
            self.drafts.inc(it.verifies)
            self.draft_tokens.inc(it.verifies * it.steps)
            self.accepted.inc(it.accepted_drafts)
            for counter, accepted in zip(self.spec_positions, it.accepted_per_pos, strict=False):
                counter.inc(accepted)

    def observe_idle(self, engine: Engine, now: float) -> None:
        super().observe_idle(engine, now)
        self.running.set(0)
        self.waiting.set(0)
        self.kv_usage.set(0)

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
        super().observe_finished(
            seq,
            stream=stream,
            created=created,
            first_token_at=first_token_at,
            finish_reason=finish_reason,
            now=now,
        )
        self.prompt_tokens.inc(seq.prompt_tokens)
        self.success.get(finish_reason or "abort", self.success["abort"]).inc()

    def render(self) -> bytes:
        """vLLM's metric families in Prometheus text: counters end in `_total` (`_created`
        series left out: no reader here uses them)."""
        return exposition(self.vllm_registry)

"""Pool internals without sockets: metrics parsing, the circuit breaker, health thresholds."""

from __future__ import annotations

from specroute.config import AdmissionConfig, BackendConfig, BreakerConfig, HealthConfig
from specroute.pool import Backend, BreakerState, CircuitBreaker, parse_metrics

METRICS = """\
# HELP sglang:num_running_reqs running
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",dp_rank="1"} 2.0
sglang_num_queue_reqs{model_name="m"} 4
sglang:spec_accept_length{model_name="m",dp_rank="0"} 2.0
sglang:spec_accept_length{model_name="m",dp_rank="1"} 3.0
sglang:generation_tokens_total{model_name="m"} 1200
sglang:time_to_first_token_seconds_bucket{le="0.1"} 5
"""


def test_metrics_parse_both_prefixes_and_sum_ranks() -> None:
    metrics = parse_metrics(METRICS)
    assert metrics.running == 5
    assert metrics.queued == 4
    assert metrics.accept_length == 2.5  # a ratio: averaged over ranks, not summed
    assert metrics.generation_tokens == 1200
    assert metrics.steps is None


def test_breaker_opens_after_threshold_and_allows_one_trial() -> None:
    breaker = CircuitBreaker(threshold=2, open_s=10)
    breaker.on_failure(now=0)
    assert breaker.allows(now=0)
    breaker.on_failure(now=1)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allows(now=5)
    assert breaker.allows(now=11)
    breaker.on_send()
    assert not breaker.allows(now=11)  # one trial at a time
    breaker.on_success()
    assert breaker.state is BreakerState.CLOSED


def test_breaker_trial_failure_reopens_and_abandoned_trial_frees_the_slot() -> None:
    breaker = CircuitBreaker(threshold=1, open_s=1)
    breaker.on_failure(now=0)
    assert breaker.allows(now=2)
    breaker.on_send()
    breaker.on_abandon()
    assert breaker.allows(now=2)
    breaker.on_send()
    breaker.on_failure(now=2)
    assert not breaker.allows(now=2.5)


def _backend(**health: int) -> Backend:
    return Backend(
        BackendConfig(url="http://127.0.0.1:1"),
        health=HealthConfig(**health),  # type: ignore[arg-type]
        admission=AdmissionConfig(overcommit=1.5),
        breaker=BreakerConfig(),
    )


def test_health_flips_only_after_thresholds() -> None:
    backend = _backend(success_threshold=2, failure_threshold=3)
    assert backend.on_probe(True) is None
    assert backend.on_probe(True) == "up"
    assert backend.on_probe(False) is None
    assert backend.on_probe(False) is None
    assert backend.on_probe(True) is None  # a success resets the failure streak
    assert [backend.on_probe(False) for _ in range(3)] == [None, None, "down"]
    assert not backend.healthy


def test_discovery_sets_depth_capacity_and_limit() -> None:
    backend = _backend()
    backend.apply_server_info(
        {
            "speculative_algorithm": "NEXTN",
            "speculative_num_steps": 2,
            "speculative_adaptive": False,
            "max_running_requests": 21,
            "served_model_name": "m",
        }
    )
    view = backend.view()
    assert (view.steps, view.algorithm, view.capacity, view.limit) == (2, "NEXTN", 21, 32)
    assert view.model == "m"


def test_adaptive_backend_reports_depth_from_metrics() -> None:
    backend = _backend()
    backend.apply_server_info(
        {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_adaptive": True}
    )
    backend.metrics = parse_metrics('sglang:spec_num_steps{model_name="m"} 1\n')
    assert backend.view().steps == 1
    assert backend.view().adaptive


def test_backend_without_speculation_has_depth_zero() -> None:
    backend = _backend()
    backend.apply_server_info({"speculative_algorithm": None, "max_running_requests": 48})
    assert backend.steps == 0

"""vLLM's running and waiting gauges lag by seconds (vllm-project/vllm#49538): the proxy reads
them with that lag, so requests of its own that ended since are not taken for other clients'."""

from __future__ import annotations

from specroute.policies import BackendView
from specroute.pool.index import gauge_lag
from specroute.pool.load import LoadMark

_FLOOR_S = 0.5  # `replicas.gauge_lag_s`'s default
_HISTORY_S = 10.0


def _view(in_flight: int) -> BackendView:
    return BackendView(
        name="b0", url="http://b0", model="m", steps=3, algorithm="mtp", adaptive=False,
        capacity=32, limit=64, healthy=True, in_flight=in_flight,
        iteration_intercept_s=0.02, iteration_per_token_s=0.0002, iteration_samples=10,
    )  # fmt: skip


def _combined_after_a_drain(lag_s: float) -> int | None:
    """Our requests end one by one over 4 s; vLLM's gauges at 5 s show the count of 0.5 s."""
    mark = LoadMark()
    for t, own in [(0.0, 12), (1.0, 10), (2.0, 6), (3.0, 3), (4.0, 2)]:
        mark.moved(own, t, _HISTORY_S)
    mark.scraped(total=12, own=2, now=5.0, lag_s=lag_s)
    return mark.combined(2, now=5.5, stale_after_s=15.0)


def test_a_vllm_backends_late_gauges_count_none_of_our_ended_requests_as_others() -> None:
    assert _combined_after_a_drain(gauge_lag("vllm", _FLOOR_S, _view(2))) == 2


def test_sglangs_gauge_lag_still_follows_its_decode_iterations() -> None:
    lag = gauge_lag("sglang", _FLOOR_S, _view(2))
    assert _FLOOR_S < lag < 3.0  # 40 iterations of a few tens of milliseconds
    assert _combined_after_a_drain(lag) == 12  # what a late vLLM gauge would be taken for
    assert gauge_lag(None, _FLOOR_S, None) == _FLOOR_S

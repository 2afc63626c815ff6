"""A level's steady rate, as a prior wants it: the span the closed loop held its concurrency,
not the drain after its last send, where fewer requests run."""

from __future__ import annotations

import pytest

from specroute.bench.client import RequestRecord
from specroute.bench.levels import held_window, summarize_level


def _request(index: int, sent: float, finished: float, every: float) -> RequestRecord:
    """One streamed request: a token every `every` seconds from its send to its finish."""
    times = []
    at = sent + every
    while at <= finished + 1e-9:
        times.append(round(at, 6))
        at += every
    return RequestRecord(
        index=index, scheduled=sent, sent=sent, first_token=times[0], finished=times[-1],
        completion_tokens=len(times), token_source="continuous", chunk_times=times,
        chunk_tokens=[1] * len(times),
    )  # fmt: skip


def _level() -> list[RequestRecord]:
    """Two at once, four requests: each finish sends the next until the last send at 1.2 s.
    The first three get a token every 0.1 s, the last one every 0.2 s; it runs alone from
    request 2's finish at 2.0 s to 3.2 s: the drain."""
    return [
        _request(0, 0.0, 1.0, 0.1),
        _request(1, 0.0, 1.2, 0.1),
        _request(2, 1.0, 2.0, 0.1),
        _request(3, 1.2, 3.2, 0.2),  # 0.8 s beside request 2, then alone after 2.0 s
    ]


def test_the_held_span_ends_at_the_first_finish_after_the_last_send() -> None:
    assert held_window(_level()) == (0.0, 2.0)
    assert held_window([]) is None


def test_a_level_reports_its_rate_while_it_held_its_concurrency_beside_its_whole_rate() -> None:
    summary = summarize_level(_level())
    # whole level: 10 + 12 + 10 + 10 tokens over 3.2 s
    assert summary.aggregate_tok_s == pytest.approx(42 / 3.2)
    # held: every token up to 2.0 s (10 + 12 + 10 + 4) over 2.0 s, the tail's 6 left out
    assert summary.held_s == pytest.approx(2.0)
    assert summary.held_tok_s == pytest.approx(36 / 2.0)
    assert summary.held_tok_s > summary.aggregate_tok_s
    # the tail's 0.2-s gaps are not among the held inter-token latencies
    assert summary.held_itl.count == summary.itl.count - 6
    assert summary.held_itl.mean < summary.itl.mean

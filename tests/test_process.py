"""The proxy's own health gauges: the worst event-loop lag is a trailing window that every
scraper sees alike, and `/metrics` reports it."""

from __future__ import annotations

import asyncio

import httpx
from hypothesis import given
from hypothesis import strategies as st

from specroute.config import load_config
from specroute.prometheus import exposition, read_samples
from specroute.proxy import create_app
from specroute.proxy.process import ProcessMonitor, TrailingMax


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lag(monitor: ProcessMonitor, stat: str) -> float:
    """What a scraper reads for `specroute_event_loop_lag_seconds{stat=...}`."""
    samples = read_samples(exposition(monitor).decode()) or []
    name = "specroute_event_loop_lag_seconds"
    (value,) = [s.value for s in samples if s.name == name and s.labels == {"stat": stat}]
    return value


def test_two_scrapes_in_a_row_both_see_a_peak_from_before_the_first() -> None:
    clock = Clock()
    monitor = ProcessMonitor(window_s=60, clock=clock)
    monitor.record(0.003)
    monitor.record(0.25)  # the peak
    clock.now += 1
    monitor.record(0.002)
    clock.now += 1
    assert lag(monitor, "max") == 0.25
    assert lag(monitor, "max") == 0.25  # a second scraper is not robbed of it
    assert lag(monitor, "last") == 0.002


def test_a_peak_leaves_the_report_once_the_window_has_passed() -> None:
    clock = Clock()
    monitor = ProcessMonitor(window_s=60, clock=clock)
    monitor.record(0.25)
    clock.now += 30
    monitor.record(0.01)
    clock.now += 29.5
    assert lag(monitor, "max") == 0.25
    clock.now += 1
    assert lag(monitor, "max") == 0.01


@given(st.lists(st.tuples(st.floats(0, 30), st.floats(0, 5)), max_size=60), st.floats(0, 90))
def test_trailing_max_is_the_max_of_the_values_within_the_window(
    steps: list[tuple[float, float]], wait: float
) -> None:
    clock = Clock()
    window = TrailingMax(60, clock)
    added: list[tuple[float, float]] = []
    for dt, value in steps:
        clock.now += dt
        window.add(value)
        added.append((clock.now, value))
    clock.now += wait
    inside = [v for t, v in added if t > clock.now - 60]
    assert window.value() == max(inside, default=0.0)
    assert window.value() == max(inside, default=0.0)


def test_metrics_route_reports_the_same_peak_to_consecutive_scrapes() -> None:
    config = load_config(environ={}, overrides={"backends": [{"url": "http://127.0.0.1:9"}]})
    app = create_app(config)
    app.state.process.record(0.4)
    app.state.process.record(0.001)
    transport = httpx.ASGITransport(app=app)

    async def scrape() -> list[str]:
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return [(await client.get("/metrics")).text for _ in range(2)]

    for text in asyncio.run(scrape()):
        assert 'specroute_event_loop_lag_seconds{stat="max"} 0.4\n' in text

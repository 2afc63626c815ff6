"""Shared fixtures: emulated SGLang backends on loopback sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog
from hypothesis import settings
from servers import Server, start_emulator

# Property tests check results, not speed: Hypothesis's 200 ms deadline per example failed
# `test_percentile_stays_in_range_and_grows_with_q` (264 ms, then 166 ms) in a CI run on two
# cores shared with a simulation. Speed is measured in benchmarks that print numbers.
settings.register_profile("specroute", deadline=None)
settings.load_profile("specroute")


@pytest.fixture(autouse=True)
def _fresh_structlog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Commands run in-process configure structlog for good (cached loggers, a level filter):
    each test starts from the defaults, and nothing caches, so `capture_logs` sees every event."""
    real = structlog.configure

    def uncached(**settings: object) -> None:
        real(**{**settings, "cache_logger_on_first_use": False})

    monkeypatch.setattr(structlog, "configure", uncached)
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def emulator() -> Iterator[Server]:
    """One emulated backend at depth 3 (seed profile), shared by read-only tests."""
    with start_emulator(3, "--seed", "7") as server:
        yield server

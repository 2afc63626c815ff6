"""The split's price (benchmarks/split_bound.py): one replica loses nothing, the exact figure
agrees with its event simulation, and a pool that keeps room loses nothing to the split."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import split_bound


def test_one_replica_keeps_every_slot_busy() -> None:
    assert split_bound.busy_slots([64], 64) == 64
    assert split_bound.busy_slots([64], 40) == 40


def test_exact_split_matches_its_simulation() -> None:
    stations = split_bound.shares(split_bound.SEED_CAPACITY, 3, ("b0", "b1", "b2"))
    assert sum(stations) == sum(split_bound.SEED_CAPACITY)
    exact = float(split_bound.busy_slots(stations, 64))
    assert exact < 0.95 * 64  # a full pool split three ways idles slots
    simulated = split_bound.simulated(stations, 64, cv=1.0, requests=40_000)
    assert simulated == pytest.approx(exact, rel=0.02)


def test_a_pool_with_room_loses_nothing_to_the_split() -> None:
    stations = split_bound.shares(split_bound.SEED_CAPACITY, 2, ("b0", "b1", "b2"))
    assert float(split_bound.busy_slots(stations, 16)) == pytest.approx(16, rel=1e-3)

"""The emulator reproduces the seed table over real HTTP, measured by the bundled bench."""

from __future__ import annotations

import asyncio

import pytest

from specroute.calibrate import TOLERANCE, run_calibration, seed_reference
from specroute.emulator.seed import SEED_MAX_RUNNING_REQUESTS

# Real time, as `specroute calibrate` runs. The profile itself is 2.7% under the seed's steps-3
# C=64 aggregate and HTTP costs about 1% more, so a host stall of a few hundred ms in a level
# of ~9 s (what a time scale of 2 gave) was enough to cross 7% on a busy CI machine (-7.5%, once).
# At scale 1 the level lasts ~18 s and the same stall costs half as much.
TIME_SCALE = 1.0


@pytest.mark.timeout(300)
def test_three_emulators_reproduce_the_published_seed_figures_over_http() -> None:
    result = asyncio.run(run_calibration("seed-qwen35-122b", [1, 64], time_scale=TIME_SCALE))
    reference = seed_reference()
    checked = 0
    for level in result.levels:
        point = reference.lookup(level.target, level.concurrency)
        if point is None:
            continue
        assert level.summary.errors == 0
        if point.per_request_tok_s:
            measured = level.summary.per_request_tok_s / TIME_SCALE
            assert measured == pytest.approx(point.per_request_tok_s, rel=TOLERANCE), level.target
            checked += 1
        if point.aggregate_tok_s:
            measured = level.summary.aggregate_tok_s / TIME_SCALE
            assert measured == pytest.approx(point.aggregate_tok_s, rel=TOLERANCE), level.target
            checked += 1
    assert checked == 7
    capacities = {t.label: t.facts.max_running_requests for t in result.targets}
    assert capacities == {f"steps{k}": r for k, r in SEED_MAX_RUNNING_REQUESTS.items()}

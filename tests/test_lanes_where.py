"""Where the lanes benchmarks say each phase's interactive requests ran (`lanes_sim.where`,
printed by `lanes_sim.py --where` and `lanes_proxy.py --where`): shares per server, per
phase, a phase without one shown empty."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from lanes_sim import where


def test_each_phase_gives_its_interactive_requests_by_server() -> None:
    ran = [(0, "b2"), (0, "b0"), (0, "b2"), (0, "b2"), (2, "b1")]
    assert where(["quiet", "busy", "saturated"], ran) == (
        "quiet b0 25% b2 75%; busy -; saturated b1 100%"
    )

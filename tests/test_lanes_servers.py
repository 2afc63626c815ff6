"""`lanes_sim.py --servers N`: the lanes evaluation on pools of N servers, the trace's users
scaled from its three servers, every pool compared (the launched default, the mixes, each
fixed and adaptive setting) of N servers, and the deep pools found by name at any size."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import lanes_sim


def test_the_trace_scales_with_the_servers() -> None:
    three = [p.concurrency for p in lanes_sim.scenario(3).phases]
    six = [p.concurrency for p in lanes_sim.scenario(6).phases]
    assert three == [1, 8, 32, 64, 16, 1]
    assert six == [2, 16, 64, 128, 32, 2]


def test_every_pool_compared_has_the_servers_asked_for() -> None:
    configs = lanes_sim.configurations(["2,2,2,2,5,5"], "seed-qwen35-122b", servers=6)
    sizes = {name: len(spec.settings) for name, spec, _ in configs}
    assert set(sizes.values()) == {6}
    names = list(sizes)
    assert names[0].startswith("lanes + planner, launched ")  # launch --servers 6's pool
    assert "lanes k2/k2/k2/k2/k5/k5" in names
    assert "6 x k7" in names
    assert "6 x adaptive<=7" in names
    assert not any(n.startswith("3 x ") for n in names)


def test_the_deep_pools_are_found_at_any_size() -> None:
    assert lanes_sim._deep("6 x k7")
    assert lanes_sim._deep("3 x adaptive<=3")
    assert not lanes_sim._deep("6 x k2")
    assert not lanes_sim._alike("lanes k2/k2/k7")
    assert lanes_sim._alike("12 x k3")

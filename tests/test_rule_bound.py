"""The bound the peak rule leaves (`benchmarks/rule_bound.py`): the pools it tries are those
the planner's rule allows; its envelope and `depth_bound`'s pick one pool a phase, each switch
charged a restart (`depth_bound.best_sequence`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specroute.planner import Setting

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def rule_bound(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("rule_bound", None)
    return importlib.import_module("rule_bound")


@pytest.fixture
def depth_bound(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("depth_bound")


def pool(*depths: int) -> tuple[Setting, ...]:
    return tuple(Setting(steps=k) for k in depths)


def test_on_a_quiet_trace_the_rule_allows_one_shallow_server_beside_two_deep(
    rule_bound: ModuleType,
) -> None:
    # Three seed k3 servers were launched (68 users escapable): three k7 servers escape only
    # under 40, so they are neither a fixed pool nor a mix the bound tries; k0/k7/k7 is.
    (fixed,) = rule_bound.allowed_fixed("seed-qwen35-122b", "depth-quiet-3")
    assert "k3" in fixed
    assert "k7" not in fixed
    assert "k4" not in fixed
    (mixes,) = rule_bound.candidates("seed-qwen35-122b", "depth-quiet-3", 4)
    assert mixes[0] == pool(0, 7, 7)
    assert len(mixes) == 4
    assert all(len(set(m)) > 1 for m in mixes)  # the fixed pools are measured whole


def test_a_phase_without_a_mix_of_its_own_is_planned_for_the_traces(
    rule_bound: ModuleType,
) -> None:
    # policy-eval's phases name no mix: they run the trace's (half greedy, half sampled), and
    # the candidates are ranked for it (this crashed on the first run over policy-eval).
    per_phase = rule_bound.candidates("seed-qwen35-122b", "policy-eval", 2)
    assert len(per_phase) == 6
    assert all(len(mixes) == 2 for mixes in per_phase)


def test_an_envelope_switches_only_where_a_restart_pays(depth_bound: ModuleType) -> None:
    def option(settings: tuple[Setting, ...], rate: float, name: str) -> object:
        return depth_bound.Option(name, settings, rate)

    phases = [("quiet", 0.0, 1000.0), ("busy", 1000.0, 1010.0), ("quiet", 1010.0, 2010.0)]
    shallow = option(pool(2, 2, 2), 100.0, "k2")
    deep = option(pool(0, 7, 7), 120.0, "k0/k7/k7")
    busy = option(pool(2, 2, 2), 400.0, "k2")
    # A 10-second busy phase: three servers restarting for 100 s each way cost more than the
    # busy phase gives on k2, so the deep pool is held through it.
    tokens, picks = depth_bound.best_sequence(
        phases,
        [[shallow, deep], [busy, option(pool(0, 7, 7), 300.0, "k0/k7/k7")], [shallow, deep]],
        startup_s=100.0,
    )
    assert [p.name for p in picks] == ["k0/k7/k7", "k0/k7/k7", "k0/k7/k7"]
    assert tokens == pytest.approx([120.0 * 1000, 300.0 * 10, 120.0 * 1000])
    # A long busy phase: the switch to k2 and back pays, each charged three start-ups.
    long = [("quiet", 0.0, 5000.0), ("busy", 5000.0, 15000.0), ("quiet", 15000.0, 20000.0)]
    tokens, picks = depth_bound.best_sequence(
        long,
        [[shallow, deep], [busy, option(pool(0, 7, 7), 300.0, "k0/k7/k7")], [shallow, deep]],
        startup_s=100.0,
    )
    assert [p.name for p in picks] == ["k0/k7/k7", "k2", "k0/k7/k7"]
    # every server changes, each way: three start-ups at the new pool's rate
    assert tokens == pytest.approx([120.0 * 5000, 400.0 * (10000 - 100), 120.0 * (5000 - 100)])


def test_an_envelope_from_the_launched_pool_pays_for_leaving_it(depth_bound: ModuleType) -> None:
    # One quiet hour: three k7 servers run it 10% faster than the three k3 launched. From any
    # pool the envelope picks k7 outright; from k3/k3/k3 the switch costs three start-ups
    # (100 s of k7's rate), so it still pays over an hour, not over 1000 s.
    launched = depth_bound.Option("launched", pool(3, 3, 3), 0.0)
    k3 = depth_bound.Option("k3", pool(3, 3, 3), 100.0)
    k7 = depth_bound.Option("k7", pool(7, 7, 7), 110.0)
    hour = [("quiet", 0.0, 3600.0)]
    tokens, picks = depth_bound.best_sequence(hour, [[k3, k7]], 100.0)
    assert [p.name for p in picks] == ["k7"]
    assert tokens == pytest.approx([110.0 * 3600])
    tokens, picks = depth_bound.best_sequence(hour, [[k3, k7]], 100.0, launched)
    assert [p.name for p in picks] == ["k7"]
    assert tokens == pytest.approx([110.0 * 3500])
    short = [("quiet", 0.0, 1000.0)]
    tokens, picks = depth_bound.best_sequence(short, [[k3, k7]], 100.0, launched)
    assert [p.name for p in picks] == ["k3"]  # the same settings as launched: no restart
    assert tokens == pytest.approx([100.0 * 1000])


def _steady(name: str, rate: float, length: float) -> object:
    """A run at `rate` tok/s for `length` seconds, one phase (the benchmarks' path is set by
    the `depth_bound` fixture)."""
    sim_results = importlib.import_module("sim_results")
    bins = [rate * 5.0] * int(length / 5.0)
    return sim_results.SimResult(pool=name, phases=[("quiet", 0.0, length)], bins=bins,
                                 finished=[])  # fmt: skip


def test_never_behind_is_out_of_reach_where_leaving_the_launched_pool_costs_more(
    depth_bound: ModuleType,
) -> None:
    # `depth_bound.py` without auto still says whether any loop launched at three k3 servers
    # could come within 0.5% of the best fixed pool: over 1000 s the three start-ups to k7
    # cost 9%; over 200,000 s, 0.05%.
    def reach(length: float) -> str:
        rates = (("launched", 100.0), ("k3", 100.0), ("k7", 110.0))
        results = {name: _steady(name, rate, length) for name, rate in rates}
        ahead = depth_bound._from_launched("seed-qwen35-122b", results, 100.0)
        (line,) = depth_bound._reach(results, *ahead)
        return str(line)

    short = reach(1000.0)
    assert "100 tok/s (launched), -9.1% against the best fixed pool, k7 110" in short
    assert "OUT OF REACH over the fixed pools" in short
    long = reach(200000.0)
    assert "(k7), -0.1% against the best fixed pool" in long
    assert "within reach" in long
    alone = {"k7": _steady("k7", 110.0, 1000.0)}
    assert not depth_bound._reach(
        alone, *depth_bound._from_launched("seed-qwen35-122b", alone, 100.0)
    )


def test_a_vllm_pool_launched_at_the_mix_pays_for_the_servers_it_changes(
    depth_bound: ModuleType,
) -> None:
    # `vllm_bound.py`'s last column: from the 1/2/3 mix, three k3 servers cost two start-ups
    # (the k3 server stays), 88 s at two thirds of k3's rate, so over 1000 s the bound is
    # 103.5 tok/s against three k3's 110; the mix itself is 100.
    vllm_bound = importlib.import_module("vllm_bound")
    run = importlib.import_module("vllm_pools").Run
    runs = {name: run(_steady(name, rate, 1000.0))
            for name, rate in (("mix-1-2-3", 100.0), ("k1", 95.0), ("k3", 110.0))}  # fmt: skip
    bound = vllm_bound.from_launch("seed-qwen35-122b", runs, "mix-1-2-3")
    assert bound == pytest.approx(110.0 - 110.0 * 88.0 * 2 / 3 / 1000.0)
    assert vllm_bound.from_launch("seed-qwen35-122b", runs, "launched-tuned") is None


def test_auto_beside_its_launched_pool_alone_prints_each_pool_not_a_verdict(
    depth_bound: ModuleType,
) -> None:
    # The verdict compares auto with the best k pool; with only the launched pool beside it
    # the report prints each pool's figures instead of failing after every run.
    ran = dict.fromkeys(("auto", "launched"))
    assert not depth_bound.drawable(ran)
    assert depth_bound.drawable({**ran, "k2": None})
    assert not depth_bound.drawable({"launched": None, "k2": None})

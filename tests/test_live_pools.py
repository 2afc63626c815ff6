"""The wall-clock run's pools (`benchmarks/live_pools.py`): each is a `specroute launch` command
line that launch itself accepts and plans as intended (auto from the prior's pool, the same pool
never reconfigured, three alike per depth, three adaptive), every one with the same emulator and
scaling; the verdict compares auto with the best other pool over the whole trace."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specroute.cli import main
from specroute.profile_format import Point, Profile, Target, Traffic, encode_profile

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def live() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("live_pools")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _prior(path: Path) -> Path:
    """Sampled traffic where k1 beats k3 at every load: tune's pool of three is k1 x3."""
    rates = {1: {1: 100.0, 16: 1400.0, 64: 2400.0}, 3: {1: 90.0, 16: 1000.0, 64: 1100.0}}
    targets = [
        Target(label=f"steps{k}", steps=k, algorithm="EAGLE", max_running_requests=48, points=[
            Point(traffic="sampled", concurrency=c, aggregate_tok_s=v, per_request_tok_s=v / c,
                  requests=c) for c, v in by_c.items()])
        for k, by_c in rates.items()
    ]  # fmt: skip
    traffic = Traffic(name="sampled", temperature=1.0, greedy=False, ignore_eos=True,
                      max_tokens=256, prompts="builtin")  # fmt: skip
    path.write_bytes(encode_profile(Profile(traffic=[traffic], targets=targets)))
    return path


def _servers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The emulator command lines `launch --dry-run` plans for a pool's argv."""
    assert argv[1:4] == ["-m", "specroute", "launch"]
    status = main([*argv[3:], "--dry-run"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return [line for line in captured.out.splitlines() if "specroute emulate" in line]


def test_every_pool_is_a_launch_that_plans_its_servers_with_the_same_scaling(
    live: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prior = _prior(tmp_path / "prior.json")
    scaling = live.Scaling(time_scale=0.25, compress=0.2)
    chosen = live.pools((1, 1, 1), fixed=[1, 3], servers=3)
    assert [p.name for p in chosen] == ["auto", "launched", "k3", "adaptive"]  # k1 x3 runs once
    expected = {"auto": "1", "launched": "1", "k3": "3", "adaptive": "3"}
    for pool in chosen:
        argv = live.launch_argv(pool, scaling, python=sys.executable, prior=str(prior),
                                port=8000, base_port=30000, logs=str(tmp_path))  # fmt: skip
        servers = _servers(argv, capsys)
        assert len(servers) == 3
        for line in servers:
            assert f"--steps {expected[pool.name]} " in line
            assert "--time-scale=0.25" in line
            assert "--startup-s=4.4" in line
            assert ("--speculative-adaptive" in line) == (pool.name == "adaptive")
        assert argv[argv.index("--reconfigure") + 1] == ("auto" if pool.name == "auto" else "off")
        assert argv[argv.index("--min-dwell") + 1] == "180"


def test_on_vllm_every_pool_launches_vllm_servers_and_the_engines_answer_is_its_table(
    live: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prior = _prior(tmp_path / "prior.json")
    scaling = live.Scaling(time_scale=0.25, compress=0.2)
    table = ((1, 12, 3), (13, 256, 2))
    chosen = live.pools((1, 1, 1), fixed=[1, 3], servers=3, dynamic=(3, table))
    assert [p.name for p in chosen] == ["auto", "launched", "k3", "dynamic"]
    for pool in chosen:
        argv = live.launch_argv(pool, scaling, python=sys.executable, prior=str(prior),
                                port=8000, base_port=30000, logs=str(tmp_path),
                                engine="vllm")  # fmt: skip
        servers = _servers(argv, capsys)
        assert len(servers) == 3
        for line in servers:
            assert "--engine vllm" in line
            assert "--speculative-adaptive" not in line
            dynamic = "'--num-speculative-tokens-per-batch-size=[[1,12,3],[13,256,2]]'" in line
            assert dynamic == (pool.name == "dynamic")
            if pool.name == "dynamic":
                assert "--steps 3 " in line  # num_speculative_tokens: the table's deepest K


def _result(live: ModuleType, name: str, tok_s: float, errors: int = 0) -> object:
    return live.PoolResult(name=name, steps="", phases={"p": tok_s}, errors=errors,
                           requests=10, tokens=int(tok_s * 100), wall_s=100.0)  # fmt: skip


def test_the_verdict_holds_auto_to_the_best_other_pool_within_one_percent(
    live: ModuleType,
) -> None:
    close = [_result(live, "auto", 995.0), _result(live, "k2", 1000.0), _result(live, "k3", 900.0)]
    assert ": met;" in live.verdict(close)
    assert "k2 1,000: -0.5%" in live.verdict(close)
    behind = [_result(live, "auto", 985.0), _result(live, "k2", 1000.0)]
    assert "NOT met" in live.verdict(behind)
    failing = [_result(live, "auto", 1000.0, errors=1), _result(live, "k2", 900.0)]
    assert "NOT met" in live.verdict(failing)
    assert "errors: auto 1" in live.verdict(failing)
    assert "| auto |" in live.table(close)
    assert "| +10.6% |" in live.table(close)

"""The no-regret evaluation on a vLLM pool (`benchmarks/vllm_pools.py`) on tiny traces: the
loop sees each server only as the proxy sees a vLLM backend (lagging gauges, no per-request
figure, counters), the proxy learns acceptance from stream chunks within 5% of the truth, and
the dynamic-K pool runs the table an operator writes, which vLLM accepts."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specroute.bench.trace import Scenario, load_scenario
from specroute.cli import main
from specroute.emulator.profiles import get_profile
from specroute.emulator.vllm_schedule import DynamicSchedule
from specroute.profile_format import decode_profile

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
PROFILE = "seed-qwen35-122b"
GREEDY = '[[phases.mix]]\nname = "g"\ntemperature = 0.0\nmax_tokens = 256\nignore_eos = true\n'
SAMPLED = '[[phases.mix]]\nname = "s"\ntemperature = 1.0\nmax_tokens = 128\nignore_eos = true\n'


@pytest.fixture
def vllm_pools(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The benchmark module, imported as its script is run (benchmarks/ on the path)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("vllm_pools", None)
    sys.modules.pop("vllm_table", None)
    return importlib.import_module("vllm_pools")


def scenario(tmp_path: Path, phases: list[tuple[int, float, str]]) -> Scenario:
    text = 'name = "tiny"\n' + "".join(
        f'\n[[phases]]\nname = "p{i}"\nconcurrency = {users}\nduration = {d}\n{mix}'
        for i, (users, d, mix) in enumerate(phases)
    )
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return load_scenario(path)


def test_the_loop_sees_vllm_backends_only_as_the_proxy_does(
    vllm_pools: ModuleType, tmp_path: Path
) -> None:
    trace = scenario(tmp_path, [(12, 90.0, GREEDY)])
    sim = vllm_pools.VllmSim(PROFILE, vllm_pools.pools()["auto"])
    sim.run(trace, "auto")
    late = [b for t, answer in sim.proxy.answers if t > 20.0 for b in answer.backends]
    assert late
    assert all(b.algorithm == "mtp" and b.gen_throughput is None for b in late)
    assert all(b.running is not None and b.accept_length is not None for b in late)
    assert all(b.combined == b.in_flight for b in late)  # no other client, none counted
    # No per-request figure: every accept length the pool learned came from stream chunks,
    # within 5% of what the emulated servers accepted.
    assert set(sim.telemetry.sources) == {"chunks"}
    learned = sim.telemetry.classes()[f"{sim.model}:greedy"].accept_length
    truth = get_profile(PROFILE)
    for steps in (1, 2, 3):
        assert learned[steps] == pytest.approx(truth.expected_tokens("greedy", steps), rel=0.05)


def test_the_operators_table_goes_shallower_with_the_batch_and_vllm_accepts_it(
    vllm_pools: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_table = sys.modules["vllm_table"]
    monkeypatch.setattr(vllm_table, "TABLE_BATCHES", (1, 4, 16))
    monkeypatch.setattr(vllm_table, "MAX_K", 4)
    # A few greedy users when quiet, a sampled crowd when busy (one server in three each).
    trace = scenario(tmp_path, [(3, 600.0, GREEDY), (48, 600.0, SAMPLED)])
    steps, table = vllm_table.operator_table(get_profile(PROFILE), trace)
    schedule = DynamicSchedule(table, steps)  # vLLM's own validation rules
    assert schedule(1) > schedule(16)
    assert schedule(1) == steps


def test_a_dynamic_server_runs_its_tables_depth_and_files_no_accept_length(
    vllm_pools: ModuleType, tmp_path: Path
) -> None:
    trace = scenario(tmp_path, [(2, 40.0, GREEDY), (30, 40.0, GREEDY)])
    spec = vllm_pools.PoolSpec((vllm_pools.Setting(steps=3),) * 3, "least_loaded")
    sim = vllm_pools.VllmSim(PROFILE, spec, table=((1, 4, 3), (5, 256, 1)))
    result = sim.run(trace, "dynamic")
    assert not sim.telemetry.sources  # K moved with the batch: no depth to file it under
    assert [n.engine.active_steps for n in sim.nodes] == [1, 1, 1]  # 10 running on each
    quiet, busy = result.window(5.0, 40.0)[1], result.window(45.0, 80.0)[1]
    assert quiet > busy  # per-request speed: three drafts when quiet, one when busy


def test_auto_tuned_is_what_launch_starts_from_the_vllm_tune_and_knows_only_its_figures(
    vllm_pools: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `auto-tuned`: the servers and depths `specroute launch --engine vllm --prior P.json`
    # prints for the committed vLLM tune, and a proxy whose only capacity figures are that
    # tune's (vLLM reports none): each server's at the depth it runs, none for a depth the
    # tune did not measure.
    spec = vllm_pools.tuned_pools(PROFILE)["auto-tuned"]
    assert main(["launch", "--emulate", "--engine", "vllm", "--dry-run", "--reconfigure", "auto",
                 "--prior", str(spec.prior)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"# --steps {','.join(str(s.steps) for s in spec.settings)}:" in out
    assert f"# --allowed-steps {','.join(map(str, spec.allowed))}:" in out
    depths = decode_profile(spec.prior.read_bytes()).depths
    measured = {d.steps: d.max_running_requests for d in depths}
    assert set(measured) == set(range(8))
    sim = vllm_pools.VllmSim(PROFILE, spec)
    sim.run(scenario(tmp_path, [(12, 60.0, GREEDY)]), "auto-tuned")
    answer = sim.snapshot()
    assert answer.estimates.capacity == measured
    for backend, node in zip(answer.backends, sim.nodes, strict=True):
        assert backend.capacity == measured[node.engine.steps] == node.engine.max_running_requests
    bare = vllm_pools.VllmSim(PROFILE, vllm_pools.pools()["auto"])  # launch without a prior
    assert all(b.capacity is None and b.limit is None for b in bare.snapshot().backends)
    assert bare.snapshot().estimates.depths == {}


def test_auto_on_vllms_tables_may_use_every_depth_its_prior_measured(
    vllm_pools: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `auto-dynamic-tuned`: `specroute launch --engine vllm --prior P.json --allow-adaptive`.
    # Its planner may use the depths the tune measured (0-7), as `auto-tuned`'s does, and the
    # tables besides; the evaluation once ran it at launch's default depths, 0-3.
    spec = vllm_pools.tuned_pools(PROFILE)["auto-dynamic-tuned"]
    assert main(["launch", "--emulate", "--engine", "vllm", "--dry-run", "--reconfigure", "auto",
                 "--allow-adaptive", "--prior", str(spec.prior)]) == 0  # fmt: skip
    assert f"# --allowed-steps {','.join(map(str, spec.allowed))}:" in capsys.readouterr().out
    trace = scenario(tmp_path, [(3, 60.0, GREEDY)])
    tables = vllm_pools.pool_sim(PROFILE, "auto-dynamic-tuned", trace).options
    fixed = vllm_pools.pool_sim(PROFILE, "auto-tuned", trace).options
    assert tables.allowed_steps == fixed.allowed_steps == spec.allowed == tuple(range(8))
    assert tables.allow_adaptive
    assert not fixed.allow_adaptive


def test_a_pool_without_a_prior_learns_each_servers_limit_once_requests_wait(
    vllm_pools: ModuleType, tmp_path: Path
) -> None:
    # The launched 1/2/3 mix with no prior: vLLM reports no limit, so the proxy knows none
    # until requests wait at a server, then the one its scrapes showed (`Backend.scraped`).
    sim = vllm_pools.VllmSim(PROFILE, vllm_pools.pools()["mix-1-2-3"])
    assert all(b.capacity is None and b.limit is None for b in sim.snapshot().backends)
    sim.run(scenario(tmp_path, [(90, 60.0, GREEDY)]), "mix-1-2-3")
    for backend, node in zip(sim.snapshot().backends, sim.nodes, strict=True):
        assert backend.capacity == node.engine.max_running_requests
        assert backend.limit == 2 * node.engine.max_running_requests


@pytest.mark.parametrize("users", [8, 16, 32])
def test_auto_tuned_for_expected_users_is_what_launch_starts_for_that_load(
    vllm_pools: ModuleType, capsys: pytest.CaptureFixture[str], users: int
) -> None:
    # `auto-tuned-uN`: `specroute launch --engine vllm --prior P.json --expected-users N`.
    pools = vllm_pools.tuned_pools("costly-drafts")
    spec = pools[f"auto-tuned-u{users}"]
    assert main(["launch", "--emulate", "--engine", "vllm", "--dry-run", "--reconfigure", "auto",
                 "--prior", str(spec.prior), "--expected-users", str(users)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"# --steps {','.join(str(s.steps) for s in spec.settings)}:" in out
    assert f"for {users} requests at once" in out
    assert pools[f"launched-tuned-u{users}"].settings == spec.settings

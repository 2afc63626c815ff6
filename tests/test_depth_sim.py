"""The virtual-time pool with restarts (`benchmarks/depth_sim.py`) on tiny traces, run by the
product's own depth loop: a clear, lasting change of regime triggers exactly one
reconfiguration, charged its start-up; phases shorter than a restart trigger none; the loop
given the simulator's /pool answers through `specroute launch`'s link decides alike."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import msgspec
import pytest

from specroute.bench.trace import Scenario, load_scenario
from specroute.cli import main
from specroute.launch.argv import EMULATED_MODEL, LaunchOptions
from specroute.planner import Setting
from specroute.profile_format import decode_profile
from specroute.reconfigure import Actuator, ProxyLink, ReconfigureOptions, Reconfigurer
from specroute.wire import Account, PlanDocument

DEEP = ReconfigureOptions(mode="auto", allowed_steps=tuple(range(8)))
"""Depths 0-7 allowed: the 1/2/3 mix already holds launch's deepest default."""

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
GREEDY = """
[[phases.mix]]
name = "greedy"
temperature = 0.0
max_tokens = 512
ignore_eos = true
"""
SAMPLED = """
[[phases.mix]]
name = "sampled"
temperature = 1.0
max_tokens = 256
ignore_eos = false
"""


@pytest.fixture
def depth_sim(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The benchmark module, imported as its script is run (benchmarks/ on the path)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("depth_sim", None)
    return importlib.import_module("depth_sim")


def scenario(tmp_path: Path, phases: list[tuple[str, int, float, str]]) -> Scenario:
    text = 'name = "tiny"\n' + "".join(
        f'\n[[phases]]\nname = "{n}"\nconcurrency = {users}\nduration = {d}\n{mix}'
        for n, users, d, mix in phases
    )
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return load_scenario(path)


def test_a_lasting_quiet_greedy_regime_triggers_exactly_one_restart(
    depth_sim: ModuleType, tmp_path: Path
) -> None:
    trace = scenario(tmp_path, [("busy", 8, 60.0, SAMPLED), ("quiet", 1, 500.0, GREEDY)])
    result = depth_sim.simulate("seed-qwen35-122b", "auto", trace, startup_s=20.0, reconfigure=DEEP)
    assert len(result.restarts) == 1
    restart = result.restarts[0]
    assert restart.began >= 60.0 + 120.0  # the quiet regime settled first
    assert int(restart.after[1:]) > int(restart.before[1:])
    assert restart.ready is not None
    assert restart.ready - restart.began >= 20.0
    # The lone user runs faster once the deeper server is back than before the restart.
    before = result.window(60.0 + 60.0, restart.began)
    after = result.window(restart.ready + 10.0, 560.0)
    assert after[1] > 1.2 * before[1]
    # The loop held the change to account: it paid, about as much as forecast.
    (account,) = result.accounts
    assert account.realized_gain is not None
    assert account.realized_gain > 0.2
    assert account.forecast_error is not None
    assert abs(account.forecast_error) < 0.1


def test_a_restarting_server_drains_is_away_for_its_start_up_then_serves_at_its_new_depth(
    depth_sim: ModuleType, tmp_path: Path
) -> None:
    trace = scenario(tmp_path, [("busy", 64, 200.0, SAMPLED)])
    manual = [(60.0, 2, depth_sim.Setting(steps=1))]
    sim = depth_sim.DepthSim("seed-qwen35-122b", depth_sim.pools()["mix-1-2-3"], startup_s=40.0)
    result = sim.run(trace, "mix-1-2-3", manual=manual)
    (restart,) = result.restarts
    assert (restart.before, restart.after, restart.aborted) == ("k3", "k1", 0)
    assert restart.ready is not None
    assert restart.ready - restart.began >= 40.0
    served = sim.nodes[2].engine
    assert (served.steps, served.max_running_requests) == (1, sim.profile.capacity(1))
    # Its share of the load is lost while it is away, and every user is back once it is ready.
    before = result.window(20.0, 60.0)[0]
    away = result.window(restart.ready - 30.0, restart.ready)[0]
    back = result.window(restart.ready + 20.0, 200.0)[0]
    assert away < 0.9 * before
    assert back > 0.95 * before


def test_phases_shorter_than_a_restart_trigger_none(depth_sim: ModuleType, tmp_path: Path) -> None:
    swings = [("quiet", 1, 90.0, GREEDY), ("busy", 16, 90.0, SAMPLED)] * 2
    result = depth_sim.simulate(
        "seed-qwen35-122b", "auto", scenario(tmp_path, swings), reconfigure=DEEP
    )
    assert result.restarts == []
    assert result.plans.get("reconfigure", 0) == 0
    assert sum(result.bins) > 0


async def _replay(sim: Any, options: ReconfigureOptions) -> list[Any]:
    """The recorded /pool answers through `specroute launch`'s loop: its `ProxyLink` (JSON over
    HTTP, here an in-memory transport), its actuator, at the recorded times."""
    answers = sim.proxy.answers
    queue = iter(answers)
    clock = [0.0]
    published: list[Any] = []

    def proxy(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            clock[0], answer = next(queue)
            return httpx.Response(200, content=msgspec.json.encode(answer))
        published.append(msgspec.json.decode(request.content, type=PlanDocument))
        return httpx.Response(200, json={"status": "published"})

    link = ProxyLink("http://proxy", "k")
    link.client = httpx.AsyncClient(base_url="http://proxy", transport=httpx.MockTransport(proxy))
    servers = [(f"b{i}", Setting(steps=k), sim.startup_s) for i, k in enumerate((1, 2, 3))]
    launch = LaunchOptions(model=EMULATED_MODEL, steps=(1, 2, 3), emulate=True)
    loop = Reconfigurer(options, link, Actuator(options.mode, servers, clock=lambda: clock[0]),
                        _never, limit=launch.running_limit)  # fmt: skip
    for _ in answers:
        await loop.tick()
    await link.aclose()
    return [(d.plan.at, d.plan.verdict, d.plan.reason, tuple(c.server for c in d.plan.start))
            for d in published if d.plan is not None]  # fmt: skip


async def _never(name: str, setting: Setting) -> str | None:
    raise AssertionError("advise restarts nothing")


def test_the_simulator_and_the_launched_loop_decide_alike_on_the_same_pool(
    depth_sim: ModuleType, tmp_path: Path
) -> None:
    trace = scenario(tmp_path, [("busy", 8, 60.0, SAMPLED), ("quiet", 1, 900.0, GREEDY)])
    advise = msgspec.structs.replace(DEEP, mode="advise")
    sim = depth_sim.DepthSim("seed-qwen35-122b", depth_sim.pools()["auto"], reconfigure=advise)
    result = sim.run(trace, "auto")
    assert [v for _, v, _, _ in result.decisions].count("reconfigure") >= 1
    assert result.restarts == []  # advise
    replayed = asyncio.run(_replay(sim, advise))
    assert replayed == result.decisions


@pytest.mark.parametrize("profile", ["seed-qwen35-122b", "costly-drafts", "h200-qwen35-122b-shape"])
def test_the_evaluated_pool_is_what_launch_starts_from_the_tuned_prior(
    depth_sim: ModuleType, profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `auto` in the evaluation: the servers, the planner's depths and the policy that
    # `specroute launch --prior P.json --reconfigure auto` prints for the committed tune prior.
    spec = depth_sim.pools(profile)["auto"]
    prior = spec.prior
    assert main(["launch", "--emulate", "--dry-run", "--reconfigure", "auto",
                 "--prior", str(prior)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    steps = ",".join(str(s.steps) for s in spec.settings)
    allowed = ",".join(map(str, spec.allowed))
    assert f"# --steps {steps}: the pool {prior} recommends" in out
    assert f"# --allowed-steps {allowed}: the depths {prior} measured" in out
    assert allowed == "0,1,2,3,4,5,6,7"  # what `specroute tune --steps 0,...,7` measured
    assert f"--policy {spec.policy} --prior {prior}" in out
    # The simulated proxy starts from the same file: the planner's depths and /pool's fits.
    sim = depth_sim.DepthSim(profile, spec)
    assert sim.options.allowed_steps == spec.allowed
    fits = {d.steps: (d.intercept_s, d.per_token_s)
            for d in decode_profile(prior.read_bytes()).depths}  # fmt: skip
    shown = sim.snapshot().estimates.depths
    assert {k: (f.intercept_s, f.per_token_s) for k, f in shown.items()} == fits


def test_a_flag_given_to_the_simulated_launch_keeps_the_depths_its_prior_measured(
    depth_sim: ModuleType,
) -> None:
    # `launch --prior P --min-dwell 60` (or `depth_bound.py --drain 2`) still lets the planner
    # use every depth P measured; only `--allowed-steps` replaces them.
    profile = "costly-drafts"
    spec = depth_sim.pools(profile)["auto"]
    options = depth_sim.launch_options(spec, min_dwell_s=60.0)
    assert options.min_dwell_s == 60.0
    assert options.allowed_steps == spec.allowed == tuple(range(8))
    assert (
        depth_sim.DepthSim(profile, spec, reconfigure=options).options.allowed_steps == spec.allowed
    )
    given = depth_sim.launch_options(spec, allowed_steps=(0, 2))
    assert given.allowed_steps == (0, 2)
    untuned = depth_sim.pools()["auto"]  # no prior: launch's default depths
    assert depth_sim.launch_options(untuned).allowed_steps == ReconfigureOptions().allowed_steps


def test_depth_bound_prints_autos_own_figures_where_no_fixed_pool_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `depth_bound.py --pool auto` alone: no envelope, but auto's tok/s, restarts and the
    # median forecast error of its changes that have a verdict (one with none is not counted).
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    depth_bound = importlib.import_module("depth_bound")
    sim_results = importlib.import_module("sim_results")
    accounts = [
        Account(at=t, servers=["b0"], before_tok_s=1.0, forecast_tok_s=1.0, forecast_error=e)
        for t, e in ((10.0, -0.02), (20.0, None), (30.0, 0.04))
    ]
    restarts = [sim_results.Restart(server="b0", before="k3", after="k7", began=t)
                for t in (10.0, 20.0, 30.0)]  # fmt: skip
    auto = sim_results.SimResult(pool="auto", phases=[("quiet", 0.0, 10.0)], bins=[500.0, 500.0],
                                 finished=[], restarts=restarts, accounts=accounts)  # fmt: skip
    lines = depth_bound._unbounded("seed-qwen35-122b", "tiny", {"auto": auto})
    assert "- auto: 100 tok/s, 3 restarts, forecast error 3.0% (2)" in lines


def test_where_puts_every_user_and_token_on_the_server_and_depth_that_had_them(
    depth_sim: ModuleType, tmp_path: Path
) -> None:
    """`--where START:END`: the servers' tokens add up to the pool's over the window, the
    requests in flight to its users, and a server restarted inside the window has a row at
    each depth it ran."""
    trace = scenario(tmp_path, [("busy", 12, 200.0, SAMPLED)])
    manual = [(60.0, 2, depth_sim.Setting(steps=1))]
    sim = depth_sim.DepthSim(
        "seed-qwen35-122b", depth_sim.pools()["mix-1-2-3"], startup_s=20.0, where=(40.0, 160.0)
    )
    result = sim.run(trace, "mix-1-2-3", manual=manual)
    where = sim.where
    assert sum(where.tokens.values()) / 120.0 == pytest.approx(result.window(40.0, 160.0)[0], 0.02)
    assert set(where.tokens) == {"b0 k1", "b1 k2", "b2 k3", "b2 k1"}
    # The 12 users' requests, each on one server at any moment (b0 and b1 have room for all
    # of them while b2 is away).
    assert sum(where.users.values()) / 120.0 == pytest.approx(12.0, abs=0.05)
    assert sum(v for (server, _), v in where.users.items() if server == "b2 k1") > 0
    assert {cls for _, cls in where.users} == {"sampled"}
    lines = where.lines()
    assert lines[0].startswith("   40-160 s")
    assert len(lines) == 5


def test_a_profile_field_given_changes_the_engine_and_a_wrong_one_is_refused(
    depth_sim: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    profiles = depth_sim.PROFILES
    monkeypatch.setitem(profiles, "costly-drafts", profiles["costly-drafts"])
    trace = scenario(tmp_path, [("busy", 24, 120.0, SAMPLED)])
    k2 = depth_sim.pools()["k2"]
    before = depth_sim.DepthSim("costly-drafts", k2).run(trace, "k2").window(20.0, 120.0)[0]
    depth_sim.with_profile_fields("costly-drafts", ["prefill_base=0", "prefill_per_token=0"])
    assert profiles["costly-drafts"].prefill_base == 0.0
    after = depth_sim.DepthSim("costly-drafts", k2).run(trace, "k2").window(20.0, 120.0)[0]
    assert after > before * 1.01  # prefills stall every running request
    with pytest.raises(SystemExit, match="prefil_base"):
        depth_sim.with_profile_fields("costly-drafts", ["prefil_base=0"])


def test_the_simulator_sends_the_scenario_s_prompt_length(
    depth_sim: ModuleType, tmp_path: Path
) -> None:
    """`[prompts] words`: a trace of long prompts pays their prefill before every first token
    (the bench's 256 words are the 330 tokens every table was run with)."""
    assert depth_sim.prompt_tokens(256) == 330
    short = scenario(tmp_path, [("busy", 6, 120.0, SAMPLED)])
    long = msgspec.structs.replace(
        short, prompts=msgspec.structs.replace(short.prompts, words=4000)
    )
    k2 = depth_sim.pools()["k2"]
    quick = depth_sim.DepthSim("seed-qwen35-122b", k2).run(short, "k2").window(20.0, 120.0)[0]
    slow = depth_sim.DepthSim("seed-qwen35-122b", k2).run(long, "k2").window(20.0, 120.0)[0]
    assert slow < quick * 0.95
    jsonl = msgspec.structs.replace(
        short, prompts=msgspec.structs.replace(short.prompts, source="jsonl", path="x.jsonl")
    )
    with pytest.raises(ValueError, match="synthetic prompts only"):
        depth_sim.DepthSim("seed-qwen35-122b", k2).run(jsonl, "k2")

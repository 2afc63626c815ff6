"""vLLM's own answer to depth, K per batch size (`num_speculative_tokens_per_batch_size`), as one
of the settings specroute plans with: the planner writes the table from its estimates and
weighs it beside the fixed depths, `launch --engine vllm --allow-adaptive` starts the pool the
prior recommends on the table the prior gives, a restart may move a server onto or off a
table, and the proxy learns from the loop that a server runs one (vLLM says so only in its
developer mode). The command lines are vLLM's own (`make vllm-check` parses them)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from servers import launch_ports
from test_actuator import pool_answer
from test_planner import SAMPLED, estimates, planner_after, pool

from specroute.cli import main
from specroute.launch.argv import LaunchOptions, PlanError, build_plan
from specroute.launch.defaults import launch_depths
from specroute.launch.depth_flags import server_at
from specroute.launch.launcher import Launcher, LaunchSettings
from specroute.launch.restarts import ServerRestarts
from specroute.planner import Setting, forecast
from specroute.planner.forecast import Physics
from specroute.planner.tables import best_table
from specroute.policies import Outcome
from specroute.pool.telemetry import Telemetry
from specroute.profile_format import decode_profile
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer
from specroute.reconfigure.readings import Traffic
from specroute.reconfigure.readings import estimates as readings
from specroute.wire import ClassSnapshot, IterationFit

PRIOR = Path(__file__).parent.parent / "benchmarks/results/live-reconfigure-vllm/tune/prior.json"
"""A `specroute tune --emulate --engine vllm` of depths 0-7 (the wall-clock benchmark's)."""


def test_the_planners_table_drafts_deep_while_few_run_and_shallow_when_many() -> None:
    phys = Physics(estimates())
    table = best_table(phys, {SAMPLED: 1.0}, 3)
    assert table[0] == (1, 3)  # alone, drafts are nearly free: the deepest pays
    assert [b for b, _ in table] == sorted(b for b, _ in table)
    assert table[-1][1] < 3  # crowded, verifying drafts costs more than they bring
    assert all(k <= 3 for _, k in table)  # never past num_speculative_tokens
    for first, k in table:  # each range's K is the depth with the most tok/s there
        rates = {d: phys.e(SAMPLED, d) / phys.time(d, first) for d in range(4)}
        assert k == max(rates, key=lambda d: rates[d])


def test_a_table_server_is_forecast_at_the_k_its_batch_looks_up() -> None:
    est = estimates()
    table = Setting(steps=3, table=((1, 3), (5, 2), (13, 1)))
    assert [table.table_depth(b) for b in (0, 1, 4, 5, 12, 13, 99)] == [3, 3, 3, 2, 2, 1, 1]
    assert table.label == "dynamic<=3"
    for users, k in ((2, 3), (8, 2), (est.depths[3].capacity, 1)):
        got = forecast([table], {SAMPLED: users}, est).servers[0]
        fixed = forecast([Setting(steps=k)], {SAMPLED: users}, est).servers[0]
        assert got.steps == k
        assert got.tok_s == pytest.approx(fixed.tok_s)
    # Its memory is sized for the most it drafts: past k3's capacity, requests wait.
    crowded = forecast([table], {SAMPLED: 40}, est)
    assert crowded.servers[0].running == est.depths[3].capacity


def test_the_planner_weighs_k_per_batch_tables_only_where_they_are_allowed() -> None:
    samples = [(900.0, {SAMPLED: 3.0}), (900.0, {SAMPLED: 30.0})] * 3
    for tables in (False, True):
        planner, now = planner_after(samples, tables=tables)
        plan = planner.plan(now, pool(3, 3, 3), estimates())
        if not tables:
            assert plan.verdict == "hold: nothing gains enough"
            continue
        # A quiet and a busy regime by turns: no one depth serves both, a table does.
        assert plan.proposed is not None
        assert "dynamic<=3" in plan.proposed.settings
        moved = [c.after for c in plan.changes]
        assert moved
        assert all(s.table and s.table[0] == (1, s.steps) for s in moved)
        assert plan.proposed.value > plan.current.value


def _dry_run(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["launch", "--engine", "vllm", "--prior", str(PRIOR), "--dry-run", *flags]) == 0
    return capsys.readouterr().out


def test_launch_starts_the_priors_pool_on_the_table_the_prior_gives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _dry_run(capsys, "--emulate", "--allow-adaptive")
    assert "--steps 3,3,3: the pool" in out
    assert "the servers at 3 start with K per batch size 1-11:3 12-:2" in out
    lines = [ln for ln in out.splitlines() if "specroute emulate" in ln]
    assert len(lines) == 3
    for line in lines:
        ranges = json.loads(line.split("--num-speculative-tokens-per-batch-size ")[1].strip("'"))
        assert ranges == [[1, 11, 3], [12, 48, 2]]  # to the server's batch limit
    real = _dry_run(capsys, "--model", "m", "--gpus", "0,1,2", "--allow-adaptive")
    config = json.loads(real.split("--speculative-config '")[1].split("'")[0])
    assert config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 11, 3], [12, 48, 2]]
    # Without the flag, with the servers named, or on SGLang: fixed depths, as before.
    assert "per-batch-size" not in _dry_run(capsys, "--emulate")
    assert "per-batch-size" not in _dry_run(capsys, "--emulate", "--allow-adaptive",
                                            "--steps", "3,3,3")  # fmt: skip
    assert (
        main(["launch", "--emulate", "--prior", str(PRIOR), "--dry-run", "--allow-adaptive"]) == 0
    )
    assert "per-batch-size" not in capsys.readouterr().out


def test_a_restart_moves_a_server_onto_a_table_or_off_it() -> None:
    options = LaunchOptions(model="m", steps=(1, 2), gpus=(0, 1), engine="vllm")
    base = build_plan(options).servers[0]
    moved = server_at(options, base, Setting(steps=4, table=((1, 4), (6, 1))))
    config = json.loads(moved.argv[moved.argv.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 5, 4], [6, 48, 1]]
    back = server_at(options, moved, Setting(steps=2))
    assert "per_batch_size" not in " ".join(back.argv)
    sglang = LaunchOptions(model="m", steps=(1,), gpus=(0,))
    with pytest.raises(PlanError, match="SGLang has no K-per-batch table"):
        server_at(sglang, build_plan(sglang).servers[0], Setting(steps=3, table=((1, 3),)))
    with pytest.raises(PlanError, match="tables are vLLM's"):
        LaunchOptions(model="m", steps=(3,), tables={3: ((1, 3), (9, 2))})


async def _launched_tables(tmp_path: Path) -> dict[str, Any]:
    """Two emulated vLLM servers, one launched on a table; the loop declares it to the proxy,
    then moves the other onto a table and the first off its own."""
    port, base = launch_ports(2)
    options = LaunchOptions(
        model="emulated", steps=(2, 3), emulate=True, engine="vllm", port=port,
        base_port=base, policy="least_loaded",
        proxy_env={"SPECROUTE_ADMIN_KEY": "k"}, emulator_args=("--time-scale=10",),
        tables={3: ((1, 3), (9, 2))},
    )  # fmt: skip
    settings = LaunchSettings(log_dir=tmp_path / "logs", drain_s=5, ready_timeout_s=60)
    launcher = Launcher(build_plan(options), settings, out=io.StringIO())
    await launcher.start()
    seen: dict[str, Any] = {}
    try:
        servers = [(s.plan.name, Setting(steps=s.plan.steps or 0,
                                         table=options.tables.get(s.plan.steps or 0, ())), 5.0)
                   for s in launcher.servers]  # fmt: skip
        act = Actuator("auto", servers)
        link = ProxyLink(launcher.plan.proxy.url, "k")
        loop = Reconfigurer(ReconfigureOptions(mode="auto", drain_s=5), link, act,
                            ServerRestarts(launcher, options, act), limit=options.running_limit,
                            tables=True)  # fmt: skip

        async def backends() -> dict[str, dict[str, Any]]:
            return {b.name: msgspec.to_builtins(b) for b in (await link.pool()).backends}

        await loop._declare()
        seen["launched"] = await backends()
        restarts = ServerRestarts(launcher, options, act)
        seen["onto"] = await restarts("steps2", Setting(steps=2, table=((1, 2), (5, 1))))
        await link.hold("steps2", "serving", setting=Setting(steps=2, table=((1, 2), (5, 1))))
        seen["off"] = await restarts("steps3", Setting(steps=1))
        await link.hold("steps3", "serving", setting=Setting(steps=1))
        seen["moved"] = await backends()
        async with httpx.AsyncClient(base_url=launcher.plan.proxy.url, timeout=30) as client:
            body = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 20}  # fmt: skip
            seen["replies"] = [(await client.post("/v1/chat/completions", json=body)).status_code
                               for _ in range(4)]  # fmt: skip
        await link.aclose()
    finally:
        await launcher.shutdown()
    return seen


def test_a_launched_table_server_is_dynamic_to_the_proxy_and_restarts_onto_and_off_tables(
    tmp_path: Path,
) -> None:
    seen = asyncio.run(_launched_tables(tmp_path))
    launched = seen["launched"]
    assert launched["steps3"]["adaptive"] is True  # declared: the emulator, like vLLM, is silent
    assert launched["steps2"]["adaptive"] is False
    assert seen["onto"] is None  # it came up: the emulator took the table
    assert seen["off"] is None
    moved = seen["moved"]
    assert moved["steps2"]["adaptive"] is True
    assert moved["steps3"]["adaptive"] is False
    assert seen["replies"] == [200] * 4


def test_a_pool_all_on_tables_plans_from_the_priors_depths() -> None:
    # Its servers' iteration fits belong to no one depth: without the prior's, no estimate.
    answer = pool_answer({"g": 1})
    for b in answer.backends:
        b.adaptive = True
    assert readings(answer, (1, 2, 3), lambda k: 48) is None
    answer.estimates.depths = {k: IterationFit(intercept_s=0.02 + k / 100, per_token_s=0.0004)
                               for k in (1, 3)}  # fmt: skip
    est = readings(answer, (1, 2, 3), lambda k: 48)
    assert est is not None
    assert sorted(est.depths) == [1, 3]  # depth 2 has neither a fit nor a prior to read
    assert est.depths[3].intercept_s == pytest.approx(0.05)


def test_a_recommended_depth_starts_on_its_table_only_where_the_table_drafts_it_alone() -> None:
    path = PRIOR.parent.parent.parent / "vllm-bound/tune/costly-drafts.json"
    prior = decode_profile(path.read_bytes(), source=path.name)
    depths = launch_depths(steps=None, allowed=None, prior=prior, users=4, tables=True)
    assert depths.steps == (2, 4, 4)
    # k2's table drafts 2 until 26 run, then 1; k4's would draft less even alone: k4 stays k4.
    assert depths.tables == {2: ((1, 2), (27, 1))}
    assert launch_depths(steps=None, allowed=None, prior=prior, users=4).tables == {}


def test_replies_from_servers_that_teach_no_acceptance_still_count_in_the_class_mix() -> None:
    # Servers on tables (or SGLang-adaptive, or at depth 0) teach no accept length per depth,
    # but their replies are the traffic: the loop's class mix must follow them, or a pool all
    # on tables plans for the prior's even mix forever (what the first live run did).
    telemetry = Telemetry()
    for klass, n in (("m:sampled", 9), ("m:greedy", 1)):
        for _ in range(n):
            telemetry.observe(Outcome(backend="a", steps=3, workload_class=klass, status=200,
                                      stream=False, completion_tokens=100, duration_s=1.0),
                              capacity=8, acceptance=False)  # fmt: skip
    classes = telemetry.classes()
    assert classes["m:sampled"].completions == 9
    assert classes["m:sampled"].samples == 0  # no accept length was learned from them
    answer = pool_answer({})
    answer.estimates.classes = {
        name: ClassSnapshot(alpha=c.alpha, samples=c.samples, completions=c.completions,
                            mean_tokens=c.mean_tokens)
        for name, c in classes.items()
    }  # fmt: skip
    traffic = Traffic()
    traffic.sample(pool_answer({}))
    loads, _ = traffic.sample(answer)
    assert loads["m:sampled"] == pytest.approx(9 * loads["m:greedy"])


def test_after_the_first_answer_every_reply_counts_in_the_mix_and_the_rate() -> None:
    # Replies from servers that teach nothing (a depth-0 server here; a table or an adaptive
    # server alike) are the pool's traffic and output: split by the replies that taught, a
    # server moved onto a table took the greedy requests it sped out of the mix, and its
    # output out of the rate its change was held to (5 tok/s on a pool running 290).
    def answer(sampled: tuple[int, int], greedy: tuple[int, int]) -> Any:
        snap = pool_answer({})
        snap.estimates.classes = {
            name: ClassSnapshot(alpha=0.7, samples=taught, completions=replies, mean_tokens=100.0)
            for name, (taught, replies) in (("m:sampled", sampled), ("m:greedy", greedy))
        }  # fmt: skip
        return snap

    traffic = Traffic()
    traffic.sample(answer((0, 0), (0, 0)))
    loads, _ = traffic.sample(answer((3, 3), (1, 1)))
    assert loads["m:sampled"] == pytest.approx(3 * loads["m:greedy"])
    before = traffic.tokens
    loads, _ = traffic.sample(answer((3, 3), (1, 9)))  # eight greedy replies at depth 0
    # these replies, all greedy, count: with the four before them (MIX_REPLIES), 9 greedy to 3
    assert loads["m:greedy"] == pytest.approx(3 * loads["m:sampled"])
    assert traffic.tokens - before == pytest.approx(8 * 100.0)

"""The reconfiguration actuator: `advise` changes nothing, `auto` drains, restarts and readmits,
a failed start falls back to the last good flags; what the loop reads from /pool; the flags a
server restarts with."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from emulator_support import parse_metrics
from servers import launch_ports

from specroute.cli import build_parser
from specroute.cmdline import UsageError
from specroute.launch.argv import LaunchOptions, build_plan
from specroute.launch.depth_flags import adaptive_config, capped_tiers, server_at
from specroute.launch.launcher import Launcher, LaunchSettings
from specroute.launch.restarts import ServerRestarts, with_admin_key
from specroute.planner import Change, Forecast, Plan, Regime, Setting
from specroute.reconfigure.actuator import Actuator, Mode
from specroute.reconfigure.advisor import Advisor
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer, replicas
from specroute.reconfigure.options import reconfigure_options
from specroute.reconfigure.readings import Traffic, estimates
from specroute.wire import (
    BackendSnapshot,
    ClassSnapshot,
    IterationFit,
    PoolEstimates,
    PoolSnapshot,
)

K1, K3 = Setting(steps=1), Setting(steps=3)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plan_moving(server: str, before: Setting, after: Setting) -> Plan:
    """A plan that says: restart `server` now, from `before` to `after`."""
    change = Change(server=server, before=before, after=after, cost_tokens=10.0)
    regime = Regime(concurrency=2.0, shares={"m:greedy": 1.0}, started_at=0.0, elapsed_s=300.0,
                    expected_remaining_s=1800.0, regimes_seen=0, peak_concurrency=2.0,
                    steady=True)  # fmt: skip
    current = Forecast(settings=("k1", "k1"), tok_s=100.0, per_request_tok_s=50.0, queued=0,
                       value=100.0, servers=())  # fmt: skip
    return Plan(at=0.0, verdict="reconfigure", reason="k1 100 -> k3 150", regime=regime,
                current=current, changes=(change,), start=(change,))  # fmt: skip


def actuator(mode: Mode, clock: Clock | None = None) -> Actuator:
    return Actuator(mode, [("a", K1, 30.0), ("b", K1, 30.0)], clock=clock or Clock())


@pytest.mark.parametrize("mode", ["advise", "off"])
def test_advise_and_off_begin_no_change_and_leave_every_server_serving(mode: Mode) -> None:
    act = actuator(mode)
    assert act.admit(plan_moving("a", K1, K3)) == []
    assert [s.phase for s in act.slots.values()] == ["serving", "serving"]
    assert [s.setting for s in act.servers()] == [K1, K1]
    assert act.history == []


def test_auto_drains_the_server_and_the_planner_sees_it_at_its_target() -> None:
    act = actuator("auto")
    begun = act.admit(plan_moving("a", K1, K3))
    assert [c.server for c in begun] == ["a"]
    assert act.slots["a"].phase == "draining"
    view = {s.name: s for s in act.servers()}
    assert view["a"].state == "draining"
    assert view["a"].setting == K3
    assert view["b"].state == "serving"


def test_a_server_already_changing_is_not_begun_twice() -> None:
    act = actuator("auto")
    act.admit(plan_moving("a", K1, K3))
    assert act.admit(plan_moving("a", K1, K3)) == []


def test_a_restart_that_comes_up_serves_at_the_new_depth_and_starts_its_dwell() -> None:
    clock = Clock()
    act = actuator("auto", clock)
    act.admit(plan_moving("a", K1, K3))
    clock.now += 5
    assert act.drained("a") == K3
    assert act.slots["a"].phase == "restarting"
    clock.now += 20
    record = act.ready("a")
    assert record.outcome == "done"
    assert (record.before, record.after) == ("k1", "k3")
    assert record.took_s == 25.0
    assert act.slots["a"].setting == K3
    assert act.slots["a"].phase == "serving"
    assert act.slots["a"].changed_at == clock.now
    assert act.outcomes == {"done": 1, "fell_back": 0, "failed": 0}


def test_a_failed_restart_falls_back_to_the_last_good_flags() -> None:
    act = actuator("auto")
    act.admit(plan_moving("a", K1, K3))
    act.drained("a")
    assert act.failed("a", "steps3 exited with status -9") == K1
    assert act.restarting_into("a") == K1
    assert {s.name: s.setting for s in act.servers()}["a"] == K1
    record = act.ready("a")
    assert record.outcome == "fell_back"
    assert "exited with status -9" in record.reason
    assert act.slots["a"].setting == K1
    assert act.outcomes["fell_back"] == 1


def test_when_the_fallback_fails_too_the_change_ends_failed() -> None:
    act = actuator("auto")
    act.admit(plan_moving("a", K1, K3))
    act.drained("a")
    act.failed("a", "first")
    assert act.failed("a", "second") is None
    assert act.history[-1].outcome == "failed"
    assert act.history[-1].error == "second"
    assert act.slots["a"].phase == "serving"
    assert act.slots["a"].setting == K1


def backend(name: str, steps: int | None, **fields: Any) -> BackendSnapshot:
    """One backend of a /pool answer: unknown figures null, as the proxy sends them."""
    base: dict[str, Any] = {
        "name": name, "url": "http://b", "model": "m", "steps": steps, "algorithm": "EAGLE",
        "adaptive": False, "capacity": None, "limit": None, "healthy": True, "in_flight": 0,
        "running": None, "queued": None, "accept_length": None, "gen_throughput": None,
        "iteration_intercept_s": None, "iteration_per_token_s": None, "iteration_samples": 0,
    }  # fmt: skip
    return msgspec.convert({**base, **fields}, BackendSnapshot)


def pool_answer(samples: dict[str, int], in_flight: int = 6) -> PoolSnapshot:
    fits = {"iteration_per_token_s": 0.0004, "iteration_samples": 10}
    estimates = {
        "prior_alpha": 0.7,
        "local_classes": {},
        "classes": {
            c: {
                "alpha": 0.8,
                "accept_length": {"1": 1.8},
                "samples": n,
                "mean_tokens": 100.0,
                "completions": n,
            }
            for c, n in samples.items()
        },
    }
    return PoolSnapshot(
        policy="least_loaded",
        waiting=2,
        backends=[
            backend("a", 1, capacity=26, in_flight=in_flight, iteration_intercept_s=0.02, **fits),
            backend("b", 3, capacity=17, iteration_intercept_s=0.03,
                    **{**fits, "iteration_per_token_s": 0.0005}),
        ],
        estimates=msgspec.convert(estimates, PoolEstimates, strict=False),
    )  # fmt: skip


def test_a_pool_snapshot_decodes_from_its_own_json_and_needs_its_fields() -> None:
    answer = pool_answer({"g": 3})
    wire = msgspec.json.encode(answer)
    assert msgspec.json.decode(wire, type=PoolSnapshot) == answer
    assert b'"combined":null' in wire  # the dashboard's shape: unknown figures are null
    renamed = wire.replace(b'"in_flight"', b'"inflight"')
    with pytest.raises(msgspec.ValidationError, match="in_flight"):
        msgspec.json.decode(renamed, type=PoolSnapshot)


def test_traffic_splits_in_flight_by_recent_completions() -> None:
    traffic = Traffic()
    traffic.sample(pool_answer({"g": 10, "s": 10}))
    loads, queued = traffic.sample(pool_answer({"g": 13, "s": 11}))
    assert loads == {"g": 4.5, "s": 1.5}
    assert queued == 2.0


def test_a_reply_an_answer_splits_the_load_by_tokens_not_by_requests() -> None:
    # Three users, long greedy replies and one short sampled reply in ten: a reply or none
    # per answer. Read alone, each answer split the load all to its reply's class, and the
    # mix summed over a regime was the requests' 90% greedy; the tokens are 98% greedy.
    def answer(greedy: int, sampled: int) -> PoolSnapshot:
        snap = pool_answer({})
        snap.estimates.classes = {
            "g": ClassSnapshot(alpha=0.9, samples=greedy, completions=greedy, mean_tokens=2048.0),
            "s": ClassSnapshot(alpha=0.6, samples=sampled, completions=sampled, mean_tokens=256.0),
        }  # fmt: skip
        return snap

    traffic = Traffic()
    traffic.sample(answer(0, 0))
    greedy = sampled = 0
    shares = []
    for i in range(40):
        if i % 10 == 9:
            sampled += 1
        else:
            greedy += 1
        loads, _ = traffic.sample(answer(greedy, sampled))
        shares.append(loads["g"] / sum(loads.values()))
    assert sum(shares[10:]) / len(shares[10:]) == pytest.approx(9 * 2048 / (9 * 2048 + 256))


def test_traffic_counts_every_replicas_requests_from_the_combined_load() -> None:
    answer = pool_answer({"g": 1})
    answer.backends[1].combined = 9  # 9 there, none of them ours
    loads, _ = Traffic().sample(answer)
    assert sum(loads.values()) == 15.0  # this replica's 6 on "a" and every replica's 9 on "b"


def test_estimates_cover_every_allowed_depth_from_the_nearest_fit() -> None:
    est = estimates(pool_answer({"g": 1}), (0, 1, 2, 3, 5), lambda k: 48)
    assert est is not None
    assert sorted(est.depths) == [0, 1, 2, 3, 5]
    assert est.depths[3].capacity == 17
    assert est.depths[2].intercept_s == 0.03  # a tie goes to the deeper fit
    assert est.depths[5].capacity == 17  # never more than a shallower depth held
    assert est.depths[0].capacity == 48
    assert est.classes["g"].accept_length == {1: 1.8}
    assert est.prior_alpha == 0.7


def test_no_estimates_before_any_fit() -> None:
    answer = pool_answer({})
    for b in answer.backends:
        b.iteration_intercept_s = None
    assert estimates(answer, (1, 2), lambda k: 48) is None


def test_replicas_count_servers_per_depth() -> None:
    tiers = capped_tiers((0, 1, 2, 3))
    assert replicas([K1, K3, K1, Setting(steps=3, tiers=tiers)]) == {
        "1": 2,
        "3": 1,
        "adaptive": 1,
    }


def test_a_server_restarts_on_its_own_port_with_the_new_depth_flags(tmp_path: Path) -> None:
    options = LaunchOptions(model="m", steps=(1, 2), gpus=(0, 1), max_running_by_depth={1: 26})
    base = build_plan(options).servers[0]
    moved = server_at(options, base, Setting(steps=3))
    argv = " ".join(moved.argv)
    assert moved.name == base.name
    assert moved.url == base.url
    assert moved.env == base.env
    assert "--speculative-num-steps 3" in argv
    assert "--speculative-num-draft-tokens 4" in argv
    assert f"--port {base.url.rsplit(':', 1)[1]}" in argv
    assert "--max-running-requests 48" in argv  # depth 3's limit, not depth 1's 26
    none = " ".join(server_at(options, base, Setting(steps=0)).argv)
    assert "--speculative" not in none


def test_an_adaptive_restart_names_its_tiers_file(tmp_path: Path) -> None:
    options = LaunchOptions(model="m", steps=(1,), emulate=True)
    base = build_plan(options).servers[0]
    tiers = capped_tiers((0, 1, 2, 3))
    assert tiers == ((1, (1, 3)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))
    path = tmp_path / "tiers.json"
    moved = server_at(options, base, Setting(steps=3, tiers=tiers), path)
    assert moved.argv[:3] == (sys.executable, "-m", "specroute")
    assert "--speculative-adaptive" in moved.argv
    assert moved.argv[moved.argv.index("--speculative-adaptive-config") + 1] == str(path)
    assert '"1": {' in adaptive_config(tiers)


# A real launched pool (emulated servers and the proxy as child processes) -----------------


async def _launched(tmp_path: Path) -> tuple[Launcher, LaunchOptions]:
    port, base = launch_ports(2)
    options = LaunchOptions(
        model="emulated", steps=(1, 2), emulate=True, port=port,
        base_port=base, policy="least_loaded",
        proxy_env={"SPECROUTE_ADMIN_KEY": "k"},
        emulator_args=("--time-scale=10", "--startup-s=10"),
    )  # fmt: skip
    settings = LaunchSettings(log_dir=tmp_path / "logs", drain_s=20, ready_timeout_s=60)
    launcher = Launcher(build_plan(options), settings, out=io.StringIO())
    await launcher.start()
    return launcher, options


async def _change_during_a_stream(tmp_path: Path, kill_first: bool) -> dict[str, Any]:
    """Move the server a long stream is on to depth 3 while the stream runs; with
    `kill_first`, the new process is SIGKILLed as soon as it is spawned."""
    launcher, options = await _launched(tmp_path)
    try:
        url = launcher.plan.proxy.url
        act = Actuator("auto", [(s.plan.name, Setting(steps=s.plan.steps or 0), 5.0)
                                for s in launcher.servers])  # fmt: skip
        restarts = ServerRestarts(launcher, options, act)
        tried: list[Setting] = []
        during: list[dict[str, Any]] = []  # the server in /pool as each restart begins

        async def restart(name: str, setting: Setting) -> str | None:
            tried.append(setting)
            async with httpx.AsyncClient(base_url=url, headers={"authorization": "Bearer k"}) as c:
                during.append(next(b for b in (await c.get("/pool")).json()["backends"]
                                   if b["name"] == name))  # fmt: skip
            i = next(j for j, s in enumerate(launcher.servers) if s.plan.name == name)
            old = launcher.servers[i].pid
            first = kill_first and len(tried) == 1
            killer = asyncio.create_task(_kill_next(launcher, i, old)) if first else None
            try:
                return await restarts(name, setting)
            finally:
                if killer is not None:
                    killer.cancel()

        link = ProxyLink(url, "k")
        loop = Reconfigurer(ReconfigureOptions(mode="auto", drain_s=20), link, act, restart,
                            limit=options.running_limit)  # fmt: skip
        body = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3000, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                busy = stream.headers["x-specroute-backend"]
                steps = act.slots[busy].setting
                (change,) = act.admit(plan_moving(busy, steps, K3))
                carry = asyncio.create_task(loop._carry_out(change))
                events = [line async for line in stream.aiter_lines() if line.startswith("data:")]
            await carry
            plan = (await client.get("/plan")).json()
            pool = (await client.get("/pool", headers={"authorization": "Bearer k"})).json()
            metrics = parse_metrics((await client.get("/metrics")).text)
        await link.aclose()
        return {"busy": busy, "before": steps, "tried": tried, "events": events, "plan": plan,
                "pool": pool, "metrics": metrics, "act": act, "during": during}  # fmt: skip
    finally:
        await launcher.shutdown()


async def _kill_next(launcher: Launcher, i: int, old: int | None) -> None:
    """SIGKILL the process that replaces `old` at position `i`, as soon as it exists."""
    while launcher.servers[i].pid in (None, old):  # noqa: ASYNC110 - polls a pid; no event to await
        await asyncio.sleep(0.02)
    pid = launcher.servers[i].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


def _stream_intact(events: list[str]) -> None:
    payloads = [e.removeprefix("data:").strip() for e in events]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert not [c for c in chunks if "error" in c]
    assert chunks[-1]["usage"]["completion_tokens"] == 3000


def _steps_of(pool: dict[str, Any], name: str) -> int:
    return int(next(b for b in pool["backends"] if b["name"] == name)["steps"])


def test_a_killed_restart_falls_back_to_the_last_good_flags(tmp_path: Path) -> None:
    seen = asyncio.run(_change_during_a_stream(tmp_path, kill_first=True))
    busy, before = seen["busy"], seen["before"]
    assert seen["tried"] == [K3, before]
    record = seen["act"].history[-1]
    assert record.outcome == "fell_back"
    assert "exited" in record.reason
    assert _steps_of(seen["pool"], busy) == before.steps
    assert seen["plan"]["history"][0]["outcome"] == "fell_back"
    assert seen["plan"]["servers"][0]["state"] == "serving"
    assert seen["metrics"]['specroute_reconfigurations_total{outcome="fell_back"}'] == 1.0
    _stream_intact(seen["events"])  # drained first: the stream on it was not cut


def test_a_restart_that_comes_up_is_readmitted_at_its_new_depth(tmp_path: Path) -> None:
    seen = asyncio.run(_change_during_a_stream(tmp_path, kill_first=False))
    busy = seen["busy"]
    assert seen["tried"] == [K3]
    assert seen["act"].history[-1].outcome == "done"
    assert _steps_of(seen["pool"], busy) == 3  # rediscovered before readmission
    # While it restarted, the proxy knew why: a planned change, not an outage.
    (during,) = seen["during"]
    assert during["state"] == "restarting"
    assert during["change"]["to"] == "k3"
    assert during["change"]["reason"] == "k1 100 -> k3 150"
    assert seen["plan"]["history"][0]["after"] == "k3"
    _stream_intact(seen["events"])


# The flags and the Kubernetes planner ---------------------------------------------------


def _launch_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["launch", "--emulate", "--steps", "1,2", *extra])


def test_reconfigure_defaults_to_advise_and_reads_its_options() -> None:
    assert reconfigure_options(_launch_args()).mode == "advise"
    options = reconfigure_options(_launch_args(
        "--reconfigure", "auto", "--allowed-steps", "3,0,1", "--min-dwell", "60",
        "--max-unavailable", "2", "--drain", "5", "--planner-option", "settle_s=30",
    ))  # fmt: skip
    assert options.allowed_steps == (0, 1, 3)
    planner = options.planner_options()
    assert (planner.max_steps, planner.min_dwell_s, planner.max_unavailable) == (3, 60.0, 2)
    assert (planner.drain_s, planner.settle_s) == (5.0, 30.0)


@pytest.mark.parametrize(
    "extra",
    [("--planner-option", "bogus=1"), ("--planner-option", "settle_s"),
     ("--max-unavailable", "0"), ("--allowed-steps", "1,x")],
)  # fmt: skip
def test_a_bad_reconfigure_option_is_refused_before_anything_starts(extra: tuple[str, str]) -> None:
    with pytest.raises(UsageError):
        reconfigure_options(_launch_args(*extra))


@pytest.mark.parametrize(
    ("option", "flag"),
    [("min_dwell_s=60", "--min-dwell"), ("max_steps=7", "--allowed-steps"),
     ("drain_s=5", "--drain"), ("max_unavailable=2", "--max-unavailable"),
     ("tables=true", "--allow-adaptive")],
)  # fmt: skip
def test_a_planner_option_a_flag_sets_names_the_flag(option: str, flag: str) -> None:
    # Both given, the option used to win over the flag without a word.
    with pytest.raises(UsageError, match=f"set it with {flag}"):
        reconfigure_options(_launch_args("--min-dwell", "300", "--planner-option", option))


def test_an_unknown_planner_option_names_the_setting_meant_or_those_there_are() -> None:
    with pytest.raises(UsageError, match=r"option regime_min: .*did you mean regime_min_s\?"):
        reconfigure_options(_launch_args("--planner-option", "regime_min=3600"))
    with pytest.raises(UsageError) as refused:
        reconfigure_options(_launch_args("--planner-option", "zzz=1"))
    said = str(refused.value)
    assert "--planner-option zzz: no such planner setting; the settings:" in said
    assert "peak_concurrency" in said
    assert "min_dwell_s" not in said  # --min-dwell sets it


@pytest.mark.parametrize(
    ("option", "said"),
    [("settle_s=abc", "--planner-option settle_s=abc: expected number"),
     ("objective=fast", "--planner-option objective=fast: expected goodput|latency|throughput")],
)  # fmt: skip
def test_a_planner_option_of_the_wrong_kind_says_what_it_takes(option: str, said: str) -> None:
    with pytest.raises(UsageError) as refused:
        reconfigure_options(_launch_args("--planner-option", option))
    assert str(refused.value).startswith(said)


@pytest.mark.parametrize(
    ("extra", "said"),
    [(("--max-unavailable", "0"), "--max-unavailable: max_unavailable must be >= 1"),
     (("--planner-option", "margin=-1"), "--planner-option: margin and min_gain must be >= 0")],
)  # fmt: skip
def test_a_planner_check_names_the_flag_at_fault(extra: tuple[str, str], said: str) -> None:
    with pytest.raises(UsageError) as refused:
        reconfigure_options(_launch_args(*extra))
    assert str(refused.value).startswith(said)


def test_the_loop_gets_an_admin_key_the_proxy_is_given_hidden() -> None:
    plan = build_plan(LaunchOptions(model="m", steps=(1,), emulate=True))
    keyed, key = with_admin_key(plan, None)
    assert keyed.proxy.env["SPECROUTE_ADMIN_KEY"] == key
    assert key not in keyed.proxy.shell()
    assert with_admin_key(plan, "mine") == (plan, "mine")


def test_the_kubernetes_planner_follows_the_pools_healthy_backends() -> None:
    advisor = Advisor(ReconfigureOptions(), ProxyLink("http://127.0.0.1:9", "k"), startup_s=600)
    pool = pool_answer({})
    pool.backends = [
        backend("a", 1),
        backend("b", 3),
        backend("c", None),  # not discovered yet
        backend("d", 2, healthy=False),  # starting or leaving
    ]
    advisor.follow(pool)
    assert {n: s.setting for n, s in advisor.actuator.slots.items()} == {"a": K1, "b": K3}
    assert advisor.actuator.slots["a"].startup_s == 600
    assert advisor.actuator.admit(plan_moving("a", K1, K3)) == []  # advise: it moves nothing


def test_a_depth_no_backend_runs_takes_the_priors_own_fit() -> None:
    # Drafts cost time of their own: the prior measured k5 slower than k3's fit scaled says.
    answer = pool_answer({"g": 1})
    answer.estimates.depths = {5: IterationFit(intercept_s=0.05, per_token_s=0.0007),
                               3: IterationFit(intercept_s=0.9, per_token_s=0.9)}  # fmt: skip
    est = estimates(answer, (1, 3, 5), lambda k: 48)
    assert est is not None
    assert (est.depths[5].intercept_s, est.depths[5].per_token_s) == (0.05, 0.0007)
    assert est.depths[3].intercept_s == 0.03  # a depth that runs keeps its live fit


def test_a_depth_no_backend_runs_is_read_between_the_points_its_tune_measured() -> None:
    # Iteration time bends (expert reads saturate): the planner reads T between tune's points
    # at b * (k + 1) tokens on a monotone curve through them, and past the last along the
    # last segment, not along the line.
    answer = pool_answer({"g": 1})
    points = [(6.0, 0.03), (24.0, 0.06), (96.0, 0.08)]
    answer.estimates.depths = {
        5: IterationFit(intercept_s=0.035, per_token_s=0.0005, measured=points),
        3: IterationFit(intercept_s=0.035, per_token_s=0.0005, measured=points),
    }
    est = estimates(answer, (1, 3, 5), lambda k: 48)
    assert est is not None
    k5 = est.depths[5]
    assert k5.iteration_time(4) == pytest.approx(0.06)  # 24 tokens: the point itself
    # 12 tokens, a third of the way to the next point: bent as the points bend, above the
    # straight line between them (0.04) and under the point past it.
    assert 0.041 < k5.iteration_time(2) < 0.06
    assert k5.iteration_time(32) == pytest.approx(0.08 + 96 * 0.02 / 72)  # past the last
    assert k5.iteration_time(4) != pytest.approx(0.035 + 0.0005 * 24, rel=0.1)  # the line's
    # A depth that runs and has observed nothing yet reads the points as they are.
    assert est.depths[3].iteration_time(6) == pytest.approx(0.06)


def test_a_depth_that_runs_follows_its_tunes_points_through_its_live_fit() -> None:
    # Server b runs k3 at 6 requests (24 tokens) where its live line reads 0.042 s and tune
    # measured 0.06: the points are scaled through the live figure, and keep their bend at
    # the busy hour where the line, taken at one load, would not.
    answer = pool_answer({"g": 1})
    points = [(6.0, 0.03), (24.0, 0.06), (96.0, 0.08)]
    answer.estimates.depths = {
        3: IterationFit(intercept_s=0.03, per_token_s=0.0005, measured=points)
    }
    b = msgspec.structs.replace(answer.backends[1], iteration_tokens=24.0)
    answer.backends = [answer.backends[0], b]
    est = estimates(answer, (1, 3), lambda k: 48)
    assert est is not None
    k3 = est.depths[3]
    assert k3.iteration_time(6) == pytest.approx(0.03 + 0.0005 * 24)  # where it ran: live
    assert k3.iteration_time(24) == pytest.approx(0.08 * 0.042 / 0.06)  # 96 tokens: the bend
    assert k3.iteration_time(24) != pytest.approx(0.03 + 0.0005 * 96, rel=0.1)  # the line's


def test_a_depth_no_backend_runs_holds_what_the_priors_tune_measured() -> None:
    # The tune measured k5 at 13 and k7 at 10 requests: below what k3 holds (17) and launch's 48.
    answer = pool_answer({"g": 1})
    answer.estimates.capacity = {0: 35, 3: 40, 5: 13, 7: 10}
    est = estimates(answer, (0, 1, 3, 5, 7), lambda k: 48)
    assert est is not None
    assert (est.depths[5].capacity, est.depths[7].capacity) == (13, 10)
    assert est.depths[0].capacity == 35  # no shallower server seen: the tune's figure
    assert est.depths[3].capacity == 17  # a depth that runs keeps what its server reports
    assert est.depths[1].capacity == 26


def test_a_depth_that_runs_is_read_without_the_prefill_pauses_its_fit_holds() -> None:
    # Server b's fit reads 0.042 s at 24 tokens, of which 0.012 s per iteration were other
    # requests' prefills (long prompts): the planner reads the decode alone there (0.030 s),
    # and a depth borrowing the fit borrows the decode; the forecast charges the pauses.
    answer = pool_answer({"g": 1})
    b = msgspec.structs.replace(answer.backends[1], iteration_tokens=24.0, iteration_stall_s=0.012)
    answer.backends = [answer.backends[0], b]
    est = estimates(answer, (1, 3, 5), lambda k: 48)
    assert est is not None
    assert est.depths[3].iteration_time(6) == pytest.approx(0.030)
    assert est.depths[5].iteration_time(4) == pytest.approx(0.030)  # 24 tokens, borrowed
    assert est.depths[1].iteration_time(4) == pytest.approx(0.02 + 0.0004 * 8)  # no pauses

"""The reconfiguration actuator: `advise` changes nothing, `auto` drains, restarts and readmits,
a failed start falls back to the last good flags; what the loop reads from /pool; the flags a
server restarts with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specroute.launch.actuator import Actuator, Mode
from specroute.launch.depth_flags import adaptive_config, capped_tiers, server_at
from specroute.launch.plan import LaunchOptions, build_plan
from specroute.launch.readings import Traffic, estimates
from specroute.launch.reconfigure import replicas
from specroute.planner import Change, Forecast, Plan, Regime, Setting

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


def pool_answer(samples: dict[str, int], in_flight: int = 6) -> dict[str, object]:
    return {
        "waiting": 2,
        "backends": [
            {"name": "a", "steps": 1, "capacity": 26, "in_flight": in_flight,
             "iteration_intercept_s": 0.02, "iteration_per_token_s": 0.0004,
             "iteration_samples": 10},
            {"name": "b", "steps": 3, "capacity": 17, "in_flight": 0,
             "iteration_intercept_s": 0.03, "iteration_per_token_s": 0.0005,
             "iteration_samples": 10},
        ],
        "estimates": {
            "prior_alpha": 0.7,
            "classes": {
                c: {"alpha": 0.8, "accept_length": {"1": 1.8}, "samples": n, "mean_tokens": 100.0}
                for c, n in samples.items()
            },
        },
    }  # fmt: skip


def test_traffic_splits_in_flight_by_recent_completions() -> None:
    traffic = Traffic()
    traffic.sample(pool_answer({"g": 10, "s": 10}))
    loads, queued = traffic.sample(pool_answer({"g": 13, "s": 11}))
    assert loads == {"g": 4.5, "s": 1.5}
    assert queued == 2.0


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
    for b in answer["backends"]:  # type: ignore[attr-defined]
        b["iteration_intercept_s"] = None
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

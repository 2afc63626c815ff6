"""A planned restart is not an outage: a backend the launcher's actuator holds `restarting`
fails its health checks on purpose, and the proxy says so (an info log with the plan's reason,
`specroute_backend_state`, `/pool`, the dashboard's data) instead of reporting it down; once
it serves again at its new depth, that depth shows beside its unchanged name (in the
launcher's crash report too). Scripted backends on loopback, the proxy in this test's loop."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import httpx
from emulator_support import parse_metrics
from inprocess import ADMIN, Upstream, proxy, stream_of
from structlog.testing import capture_logs

from specroute.launch.argv import LaunchOptions, build_plan
from specroute.launch.depth_flags import server_at
from specroute.launch.launcher import Launcher, LaunchSettings
from specroute.launch.supervisor import Supervised
from specroute.planner import Setting
from specroute.pool import Holds
from specroute.proxy.dashboard import Sampler

REASON = "saturated: k3 pays 4.1% over k2"


def test_a_restarting_backend_is_restarting_whatever_its_health() -> None:
    holds = Holds()
    holds.hold("a", "restarting", 1.0, to="k3", reason=REASON)
    holds.hold("b", "draining", 1.0, to="k1")
    assert holds.state_of("a", healthy=False) == "restarting"
    assert holds.state_of("b", healthy=True) == "draining"
    assert holds.state_of("b", healthy=False) == "down"  # a drain keeps the server up
    assert holds.state_of("c", healthy=False) == "down"
    assert holds.state_of("c", healthy=True) == "serving"
    held = holds.get("a")
    assert held is not None
    assert (held.to, held.reason, held.since) == ("k3", REASON, 1.0)
    holds.hold("a", "restarting", 5.0)  # again in the same state: its change and since stay
    assert holds.get("a") == held


async def _until(check: Any) -> None:
    """Poll `check()` (the pool's health watch runs every 0.1 s) until it holds."""
    for _ in range(300):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the pool never got there")


async def _fail_then_serve(planned: bool) -> dict[str, Any]:
    """Backend `a` (depth 2) stops answering /ready, held `restarting` first when `planned`;
    then it comes back at depth 3 and is readmitted. What a user sees at each point."""
    a, b = Upstream(stream_of([]), steps=2), Upstream(stream_of([]), steps=1)
    seen: dict[str, Any] = {}
    async with (
        a.running(),
        b.running(),
        proxy(
            {"a": a, "b": b},
            health={"interval_s": 0.1, "success_threshold": 1, "failure_threshold": 1},
        ) as (url, app),  # fmt: skip
        httpx.AsyncClient(base_url=url) as client,
    ):
        pool = app.state.pool
        if planned:
            body = {"state": "restarting", "to": "k3", "reason": REASON}
            answer = await client.put("/pool/backends/a/state", json=body, headers=ADMIN)
            assert answer.status_code == 200, answer.text
        ready = a._info.pop("/ready")
        with capture_logs() as logs:
            await _until(lambda: not pool.by_name["a"].reachable)
        seen["logs"] = logs
        seen["metrics"] = parse_metrics((await client.get("/metrics")).text)
        seen["pool"] = {x["name"]: x for x in (await client.get("/pool")).json()["backends"]}
        seen["sample"] = Sampler(app.state).take().backends["a"]
        a._info["/server_info"]["speculative_num_steps"] = 3
        a._info["/ready"] = ready
        if planned:
            answer = await client.put("/pool/backends/a/state", json={"state": "serving"},
                                      headers=ADMIN)  # fmt: skip
            assert answer.status_code == 200, answer.text
        else:
            await _until(lambda: (view := pool.index.view_of("a")) is not None and view.steps == 3)
        seen["after"] = {x["name"]: x for x in (await client.get("/pool")).json()["backends"]}
        seen["after_sample"] = Sampler(app.state).take().backends["a"]
    return seen


def _events(logs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["event"]: e for e in logs if e.get("backend") == "a"}


def test_a_planned_restart_is_logged_at_info_with_the_plans_reason_not_as_down() -> None:
    events = _events(asyncio.run(_fail_then_serve(planned=True))["logs"])
    assert "backend_down" not in events
    restarting = events["backend_restarting"]
    assert restarting["log_level"] == "info"
    assert (restarting["to"], restarting["reason"], restarting["steps"]) == ("k3", REASON, 2)


def test_an_unplanned_failure_is_still_down_at_warning() -> None:
    seen = asyncio.run(_fail_then_serve(planned=False))
    events = _events(seen["logs"])
    assert events["backend_down"]["log_level"] == "warning"
    assert "backend_restarting" not in events
    assert seen["metrics"]['specroute_backend_state{backend="a",state="down"}'] == 1.0
    assert seen["pool"]["a"]["state"] == "down"
    assert seen["sample"].state == "down"


def test_a_restarting_backend_is_restarting_in_metrics_pool_and_dashboard_data() -> None:
    seen = asyncio.run(_fail_then_serve(planned=True))
    metrics = seen["metrics"]
    state = 'specroute_backend_state{{backend="a",state="{}"}}'
    assert metrics[state.format("restarting")] == 1.0
    assert metrics[state.format("down")] == 0.0
    assert metrics[state.format("serving")] == 0.0
    assert metrics['specroute_backend_state{backend="b",state="serving"}'] == 1.0
    # `healthy` stays about health: the restarting server does not pass its checks.
    assert metrics['specroute_backend_healthy{backend="a"}'] == 0.0
    a = seen["pool"]["a"]
    assert a["state"] == "restarting"
    assert a["change"]["to"] == "k3"
    assert a["change"]["reason"] == REASON
    sample = seen["sample"]
    assert (sample.state, sample.to, sample.reason) == ("restarting", "k3", REASON)


def test_after_the_restart_the_new_depth_shows_beside_the_launch_name() -> None:
    seen = asyncio.run(_fail_then_serve(planned=True))
    a = seen["after"]["a"]
    assert (a["name"], a["steps"], a["state"], a["change"]) == ("a", 3, "serving", None)
    assert (seen["after_sample"].steps, seen["after_sample"].state) == (3, "serving")


def test_a_crash_after_a_depth_change_names_the_depth_the_server_runs_at(tmp_path: Path) -> None:
    options = LaunchOptions(model="m", steps=(2,), emulate=True)
    plan = build_plan(options)
    out = io.StringIO()
    launcher = Launcher(plan, LaunchSettings(log_dir=tmp_path), out=out)
    moved = server_at(options, plan.servers[0], Setting(steps=3))  # as a restart does
    launcher.crashed(Supervised(moved, tmp_path), -9, "last words")
    assert "steps2 exited with status -9; restarting at depth 3 (log:" in out.getvalue()

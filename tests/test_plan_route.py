"""`GET /plan` and the `specroute_plan_*` metrics: what the launcher's planner publishes, served
as sent; in `advise` the plan shows a paying change and nothing is drained or restarted."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import httpx
import msgspec
from emulator_support import parse_metrics
from inprocess import ADMIN, proxy
from servers import Server

from specroute.planner import DepthEstimate, Estimates, Setting
from specroute.policies import ClassEstimate
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer
from specroute.speculation import expected_tokens
from specroute.wire import Account, PlanDocument, PoolSnapshot

GREEDY = "m:greedy"
SETTLED = Account(at=100.0, servers=["a"], before_tok_s=782.0, forecast_tok_s=948.0,
                  realized_tok_s=897.0, forecast_error=0.0569, realized_gain=0.1471,
                  forecast_gain=0.0797)  # fmt: skip


def test_plan_says_no_planner_until_one_publishes(emulator: Server) -> None:
    async def scenario() -> dict[str, Any]:
        async with (
            proxy({"a": emulator}) as (url, _),  # type: ignore[dict-item]
            httpx.AsyncClient(base_url=url) as client,
        ):
            return (await client.get("/plan")).json()  # type: ignore[no-any-return]

    plan = asyncio.run(scenario())
    assert plan["mode"] == "off"
    assert plan["planner"] is None


def test_publishing_needs_the_admin_key_and_a_plan_document(emulator: Server) -> None:
    async def scenario() -> tuple[int, int]:
        async with (
            proxy({"a": emulator}) as (url, _),  # type: ignore[dict-item]
            httpx.AsyncClient(base_url=url) as client,
        ):
            keyless = await client.put("/plan", json={"mode": "auto"})
            bad = await client.put("/plan", json={"mode": 3}, headers=ADMIN)
        return keyless.status_code, bad.status_code

    assert asyncio.run(scenario()) == (401, 400)


def test_the_loop_reads_the_proxys_pool_through_the_typed_contract(emulator: Server) -> None:
    """The real proxy's `GET /pool` and a hold's answer decode as the loop's Structs, after a
    request so that a class and an iteration fit are there to read."""

    async def scenario() -> tuple[PoolSnapshot, int]:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "temperature": 0}  # fmt: skip
        async with (
            proxy({"a": emulator}) as (url, _),  # type: ignore[dict-item]
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            (await client.post("/v1/chat/completions", json=body)).raise_for_status()
            link = ProxyLink(url, ADMIN["authorization"].removeprefix("Bearer "))
            try:
                pool = await link.pool()
                held = await link.hold("a", "serving")
            finally:
                await link.aclose()
        return pool, held.in_flight

    pool, in_flight = asyncio.run(scenario())
    (backend,) = pool.backends
    assert backend.name == "a"
    assert backend.steps is not None
    assert backend.iteration_intercept_s is not None
    assert sum(c.samples for c in pool.estimates.classes.values()) == 1
    assert in_flight == 0


def _estimates() -> Estimates:
    depths = {
        k: DepthEstimate(steps=k, capacity=100 // (3 + k), intercept_s=0.02, per_token_s=0.0004)
        for k in range(4)
    }
    greedy = ClassEstimate(alpha=0.95, accept_length={1: expected_tokens(0.95, 1)})
    return Estimates(depths=depths, classes={GREEDY: greedy})


async def _advise(emulator: Server) -> tuple[dict[str, Any], dict[str, float], list[Any], Any]:
    """A quiet greedy regime on two k1 servers, planned in `advise`: the plan is published
    and the restart is never called."""
    restarts: list[tuple[str, Setting]] = []

    async def restart(name: str, setting: Setting) -> str | None:
        restarts.append((name, setting))
        return None

    async with proxy({"a": emulator}) as (url, app):  # type: ignore[dict-item]
        clock = [0.0]
        # Sized for this quiet load: a restart is charged what it costs at it (not at a peak).
        planner = {"confirm_s": 0.0, "peak_concurrency": 2.0}
        options = ReconfigureOptions(mode="advise", planner=planner)
        two = [("a", Setting(steps=1), 60.0), ("b", Setting(steps=1), 60.0)]
        actuator = Actuator("advise", two, clock=lambda: clock[0])
        link = ProxyLink(url, "admin-key")
        loop = Reconfigurer(options, link, actuator, restart, limit=lambda k: 48)
        while clock[0] < 600:
            loop.planner.observe(clock[0], {GREEDY: 2.0})
            clock[0] += 2.0
        loop._decide(clock[0], _estimates())
        loop.ledger.accounts = [SETTLED]
        await loop.publish()
        await link.aclose()
        async with httpx.AsyncClient(base_url=url) as client:
            plan = (await client.get("/plan")).json()
            metrics = parse_metrics((await client.get("/metrics")).text)
        return plan, metrics, restarts, app.state.pool.holds.state("a")


def test_plan_times_are_given_as_wall_clock_utc_beside_the_ages(emulator: Server) -> None:
    plan, _, _, _ = asyncio.run(_advise(emulator))
    published = datetime.datetime.fromisoformat(plan["published_at"])
    assert plan["published_at"].endswith("Z")  # as the log lines' timestamps
    assert abs((datetime.datetime.now(datetime.UTC) - published).total_seconds()) < 60
    made = datetime.datetime.fromisoformat(plan["plan_made_at"])
    assert abs((published - made).total_seconds() - plan["plan_age_s"]) <= 1
    for server in plan["servers"]:
        since = datetime.datetime.fromisoformat(server["since"])
        assert abs((published - since).total_seconds() - server["since_s"]) <= 1


def test_advise_publishes_a_paying_change_and_changes_nothing(emulator: Server) -> None:
    plan, metrics, restarts, hold = asyncio.run(_advise(emulator))
    assert plan["mode"] == "advise"
    assert plan["plan"]["verdict"] == "reconfigure"
    assert plan["plan"]["start"]
    assert [s["state"] for s in plan["servers"]] == ["serving", "serving"]
    assert [s["setting"] for s in plan["servers"]] == ["k1", "k1"]
    assert msgspec.convert(plan, PlanDocument).history == []  # an empty list is left out
    assert restarts == []
    assert hold is None
    # Kubernetes reads the wanted replicas per depth; the current ones stay apart.
    assert plan["current_replicas"] == {"1": 2}
    assert sum(plan["replicas"].values()) == 2
    assert plan["replicas"] != plan["current_replicas"]
    for steps, count in plan["replicas"].items():
        assert metrics[f'specroute_plan_replicas{{steps="{steps}"}}'] == count
    assert metrics['specroute_plan_info{mode="advise",verdict="reconfigure"}'] == 1.0
    assert metrics["specroute_plan_gain_tok_s"] == plan["plan"]["gain"]
    assert metrics['specroute_plan_servers{state="serving"}'] == 2.0
    # The last change held to account: its forecast error, and the gains forecast and realized.
    assert plan["accounts"][-1]["forecast_gain"] == SETTLED.forecast_gain
    assert metrics["specroute_plan_forecast_error_ratio"] == SETTLED.forecast_error
    assert metrics["specroute_plan_realized_gain_ratio"] == SETTLED.realized_gain
    assert metrics["specroute_plan_forecast_gain_ratio"] == SETTLED.forecast_gain


def test_the_kubernetes_planner_publishes_to_every_address_of_the_replicas_name(
    emulator: Server,
) -> None:
    from specroute.reconfigure.advisor import FanoutLink

    async def scenario() -> list[dict[str, Any]]:
        pair = proxy({"a": emulator}), proxy({"a": emulator})  # type: ignore[dict-item]
        async with pair[0] as (one, _), pair[1] as (two, _):
            port = one.rsplit(":", 1)[1]
            # "localhost" stands in for the headless Service: here it names only the first.
            link = FanoutLink(two, "admin-key", f"localhost:{port}")
            await link.publish(PlanDocument(mode="advise", planner="test", replicas={"2": 3}))
            await link.aclose()
            async with httpx.AsyncClient() as client:
                return [(await client.get(url + "/plan")).json() for url in (one, two)]

    first, second = asyncio.run(scenario())
    assert first["replicas"] == {"2": 3}
    assert second["mode"] == "off"  # --replicas, not --proxy, is where plans go

"""The depth plan at the proxy: `GET /plan` shows what the deployment's one planner (the
launcher's, `specroute launch --reconfigure`) last published with `PUT /plan`; its numbers as
`specroute_plan_*` metrics; and the backend holds the actuator sets while it drains and
restarts a server (`PUT /pool/backends/{name}/state`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import msgspec
import structlog
from litestar import Request, Response, get, put
from litestar.params import PathParameter
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from specroute.errors import BadRequestError, NotFoundError
from specroute.proxy.auth import ADMIN
from specroute.proxy.state import ProxyState

__all__ = ["PlanBoard", "PlanGauges", "plan_handlers"]

log = structlog.get_logger()

NO_PLANNER = {
    "mode": "off",
    "planner": None,
    "note": "no planner publishes here: `specroute launch --reconfigure advise|auto` runs one",
}
_READMIT_WAIT_S = 30.0
"""How long readmission waits for the backend to answer /ready and be rediscovered."""


class _Forecast(msgspec.Struct):
    tok_s: float = 0.0


class _Plan(msgspec.Struct):
    verdict: str = ""
    gain: float = 0.0
    current: _Forecast | None = None
    proposed: _Forecast | None = None


class _Server(msgspec.Struct):
    name: str
    state: str = "serving"


class _Numbers(msgspec.Struct, kw_only=True):
    """The few fields of a published plan that metrics read; the rest is served as sent."""

    mode: str = "off"
    plan: _Plan | None = None
    servers: list[_Server] = []
    outcomes: dict[str, int] = {}
    replicas: dict[str, int] = {}


class PlanBoard:
    """The last published plan, as bytes for `GET /plan` and as numbers for `/metrics`."""

    def __init__(self) -> None:
        self.body = msgspec.json.encode(NO_PLANNER)
        self.numbers = _Numbers()
        self.document: dict[str, Any] = dict(NO_PLANNER)
        self.published_at: float | None = None

    def publish(self, body: bytes) -> None:
        """Take a plan document; BadRequestError when it is not one."""
        try:
            document = msgspec.json.decode(body, type=dict[str, Any])
            numbers = msgspec.convert(document, _Numbers)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BadRequestError(f"not a plan document: {exc}", param="plan") from exc
        self.body, self.document, self.numbers = body, document, numbers
        self.published_at = time.monotonic()


class PlanGauges:
    """`specroute_plan_*` and `specroute_reconfigurations_total` from the board."""

    def __init__(self, board: PlanBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[Metric]:
        n = self._board.numbers
        replicas = GaugeMetricFamily(
            "specroute_plan_replicas",
            "Servers the plan wants at each depth (`adaptive`: SGLang-adaptive); Kubernetes "
            "scales each depth's Deployment to it.",
            labels=("steps",),
        )
        for steps, count in sorted(n.replicas.items()):
            replicas.add_metric((steps,), count)
        yield replicas
        plan = n.plan
        yield GaugeMetricFamily(
            "specroute_plan_gain_tok_s",
            "The plan's predicted gain of its proposal over the current depths (the "
            "objective's unit: tok/s, or per-user tok/s for latency).",
            value=plan.gain if plan is not None else 0.0,
        )
        predicted = GaugeMetricFamily(
            "specroute_plan_predicted_tok_s",
            "Predicted pool tok/s of the current depths and of the plan's proposal.",
            labels=("assignment",),
        )
        if plan is not None:
            for which, fc in (("current", plan.current), ("proposed", plan.proposed)):
                if fc is not None:
                    predicted.add_metric((which,), fc.tok_s)
        yield predicted
        yield from self._states(n)
        done = CounterMetricFamily(
            "specroute_reconfigurations",
            "Depth changes carried out, by outcome (done, fell_back, failed).",
            labels=("outcome",),
        )
        for outcome, count in sorted(n.outcomes.items()):
            done.add_metric((outcome,), count)
        yield done

    def _states(self, n: _Numbers) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "specroute_plan_servers",
            "Servers serving, draining or restarting, as the actuator reports them.",
            labels=("state",),
        )
        for state in ("serving", "draining", "restarting"):
            states.add_metric((state,), sum(1 for s in n.servers if s.state == state))
        yield states
        verdict = n.plan.verdict.split(":")[0] if n.plan is not None else "none"
        info = GaugeMetricFamily(
            "specroute_plan_info", "1, labelled with the mode and the plan's verdict.",
            labels=("mode", "verdict"),
        )  # fmt: skip
        info.add_metric((n.mode, verdict), 1.0)
        yield info


class HoldChange(msgspec.Struct, forbid_unknown_fields=True):
    """`PUT /pool/backends/{name}/state`: the actuator's hold, with the change it is part of
    (`to`: the setting it moves to, `reason`: the plan's), which logs, `/pool`, metrics and
    the dashboard show while it lasts."""

    state: Literal["serving", "draining", "restarting"]
    to: str = ""
    reason: str = ""


def _hold_answer(state: ProxyState, name: str) -> dict[str, Any]:
    backend = state.pool.by_name[name]
    held = state.pool.holds.get(name)
    return {
        "backend": name,
        "state": held.state if held else "serving",
        "to": held.to if held else "",
        "reason": held.reason if held else "",
        "in_flight": backend.in_flight,
        "reachable": backend.reachable,
        "steps": backend.steps,
        "capacity": backend.capacity,
    }


async def _readmit(state: ProxyState, name: str) -> None:
    """Serve `name` again once it answers /ready and its depth and capacity are read anew
    (the pool's watch rediscovers it); after `_READMIT_WAIT_S` it is released anyway and
    the health checks keep it out while it is down."""
    backend = state.pool.by_name[name]
    if state.pool.holds.state(name) == "restarting":
        backend.needs_discovery = True
        deadline = time.monotonic() + _READMIT_WAIT_S
        while time.monotonic() < deadline and (backend.needs_discovery or not backend.reachable):
            await state.pool.wait_changed(0.05)
    state.pool.holds.release(name)
    state.pool.notify()


def plan_handlers(state: ProxyState, board: PlanBoard) -> list[Any]:
    @get("/plan", sync_to_thread=False)
    def get_plan() -> Response[bytes]:
        return Response(board.body, media_type="application/json")

    @put("/plan", opt=ADMIN)
    async def put_plan(request: Request[Any, Any, Any]) -> Response[bytes]:
        board.publish(await request.body())
        return Response(b'{"status":"published"}', media_type="application/json")

    @put("/pool/backends/{name:str}/state", opt=ADMIN)
    async def put_backend_state(
        name: Annotated[str, PathParameter()], request: Request[Any, Any, Any]
    ) -> Response[bytes]:
        if name not in state.pool.by_name:
            raise NotFoundError(f"no backend named {name!r}", param="name")
        try:
            change = msgspec.json.decode(await request.body(), type=HoldChange)
        except msgspec.DecodeError as exc:
            raise BadRequestError(str(exc), param="state") from exc
        before = state.pool.holds.state(name) or "serving"
        if change.state == "serving":
            await _readmit(state, name)
        else:
            state.pool.holds.hold(name, change.state, to=change.to, reason=change.reason)
        if before != change.state:
            log.info("backend_hold", backend=name, state=change.state, previous=before,
                     steps=state.pool.by_name[name].steps, to=change.to,
                     reason=change.reason)  # fmt: skip
        return Response(msgspec.json.encode(_hold_answer(state, name)),
                        media_type="application/json")  # fmt: skip

    return [get_plan, put_plan, put_backend_state]

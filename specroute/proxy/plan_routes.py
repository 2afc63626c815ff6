"""The depth plan at the proxy: `GET /plan` shows what the deployment's one planner (the
launcher's, `specroute launch --reconfigure`) last published with `PUT /plan`; its numbers as
`specroute_plan_*` metrics; and the backend holds the actuator sets while it drains and
restarts a server (`PUT /pool/backends/{name}/state`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Request, Response, get, put
from litestar.params import PathParameter
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from specroute.errors import BadRequestError, NotFoundError
from specroute.proxy.auth import ADMIN
from specroute.proxy.state import ProxyState
from specroute.wire import HoldAnswer, HoldChange, PlanDocument, no_planner

__all__ = ["PlanBoard", "PlanGauges", "plan_handlers"]

log = structlog.get_logger()
_plan_document = msgspec.json.Decoder(PlanDocument)
_hold_change = msgspec.json.Decoder(HoldChange)
_encode = msgspec.json.Encoder().encode

_READMIT_WAIT_S = 30.0
"""How long readmission waits for the backend to answer /ready and be rediscovered."""


class PlanBoard:
    """The last published plan, as bytes for `GET /plan` and as numbers for `/metrics`."""

    def __init__(self) -> None:
        self.document = no_planner()
        self.body = _encode(self.document)
        self.published_at: float | None = None

    def publish(self, body: bytes) -> None:
        """Take a plan document, served as sent; BadRequestError when it is not one."""
        try:
            document = _plan_document.decode(body)
        except msgspec.DecodeError as exc:  # ValidationError included
            raise BadRequestError(f"not a plan document: {exc}", param="plan") from exc
        self.body, self.document = body, document
        self.published_at = time.monotonic()


class PlanGauges:
    """`specroute_plan_*` and `specroute_reconfigurations_total` from the board."""

    def __init__(self, board: PlanBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[Metric]:
        n = self._board.document
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
        yield from self._accounts(n)
        yield from self._states(n)
        done = CounterMetricFamily(
            "specroute_reconfigurations",
            "Depth changes carried out, by outcome (done, fell_back, failed).",
            labels=("outcome",),
        )
        for outcome, count in sorted(n.outcomes.items()):
            done.add_metric((outcome,), count)
        yield done

    def _accounts(self, n: PlanDocument) -> Iterator[Metric]:
        """The last settled change held to account, and the bar the planner holds now."""
        settled = [a for a in n.accounts if a.realized_tok_s is not None]
        last = settled[-1] if settled else None
        error = GaugeMetricFamily(
            "specroute_plan_forecast_error_ratio",
            "The last settled change: (forecast - realized) / realized pool tok/s.",
        )
        gain = GaugeMetricFamily(
            "specroute_plan_realized_gain_ratio",
            "The last settled change: realized pool tok/s over the rate before it, less one.",
        )
        promised = GaugeMetricFamily(
            "specroute_plan_forecast_gain_ratio",
            "The last settled change: the gain its plan forecast (the pool it made over the "
            "pool before, both forecast), less one; what the bar's band compares with the "
            "realized gain.",
        )
        if last is not None and last.forecast_error is not None:
            error.add_metric((), last.forecast_error)
        if last is not None and last.realized_gain is not None:
            gain.add_metric((), last.realized_gain)
        if last is not None and last.forecast_gain is not None:
            promised.add_metric((), last.forecast_gain)
        yield error
        yield gain
        yield promised
        yield GaugeMetricFamily(
            "specroute_plan_bar_ratio",
            "The gain a change must promise, as a fraction of the objective (raised while "
            "changes do not pay).",
            value=n.plan.bar if n.plan is not None else 0.0,
        )

    def _states(self, n: PlanDocument) -> Iterator[Metric]:
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


def _hold_answer(state: ProxyState, name: str) -> HoldAnswer:
    backend = state.pool.by_name[name]
    held = state.pool.holds.get(name)
    return HoldAnswer(
        backend=name, state=held.state if held else "serving",
        to=held.to if held else "", reason=held.reason if held else "",
        in_flight=backend.in_flight, reachable=backend.reachable, steps=backend.steps,
        capacity=backend.capacity,
    )  # fmt: skip


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
            change = _hold_change.decode(await request.body())
        except msgspec.DecodeError as exc:
            raise BadRequestError(str(exc), param="state") from exc
        before = state.pool.holds.state(name) or "serving"
        if change.setting is not None:
            backend = state.pool.by_name[name]
            backend.declare(change.setting.steps, bool(change.setting.table))
            state.pool.index.touch(backend)
        if change.state == "serving":
            await _readmit(state, name)
        else:
            state.pool.holds.hold(name, change.state, to=change.to, reason=change.reason)
        if before != change.state:
            log.info("backend_hold", backend=name, state=change.state, previous=before,
                     steps=state.pool.by_name[name].steps, to=change.to,
                     reason=change.reason)  # fmt: skip
        return Response(_encode(_hold_answer(state, name)),
                        media_type="application/json")  # fmt: skip

    return [get_plan, put_plan, put_backend_state]

"""Answers about the pool as a whole: /v1/models, /server_info, /model_info and /pool, so that
SGLang's own tools (sglang.bench_serving) work through the proxy."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from specroute.errors import NoHealthyBackendError, UpstreamUnavailableError
from specroute.lanes import BATCH, INTERACTIVE
from specroute.policies import ClassEstimate
from specroute.pool import Backend, Hold, UpstreamFailure
from specroute.pool.telemetry import Telemetry
from specroute.proxy.state import ProxyState
from specroute.proxy.vllm_info import vllm_server_info
from specroute.wire import BackendSnapshot, ClassSnapshot, IterationFit, PoolEstimates, PoolSnapshot

__all__ = [
    "class_snapshots",
    "model_list",
    "pool_info",
    "prior_depths",
    "proxied_info",
    "replicas_info",
    "scrub_secrets",
    "server_info",
]

_json = msgspec.json.Decoder(dict[str, Any])
_SECRET_WORDS = ("api_key", "secret", "password", "credential")


def scrub_secrets(info: dict[str, Any]) -> dict[str, Any]:
    """A backend's /server_info without its keys: SGLang lists every server argument there,
    `api_key` and `admin_api_key` included, and clients of the proxy must never see them."""
    return {
        k: v
        for k, v in info.items()
        if not (any(word in k.lower() for word in _SECRET_WORDS) or k.lower().endswith("token"))
    }


def model_list(state: ProxyState) -> dict[str, Any]:
    """The union of the backends' model cards, one per model id."""
    cards: dict[str, dict[str, Any]] = {}
    for backend in state.pool.backends:
        for card in backend.model_cards:
            cards.setdefault(str(card["id"]), card)
        if backend.model and backend.model not in cards:
            cards[backend.model] = {
                "id": backend.model,
                "object": "model",
                "created": int(state.started),
                "owned_by": "sglang",
                "root": backend.model,
                "parent": None,
            }
    return {"object": "list", "data": list(cards.values())}


def pool_info(state: ProxyState) -> PoolSnapshot:
    """`GET /pool`: every backend as policies see it (its combined load and headroom too,
    while it is reachable) with its state (serving, draining, restarting, down) and the depth
    change it is part of, what the pool learned, the lanes, the replicas, and the recent
    decisions. `steps` is the depth it serves at now, whatever its name says (a server keeps
    its launch name across depth changes)."""
    pool = state.pool
    now = time.monotonic()
    backends = []
    for backend in pool.backends:
        view = msgspec.structs.asdict(pool.index.view_of(backend.name) or backend.view())
        view["breaker"] = backend.breaker.state.value
        view["state"] = pool.state_of(backend)
        view["change"] = _change(pool.holds.get(backend.name), now)
        backends.append(msgspec.convert(view, BackendSnapshot))
    return PoolSnapshot(
        policy=state.policy.name,
        waiting=state.admission.waiting,
        backends=backends,
        estimates=_estimates(state),
        replicas=replicas_info(state),
        recent_decisions=state.decisions.render(),
        lanes=state.lanes.report(_lanes_waiting(state)),
    )


def _estimates(state: ProxyState) -> PoolEstimates:
    """What the pool has learned: acceptance and length per class, iteration time per backend."""
    pool = state.pool
    telemetry = pool.telemetry
    iteration = {
        f"{name}@{steps}": IterationFit(
            intercept_s=model.intercept, per_token_s=model.slope, observations=model.observations
        )
        for (name, steps), model in telemetry.iteration.items()
    }
    # What policies see: blended over this replica and its peers (this one's alone if none).
    blended = pool.index.classes(pool.instance, time.monotonic())
    return PoolEstimates(
        classes=class_snapshots(blended),
        local_classes=class_snapshots(telemetry.classes()),
        prior_alpha=telemetry.acceptance.prior_alpha,
        acceptance_sources=dict(telemetry.sources),
        iteration=iteration,
        depths=prior_depths(telemetry),
        capacity=dict(sorted(pool.tuned_capacity.items())),
    )


def prior_depths(telemetry: Telemetry) -> dict[int, IterationFit]:
    """`/pool`'s `estimates.depths`: the prior's line and measured points per depth."""
    return {
        k: IterationFit(intercept_s=a, per_token_s=s, measured=list(telemetry.curves.get(k, ())))
        for k, (a, s) in sorted(telemetry.priors.items())
    }


def class_snapshots(classes: Mapping[str, ClassEstimate]) -> dict[str, ClassSnapshot]:
    """`/pool`'s classes: what each class's estimate says, as the wire carries it."""
    return {
        name: ClassSnapshot(alpha=c.alpha, accept_length=dict(c.accept_length),
                            samples=c.samples, mean_tokens=c.mean_tokens,
                            completions=c.completions, first_token_s=c.first_token_s,
                            prefill_pause_s=c.prefill_pause_s)
        for name, c in classes.items()
    }  # fmt: skip


def _change(hold: Hold | None, now: float) -> dict[str, Any] | None:
    """The depth change a held backend is part of, as the launcher's actuator said."""
    if hold is None:
        return None
    return {"state": hold.state, "to": hold.to, "reason": hold.reason,
            "since_s": round(now - hold.since, 1)}  # fmt: skip


def replicas_info(state: ProxyState) -> dict[str, Any]:
    """This replica among the others: its id, their count and its rank (the split of each
    backend's free room), each peer's age, and what the scrapes behind it cost."""
    pool = state.pool
    now = time.monotonic()
    share = pool.index.share
    ages = pool.peers.table.ages(now)
    return {
        "instance": pool.instance,
        "replicas": share.replicas,
        "rank": share.rank,
        "peers": {k: None if v is None else round(v, 3) for k, v in ages.items()},
        "scrapes": pool.scraper.stats(),
    }


async def _fetch(state: ProxyState, backend: Backend, path: str) -> bytes | None:
    try:
        status, body = await state.client.get(
            backend.url + path,
            timeout_s=state.config.health.timeout_s,
            headers=backend.auth_headers,
        )
    except UpstreamFailure:
        return None
    return body if status == 200 else None


async def proxied_info(state: ProxyState, path: str) -> bytes:
    """The first healthy backend's answer (every backend serves the same model)."""
    healthy = state.pool.healthy()
    if not healthy:
        raise NoHealthyBackendError("no healthy backend", retry_after=1)
    for backend in healthy:
        body = await _fetch(state, backend, path)
        if body is not None:
            return body
    raise UpstreamUnavailableError(f"no backend answered {path}")


async def server_info(state: ProxyState) -> dict[str, Any]:
    """One backend's /server_info, with `internal_states[0]` describing the whole pool (what
    sglang.bench_serving reads): its `avg_spec_accept_length` is the mean over backends weighted
    by their generated tokens. `host` and `port` are the proxy's own, never a backend's. A vLLM
    backend is described by the pool (`vllm_info`); a pool of vLLM servers alone gets that."""
    healthy = state.pool.healthy()
    if not healthy:
        raise NoHealthyBackendError("no healthy backend", retry_after=1)
    # vLLM has no /server_info (developer mode aside): the pool's knowledge answers for it.
    asked = [b for b in healthy if b.engine != "vllm"]
    async with asyncio.TaskGroup() as group:
        tasks = [(b, group.create_task(_fetch(state, b, "/server_info"))) for b in asked]
    infos = [(b, vllm_server_info(b)) for b in healthy if b.engine == "vllm"]
    for backend, task in tasks:
        body = task.result()
        if body is not None:
            try:
                infos.append((backend, _json.decode(body)))
            except msgspec.DecodeError:
                continue
    if not infos:
        raise UpstreamUnavailableError("no backend answered /server_info")
    infos.sort(key=lambda pair: pair[0].engine == "vllm")  # an SGLang server's answer first
    base = scrub_secrets(infos[0][1])
    # Clients record these as the server they measured: that is this proxy (port 0: unknown).
    base["host"], base["port"] = state.config.host, state.config.port or None
    base.pop("launch_command", None)  # one backend's command line, its port included
    states = [_first_state(info) for _, info in infos]
    base["internal_states"] = [_pool_state(infos, states), *states]
    base["specroute"] = {"backends": [b.name for b, _ in infos], "policy": state.policy.name}
    return base


def _first_state(info: dict[str, Any]) -> dict[str, Any]:
    """`internal_states[0]`, where it is an object: an odd one is left out, not a 500."""
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states else None
    return dict(first) if isinstance(first, dict) else {}


def _pool_state(
    infos: list[tuple[Backend, dict[str, Any]]], states: list[dict[str, Any]]
) -> dict[str, Any]:
    merged = dict(states[0])
    weighted = [
        (float(s["avg_spec_accept_length"]), b.metrics.generation_tokens or 1.0)
        for (b, _), s in zip(infos, states, strict=True)
        if isinstance(s.get("avg_spec_accept_length"), int | float)
        and math.isfinite(s["avg_spec_accept_length"])
    ]
    if weighted:
        total = sum(w for _, w in weighted)
        merged["avg_spec_accept_length"] = sum(v * w for v, w in weighted) / total
    throughputs = [s.get("last_gen_throughput") for s in states]
    merged["last_gen_throughput"] = sum(t for t in throughputs if isinstance(t, int | float))
    return merged


def _lanes_waiting(state: ProxyState) -> dict[str, int]:
    """Requests of each lane in the admission queue."""
    admission = state.admission
    interactive = admission.interactive_waiting
    return {INTERACTIVE: interactive, BATCH: admission.waiting - interactive}

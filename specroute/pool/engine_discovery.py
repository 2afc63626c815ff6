"""The I/O half of `engines`: recognise an "auto" backend's engine, and discover a vLLM
backend (which has no /server_info outside its developer mode) from what it does serve."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from specroute.pool.backend import Backend
from specroute.pool.engines import (
    Engine,
    engine_of_metrics,
    engine_of_server_info,
    parse_vllm_metrics,
    vllm_settings,
)

__all__ = ["Getter", "discover_vllm", "recognise"]

Getter = Callable[[str], Awaitable[tuple[int, bytes]]]
"""A GET of one path on the backend: (status, body); raises the pool client's failures."""

_json = msgspec.json.Decoder(dict[str, Any])


def _object(body: bytes) -> dict[str, Any] | None:
    try:
        return _json.decode(body)
    except msgspec.DecodeError:
        return None


async def recognise(get: Getter) -> Engine | None:
    """SGLang answers /server_info with its arguments (vLLM, in developer mode only, with
    `vllm_config`); else the prefix of the metric names tells; None when nothing does."""
    status, body = await get("/server_info")
    info = _object(body) if status == 200 else None
    if info is not None:
        return engine_of_server_info(info)
    status, body = await get("/metrics")
    return engine_of_metrics(body.decode("utf-8", "replace")) if status == 200 else None


async def discover_vllm(get: Getter, backend: Backend) -> None:
    """Model from /v1/models, depth and capacity from the developer-mode /server_info where it
    answers, else from the operator's configuration, and the depth from the per-position
    counters of one scrape where neither says."""
    status, body = await get("/server_info?config_format=json")
    info = _object(body) if status == 200 else None
    status, body = await get("/v1/models")
    models = _object(body) if status == 200 else None
    if models is not None:
        backend.apply_models(models)
    status, body = await get("/metrics")
    if status == 200:
        backend.scraped(parse_vllm_metrics(body.decode("utf-8", "replace"), backend.metrics))
    backend.apply_vllm(vllm_settings(info) if info is not None else None)

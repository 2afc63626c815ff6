"""The backend pool: discovery, health, metrics, in-flight accounting and the upstream client."""

from specroute.pool.backend import Backend
from specroute.pool.breaker import BreakerState, CircuitBreaker
from specroute.pool.client import (
    ConnectFailed,
    StreamBroken,
    TimedOut,
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
)
from specroute.pool.pool import Lease, Pool
from specroute.pool.promtext import BackendMetrics, parse_metrics

__all__ = [
    "Backend",
    "BackendMetrics",
    "BreakerState",
    "CircuitBreaker",
    "ConnectFailed",
    "Lease",
    "Pool",
    "StreamBroken",
    "TimedOut",
    "UpstreamClient",
    "UpstreamFailure",
    "UpstreamResponse",
    "parse_metrics",
]

"""The backend pool: discovery, health, metrics, in-flight accounting and the upstream client."""

from specroute.pool.backend import Backend
from specroute.pool.breaker import BreakerState, CircuitBreaker
from specroute.pool.client import (
    ConnectFailed,
    Stalled,
    StreamBroken,
    TimedOut,
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
)
from specroute.pool.estimators import StallRule
from specroute.pool.pool import Lease, Pool
from specroute.pool.prior import load_profile_priors, priors_from_profile
from specroute.pool.promtext import BackendMetrics, parse_metrics
from specroute.pool.telemetry import Telemetry

__all__ = [
    "Backend",
    "BackendMetrics",
    "BreakerState",
    "CircuitBreaker",
    "ConnectFailed",
    "Lease",
    "Pool",
    "StallRule",
    "Stalled",
    "StreamBroken",
    "Telemetry",
    "TimedOut",
    "UpstreamClient",
    "UpstreamFailure",
    "UpstreamResponse",
    "load_profile_priors",
    "parse_metrics",
    "priors_from_profile",
]

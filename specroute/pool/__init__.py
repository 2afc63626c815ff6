"""The backend pool: discovery, health, metrics, in-flight accounting and the upstream client;
its routing index, and what its replicas share (load split, peers' estimates)."""

from specroute.pool.backend import Backend
from specroute.pool.breaker import BreakerState, CircuitBreaker
from specroute.pool.client import (
    BadReply,
    ConnectFailed,
    ReplyTooLarge,
    Stalled,
    StreamBroken,
    TimedOut,
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
)
from specroute.pool.deadlines import AttemptLimits, Deadlines, attempt_limits
from specroute.pool.eligibility import Refusal, refusal
from specroute.pool.engines import Engine, VllmSettings, parse_vllm_metrics, vllm_settings
from specroute.pool.estimators import StallRule
from specroute.pool.holds import BACKEND_STATES, BackendState, Hold, Holds, HoldState
from specroute.pool.index import RoutingIndex
from specroute.pool.load import LoadMark, Share, headroom, share_of
from specroute.pool.peers import Peers
from specroute.pool.pool import Lease, Pool
from specroute.pool.prior import load_profile_priors, priors_from_profile
from specroute.pool.promtext import BackendMetrics, parse_metrics
from specroute.pool.scraper import Scraper, scrape_interval
from specroute.pool.sharing import EstimatesWire, PeerTable, blend_classes, local_estimates
from specroute.pool.telemetry import Telemetry

__all__ = [
    "BACKEND_STATES",
    "AttemptLimits",
    "Backend",
    "BackendMetrics",
    "BackendState",
    "BadReply",
    "BreakerState",
    "CircuitBreaker",
    "ConnectFailed",
    "Deadlines",
    "Engine",
    "EstimatesWire",
    "Hold",
    "HoldState",
    "Holds",
    "Lease",
    "LoadMark",
    "PeerTable",
    "Peers",
    "Pool",
    "Refusal",
    "ReplyTooLarge",
    "RoutingIndex",
    "Scraper",
    "Share",
    "StallRule",
    "Stalled",
    "StreamBroken",
    "Telemetry",
    "TimedOut",
    "UpstreamClient",
    "UpstreamFailure",
    "UpstreamResponse",
    "VllmSettings",
    "attempt_limits",
    "blend_classes",
    "headroom",
    "load_profile_priors",
    "local_estimates",
    "parse_metrics",
    "parse_vllm_metrics",
    "priors_from_profile",
    "refusal",
    "scrape_interval",
    "share_of",
    "vllm_settings",
]

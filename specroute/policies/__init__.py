"""Routing policies: the `Policy` protocol, its data types, the registry and the built-ins."""

from specroute.policies.builtin import LeastLoaded, RoundRobin
from specroute.policies.registry import (
    ENTRY_POINT_GROUP,
    PolicyFactory,
    UnknownPolicyError,
    available,
    create,
)
from specroute.policies.types import (
    BackendView,
    Decision,
    Outcome,
    Policy,
    PoolView,
    RouteRequest,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendView",
    "Decision",
    "LeastLoaded",
    "Outcome",
    "Policy",
    "PolicyFactory",
    "PoolView",
    "RoundRobin",
    "RouteRequest",
    "UnknownPolicyError",
    "available",
    "create",
]

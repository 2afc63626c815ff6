"""Routing policies: the `Policy` protocol, its data types, the registry and the built-ins."""

from specroute.policies.bandit import Bandit, BanditOptions
from specroute.policies.builtin import LeastLoaded, RoundRobin
from specroute.policies.groups import Candidates, Group, Groups, LazyBackends, candidates_of
from specroute.policies.registry import (
    ENTRY_POINT_GROUP,
    OptionHelp,
    PolicyFactory,
    UnknownPolicyError,
    available,
    create,
    option_help,
    options_of,
    parse_spec,
    pinned_depth,
)
from specroute.policies.static import Static, StaticOptions
from specroute.policies.threshold import Threshold, ThresholdOptions
from specroute.policies.throughput import Throughput, ThroughputOptions
from specroute.policies.types import (
    BackendView,
    ClassEstimate,
    Decision,
    Outcome,
    Policy,
    PoolView,
    RouteRequest,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendView",
    "Bandit",
    "BanditOptions",
    "Candidates",
    "ClassEstimate",
    "Decision",
    "Group",
    "Groups",
    "LazyBackends",
    "LeastLoaded",
    "OptionHelp",
    "Outcome",
    "Policy",
    "PolicyFactory",
    "PoolView",
    "RoundRobin",
    "RouteRequest",
    "Static",
    "StaticOptions",
    "Threshold",
    "ThresholdOptions",
    "Throughput",
    "ThroughputOptions",
    "UnknownPolicyError",
    "available",
    "candidates_of",
    "create",
    "option_help",
    "options_of",
    "parse_spec",
    "pinned_depth",
]

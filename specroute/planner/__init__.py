"""The depth planner: which speculative depth each server should run as load shifts, and when
a restart pays. Pure: the caller passes time, the pool's servers and the estimators."""

from specroute.planner.decision import (
    DEFAULT_DWELL_S,
    Change,
    Plan,
    PlannerOptions,
    ServerState,
)
from specroute.planner.estimates import DepthEstimate, Estimates
from specroute.planner.forecast import (
    Forecast,
    Objective,
    ServerForecast,
    Setting,
    Table,
    Tier,
    forecast,
    forecast_seen,
    held_under,
    user_counts,
    user_split,
)
from specroute.planner.lanes import LaneDemand, at_target_slots, served_first, shortfall
from specroute.planner.plan import Planner
from specroute.planner.regime import Regime, RegimeTracker

__all__ = [
    "DEFAULT_DWELL_S",
    "Change",
    "DepthEstimate",
    "Estimates",
    "Forecast",
    "LaneDemand",
    "Objective",
    "Plan",
    "Planner",
    "PlannerOptions",
    "Regime",
    "RegimeTracker",
    "ServerForecast",
    "ServerState",
    "Setting",
    "Table",
    "Tier",
    "at_target_slots",
    "forecast",
    "forecast_seen",
    "held_under",
    "served_first",
    "shortfall",
    "user_counts",
    "user_split",
]

"""Typed contracts between processes: what the launcher, the advisor and the proxy send each
other (`GET /pool`, `PUT /plan`, backend holds), as msgspec Structs both sides decode."""

from specroute.wire.admin import (
    Account,
    BackendSnapshot,
    ChangeRecord,
    ChangeSummary,
    ClassSnapshot,
    ForecastSummary,
    HoldAnswer,
    HoldChange,
    HoldState,
    IterationFit,
    PlanDocument,
    PlanSummary,
    PoolEstimates,
    PoolSnapshot,
    RegimeSummary,
    ServerRow,
    SettingWire,
    no_planner,
)

__all__ = [
    "Account",
    "BackendSnapshot",
    "ChangeRecord",
    "ChangeSummary",
    "ClassSnapshot",
    "ForecastSummary",
    "HoldAnswer",
    "HoldChange",
    "HoldState",
    "IterationFit",
    "PlanDocument",
    "PlanSummary",
    "PoolEstimates",
    "PoolSnapshot",
    "RegimeSummary",
    "ServerRow",
    "SettingWire",
    "no_planner",
]

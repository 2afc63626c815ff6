"""The bundled benchmark client: sweeps, trace replay, comparisons, profiles and reports.

It talks to servers only over HTTP. Python API: `await run_sweep(SweepSettings(...))`, then
`render_table(result, reference)`; `run_trace`, `render_comparison`, `profile_from_result`.
"""

from specroute.bench.client import BenchClient, RequestRecord
from specroute.bench.compare import render_comparison
from specroute.bench.level import SweepSettings, Target, parse_target
from specroute.bench.levels import AcceptLengths, LevelSummary, summarize_level
from specroute.bench.profile import load_profile, merge_profiles, profile_from_result
from specroute.bench.reference import (
    Reference,
    ReferencePoint,
    load_reference,
    reference_from_mapping,
)
from specroute.bench.report import (
    load_result,
    render_csv,
    render_markdown,
    render_table,
    save_result,
)
from specroute.bench.selfcheck import ClientHealth
from specroute.bench.stats import Summary, percentile, summarize
from specroute.bench.sweep import LevelResult, SweepResult, run_sweep
from specroute.bench.trace import Scenario, load_scenario, run_trace
from specroute.bench.workload import ApiSettings, PromptSettings, Sampling

__all__ = [
    "AcceptLengths",
    "ApiSettings",
    "BenchClient",
    "ClientHealth",
    "LevelResult",
    "LevelSummary",
    "PromptSettings",
    "Reference",
    "ReferencePoint",
    "RequestRecord",
    "Sampling",
    "Scenario",
    "Summary",
    "SweepResult",
    "SweepSettings",
    "Target",
    "load_profile",
    "load_reference",
    "load_result",
    "load_scenario",
    "merge_profiles",
    "parse_target",
    "percentile",
    "profile_from_result",
    "reference_from_mapping",
    "render_comparison",
    "render_csv",
    "render_markdown",
    "render_table",
    "run_sweep",
    "run_trace",
    "save_result",
    "summarize",
    "summarize_level",
]

"""The pools the wall-clock run puts side by side (`benchmarks/live_reconfigure.py`), each one
`specroute launch --emulate` command line with the same prior, emulator and time scaling, and the
table that compares them phase by phase. Pure: no process, no socket."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import msgspec

from specroute.bench.sweep import SweepResult
from specroute.wire import PlanDocument

__all__ = ["Pool", "PoolResult", "Scaling", "launch_argv", "pools", "table", "verdict"]

STARTUP_S = 88.0
"""The seed profile's start-up on real hardware (model load, CUDA graphs, warm-up)."""


class Scaling(msgspec.Struct, frozen=True, kw_only=True):
    """How the run shrinks time. The emulated GPU runs `time_scale` times as fast (below 1: slower,
    to keep each emulator's CPU low on a shared machine); the trace's phases, a server's start-up
    and the planner's times (settle, window, confirm, dwell, drain, regime prior) are all
    multiplied by `compress`, so regimes stay as long against a restart as in the trace."""

    profile: str = "seed-qwen35-122b"
    time_scale: float = 0.25
    compress: float = 0.2
    planner: dict[str, float] = {}
    """Planner settings that replace the compressed ones (`--planner-option`)."""

    def planner_options(self) -> dict[str, float]:
        """`--planner-option` values: the planner's defaults, compressed, then `planner`."""
        c = self.compress
        return {"settle_s": 120 * c, "window_s": 60 * c, "confirm_s": 30 * c,
                "regime_prior_s": 1800 * c, **self.planner}  # fmt: skip

    def emulator_args(self) -> list[str]:
        """`--emulator-arg`s: the profile, the GPU's speed and a start-up of STARTUP_S x
        compress wall seconds (the emulator divides its start-up by the time scale)."""
        startup = STARTUP_S * self.compress * self.time_scale
        return [
            f"--emulator-arg=--profile={self.profile}",
            f"--emulator-arg=--time-scale={self.time_scale:g}",
            f"--emulator-arg=--startup-s={startup:g}",
        ]

    def loop_flags(self) -> list[str]:
        """`launch`'s own loop flags, compressed from their defaults (900 s dwell, 30 s drain)."""
        return ["--min-dwell", f"{900 * self.compress:g}", "--drain", f"{30 * self.compress:g}"]


class Pool(msgspec.Struct, frozen=True, kw_only=True):
    """One pool of the comparison: `steps` None runs the pool the prior recommends."""

    name: str
    steps: tuple[int, ...] | None = None
    reconfigure: str = "off"
    adaptive: bool = False
    """SGLang's `--speculative-adaptive` with its built-in tiers (depths up to 7)."""
    table: tuple[tuple[int, int, int], ...] | None = None
    """vLLM's `num_speculative_tokens_per_batch_size` (first batch, last batch, K), with
    `steps` its `num_speculative_tokens`."""
    allow_adaptive: bool = False
    """`launch --allow-adaptive`: on vLLM, the prior's pool starts on the prior's K-per-batch
    tables and the planner may assign its own."""


def pools(
    launched: tuple[int, ...],
    fixed: Sequence[int],
    servers: int,
    dynamic: tuple[int, tuple[tuple[int, int, int], ...]] | None = None,
    allow_adaptive: bool = False,
) -> list[Pool]:
    """auto from the prior's pool; the same pool never reconfigured; `servers` alike at each
    depth of `fixed` (one the launched pool already is runs once, as the launched pool); then
    the engine's own answer: `servers` SGLang-adaptive servers, or on vLLM (`dynamic`: its
    `num_speculative_tokens` and table) `servers` running that dynamic-K table.
    `allow_adaptive`: auto and the launched pool with `launch --allow-adaptive`."""
    out = [Pool(name="auto", reconfigure="auto", allow_adaptive=allow_adaptive),
           Pool(name="launched", allow_adaptive=allow_adaptive)]  # fmt: skip
    out += [Pool(name=f"k{k}", steps=(k,) * servers) for k in fixed if launched != (k,) * servers]
    if dynamic is None:
        out.append(Pool(name="adaptive", steps=(3,) * servers, adaptive=True))
    else:
        out.append(Pool(name="dynamic", steps=(dynamic[0],) * servers, table=dynamic[1]))
    return out


def launch_argv(
    pool: Pool,
    scaling: Scaling,
    *,
    python: str,
    prior: str,
    port: int,
    base_port: int,
    logs: str,
    engine: str = "sglang",
) -> list[str]:
    """The pool's `specroute launch` command line: every pool gets the same prior (the proxy
    routes from it), engine, emulator and scaling; only the steps and the loop differ."""
    argv = [python, "-m", "specroute", "launch", "--emulate", "--engine", engine, "--prior", prior]
    if pool.steps is not None:
        argv += ["--steps", ",".join(map(str, pool.steps))]
    argv += ["--port", str(port), "--base-port", str(base_port), "--log-dir", logs]
    argv += ["--reconfigure", pool.reconfigure, "--admin-key", "live-admin"]
    argv += [*scaling.emulator_args(), *scaling.loop_flags()]
    if pool.allow_adaptive:
        argv.append("--allow-adaptive")
    if pool.adaptive:
        argv.append("--emulator-arg=--speculative-adaptive")
    if pool.table is not None:
        table = json.dumps([list(r) for r in pool.table], separators=(",", ":"))
        argv.append(f"--emulator-arg=--num-speculative-tokens-per-batch-size={table}")
    argv += [f"--planner-option={k}={v:g}" for k, v in scaling.planner_options().items()]
    return argv


class PoolResult(msgspec.Struct, kw_only=True):
    """What one pool did: per phase (aggregate tok/s, errors, requests), its /plan at the end,
    the proxy's answers that were not 200, and whether its client may have been the limit."""

    name: str
    steps: str
    phases: dict[str, float]
    errors: int
    requests: int
    tokens: int
    wall_s: float
    proxy_errors: dict[str, float] = {}
    client_limited: list[str] = []
    plan: PlanDocument | None = None

    @property
    def tok_s(self) -> float:
        """Completion tokens over the phases' summed wall time."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def result_of(name: str, steps: str, sweep: SweepResult) -> PoolResult:
    """A pool's figures from its `bench trace` result."""
    levels = sweep.levels
    limited = [f"{lv.phase}: {', '.join(lv.client.reasons)}" for lv in levels if lv.client.limited]
    return PoolResult(
        name=name,
        steps=steps,
        phases={lv.phase: lv.summary.aggregate_tok_s for lv in levels},
        errors=sum(lv.summary.errors for lv in levels),
        requests=sum(lv.summary.requests for lv in levels),
        tokens=sum(lv.summary.completion_tokens for lv in levels),
        wall_s=sum(lv.summary.wall_s for lv in levels),
        client_limited=limited,
    )


def table(results: Sequence[PoolResult]) -> str:
    """Markdown: one row per pool, tok/s per phase, the whole trace, its gap to auto, errors."""
    phases = list(results[0].phases)
    auto = next((r for r in results if r.name == "auto"), None)
    head = ["Pool", "Servers", *phases, "Whole trace", "auto vs it", "Errors"]
    rows = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for r in results:
        gap = f"{auto.tok_s / r.tok_s - 1:+.1%}" if auto and r is not auto and r.tok_s else ""
        errors = r.errors + int(sum(r.proxy_errors.values()))
        cells = [r.name, r.steps, *(f"{r.phases.get(p, 0.0):,.0f}" for p in phases),
                 f"{r.tok_s:,.0f}", gap, str(errors)]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def verdict(results: Sequence[PoolResult], tolerance: float = 0.01) -> str:
    """Whether auto is within `tolerance` of the best other pool over the whole trace, and
    whether any pool saw an error."""
    auto = next(r for r in results if r.name == "auto")
    best = max((r for r in results if r is not auto), key=lambda r: r.tok_s)
    gap = auto.tok_s / best.tok_s - 1 if best.tok_s else 0.0
    errors = {r.name: r.errors + int(sum(r.proxy_errors.values())) for r in results}
    met = gap >= -tolerance and errors["auto"] == 0
    failed = ", ".join(f"{n} {e}" for n, e in errors.items() if e) or "none"
    return (
        f"auto {auto.tok_s:,.0f} tok/s against the best other pool, {best.name} "
        f"{best.tok_s:,.0f}: {gap:+.1%} (target: no worse than -{tolerance:.0%}, no error): "
        f"{'met' if met else 'NOT met'}; errors: {failed}"
    )


def accounts(plan: PlanDocument | None) -> list[str]:
    """Each change of a pool's planner, its reason, and forecast against realized."""
    if plan is None:
        return []
    lines = [f"- {c.server}: {c.before} -> {c.after}, {c.outcome} in {c.took_s:.0f} s: {c.reason}"
             for c in sorted(plan.history, key=lambda c: c.at)]  # fmt: skip
    for a in sorted(plan.accounts, key=lambda a: a.at):
        realized = f"{a.realized_tok_s:,.0f}" if a.realized_tok_s is not None else "-"
        error = f"{a.forecast_error:+.1%}" if a.forecast_error is not None else a.note or "-"
        lines.append(
            f"- account ({', '.join(a.servers)}): before {a.before_tok_s:,.0f}, forecast "
            f"{a.forecast_tok_s:,.0f}, realized {realized} tok/s (forecast error {error})"
        )
    return lines


def loads(samples: Mapping[str, Sequence[float]]) -> str:
    """One line: load average and machine CPU busy share, mean and peak."""
    parts = []
    for name, values in samples.items():
        if values:
            parts.append(f"{name} mean {sum(values) / len(values):.2f}, peak {max(values):.2f}")
    return "; ".join(parts)

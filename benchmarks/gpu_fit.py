"""Fit the emulator profile's iteration-time parameters to a measured decode-step cost curve.

Composes each speculative iteration from `gpu_step_cost.py`'s parts (the timed layers scaled to
the whole stack, the LM head, k - 1 draft steps and one draft extend, as SGLang's EAGLE worker
runs them), then fits `T(b, k)` of `specroute/emulator/profiles.py` by non-negative least
squares on relative error, the knee by search, and prints the parameters and every residual.

    .venv/bin/python benchmarks/gpu_fit.py benchmarks/results/h200-qwen35-122b/result.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PARAMS = ("t0", "t_draft", "t_draft_per_request", "t_token", "t_expert", "t_token_compute")
NO_KNEE = 1_000_000


@dataclass(frozen=True)
class Point:
    """One measured iteration: `b` requests drafting `k` tokens, in seconds."""

    b: int
    k: int
    seconds: float


@dataclass(frozen=True)
class Fit:
    params: dict[str, float]
    knee: int
    points: tuple[Point, ...]
    predicted: tuple[float, ...]

    @property
    def residuals(self) -> list[float]:
        """(fitted - measured) / measured for every point."""
        return [f / p.seconds - 1.0 for f, p in zip(self.predicted, self.points, strict=True)]


def iterations(result: dict[str, Any], variant: str, context: int) -> list[Point]:
    """Whole-model iteration times from the timed parts, for every (b, k) measured in full."""
    t: dict[tuple[str, str, int, int, int], float] = {}
    for r in result["timings"]:
        key = (r["part"], r["variant"], r["b"], r["t"], r["context"])
        t[key] = r["median_ms"] / 1e3
    scale = result["settings"]["layer_scale"]
    out = []
    for b in result["settings"]["batches"]:
        for k in result["settings"]["depths"]:
            n = b * (k + 1)
            parts = [("layers", variant, b, k + 1, context), ("ends", "-", n, 1, 0)]
            if k > 0:
                parts += [
                    ("draft_step", "-", b, 1, context),
                    ("draft_extend", "-", b, k + 1, context),
                ]
            if not all(p in t for p in parts):
                continue
            seconds = scale * t[parts[0]] + t[parts[1]]
            if k > 0:
                seconds += (k - 1) * t[parts[2]] + t[parts[3]]
            out.append(Point(b, k, seconds))
    return out


def features(points: list[Point], experts: int, top_k: int, knee: int) -> np.ndarray:
    """The profile's terms per point, in `PARAMS` order."""
    rows = []
    for p in points:
        n = p.b * (p.k + 1)
        distinct = experts * (1.0 - (1.0 - top_k / experts) ** n) if experts else 0.0
        rows.append([1.0, p.k, p.k * p.b, n, distinct, max(0, n - knee)])
    return np.array(rows)


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0, exactly, by trying each set of free terms."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(y**2))
    for size in range(1, a.shape[1] + 1):
        for free in itertools.combinations(range(a.shape[1]), size):
            cols = list(free)
            coef, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((a[:, cols] @ coef - y) ** 2))
            if err < best_err - 1e-18:
                full = np.zeros(a.shape[1])
                full[cols] = coef
                best, best_err = full, err
    return best


def fit(points: list[Point], experts: int, top_k: int, knees: list[int] | None = None) -> Fit:
    """The parameters and knee with the smallest squared relative error over `points`.

    A knee must earn its place: it is kept only where it cuts the squared error of the fit
    without one by `KNEE_GAIN` or more (else a bend in the data is fitted, not a bound)."""
    y = np.array([p.seconds for p in points])
    candidates = sorted({p.b * (p.k + 1) for p in points}) if knees is None else knees
    best = _fit_at(points, y, experts, top_k, NO_KNEE)
    plain = best_err = _sq_error(best)
    for knee in candidates:
        if knee == NO_KNEE:
            continue
        trial = _fit_at(points, y, experts, top_k, knee)
        err = _sq_error(trial)
        if trial.params["t_token_compute"] > 0 and err < best_err and err <= KNEE_GAIN * plain:
            best, best_err = trial, err
    return best


KNEE_GAIN = 0.8


def _fit_at(points: list[Point], y: np.ndarray, experts: int, top_k: int, knee: int) -> Fit:
    a = features(points, experts, top_k, knee)
    coef = nnls(a / y[:, None], np.ones_like(y))
    params = dict(zip(PARAMS, (float(c) for c in coef), strict=True))
    return Fit(params, knee, tuple(points), tuple(float(v) for v in a @ coef))


def _sq_error(f: Fit) -> float:
    return float(np.sum(np.square(f.residuals)))


def render(fit_: Fit, title: str) -> str:
    """Parameters in ms, then measured / fitted ms and residual % for each b (rows) and k."""
    p = fit_.params
    knee = "none" if fit_.knee == NO_KNEE else str(fit_.knee)
    head = ", ".join(f"{k} {v * 1e3:.4f} ms" for k, v in p.items()) + f", knee_tokens {knee}"
    res = fit_.residuals
    worst = max(abs(r) for r in res)
    rms = float(np.sqrt(np.mean(np.square(res))))
    lines = [f"## {title}", head, f"residuals: max {worst:.1%}, rms {rms:.1%}"]
    depths = sorted({pt.k for pt in fit_.points})
    lines.append("b    " + " ".join(f"{'k=' + str(k) + ' meas/fit/res':<24}" for k in depths))
    cells = {
        (pt.b, pt.k): (pt.seconds, f, r)
        for pt, f, r in zip(fit_.points, fit_.predicted, res, strict=True)
    }
    for b in sorted({pt.b for pt in fit_.points}):
        row = []
        for k in depths:
            m, f, r = cells.get((b, k), (float("nan"),) * 3)
            row.append(f"{m * 1e3:6.2f}/{f * 1e3:6.2f}/{r:+6.1%}".ljust(24))
        lines.append(f"{b:<4} " + " ".join(row))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="result.json from gpu_step_cost.py")
    parser.add_argument("--json", type=Path, help="write every fit's parameters here")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    config = result["settings"]["config"]
    experts, top_k = config["num_experts"], config["num_experts_per_tok"]
    fits: dict[str, Any] = {}
    for variant in result["settings"]["variants"]:
        for context in result["settings"]["contexts"]:
            points = iterations(result, variant, context)
            if not points:
                continue
            f = fit(points, experts, top_k)
            print(render(f, f"{variant}, context {context}"), end="\n\n")
            fits[f"{variant}@{context}"] = {
                **f.params, "knee_tokens": f.knee,
                "max_residual": max(abs(r) for r in f.residuals),
            }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(fits, indent=1) + "\n")
    return fits


if __name__ == "__main__":
    main()

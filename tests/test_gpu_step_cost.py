"""The decode-step cost benchmark (`benchmarks/gpu_step_cost.py`) on the CPU with a tiny model,
and its fit (`benchmarks/gpu_fit.py`): iterations composed as SGLang runs them, parameters
recovered from a profile's own curve."""

from __future__ import annotations

import csv
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specroute.emulator.profiles import get_profile

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
BATCHES, DEPTHS, CONTEXTS = (1, 2), (0, 2), (8, 16)


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A benchmark module, imported as its script is run (benchmarks/ on the path)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.fixture
def gpu_fit(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _load("gpu_fit", monkeypatch)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CPU run of the script on the tiny shape (seconds), shared by the tests below."""
    reason = "the CPU path needs torch: pip install -e '.[gpu-bench]' (make test leaves it out)"
    pytest.importorskip("torch", reason=reason)
    out = tmp_path_factory.mktemp("step-cost")
    with pytest.MonkeyPatch.context() as mp:
        step_cost = _load("gpu_step_cost", mp)
        step_cost.main([
            "--device", "cpu", "--shape", "tiny", "--layers", "4", "--warmup", "1",
            "--repeats", "2", "--batches", ",".join(map(str, BATCHES)),
            "--depths", ",".join(map(str, DEPTHS)), "--contexts", ",".join(map(str, CONTEXTS)),
            "--out", str(out),
        ])  # fmt: skip
    return out


def test_cpu_run_times_every_part_of_every_grid_point(cpu_run: Path) -> None:
    result = json.loads((cpu_run / "result.json").read_text())
    seen = {(r["part"], r["variant"], r["b"], r["t"], r["context"]) for r in result["timings"]}
    expected = {("ends", "-", b * (k + 1), 1, 0) for b in BATCHES for k in DEPTHS}
    for ctx in CONTEXTS:
        for b in BATCHES:
            expected.add(("draft_step", "-", b, 1, ctx))
            for k in DEPTHS:
                for variant in ("hybrid", "no_linear_attention"):
                    expected.add(("layers", variant, b, k + 1, ctx))
                if k:
                    expected.add(("draft_extend", "-", b, k + 1, ctx))
    assert seen == expected
    assert all(r["median_ms"] > 0 and len(r["samples_ms"]) == 2 for r in result["timings"])
    with (cpu_run / "result.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(result["timings"])


def test_cpu_run_records_device_versions_settings_and_passing_checks(cpu_run: Path) -> None:
    result = json.loads((cpu_run / "result.json").read_text())
    env, settings, checks = result["environment"], result["settings"], result["checks"]
    assert env["device"] == "cpu"
    assert env["torch"]
    assert env["device_name"]
    assert settings["layers_timed"] == 4
    assert settings["linear_attention_layers_timed"] == 3
    assert settings["layer_scale"] == 1.0  # the tiny shape has 4 layers in all
    assert settings["config"]["num_experts"] == 8
    assert "--shape tiny" in result["command"]
    assert checks["gqa_rel_error"] < 1e-2
    assert checks["moe_rel_error"] < 2e-2
    counts = {c["tokens"]: c["seen"] for c in checks["distinct_experts"]}
    assert counts[1] == 2
    assert counts[320] == 8


def test_fit_reads_the_cpu_run(cpu_run: Path, gpu_fit: ModuleType) -> None:
    fits = gpu_fit.main([str(cpu_run / "result.json")])
    assert set(fits) == {f"{v}@{c}" for v in ("hybrid", "no_linear_attention") for c in CONTEXTS}
    assert all(f["t0"] >= 0 and f["t_expert"] >= 0 for f in fits.values())


def test_an_iteration_is_the_scaled_layers_the_head_and_sglangs_draft_passes(
    gpu_fit: ModuleType,
) -> None:
    rows = [
        ("layers", "hybrid", 2, 1, 64, 1.0), ("layers", "hybrid", 2, 4, 64, 2.0),
        ("ends", "-", 2, 1, 0, 0.1), ("ends", "-", 8, 1, 0, 0.3),
        ("draft_step", "-", 2, 1, 64, 0.05), ("draft_extend", "-", 2, 4, 64, 0.07),
    ]  # fmt: skip
    result = {
        "settings": {"layer_scale": 6.0, "batches": [2], "depths": [0, 3]},
        "timings": [
            {"part": p, "variant": v, "b": b, "t": t, "context": c, "median_ms": ms}
            for p, v, b, t, c, ms in rows
        ],
    }
    points = {p.k: p.seconds * 1e3 for p in gpu_fit.iterations(result, "hybrid", 64)}
    assert points[0] == pytest.approx(6.0 * 1.0 + 0.1)
    # k = 3: k - 1 draft forwards and one draft extend over the verified tokens
    assert points[3] == pytest.approx(6.0 * 2.0 + 0.3 + 2 * 0.05 + 0.07)


@pytest.mark.parametrize("name", ["costly-drafts", "seed-qwen35-122b"])
def test_fit_recovers_a_profiles_parameters_from_its_own_curve(
    gpu_fit: ModuleType, name: str
) -> None:
    profile = get_profile(name)
    points = [
        gpu_fit.Point(b, k, profile.iteration_time(b, k))
        for b in (1, 2, 4, 8, 16, 24, 32, 48, 64)
        for k in range(5)
    ]
    fit = gpu_fit.fit(points, profile.experts, profile.experts_per_token)
    assert max(abs(r) for r in fit.residuals) < 1e-6
    assert fit.knee == min(profile.knee_tokens, gpu_fit.NO_KNEE)
    for param, value in fit.params.items():
        assert value == pytest.approx(getattr(profile, param), rel=1e-4, abs=1e-9), param

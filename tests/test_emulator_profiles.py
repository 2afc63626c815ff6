"""The built-in profiles: the H200 one follows its committed measurement and takes what no
random-weight run can measure from the seed; `specroute emulate` and the bench run on it."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import httpx
import pytest
from servers import start_emulator

from specroute.cli import main
from specroute.emulator.profiles import PROFILES, Profile, get_profile

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "h200-qwen35-122b" / "result.json"
H200 = "h200-qwen35-122b-shape"


def test_h200_profile_follows_the_measured_iterations_within_ten_percent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("gpu_fit", None)
    gpu_fit = importlib.import_module("gpu_fit")
    result = json.loads(RESULT.read_text())
    assert result["environment"]["device_name"] == "NVIDIA H200"
    points = gpu_fit.iterations(result, "hybrid", 512)
    assert len(points) == 45  # b in 1..64 (9 sizes) x k in 0..4, every part measured
    profile = get_profile(H200)
    for p in points:
        assert profile.iteration_time(p.b, p.k) == pytest.approx(p.seconds, rel=0.10), (p.b, p.k)


def test_h200_profile_takes_acceptance_capacity_and_lengths_from_the_seed() -> None:
    seed, h200 = get_profile("seed-qwen35-122b"), get_profile(H200)
    assert h200.model_name == seed.model_name
    assert h200.acceptance == seed.acceptance
    assert h200.spread == seed.spread
    assert [h200.capacity(k) for k in range(5)] == [seed.capacity(k) for k in range(5)]
    assert (h200.prefill_base, h200.prefill_per_token) == (
        seed.prefill_base,
        seed.prefill_per_token,
    )
    assert h200.mean_output_tokens == seed.mean_output_tokens
    assert h200.startup_s == seed.startup_s


def test_h200_drafts_cost_more_than_the_seeds_alone_and_less_at_64_requests() -> None:
    """Alone, each draft token reads ~8 more experts per layer; at 64 requests nearly all 256
    are read already, so drafts add little (the seed's linear verify cost grows instead)."""
    seed, h200 = get_profile("seed-qwen35-122b"), get_profile(H200)

    def depth_cost(p: Profile, b: int) -> float:
        return p.iteration_time(b, 3) / p.iteration_time(b, 0)

    assert depth_cost(h200, 1) > 1.5 > depth_cost(seed, 1)
    assert depth_cost(h200, 64) < depth_cost(seed, 64)


def test_emulate_serves_the_h200_profile_and_the_bench_measures_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert H200 in PROFILES
    out = tmp_path / "run.json"
    with start_emulator(2, "--profile", H200, "--time-scale", "20") as server:
        info = httpx.get(f"{server.url}/server_info").json()
        assert info["emulator"]["profile"] == H200
        status = main([
            "bench", "sweep", f"steps2={server.url}", "-c", "1,2", "--max-tokens", "16",
            "--prompt-words", "8", "--json", str(out),
        ])  # fmt: skip
    assert status == 0
    assert "steps2" in capsys.readouterr().out
    run = json.loads(out.read_text())
    assert run["targets"][0]["facts"]["max_running_requests"] == get_profile(H200).capacity(2)
    assert [level["summary"]["errors"] for level in run["levels"]] == [0, 0]

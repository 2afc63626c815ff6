"""The profile file as the pool's prior: one format written and read, fitted iteration times and
acceptance seeded into the estimators, `[prior]` and `--prior` at start-up, clear refusals of
unreadable files and of other format versions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specroute.cli import main
from specroute.config import load_config
from specroute.errors import ConfigError
from specroute.pool import Pool, UpstreamClient
from specroute.pool.prior import PRIOR_VERIFIES, load_prior
from specroute.profile_format import (
    SCHEMA,
    Point,
    Profile,
    Target,
    Traffic,
    decode_profile,
    encode_profile,
    with_fits,
)
from specroute.proxy.info import prior_depths

MODEL = "Qwen/Qwen3.5-122B-A10B"
INTERCEPT, PER_TOKEN = 0.0155, 0.00021
CAPACITY = {1: 26, 3: 17}
ACCEPT = {("greedy", 1): 1.99, ("greedy", 3): 3.95, ("sampled", 1): 1.80, ("sampled", 3): 2.50}


def _traffic(name: str, greedy: bool) -> Traffic:
    return Traffic(name=name, temperature=0.0 if greedy else 1.0, greedy=greedy, ignore_eos=True,
                   max_tokens=256, prompts="synthetic, 256 words")  # fmt: skip


def _profile() -> Profile:
    """Two depths whose iteration time is exactly INTERCEPT + PER_TOKEN * min(C, R) * (k + 1)."""
    targets = []
    for k, capacity in CAPACITY.items():
        points = [
            Point(traffic=kind, concurrency=c, accept_length=ACCEPT[(kind, k)], requests=2 * c,
                  iteration_time_s=INTERCEPT + PER_TOKEN * min(c, capacity) * (k + 1))
            for kind in ("greedy", "sampled")
            for c in (1, 4, 16, 64)
        ]  # fmt: skip
        targets.append(Target(label=f"steps{k}", model=MODEL, steps=k,
                              max_running_requests=capacity, points=points))  # fmt: skip
    return with_fits(
        Profile(traffic=[_traffic("greedy", True), _traffic("sampled", False)], targets=targets)
    )


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "prior.json"
    path.write_bytes(data)
    return path


def test_the_fits_recover_iteration_time_capacity_and_acceptance_per_depth() -> None:
    profile = _profile()
    fits = {d.steps: d for d in profile.depths}
    assert set(fits) == {1, 3}
    for k, fit in fits.items():
        assert fit.intercept_s == pytest.approx(INTERCEPT)
        assert fit.per_token_s == pytest.approx(PER_TOKEN)
        assert fit.max_running_requests == CAPACITY[k]
    assert profile.acceptance["greedy"].accept_length == pytest.approx({1: 1.99, 3: 3.95})
    assert profile.acceptance["sampled"].accept_length == pytest.approx({1: 1.80, 3: 2.50})
    assert profile.acceptance["sampled"].alpha < profile.acceptance["greedy"].alpha


def test_a_written_profile_reads_back_as_written() -> None:
    profile = _profile()
    assert decode_profile(encode_profile(profile)) == profile


def test_the_prior_seeds_the_estimators_the_pool_starts_with(tmp_path: Path) -> None:
    path = _write(tmp_path, encode_profile(_profile()))
    config = load_config(
        None,
        environ={},
        overrides={"backends": ["http://127.0.0.1:9"], "prior": {"path": str(path)}},
    )
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    telemetry = pool.telemetry
    model = telemetry.iteration_model("127.0.0.1:9", 3)
    assert model.intercept == pytest.approx(INTERCEPT)
    assert model.slope == pytest.approx(PER_TOKEN)
    classes = telemetry.classes()
    assert classes[f"{MODEL}:greedy"].accept_length == pytest.approx({1: 1.99, 3: 3.95})
    assert classes[f"{MODEL}:sampled"].accept_length == pytest.approx({1: 1.80, 3: 2.50})
    # A class the profile never saw starts from the measured sampled acceptance.
    assert telemetry.acceptance.prior_alpha == pytest.approx(_profile().acceptance["sampled"].alpha)


def test_the_prior_keeps_what_tune_measured_where_iteration_time_bends(tmp_path: Path) -> None:
    # Expert reads saturate: T rises fast at small batches and slowly past them. /pool hands
    # the planner each depth's points (tokens per iteration, mean seconds), capped at R(k),
    # never falling as the batch grows; the line alone misses them.
    def bent(tokens: float) -> float:
        return 0.015 + 0.06 * (1 - math.exp(-tokens / 24))

    points = [
        Point(traffic=kind, concurrency=c, requests=2 * c,
              iteration_time_s=bent(min(c, 26) * 2) + (0.001 if kind == "greedy" else -0.001))
        for kind in ("greedy", "sampled")
        for c in (1, 4, 16, 64)
    ]  # fmt: skip
    points.append(Point(traffic="sampled", concurrency=20, requests=8, iteration_time_s=0.01))
    target = Target(label="steps1", model=MODEL, steps=1, max_running_requests=26, points=points)
    profile = Profile(traffic=[_traffic("greedy", True), _traffic("sampled", False)],
                      targets=[target])  # fmt: skip
    path = _write(tmp_path, encode_profile(with_fits(profile)))
    config = load_config(
        None,
        environ={},
        overrides={"backends": ["http://127.0.0.1:9"], "prior": {"path": str(path)}},
    )
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    shown = prior_depths(pool.telemetry)[1]
    tokens = [2.0, 8.0, 32.0, 40.0, 52.0]  # 64 users run 26
    assert [x for x, _ in shown.measured] == tokens
    # Two traffic kinds averaged at each; the dip measured at 20 users is held at the level
    # before it.
    expected = [bent(2), bent(8), bent(32), bent(32), bent(52)]
    assert [y for _, y in shown.measured] == pytest.approx(expected)
    line = [shown.intercept_s + shown.per_token_s * x for x in tokens]
    assert max(abs(a / bent(x) - 1) for a, x in zip(line, tokens, strict=True)) > 0.1


def test_a_vllm_backend_takes_the_batch_limit_the_tune_measured_at_the_depth_it_runs(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, encode_profile(_profile()))
    backends = [
        {"url": "http://127.0.0.1:9", "engine": "vllm"},
        {"url": "http://127.0.0.1:10", "engine": "vllm", "capacity": 48},
        {"url": "http://127.0.0.1:11", "engine": "sglang"},
    ]
    config = load_config(
        None, environ={}, overrides={"backends": backends, "prior": {"path": str(path)}}
    )
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    vllm, configured, sglang = pool.backends
    for backend in (vllm, configured):
        backend.apply_vllm(None)
        backend.metrics.steps = 3.0  # as vLLM's per-position counters show it
    assert vllm.capacity == CAPACITY[3]
    assert vllm.limit is not None
    vllm.metrics.steps = 1.0  # restarted at K = 1: the limit follows the depth
    assert vllm.capacity == CAPACITY[1]
    vllm.metrics.steps = 2.0  # a depth the tune did not measure: unknown, not borrowed
    assert vllm.capacity is None
    assert configured.capacity == 48  # the operator's figure wins
    assert sglang.capacity is None  # SGLang reports its own on /server_info


def test_a_server_that_names_no_speculative_algorithm_is_fitted_at_depth_0() -> None:
    points = [
        Point(traffic="greedy", concurrency=c, accept_length=1.0, requests=2 * c,
              iteration_time_s=INTERCEPT + PER_TOKEN * min(c, 35))
        for c in (1, 4, 64)
    ]  # fmt: skip
    k0 = Target(label="steps0", model=MODEL, max_running_requests=35, points=points)
    silent = Target(label="other", model=MODEL, points=points)  # said nothing of itself
    profile = with_fits(Profile(traffic=[_traffic("greedy", True)], targets=[k0, silent]))
    (fit,) = profile.depths
    assert (fit.steps, fit.max_running_requests) == (0, 35)
    assert fit.per_token_s == pytest.approx(PER_TOKEN)


def test_live_traffic_outweighs_the_prior_within_a_few_requests(tmp_path: Path) -> None:
    telemetry = load_prior(_write(tmp_path, encode_profile(_profile()))).telemetry()
    klass = f"{MODEL}:sampled"
    for _ in range(10):  # ten requests of ~100 verifies each, accepting far less
        telemetry.acceptance.observe(klass, steps=3, accept_length=1.5, verifies=PRIOR_VERIFIES / 2)
    assert telemetry.classes()[klass].accept_length[3] == pytest.approx(1.5, abs=0.2)


def test_without_a_prior_the_pool_starts_from_the_defaults() -> None:
    config = load_config(None, environ={}, overrides={"backends": ["http://127.0.0.1:9"]})
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    assert pool.telemetry.classes() == {}
    assert pool.telemetry.priors == {}


def test_the_prior_is_read_from_the_toml_section_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "specroute.toml"
    path.write_text('backends = ["http://127.0.0.1:9"]\n[prior]\npath = "tuned/prior.json"\n')
    assert load_config(path, environ={}).prior.path == "tuned/prior.json"
    environ = {"SPECROUTE_PRIOR__PATH": "other.json"}
    assert load_config(path, environ=environ).prior.path == "other.json"


def test_an_old_version_profile_is_refused_naming_both_versions(tmp_path: Path) -> None:
    old = {"schema": "specroute.bench-profile/1", "workload": {}, "targets": []}
    path = _write(tmp_path, json.dumps(old).encode())
    with pytest.raises(ConfigError) as exc:
        load_prior(path)
    message = str(exc.value)
    assert str(path) in message
    assert "version 1" in message
    assert SCHEMA in message


@pytest.mark.parametrize(
    ("data", "words"),
    [(b"{not json", "not a JSON profile"), (b'{"targets": []}', "no `schema`"),
     (b'{"schema": "other/3"}', "not a specroute profile"),
     (json.dumps({"schema": SCHEMA, "targets": [{"points": [{"concurrency": "x"}]}]}).encode(),
      "targets[0].points[0].concurrency")],
)  # fmt: skip
def test_a_file_that_is_not_a_profile_is_refused_with_its_reason(
    tmp_path: Path, data: bytes, words: str
) -> None:
    with pytest.raises(ConfigError, match="invalid prior") as exc:
        load_prior(_write(tmp_path, data))
    assert words in str(exc.value)


def test_a_missing_prior_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read prior file .*missing\.json"):
        load_prior(tmp_path / "missing.json")


def test_serve_with_an_unreadable_or_old_prior_exits_two_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _write(tmp_path, json.dumps({"schema": "specroute.bench-profile/1"}).encode())
    for prior in (tmp_path / "missing.json", old):
        assert main(["serve", "--backend", "http://127.0.0.1:9", "--prior", str(prior)]) == 2
        assert str(prior) in capsys.readouterr().err


def test_launch_hands_the_prior_to_the_proxy_and_refuses_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, encode_profile(_profile()))
    argv = ["launch", "--emulate", "--steps", "1,3,3", "--dry-run"]
    assert main([*argv, "--prior", str(path)]) == 0
    proxy = capsys.readouterr().out.splitlines()[-1]
    assert f"--prior {path.resolve()}" in proxy
    assert "--backend steps3=" in proxy
    assert "--backend steps3-2=" in proxy  # a pool mix repeats a depth
    assert main([*argv, "--prior", str(tmp_path / "missing.json")]) == 2
    assert "cannot read prior file" in capsys.readouterr().err

"""The launcher's plan and `--dry-run`: SGLang's required flags, GPU partitioning, clear errors."""

from __future__ import annotations

import pytest

from specroute.cli import main
from specroute.launch.plan import LaunchOptions, PlanError, build_plan, parse_gpus


def test_each_depth_gets_the_flags_sglang_requires() -> None:
    plan = build_plan(LaunchOptions(model="/m", steps=(1, 3), gpus=(0, 1)))
    first, second = (list(s.argv) for s in plan.servers)
    assert first[first.index("--speculative-num-steps") + 1] == "1"
    assert second[second.index("--speculative-num-draft-tokens") + 1] == "4"
    for argv in (first, second):
        assert argv[argv.index("--speculative-eagle-topk") + 1] == "1"
        assert argv[argv.index("--max-running-requests") + 1] == "48"
        assert "--enable-metrics" in argv
    assert [s.url for s in plan.servers] == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]


def test_gpus_are_split_in_order_by_tensor_parallel_size() -> None:
    plan = build_plan(LaunchOptions(model="/m", steps=(1, 2, 3), tp=2, gpus=(7, 6, 5, 4, 3, 2)))
    envs = [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers]
    assert envs == ["7,6", "5,4", "3,2"]


def test_too_few_gpus_is_a_clear_error() -> None:
    with pytest.raises(PlanError, match=r"3 servers x --tp 2 need 6 GPUs, but only 4"):
        build_plan(LaunchOptions(model="/m", steps=(1, 2, 3), tp=2, gpus=(0, 1, 2, 3)))


def test_eagle_without_a_draft_model_is_refused() -> None:
    with pytest.raises(PlanError, match="needs --draft-model"):
        LaunchOptions(model="/m", steps=(1,), algorithm="EAGLE")


def test_gpus_all_means_detected() -> None:
    assert parse_gpus("all") is None
    assert parse_gpus("0,2") == (0, 2)


def test_dry_run_prints_commands_environment_and_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch", "--model", "/m", "--steps", "1,2", "--gpus", "0,1", "--algorithm", "EAGLE3"]
    argv += ["--draft-model", "/d", "--sglang-arg=--mem-fraction-static=0.8", "--dry-run"]
    argv += ["--no-sglang-check"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES=0 " in out
    assert "CUDA_VISIBLE_DEVICES=1 " in out
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path /d" in out
    assert out.count("--mem-fraction-static=0.8") == 2
    assert "-m specroute serve" in out
    assert "--backend http://127.0.0.1:30000 --backend http://127.0.0.1:30001" in out


def test_launch_without_enough_gpus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--model", "/m", "--steps", "1,2,3", "--gpus", "0", "--dry-run"]) == 2
    assert "need 3 GPUs" in capsys.readouterr().err


def test_emulated_plan_needs_no_gpu() -> None:
    plan = build_plan(LaunchOptions(model="tiny", steps=(1, 2), emulate=True))
    assert all(s.env == {} and "emulate" in s.argv for s in plan.servers)
    assert plan.servers[0].argv[-2:] == ("--model-name", "tiny")

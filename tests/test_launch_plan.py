"""The launcher's plan and `--dry-run`: SGLang's required flags, GPU partitioning, clear errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specroute.cli import main
from specroute.launch.argv import LaunchOptions, PlanError, build_plan, parse_gpus


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
    assert "--backend steps1=http://127.0.0.1:30000 --backend steps2=http://127.0.0.1:30001" in out


def test_launch_without_enough_gpus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--model", "/m", "--steps", "1,2,3", "--gpus", "0", "--dry-run"]) == 2
    assert "need 3 GPUs" in capsys.readouterr().err


def test_emulated_plan_needs_no_gpu() -> None:
    plan = build_plan(LaunchOptions(model="tiny", steps=(1, 2), emulate=True))
    assert all(s.env == {} and "emulate" in s.argv for s in plan.servers)
    assert plan.servers[0].argv[-2:] == ("--model-name", "tiny")


def _dry_run(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    status = main(["launch", "--model", "/m", "--gpus", "0,1,2", "--no-sglang-check", *flags])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _server_lines(out: str) -> dict[str, str]:
    """Each server's command line in --dry-run's output, by name."""
    lines = out.splitlines()
    return {
        line.split(":")[0].removeprefix("# "): lines[i + 1]
        for i, line in enumerate(lines)
        if line.startswith("# steps")
    }


def _flag(line: str, flag: str) -> str:
    words = line.split()
    return words[words.index(flag) + 1]


def test_max_running_requests_per_depth_with_a_bare_number_for_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = _dry_run(
        capsys, "--steps", "1,2,3", "--max-running-requests", "1=26,2=21,3=17", "--dry-run"
    )
    assert status == 0
    servers = _server_lines(out)
    limits = {k: _flag(v, "--max-running-requests") for k, v in servers.items()}
    assert limits == {"steps1": "26", "steps2": "21", "steps3": "17"}
    status, out, _ = _dry_run(
        capsys, "--steps", "1,2,3", "--max-running-requests", "32,3=17", "--dry-run"
    )
    servers = _server_lines(out)
    limits = {k: _flag(v, "--max-running-requests") for k, v in servers.items()}
    assert limits == {"steps1": "32", "steps2": "32", "steps3": "17"}


def test_sglang_arg_with_a_depth_goes_to_that_server_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = _dry_run(
        capsys, "--steps", "1,2,3", "--sglang-arg=--decode-log-interval=10",
        "--sglang-arg=3:--mem-fraction-static=0.85", "--dry-run",
    )  # fmt: skip
    assert status == 0
    servers = _server_lines(out)
    assert all("--decode-log-interval=10" in line for line in servers.values())
    assert [k for k, line in servers.items() if "--mem-fraction-static" in line] == ["steps3"]
    assert servers["steps3"].endswith("--mem-fraction-static=0.85")


@pytest.mark.parametrize(
    "flags",
    [
        ("--max-running-requests", "1=26,4=17"),
        ("--sglang-arg=4:--mem-fraction-static=0.8",),
        ("--max-running-requests", "1=lots"),
    ],
)
def test_per_depth_values_for_depths_not_launched_exit_2(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]
) -> None:
    status, _, err = _dry_run(capsys, "--steps", "1,2", *flags, "--dry-run")
    assert status == 2
    assert "--max-running-requests" in err or "--sglang-arg" in err


def test_servers_stay_on_loopback_when_the_proxy_is_exposed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = _dry_run(capsys, "--steps", "1,2", "--host", "0.0.0.0", "--dry-run")
    assert status == 0
    assert all(_flag(line, "--host") == "127.0.0.1" for line in _server_lines(out).values())
    proxy = out.splitlines()[out.splitlines().index("# proxy: http://127.0.0.1:8000") + 1]
    assert _flag(proxy, "--host") == "0.0.0.0"
    assert "the proxy listens on 0.0.0.0 without api_keys" in err
    status, out, err = _dry_run(capsys, "--steps", "1", "--server-host", "0.0.0.0", "--dry-run")
    assert _flag(_server_lines(out)["steps1"], "--host") == "0.0.0.0"
    assert "--backend steps1=http://127.0.0.1:30000" in out
    assert "SGLang servers listen on 0.0.0.0 and take no keys" in err


def test_keys_reach_the_proxy_in_its_environment_hidden_from_the_dry_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from specroute.launch.command import options_from_args, register

    flags = ["--steps", "1", "--api-key", "client-secret", "--api-key", "second", "--admin-key"]
    status, out, err = _dry_run(capsys, *flags, "admin-secret", "--host", "0.0.0.0", "--dry-run")
    assert status == 0
    assert "secret" not in out
    assert "SPECROUTE_ADMIN_KEY=<hidden> SPECROUTE_API_KEYS=<hidden>" in out
    assert "without api_keys" not in err
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["launch", "--model", "/m", "--gpus", "0", *flags, "admin-secret"])
    plan = build_plan(options_from_args(args))
    assert plan.proxy.env == {
        "SPECROUTE_API_KEYS": "client-secret,second",
        "SPECROUTE_ADMIN_KEY": "admin-secret",
    }
    assert not any("secret" in word for word in plan.proxy.argv)


def test_config_file_reaches_the_proxy_and_sets_its_address(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('port = 9100\npolicy = "round_robin"\napi_keys = ["k"]\n')
    status, out, _ = _dry_run(capsys, "--steps", "1,2", "--config", str(config), "--dry-run")
    assert status == 0
    assert "# proxy: http://127.0.0.1:9100" in out
    assert f"serve --config {config} --host 127.0.0.1 --port 9100 --policy round_robin" in out
    status, out, _ = _dry_run(
        capsys, "--steps", "1", "--config", str(config), "--port", "9200", "--dry-run"
    )
    assert "--port 9200" in out  # flags win over the file, as for `specroute serve`


@pytest.mark.parametrize(
    ("policy", "status"), [("static:steps=7", 2), ("static:steps=3", 0), ("bogus", 2)]
)
def test_policy_is_checked_against_the_launched_depths(
    capsys: pytest.CaptureFixture[str], policy: str, status: int
) -> None:
    got, _, err = _dry_run(capsys, "--steps", "1,2,3", "--policy", policy, "--dry-run")
    assert got == status
    if policy == "static:steps=7":
        assert "sends every request to depth 7, but --steps 1,2,3 starts no server" in err


def test_a_misspelt_variable_stops_the_launch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECROUTE_ADMIN_KY", "x")
    status, _, err = _dry_run(capsys, "--steps", "1", "--dry-run")
    assert status == 2
    assert "SPECROUTE_ADMIN_KY is not a setting; did you mean SPECROUTE_ADMIN_KEY?" in err

"""`launch` and `tune` with `--engine vllm`: vLLM's command line per depth (the depth in
`--speculative-config` JSON, the limit as `--max-num-seqs`), and a launched emulated vLLM pool
that the proxy recognises, measures and routes over."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from emulator_support import wait_for
from servers import launch_ports

from specroute.children import spawn, stop
from specroute.launch.argv import LaunchOptions, PlanError, build_plan, server_argv

EAGLE3 = LaunchOptions(
    model="/m/llama", steps=(0, 2), algorithm="EAGLE3", draft_model="/m/eagle3", tp=2,
    gpus=(0, 1, 2, 3), max_running_requests=64, max_running_by_depth={2: 40}, engine="vllm",
    vllm_args=("--gpu-memory-utilization=0.85",), vllm_args_by_depth={2: ("--seed=1",)},
)  # fmt: skip


def test_vllm_plan_has_one_vllm_serve_per_depth_with_its_speculative_config() -> None:
    plan = build_plan(EAGLE3)
    plain, deep = (list(s.argv) for s in plan.servers)
    assert plain[1:] == [
        "-m", "vllm.entrypoints.cli.main", "serve", "/m/llama", "--host", "127.0.0.1",
        "--port", "30000", "--tensor-parallel-size", "2", "--max-num-seqs", "64",
        "--gpu-memory-utilization=0.85",
    ]  # fmt: skip
    spec = json.loads(deep[deep.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "num_speculative_tokens": 2, "model": "/m/eagle3"}
    assert deep[deep.index("--max-num-seqs") + 1] == "40"
    assert deep[-2:] == ["--gpu-memory-utilization=0.85", "--seed=1"]
    assert [s.ready_path for s in plan.servers] == ["/health", "/health"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["0,1", "2,3"]
    # The shell line quotes the JSON so that a shell passes it as one argument.
    assert shlex.split(plan.servers[1].shell())[1:] == deep


def test_mtp_method_and_no_adaptive_flags_for_vllm() -> None:
    mtp = LaunchOptions(model="/m/ds", steps=(3,), engine="vllm", gpus=(0,))
    argv = server_argv(mtp, 3, 30000)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
    }
    with pytest.raises(PlanError, match="vLLM has no adaptive"):
        server_argv(mtp, 3, 30000, ["--speculative-adaptive"])


def test_tune_dry_run_prints_vllm_lines_and_refuses_adaptive() -> None:
    base = [sys.executable, "-m", "specroute", "tune", "--engine", "vllm", "--model", "/m/ds"]
    base += ["--steps", "1,2", "--gpus", "0", "--dry-run"]
    done = subprocess.run(base, capture_output=True, text=True, check=True)
    lines = [ln for ln in done.stdout.splitlines() if "vllm.entrypoints.cli.main serve" in ln]
    assert len(lines) == 2
    assert '"num_speculative_tokens": 2' in lines[1]
    refused = subprocess.run([*base, "--adaptive"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2
    assert "vLLM has none" in refused.stderr


def test_launch_warns_when_nothing_tells_the_proxy_a_vllm_servers_batch_limit() -> None:
    base = [sys.executable, "-m", "specroute", "launch", "--emulate", "--engine", "vllm"]
    bare = subprocess.run([*base, "--steps", "1,3", "--dry-run"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert "vLLM reports no batch limit" in bare.stderr
    assert "--prior" in bare.stderr
    prior = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "vllm-bound"
    tuned = subprocess.run([*base, "--prior", str(prior / "tune" / "seed-qwen35-122b.json"),
                            "--dry-run"], capture_output=True, text=True, check=True)  # fmt: skip
    assert "batch limit" not in tuned.stderr
    sglang = subprocess.run([*base[:5], "--steps", "1,3", "--dry-run"], capture_output=True,
                            text=True, check=True)  # fmt: skip
    assert "batch limit" not in sglang.stderr


def test_launched_emulated_vllm_pool_is_recognised_and_routed(tmp_path: Path) -> None:
    port, base = launch_ports(2)
    argv = [sys.executable, "-m", "specroute", "launch", "--emulate", "--engine", "vllm"]
    argv += ["--steps", "1,3", "--port", str(port), "--base-port", str(base)]
    argv += ["--log-dir", str(tmp_path / "logs"), "--emulator-arg=--time-scale=20"]
    argv += ["--policy", "round_robin"]
    with (tmp_path / "launch.out").open("wb") as out:
        process = spawn(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:

        def pool_steps() -> list[int | None]:
            try:
                reply = httpx.get(url + "/pool", timeout=2)
            except httpx.HTTPError:
                return []
            return sorted(b["steps"] for b in reply.json()["backends"]) if reply.is_success else []

        wait_for(lambda: pool_steps() == [1, 3], timeout=30)
        body = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}]}
        body["max_tokens"] = 8
        seen = set()
        for _ in range(2):
            reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert reply.json()["usage"]["completion_tokens"] == 8
            seen.add(reply.headers["x-specroute-steps"])
        assert seen == {"1", "3"}
    finally:
        stop(process)


def test_speculative_vllm_servers_report_per_request_acceptance() -> None:
    """Each speculative server (real or emulated) says what every reply accepted; vLLM refuses
    the flag without speculation, so depth 0 goes without; `--vllm-arg` comes later and wins."""
    plain, deep = (list(s.argv) for s in build_plan(EAGLE3).servers)
    flag = "--per-request-spec-decode-metrics"
    assert flag not in plain
    assert deep[deep.index(flag) + 1] == "summary"
    assert deep.index(flag) < deep.index("--gpu-memory-utilization=0.85")
    emulated = LaunchOptions(model="emulated", steps=(0, 3), engine="vllm", emulate=True)
    plain, deep = (list(s.argv) for s in build_plan(emulated).servers)
    assert flag not in plain
    assert deep[deep.index(flag) + 1] == "summary"

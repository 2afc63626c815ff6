"""`specroute tune --engine vllm` on emulated vLLM servers: the report records the engine, each
server's K and method, the launch as their source, what vLLM cannot tell, the launch's
`--max-num-seqs` as capacity, and a `specroute launch` line that starts vLLM again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from servers import free_run

from specroute.children import spawn, stop
from specroute.tune.engine_facts import VLLM_CANNOT_TELL
from specroute.tune.vllm_facts import LoadWatch

TINY = ["--emulate", "--engine", "vllm", "--steps", "1,2", "--concurrency", "1"]
TINY += ["--temperature", "0", "--max-tokens", "8", "--prompt-words", "8", "--warmup", "1"]
TINY += ["--time-scale", "10", "--max-running-requests", "32"]


def _tune(tmp_path: Path, *extra: str) -> Path:
    out, log = tmp_path / "tune", tmp_path / "tune.out"
    argv = [sys.executable, "-m", "specroute", "tune", *TINY, *extra, "--out", str(out)]
    with log.open("wb") as fh:
        process = spawn(
            [*argv, "--base-port", str(free_run(1))], stdout=fh, stderr=subprocess.STDOUT
        )
        try:
            assert process.wait(timeout=120) == 0, log.read_text()
        finally:
            stop(process, grace_s=5)
    return out


def test_tune_report_says_what_vllm_reports_and_what_it_cannot(tmp_path: Path) -> None:
    out = _tune(tmp_path)
    report = json.loads((out / "report.json").read_text())
    facts = report["engine"]
    assert facts["engine"] == "vllm"
    assert facts["method"] == "mtp"
    assert facts["depths"] == {"steps1": 1, "steps2": 2}
    assert facts["source"] == "launch and /metrics under load"
    assert facts["cannot_tell"] == list(VLLM_CANNOT_TELL)
    assert [d["max_running_requests"] for d in report["depths"]] == [32, 32]
    assert "--engine vllm" in report["command"]
    text = (out / "report.md").read_text()
    assert "EMULATED vLLM servers" in text
    assert "What vllm does not report" in text


def test_a_vllm_prior_holds_each_depth_and_the_batch_limit_the_server_held(
    tmp_path: Path,
) -> None:
    # Above the emulated seed's memory bound at K=2 (21 requests): requests wait, and the peak
    # of vllm:num_requests_running is the limit, not the launch's --max-num-seqs (32).
    out = _tune(tmp_path, "--steps", "2", "--concurrency", "40", "--max-tokens", "128")
    prior = json.loads((out / "prior.json").read_text())
    (target,) = prior["targets"]
    assert (target["steps"], target["algorithm"]) == (2, "mtp")
    assert target["max_running_requests"] == 21
    assert [(d["steps"], d["max_running_requests"]) for d in prior["depths"]] == [(2, 21)]
    assert set(prior["acceptance"]["greedy"]["accept_length"]) == {"2"}
    report = json.loads((out / "report.json").read_text())
    assert [d["max_running_requests"] for d in report["depths"]] == [21]
    # `launch --prior` starts the depths the vLLM tune measured.
    plan = subprocess.run(
        [sys.executable, "-m", "specroute", "launch", "--emulate", "--engine", "vllm",
         "--prior", str(out / "prior.json"), "--dry-run"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "# --steps 2,2,2:" in plan.stdout
    assert "# --allowed-steps 2:" in plan.stdout


def test_load_watch_reads_the_limit_and_the_depth_from_vllms_metrics() -> None:
    def text(running: int, waiting: int, positions: int) -> str:
        lines = [
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} 5'
            for i in range(positions)
        ]
        return "\n".join(lines) + "\n"

    watch = LoadWatch()
    watch.read(text(12, 0, 3) + text(0, 0, 3).replace('engine="0"', 'engine="1"'))  # 2 ranks
    assert watch.steps == 3  # the positions, not the series
    watch.read(text(12, 0, 3))
    assert (watch.peak, watch.waited, watch.steps) == (12, False, 3)
    assert watch.limit(48) == 48  # nothing waited: the launch's limit stands
    watch.read(text(17, 9, 3))
    watch.read(text(15, 0, 3))
    assert watch.limit(48) == 17
    assert watch.limit(16) == 16  # never above what the launch allows

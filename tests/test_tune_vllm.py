"""`specroute tune --engine vllm` on emulated vLLM servers: the report records the engine, each
server's K and method, the launch as their source, what vLLM cannot tell, the launch's
`--max-num-seqs` as capacity, and a `specroute launch` line that starts vLLM again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specroute.children import free_port, spawn, stop
from specroute.tune.engine_facts import VLLM_CANNOT_TELL

TINY = ["--emulate", "--engine", "vllm", "--steps", "1,2", "--concurrency", "1"]
TINY += ["--temperature", "0", "--max-tokens", "8", "--prompt-words", "8", "--warmup", "1"]
TINY += ["--time-scale", "10", "--max-running-requests", "32"]


def test_tune_report_says_what_vllm_reports_and_what_it_cannot(tmp_path: Path) -> None:
    out, log = tmp_path / "tune", tmp_path / "tune.out"
    argv = [sys.executable, "-m", "specroute", "tune", *TINY, "--out", str(out)]
    with log.open("wb") as fh:
        process = spawn(
            [*argv, "--base-port", str(free_port())], stdout=fh, stderr=subprocess.STDOUT
        )
        try:
            assert process.wait(timeout=120) == 0, log.read_text()
        finally:
            stop(process, grace_s=5)
    report = json.loads((out / "report.json").read_text())
    facts = report["engine"]
    assert facts["engine"] == "vllm"
    assert facts["method"] == "mtp"
    assert facts["depths"] == {"steps1": 1, "steps2": 2}
    assert facts["source"] == "launch"
    assert facts["cannot_tell"] == list(VLLM_CANNOT_TELL)
    assert [d["max_running_requests"] for d in report["depths"]] == [32, 32]
    assert "--engine vllm" in report["command"]
    text = (out / "report.md").read_text()
    assert "EMULATED vLLM servers" in text
    assert "What vllm does not report" in text

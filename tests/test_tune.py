"""`specroute tune` end to end: the command lines it would run, a run interrupted with Ctrl-C
(no server left behind, finished depths kept) and resumed, and the outputs it writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from servers import free_run

from specroute.children import spawn, stop
from specroute.cli import main
from specroute.pool.prior import load_prior

# Small and fast: two depths, two levels, short requests on 10x emulated GPUs.
TINY = ["--emulate", "--steps", "1,2", "--concurrency", "1,2", "--temperature", "0"]
TINY += ["--max-tokens", "8", "--prompt-words", "8", "--warmup", "1", "--time-scale", "10"]


def _until(check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Run:
    """`specroute tune` in a child process, its output in a file."""

    def __init__(self, tmp_path: Path, out: Path, *extra: str, name: str = "run") -> None:
        self.output = tmp_path / f"{name}.out"
        argv = [sys.executable, "-m", "specroute", "tune", *TINY, "--out", str(out)]
        argv += ["--base-port", str(free_run(1)), *extra]
        with self.output.open("wb") as fh:
            self.process = spawn(argv, stdout=fh, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def pid_of(self, label: str) -> int:
        match = re.search(rf"^{label}: started, pid (\d+)", self.text(), re.MULTILINE)
        assert match, self.text()
        return int(match.group(1))

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=120)
        finally:
            stop(self.process, grace_s=5)


def test_dry_run_prints_every_sglang_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--model", "/models/qwen", "--steps", "0,1,2,3", "--adaptive", "--tp", "2"]
    assert main([*argv, "--gpus", "4,5", "--base-port", "31000", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [line for line in lines if "sglang.launch_server" in line]
    assert len(commands) == 5
    for line in commands:
        assert line.startswith("CUDA_VISIBLE_DEVICES=4,5 ")  # one server at a time, same GPUs
        assert "--model-path /models/qwen --host 127.0.0.1 --port 31000 --tp-size 2" in line
        assert "--max-running-requests 48 --enable-metrics" in line
    assert "--speculative" not in commands[0]
    for k, line in zip((1, 2, 3), commands[1:4], strict=True):
        assert (
            f"--speculative-algorithm NEXTN --speculative-num-steps {k} "
            f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
        ) in line
    assert commands[4].endswith("--speculative-adaptive")
    assert "--speculative-num-steps 3 " in commands[4]
    assert [line for line in lines if line.startswith("# ")][:5] == [
        f"# {label}: http://127.0.0.1:31000"
        for label in ("steps0", "steps1", "steps2", "steps3", "adaptive")
    ]


def test_per_depth_server_flags_mean_what_they_mean_in_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`K:ARG` and `K=N` reach only depth K's server, as with `specroute launch`; --server-host
    is where the servers listen (the old --host still works)."""
    argv = ["tune", "--model", "/m", "--steps", "1,2", "--gpus", "0", "--dry-run"]
    extra = ["--sglang-arg=2:--mem-fraction-static=0.7", "--max-running-requests", "40,2=21"]
    assert main([*argv, *extra, "--server-host", "10.0.0.5"]) == 0
    one, two = [line for line in capsys.readouterr().out.splitlines() if "launch_server" in line]
    assert "--mem-fraction-static" not in one
    assert "2:--mem" not in two
    assert "--mem-fraction-static=0.7" in two
    assert "--max-running-requests 40 " in one
    assert "--max-running-requests 21 " in two
    assert "--host 10.0.0.5 " in one
    assert main([*argv, "--host", "10.0.0.6"]) == 0
    assert "--host 10.0.0.6 " in capsys.readouterr().out


def test_a_run_without_gpus_or_model_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["tune", "--steps", "1", "--dry-run"]) == 2
    assert "--model PATH is required" in capsys.readouterr().err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["tune", "--model", "/m", "--steps", "1", "--dry-run"]) == 2
    assert "no GPU found" in capsys.readouterr().err
    assert main(["tune", "--model", "/m", "--gpus", "0", "--time-scale", "2", "--dry-run"]) == 2
    assert "--time-scale is for emulated servers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--min-requests", "0", "--min-requests must be >= 1"),
     ("--requests-per-concurrency", "0", "--requests-per-concurrency > 0"),
     ("--warmup", "-1", "--warmup >= 0"),
     ("--temperature", "-1", "temperature must be >= 0, not -1"),
     ("--max-tokens", "0", "max_tokens must be >= 1, not 0"),
     ("--top-p", "0", "top_p must be in (0, 1], not 0"),
     ("--tp", "0", "--tp is GPUs per server, at least 1"),
     ("--base-port", "0", "--base-port must be a port from 1 to 65535, not 0")],
)  # fmt: skip
def test_a_value_out_of_range_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, said: str
) -> None:
    # These were taken: --min-requests 0 or --tp 0 started servers and measured nothing.
    assert main(["tune", "--emulate", "--steps", "1", flag, value, "--dry-run"]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_server_keeps_finished_depths_and_a_rerun_resumes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tune"
    first = Run(tmp_path, out, name="first")
    _until(lambda: "steps2: started" in first.text() or first.process.poll() is not None,
           "the second depth to start")  # fmt: skip
    server = first.pid_of("steps2")
    first.process.send_signal(signal.SIGINT)
    assert first.wait() == 130, first.text()
    assert "interrupted" in first.text()
    assert _gone(server), "the interrupted depth's server is still running"
    assert _gone(first.pid_of("steps1"))
    assert (out / "depths" / "steps1.json").exists()
    assert not (out / "depths" / "steps2.json").exists()
    saved = (out / "depths" / "steps1.json").read_bytes()

    second = Run(tmp_path, out, name="second")
    assert second.wait() == 0, second.text()
    text = second.text()
    assert "steps1: measured already" in text
    assert "steps1: started" not in text
    assert "steps2: started" in text
    assert (out / "depths" / "steps1.json").read_bytes() == saved
    report = json.loads((out / "report.json").read_text())
    assert [d["label"] for d in report["depths"]] == ["steps1", "steps2"]
    assert [d["max_running_requests"] for d in report["depths"]] == [26, 21]
    prior = load_prior(out / "prior.json")
    assert set(prior.iteration) == {1, 2}
    assert set(prior.accept_length) == {"greedy"}
    assert (out / "report.md").read_text().startswith("## specroute tune:")
    # The launch line holds each chosen depth at the capacity its server reported, and says
    # how to let depths follow load.
    capacities = {"1": 26, "2": 21}
    command = report["command"].split()
    steps = command[command.index("--steps") + 1].split(",")
    per_depth = command[command.index("--max-running-requests") + 1]
    assert per_depth == ",".join(f"{k}={capacities[k]}" for k in sorted(set(steps)))
    assert "--reconfigure auto" in text


@pytest.mark.timeout(300)
def test_ctrl_c_while_a_server_loads_leaves_none_running(tmp_path: Path) -> None:
    # The emulated server keeps its port closed for 300 emulated seconds (30 s at 10x).
    run = Run(tmp_path, tmp_path / "tune", "--emulator-arg=--startup-s=300", name="loading")
    _until(lambda: "steps1: started" in run.text(), "the first server to start")
    server = run.pid_of("steps1")
    log = tmp_path / "tune" / "logs" / "steps1.log"
    _until(lambda: log.exists() and "emulator_loading" in log.read_text(), "it to be loading")
    run.process.send_signal(signal.SIGINT)
    assert run.wait() == 130, run.text()
    assert _gone(server)
    assert not (tmp_path / "tune" / "depths").exists()


@pytest.mark.timeout(300)
def test_a_changed_setting_measures_a_saved_depth_again_and_force_redoes_all(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tune"
    assert Run(tmp_path, out, "--steps", "1", name="a").wait() == 0
    changed = Run(tmp_path, out, "--steps", "1", "--max-tokens", "9", name="b")
    assert changed.wait() == 0, changed.text()
    assert "steps1: saved with other settings (traffic): measuring again" in changed.text()
    forced = Run(tmp_path, out, "--steps", "1", "--max-tokens", "9", "--force", name="c")
    assert forced.wait() == 0
    assert "steps1: started" in forced.text()
    assert "measured already" not in forced.text()

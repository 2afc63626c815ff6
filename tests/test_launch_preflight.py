"""`launch` refuses what cannot start before starting it, and gives up on the same error twice;
`--emulate` checks what a real pool would and says what it leaves out."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from servers import closed_port

from specroute.cli import main
from specroute.launch.preflight import cannot_start


def test_a_missing_module_and_an_absent_model_path_are_found_before_starting(
    tmp_path: Path,
) -> None:
    argv = [sys.executable, "-m", "no_such_package_26.launch_server", "--model-path", "/no/model"]
    problems = cannot_start(argv)
    assert problems == [
        f"No module named 'no_such_package_26' in {sys.executable}",
        "--model-path /no/model does not exist",
    ]
    present = [sys.executable, "-m", "specroute", "--model-path", str(tmp_path)]
    assert cannot_start(present) == []
    assert cannot_start([sys.executable, "-m", "specroute", "--model-path", "Qwen/Qwen3-8B"]) == []


def test_a_launch_that_cannot_start_exits_2_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["launch", "--model", str(tmp_path / "absent"), "--gpus", "0", "--steps", "1",
            "--log-dir", str(tmp_path / "logs"), "--no-sglang-check"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"steps1 cannot start: --model-path {tmp_path / 'absent'} does not exist" in err
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_the_same_error_twice_while_starting_ends_the_launch_with_its_cause(
    tmp_path: Path,
) -> None:
    # The server never starts, nor the proxy: both ports stay held here, refusing connections.
    with closed_port() as base, closed_port() as port:
        argv = [sys.executable, "-m", "specroute", "launch", "--emulate", "--steps", "1",
                "--emulator-arg=--no-such-flag", "--base-port", str(base),
                "--port", str(port), "--log-dir", str(tmp_path)]  # fmt: skip
        run = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 1, run.stderr
    assert "steps1 failed twice the same way (status 2)" in run.stderr
    assert "unrecognized arguments: --no-such-flag" in run.stderr
    assert run.stderr.count("restarting") == 1


def test_emulate_refuses_what_a_real_pool_would(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch", "--emulate", "--steps", "1,2,3", "--tp", "4", "--gpus", "0",
            "--algorithm", "EAGLE3", "--draft-model", "/x", "--dry-run"]  # fmt: skip
    assert main(argv) == 2
    assert "3 servers x --tp 4 need 12 GPUs, but only 1 are available" in capsys.readouterr().err
    assert main(["launch", "--emulate", "--steps", "1", "--algorithm", "EAGLE3", "--dry-run"]) == 2
    assert "--algorithm EAGLE3 needs --draft-model PATH" in capsys.readouterr().err


def test_emulate_says_what_it_leaves_out(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch", "--emulate", "--steps", "1,2", "--tp", "2", "--gpus", "0,1,2,3",
            "--sglang-arg=--mem-fraction-static=0.8", "--no-sglang-check", "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--emulate: --sglang-arg is not passed to emulated servers" in err
    assert "--emulate: --tp 2 is not emulated" in err


def test_an_address_another_process_answers_on_stops_the_launch_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    with socket.socket() as other, closed_port() as base:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        argv = ["launch", "--emulate", "--steps", "1", "--base-port", str(base),
                "--port", str(port), "--log-dir", str(logs)]  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"proxy cannot start: http://127.0.0.1:{port} already answers" in err
        assert "pick --port" in err
        # the proxy's port one of the servers' own: refused before anything binds either
        argv = ["launch", "--emulate", "--steps", "1,2", "--base-port", str(base),
                "--port", str(base + 1), "--log-dir", str(logs)]  # fmt: skip
        assert main(argv) == 2
        assert f"proxy cannot start: port {base + 1} is steps2's too" in capsys.readouterr().err
    assert not logs.exists()  # nothing was started

"""`launch` refuses what cannot start before starting it, and gives up on the same error twice;
`--emulate` checks what a real pool would and says what it leaves out."""

from __future__ import annotations

import asyncio
import io
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from servers import closed_port, launch_ports

from specroute.cli import main
from specroute.launch.argv import LaunchOptions, build_plan
from specroute.launch.launcher import Launcher, LaunchError, LaunchSettings
from specroute.launch.preflight import cannot_start
from specroute.launch.restarts import ServerRestarts
from specroute.planner import Setting
from specroute.reconfigure.actuator import Actuator


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


def _one_server(tmp_path: Path) -> tuple[LaunchOptions, Launcher]:
    """An emulated pool of one server, planned and not started."""
    port, base = launch_ports(1)
    options = LaunchOptions(model="emulated", steps=(1,), emulate=True, port=port,
                            base_port=base, emulator_args=("--time-scale=40",))  # fmt: skip
    settings = LaunchSettings(log_dir=tmp_path / "logs", drain_s=5, ready_timeout_s=60, poll_s=0.1)
    return options, Launcher(build_plan(options), settings, out=io.StringIO())


def test_a_proxy_port_taken_while_the_servers_load_stops_the_launch_with_its_name(
    tmp_path: Path,
) -> None:
    """The launch checked every address before starting; a process that binds the proxy's
    port while the servers load (minutes on GPUs) is found just before the proxy starts, not
    taken for the proxy (its answers were read as the proxy's readiness, and its 404s as the
    proxy's)."""
    options, launcher = _one_server(tmp_path)
    port = options.port

    async def scenario() -> str:
        try:
            await launcher.start()
        except LaunchError as exc:
            return str(exc)
        finally:
            await launcher.shutdown()
        return "started"

    with socket.socket() as other:
        other.bind(("127.0.0.1", port))  # after `build_plan`: as if taken once the launch began
        other.listen()
        said = asyncio.run(scenario())
    assert said == f"proxy: http://127.0.0.1:{port} already answers (another process listens " \
        f"on port {port}); stop it or pick --port"  # fmt: skip
    assert launcher.proxy.pid is None  # never started
    assert all(not s.running for s in launcher.servers)


def test_a_server_port_taken_while_it_drained_fails_its_restart_with_the_reason(
    tmp_path: Path,
) -> None:
    options, launcher = _one_server(tmp_path)
    base = options.base_port
    other = socket.socket()

    async def scenario() -> str | None:
        try:
            await launcher.start()
            (server,) = launcher.servers
            stop = server.stop

            async def stop_then_taken(grace_s: float = 30.0) -> int | None:
                status = await stop(grace_s)
                if other.getsockname()[1] == base:
                    return status  # the launcher's shutdown, after the restart
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its TIME_WAITs
                other.bind(("127.0.0.1", base))  # another process, while the server was down
                other.listen()
                return status

            server.stop = stop_then_taken  # type: ignore[method-assign]
            act = Actuator("auto", [(server.plan.name, Setting(steps=1), 10.0)])
            return await ServerRestarts(launcher, options, act)(server.plan.name, Setting(steps=3))
        finally:
            await launcher.shutdown()

    with other:
        said = asyncio.run(scenario())
    assert said == f"http://127.0.0.1:{base} already answers (another process listens on port " \
        f"{base}); stop it or pick --base-port"  # fmt: skip

"""The emulator's start-up in parts and its weight cache: parts that sum to each profile's
figure, an emulated daemon a server restarts through (weight load about a second while the
daemon lives, the disk's time when it does not), each part logged, and SGLang's refusal of the
cache with speculative decoding."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from emulator_support import wait_for

from specroute.children import spawn, stop
from specroute.emulator import EmulatorOptions
from specroute.emulator.profiles import PROFILES
from specroute.emulator.startup import CACHED_WEIGHTS_S, StartupParts, StartupPlan
from specroute.emulator.weight_cache import daemon_answers, through_weight_cache


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_parts_default_to_the_profiles_startup_figure(profile: str) -> None:
    options = EmulatorOptions(steps=0, profile=profile, startup_s="profile")
    parts = options.startup_parts
    assert parts.total_s == pytest.approx(PROFILES[profile].startup_s)
    assert min(parts.weights_s, parts.init_s, parts.graphs_s, parts.warmup_s) > 0


def test_a_part_given_replaces_its_share_and_the_total_follows() -> None:
    options = EmulatorOptions(steps=0, startup_s=88.0, startup_graphs_s=5.0)
    assert options.startup_parts.graphs_s == 5.0
    assert options.startup_parts.init_s == pytest.approx(22.0)
    assert options.startup_seconds == pytest.approx(88.0 - 20.0 + 5.0)


def test_the_plan_keeps_the_port_closed_part_by_part_and_scales() -> None:
    plan = StartupPlan.of_parts(StartupParts(40.0, 20.0, 10.0, 3.0), time_scale=10.0)
    assert [name for name, _ in plan.parts] == ["weights", "init", "graphs", "warmup"]
    assert [s for _, s in plan.parts] == pytest.approx([4.0, 2.0, 1.0, 0.2])
    assert plan.warmup_wait_s == pytest.approx(0.1)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """An emulated weight cache daemon, answering once its (instant) load is done."""
    path = tmp_path / "cache" / "emulated.sock"
    argv = [sys.executable, "-m", "specroute", "emulate-weight-cache", "--socket", str(path),
            "--load-s", "0"]  # fmt: skip
    process = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: daemon_answers(str(path)) is not None, timeout=60)
        yield path, process
    finally:
        stop(process)


def test_a_client_of_a_live_daemon_loads_its_weights_in_about_a_second(
    daemon: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    path, process = daemon
    hello = daemon_answers(str(path))
    assert hello is not None
    assert hello.pid == process.pid
    options = EmulatorOptions(steps=0, startup_s=88.0, weight_cache_socket=str(path))
    cached = through_weight_cache(options)
    assert cached.startup_parts.weights_s == CACHED_WEIGHTS_S
    assert cached.startup_seconds == pytest.approx(88.0 - 42.6 + CACHED_WEIGHTS_S)
    assert cached.startup_parts.init_s == options.startup_parts.init_s  # the rest remains


def test_without_its_daemon_a_client_loads_from_disk(
    daemon: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    path, process = daemon
    stop(process)
    assert not path.exists()  # the daemon removed its socket on the way out
    options = EmulatorOptions(steps=0, startup_s=88.0, weight_cache_socket=str(path))
    assert through_weight_cache(options).startup_parts.weights_s == pytest.approx(42.6)


def test_an_emulated_server_logs_each_part_of_its_start_up(
    daemon: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    path, _ = daemon
    argv = [sys.executable, "-m", "specroute", "emulate", "--steps", "0", "--port", "0",
            "--startup-s", "8.8", "--time-scale", "100",
            "--weight-cache-socket", str(path)]  # fmt: skip
    process = spawn(argv, env={"PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE)  # fmt: skip
    events: list[dict[str, Any]] = []
    try:
        assert process.stderr is not None
        while not any(e.get("part") == "graphs" for e in events):
            line = process.stderr.readline()
            assert line, f"the emulator exited before its last part: {events}"
            if line.startswith(b"{"):
                events.append(json.loads(line))
    finally:
        stop(process)
    names = [e["event"] for e in events]
    assert "weight_cache_client" in names
    loading = [e for e in events if e["event"] == "emulator_loading"]
    assert [e["part"] for e in loading] == ["weights", "init", "graphs"]
    assert loading[0]["wall_s"] == 0.01  # 1 s of cached weight load at --time-scale 100


def test_sglang_refuses_the_weight_cache_with_speculative_decoding() -> None:
    with pytest.raises(ValueError, match="not supported together with speculative decoding"):
        EmulatorOptions(steps=3, weight_cache_socket="/tmp/x.sock")
    assert EmulatorOptions(steps=0, weight_cache_socket="/tmp/x.sock").weight_cache_socket
    vllm = EmulatorOptions(steps=3, engine="vllm", weight_cache_socket="/tmp/x.sock")
    assert vllm.weight_cache_socket == "/tmp/x.sock"

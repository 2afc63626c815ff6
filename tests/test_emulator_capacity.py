"""Capacity, adaptive configuration and start-up of the emulator, as SGLang has them."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from emulator_support import wait_for
from litestar.testing import TestClient

from specroute.children import bound_socket, spawn, stop
from specroute.emulator import EmulatorOptions, Engine, command, get_profile
from specroute.emulator.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveSteps
from specroute.emulator.adaptive_config import (
    AdaptiveConfigError,
    load_adaptive_config,
    parse_adaptive_config,
)
from specroute.emulator.fleet import emulated_fleet
from specroute.emulator.server import create_app
from specroute.emulator.startup import StartupPlan

SEED = get_profile("seed-qwen35-122b")
CAPPED = Path(__file__).parent.parent / "examples" / "adaptive-capped-3.json"


def capped() -> Any:
    return load_adaptive_config(str(CAPPED))


# -- the running limit ----------------------------------------------------------------------
@pytest.mark.parametrize("steps", [1, 3, 5, 7])
def test_adaptive_server_is_sized_for_its_deepest_default_candidate(steps: int) -> None:
    # floor(106 / (2 + 7 + 1)): memory for 8 draft tokens, whatever depth it starts at.
    assert Engine(SEED, steps=steps, adaptive=True).max_running_requests == 10


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_tiers_capped_at_3_give_the_capacity_of_depth_3(steps: int) -> None:
    engine = Engine(SEED, steps=steps, adaptive=True, adaptive_config=capped())
    assert engine.max_running_requests == 17 == SEED.capacity(3)


@pytest.mark.parametrize(
    ("steps", "adaptive", "flag", "limit"),
    [
        (1, False, 5, 5),
        (3, True, 5, 5),
        (1, False, 100, 26),
        (3, True, 100, 10),
        (2, False, 21, 21),
    ],
)
def test_max_running_requests_is_a_cap_under_memory(
    steps: int, adaptive: bool, flag: int, limit: int
) -> None:
    engine = Engine(SEED, steps=steps, adaptive=adaptive, max_running_requests=flag)
    assert engine.max_running_requests == limit


def test_speculative_server_without_the_flag_runs_at_most_48() -> None:
    roomy = msgspec.structs.replace(SEED, capacity_c=1000.0)
    assert Engine(roomy, steps=1).max_running_requests == 48
    assert Engine(roomy, steps=0).max_running_requests == roomy.capacity(0) > 48


def test_adaptive_server_queues_past_its_capacity() -> None:
    engine = Engine(SEED, steps=1, adaptive=True)
    for i in range(12):
        engine.submit(f"r{i}", prompt_tokens=8, max_new_tokens=50, klass="greedy", ignore_eos=True)
    engine.step()
    assert (len(engine.running), len(engine.waiting)) == (10, 2)


def _reported(options: EmulatorOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    with TestClient(create_app(options)) as client:
        return client.get("/server_info").json(), client.get("/v1/loads").json()


@pytest.mark.parametrize(
    ("options", "limit"),
    [
        (EmulatorOptions(steps=3, speculative_adaptive=True), 10),
        (EmulatorOptions(steps=1, speculative_adaptive=True, max_running_requests=5), 5),
        (EmulatorOptions(steps=1, max_running_requests=100), 26),
    ],
)
def test_server_info_and_loads_report_the_effective_limit(
    options: EmulatorOptions, limit: int
) -> None:
    info, loads = _reported(options)
    assert info["max_running_requests"] == limit
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == limit
    assert loads["loads"][0]["max_running_requests"] == limit


def test_server_info_names_the_adaptive_config_it_runs() -> None:
    options = EmulatorOptions(
        steps=3, speculative_adaptive=True, speculative_adaptive_config=capped()
    )
    info, _ = _reported(options)
    assert info["max_running_requests"] == 17
    assert info["speculative_adaptive_config"] == str(CAPPED)
    assert f"--speculative-adaptive-config {CAPPED}" in info["launch_command"]
    assert info["emulator"]["memory_sized_for_steps"] == 3


# -- the adaptive controller follows the file -------------------------------------------------
def test_capped_server_never_runs_deeper_than_its_candidates() -> None:
    def depths(config: Any) -> set[int]:
        engine = Engine(SEED, steps=3, adaptive=True, adaptive_config=config, seed=2)
        engine.submit("one", prompt_tokens=8, max_new_tokens=600, klass="greedy", ignore_eos=True)
        seen = set()
        while (iteration := engine.step()) is not None:
            seen.add(iteration.steps)
        return seen

    assert max(depths(DEFAULT_ADAPTIVE_CONFIG)) == 7  # greedy alone climbs the default tier
    assert depths(capped()) == {3}  # already at the top of the capped tier


def test_controller_takes_the_files_tuning() -> None:
    eager = {"1": {"candidate_steps": [1, 2, 3], "warmup_batches": 0, "update_interval": 1}}
    config = parse_adaptive_config(json.dumps({**eager, "ema_alpha": 1.0}).encode(), source="f")
    adaptive = AdaptiveSteps(1, config)
    adaptive.observe(batch_size=1, accepted_per_verify=2.0)
    assert adaptive.steps_for(1) == 3  # decided on the first batch, EMA = the last batch
    slow = AdaptiveSteps(1, parse_adaptive_config(json.dumps(eager).encode(), source="f"))
    slow.observe(batch_size=1, accepted_per_verify=2.0)
    assert slow.steps_for(1) == 1  # alpha 0.2: EMA 0.4, under the 0.5 needed to rise


def test_each_tier_learns_on_its_own() -> None:
    adaptive = AdaptiveSteps(3)
    for _ in range(20):
        adaptive.observe(batch_size=40, accepted_per_verify=0.0)
    assert adaptive.steps_for(40) in (0, 1)
    assert adaptive.steps_for(2) == 3  # the small-batch tier saw nothing
    assert adaptive.steps_for(31) == adaptive.steps_for(32)  # 31 runs padded to the graph of 32


def test_top_level_tuning_applies_to_every_tier_unless_a_tier_sets_its_own() -> None:
    raw = {
        "ema_alpha": 0.5,
        "1": {"candidate_steps": [1]},
        "8": {"candidate_steps": [0, 1], "ema_alpha": 0.1},
        "note": "ignored, as SGLang ignores it",
    }
    config = parse_adaptive_config(json.dumps(raw).encode(), source="f")
    assert [(t.smallest_batch, t.ema_alpha) for t in config.tiers] == [(1, 0.5), (8, 0.1)]
    assert config.tiers[0].down_hysteresis == -0.25  # SGLang's default when a file omits it


# -- bad files --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"tiers": {"1": {}}, "strategy": "ema"}, ["Got keys: ['tiers', 'strategy']"]),
        ({"1": {"candidate_steps": 3}}, ['$["1"].candidate_steps', "got 3"]),
        ({"8": {"candidate_steps": [0, -1]}}, ['$["8"].candidate_steps', "non-negative"]),
        ({"8": {"candidate_steps": []}}, ['$["8"].candidate_steps']),
        ({"1": {"candidate_steps": [1], "update_interval": 0}}, ['$["1"].update_interval']),
        ({"1": {"candidate_steps": [1]}, "ema_alpha": "fast"}, ["$.ema_alpha"]),
        ({"1": {"candidate_steps": [99]}}, ['$["1"].candidate_steps', "16"]),
        ([{"1": {"candidate_steps": [1]}}], ["must be a JSON object"]),
    ],
)
def test_bad_config_is_refused_naming_file_and_field(
    tmp_path: Path, body: Any, names: list[str]
) -> None:
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(body))
    with pytest.raises(AdaptiveConfigError) as error:
        load_adaptive_config(str(path))
    for name in [str(path), *names]:
        assert name in str(error.value)


def _emulate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`specroute emulate ARGV`'s exit status and stderr; on a taken port, so it cannot serve."""
    parser = argparse.ArgumentParser(prog="specroute")
    command.register(parser.add_subparsers())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = parser.parse_args(["emulate", *argv, "--port", port])
        with pytest.raises(SystemExit) as exited:
            args.run(args)
    code = exited.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


def test_cli_exits_2_on_a_bad_config_naming_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"1": {"candidate_steps": "1,3"}}')
    argv = ["--steps", "1", "--speculative-adaptive", "--speculative-adaptive-config", str(path)]
    status, err = _emulate(argv, capsys)
    assert status == 2
    assert str(path) in err
    assert '$["1"].candidate_steps' in err


def test_cli_refuses_steps_outside_the_candidates(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--steps", "5", "--speculative-adaptive", "--speculative-adaptive-config", str(CAPPED)]
    status, err = _emulate(argv, capsys)
    assert status == 2
    assert "--speculative-num-steps=5 is not in the adaptive config candidate_steps" in err


# -- start-up ---------------------------------------------------------------------------------
def test_startup_splits_into_load_and_warmup_and_scales() -> None:
    plan = StartupPlan.of(20.0, 100.0)  # the warm-up's share of 20 s (0.77 s) is under a poll
    assert plan.load_s + plan.warmup_wait_s == pytest.approx(0.2)
    assert plan.warmup_wait_s == pytest.approx(20.0 * 3.4 / 88 / 100)
    assert StartupPlan.of(0.0, 8.0).instant
    assert EmulatorOptions(steps=1, startup_s="profile").startup_seconds == SEED.startup_s == 88


def test_health_and_ready_answer_503_while_warming_up_then_200() -> None:
    options = EmulatorOptions(steps=2, startup_s=0.6)
    with TestClient(create_app(options)) as client:
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 503
        assert client.get("/server_info").status_code == 200  # the listener already answers
        wait_for(lambda: client.get("/ready").status_code == 200)
        assert client.get("/health").status_code == 200


def test_port_stays_closed_while_loading_though_the_socket_was_handed_over() -> None:
    with bound_socket() as sock:  # bound here, listened on by the emulator once loaded
        port, fd = sock.getsockname()[1], sock.fileno()
        argv = ["emulate", "--steps", "1", "--startup-s", "600", "--time-scale", "10"]
        process = spawn(
            [sys.executable, "-m", "specroute", *argv, "--port", str(port), "--fd", str(fd)],
            env={"PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=[fd],
        )
    try:
        assert process.stderr is not None
        while b"emulator_loading" not in (line := process.stderr.readline()):
            assert line, "the emulator exited before loading"
        with pytest.raises(ConnectionRefusedError):  # 60 s of loading left: closed, as SGLang
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
    finally:
        stop(process)


def test_fleet_passes_capacity_adaptive_config_and_startup_through() -> None:
    extra = ["--speculative-adaptive", "--speculative-adaptive-config", str(CAPPED)]
    extra += ["--startup-s", "3", "--time-scale", "10"]

    async def server_infos() -> list[dict[str, Any]]:
        async with (
            emulated_fleet([1, 3], profile="seed-qwen35-122b", extra_args=extra) as servers,
            httpx.AsyncClient(timeout=10) as client,
        ):
            return [(await client.get(s.url + "/server_info")).json() for s in servers]

    infos = asyncio.run(server_infos())
    assert [info["max_running_requests"] for info in infos] == [17, 17]
    assert {info["speculative_adaptive_config"] for info in infos} == {str(CAPPED)}
    assert {info["emulator"]["startup_s"] for info in infos} == {3.0}

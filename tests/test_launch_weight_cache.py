"""`specroute launch --weight-cache`: the command lines per engine, and on an emulated pool the
daemon's lifecycle (up before its servers, restarted when it dies, stopped at exit) and a depth
change whose restart maps the cached weights, which the planner is then charged."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from servers import launch_ports

from specroute.cmdline import UsageError
from specroute.launch.argv import LaunchOptions, build_plan
from specroute.launch.depth_flags import server_at
from specroute.launch.launcher import Launcher, LaunchSettings
from specroute.launch.restarts import ServerRestarts
from specroute.launch.weight_cache import serving_sockets
from specroute.planner import Change, Setting
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer

CONFIGURED_S = 88.0


def test_vllm_servers_map_their_gpu_sets_daemon() -> None:
    options = LaunchOptions(model="M", steps=(1, 3), engine="vllm", tp=2, gpus=(0, 1, 2, 3),
                            weight_cache="/wc")  # fmt: skip
    plan = build_plan(options)
    first, second = plan.caches
    assert first.process.argv[1:] == (
        "-m", "vllm.model_executor.model_loader.weight_cache.daemon", "--model", "M",
        "--tensor-parallel-size", "2", "--weight-cache-socket-dir", "/wc/gpus0-1")  # fmt: skip
    assert first.process.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert (first.cache.sockets, second.cache.socket_dir) == (2, "/wc/gpus2-3")
    server = plan.servers[1]
    at = server.argv.index("--load-format")
    assert server.argv[at + 1] == "ipc_cache"
    extra = json.loads(server.argv[server.argv.index("--model-loader-extra-config") + 1])
    assert extra == {"socket_dir": "/wc/gpus2-3", "mode": "zero_copy", "fallback": False}
    moved = server_at(options, server, Setting(steps=1))  # a depth change keeps the client flags
    assert moved.argv[-4:] == server.argv[-4:]
    assert "--load-format" in moved.argv


def test_sglang_servers_find_the_daemon_by_the_gpu_uuid_template() -> None:
    options = LaunchOptions(model="M", steps=(0,), gpus=(3,), sglang_args=("--dtype=bfloat16",),
                            weight_cache="/wc")  # fmt: skip
    plan = build_plan(options)
    (cache,) = plan.caches
    assert cache.process.argv[1:] == ("-m", "sglang.srt.weight_cache.daemon", "--model-path",
                                      "M", "--tp-size", "1", "--dtype=bfloat16")  # fmt: skip
    template = "/wc/gpus3/sglang_weight_cache_{device_uuid}.sock"
    assert cache.process.env["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] == template
    (server,) = plan.servers
    assert server.argv[-2:] == ("--weight-cache-mode", "client")
    assert server.env["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] == template


def test_sglang_with_a_speculative_depth_is_refused_with_the_reason() -> None:
    with pytest.raises(UsageError, match="does not export draft weights"):
        LaunchOptions(model="M", steps=(0, 3), weight_cache="/wc")


def test_without_the_flag_no_daemon_and_no_client_flags() -> None:
    plan = build_plan(LaunchOptions(model="M", steps=(1,), engine="vllm", gpus=(0,)))
    assert plan.caches == ()
    assert "--load-format" not in plan.servers[0].argv


# An emulated pool: daemons, servers and the proxy as child processes -------------------------


def _options(tmp_path: Path) -> LaunchOptions:
    port, base = launch_ports(2)
    return LaunchOptions(
        model="emulated", steps=(1, 3), engine="vllm", emulate=True, port=port,
        base_port=base, policy="least_loaded", proxy_env={"SPECROUTE_ADMIN_KEY": "k"},
        emulator_args=("--time-scale=40", f"--startup-s={CONFIGURED_S}"),
        weight_cache=str(tmp_path / "wc"),
    )  # fmt: skip


def _events(path: Path, event: str) -> list[dict[str, Any]]:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
    return [e for e in map(json.loads, lines) if e.get("event") == event]


async def _depth_change(launcher: Launcher, options: LaunchOptions) -> Actuator:
    """Move the first server to depth 3 through the product's loop and restart."""
    name = launcher.servers[0].plan.name
    servers = [(s.plan.name, Setting(steps=s.plan.steps or 0), CONFIGURED_S)
               for s in launcher.servers]  # fmt: skip
    act = Actuator("auto", servers)
    link = ProxyLink(launcher.plan.proxy.url, "k")
    restart = ServerRestarts(launcher, options, act)
    loop = Reconfigurer(ReconfigureOptions(mode="auto", drain_s=5), link, act, restart,
                        limit=options.running_limit)  # fmt: skip
    slot = act.slots[name]
    slot.phase, slot.target, slot.started = "draining", Setting(steps=3), act.clock()
    try:
        await loop._carry_out(Change(server=name, before=slot.setting, after=Setting(steps=3),
                                     cost_tokens=1.0))  # fmt: skip
    finally:
        await link.aclose()
    return act


def test_an_emulated_pool_restarts_through_its_weight_cache(tmp_path: Path) -> None:
    options = _options(tmp_path)

    async def scenario() -> dict[str, Any]:
        settings = LaunchSettings(log_dir=tmp_path / "logs", drain_s=5, ready_timeout_s=120,
                                  poll_s=0.1)  # fmt: skip
        launcher = Launcher(build_plan(options), settings, out=io.StringIO())
        try:
            await launcher.start()
            caches = [c.pid for c in launcher.caches]
            act = await _depth_change(launcher, options)
            return {"launcher": launcher, "act": act, "caches": caches}
        finally:
            await launcher.shutdown()

    seen = asyncio.run(scenario())
    launcher, act = seen["launcher"], seen["act"]
    name = launcher.servers[0].plan.name
    log = launcher.servers[0].log_path
    clients = _events(log, "weight_cache_client")
    assert len(clients) == 2  # at launch and again after the depth change
    weights = [e for e in _events(log, "emulator_loading") if e["part"] == "weights"]
    assert [e["wall_s"] for e in weights] == [0.025, 0.025]  # 1 s cached at --time-scale 40
    (took,) = act.restart_times.seen(name)
    charged = next(s.startup_s for s in act.servers() if s.name == name)
    assert charged == took  # what the server showed, not the configured 88 s
    assert charged < CONFIGURED_S
    assert all(not c.running for c in launcher.caches)  # stopped at exit, sockets gone
    assert not [c.log_path for c in launcher.caches if "Traceback" in c.log_path.read_text()]
    assert not list((tmp_path / "wc").rglob("*.sock"))


def test_a_daemon_that_dies_is_restarted(tmp_path: Path) -> None:
    port, base = launch_ports(1)
    options = LaunchOptions(model="emulated", steps=(0,), emulate=True, port=port,
                            base_port=base, emulator_args=("--time-scale=40",),
                            weight_cache=str(tmp_path / "wc"))  # fmt: skip

    async def scenario() -> tuple[int | None, int | None, int]:
        settings = LaunchSettings(log_dir=tmp_path / "logs", drain_s=5, ready_timeout_s=120,
                                  poll_s=0.1)  # fmt: skip
        launcher = Launcher(build_plan(options), settings, out=io.StringIO())
        try:
            await launcher._start_caches()
            (cache,), (planned,) = launcher.caches, launcher.plan.caches
            first = cache.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            while cache.pid == first or serving_sockets(planned.cache) < 1:  # noqa: ASYNC110 - polls a pid and a socket
                await asyncio.sleep(0.05)
            return first, cache.pid, cache.restarts
        finally:
            await launcher.shutdown()

    first, second, restarts = asyncio.run(scenario())
    assert second != first
    assert restarts == 1


def test_the_kubernetes_cached_depth_0_runs_the_launchers_plan() -> None:
    import shlex

    import yaml

    path = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "components"
    doc = yaml.safe_load((path / "steps-0-cached" / "deployment.yaml").read_text())
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    script = container["args"][0]
    options = LaunchOptions(model="/models/model", steps=(0,), host="0.0.0.0", gpus=(0,),
                            weight_cache="/weight-cache")  # fmt: skip
    plan = build_plan(options)
    assert shlex.join(plan.servers[0].argv[1:]).replace("-m ", "python3 -m ", 1) in script
    assert shlex.join(plan.caches[0].process.argv[1:]).replace("-m ", "python3 -m ", 1) in script
    template = plan.servers[0].env["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"].replace("/gpus0", "")
    assert template in script

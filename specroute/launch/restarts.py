"""Restarting one launched server at another depth: stop it, check the new command line with
SGLang's resolver (when installed), start it supervised, wait for /ready; and the wiring of the
depth loop into a running `Launcher`."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import msgspec
import structlog

from specroute.children import ChildExited, NotReady, wait_ready
from specroute.launch.argv import LaunchOptions, LaunchPlan, PlanError
from specroute.launch.depth_flags import adaptive_config, capped_tiers, server_at
from specroute.launch.launcher import Launcher, validate_with_sglang
from specroute.launch.preflight import answered_by_another
from specroute.launch.sglang_check import sglang_installed
from specroute.launch.supervisor import Supervised
from specroute.planner import Setting
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer

__all__ = ["ServerRestarts", "admin_key_for", "attach", "depth_loop", "with_admin_key"]

log = structlog.get_logger()


def admin_key_for(given: str | None) -> tuple[str, dict[str, str]]:
    """The admin key the loop calls the proxy with, and the environment that gives the proxy
    one when the operator set none (a fresh random key, never printed)."""
    if given:
        return given, {}
    key = secrets.token_urlsafe(24)
    return key, {"SPECROUTE_ADMIN_KEY": key}


class ServerRestarts:
    """`Reconfigurer`'s restart: the server named `name` in `launcher`, at `setting`."""

    def __init__(self, launcher: Launcher, options: LaunchOptions, actuator: Actuator) -> None:
        self.launcher = launcher
        self.options = options
        self.actuator = actuator
        self.check = not options.emulate and options.engine == "sglang" and sglang_installed()

    async def __call__(self, name: str, setting: Setting) -> str | None:
        servers = self.launcher.servers
        i = next(j for j, s in enumerate(servers) if s.plan.name == name)
        old = servers[i]
        try:
            plan = server_at(self.options, old.plan, setting, self._tiers_file(name, setting))
        except PlanError as exc:  # a setting the engine lacks (tiers on vLLM, a table on SGLang)
            return str(exc)
        if self.check:
            verdict = (await asyncio.to_thread(validate_with_sglang, [plan.argv]))[0]
            if verdict is not None:
                return f"SGLang rejects the flags: {verdict}"
        await old.stop(self.launcher.settings.drain_s)
        taken = await asyncio.to_thread(answered_by_another, plan.url, "--base-port")
        if taken:  # taken while the old server drained
            return taken
        child = Supervised(plan, self.launcher.settings.log_dir, on_crash=self.launcher.crashed)
        servers[i] = child
        await child.start()
        try:
            await wait_ready(
                plan.url + plan.ready_path, process=child.process, within=self.launcher.settings
                .ready_timeout_s, poll_s=self.launcher.settings.poll_s, name=name,
                output=child.log_path,
            )  # fmt: skip
        except (NotReady, ChildExited) as exc:
            return str(exc).splitlines()[0].split("; last lines of")[0]
        return None

    def _tiers_file(self, name: str, setting: Setting) -> Path | None:
        if not setting.tiers:
            return None
        path = self.launcher.settings.log_dir / f"{name}-adaptive.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(adaptive_config(setting.tiers))
        return path


def depth_loop(
    launcher: Launcher, options: LaunchOptions, reconfigure: ReconfigureOptions, admin_key: str
) -> Reconfigurer:
    """The planner and actuator for `launcher`'s servers, talking to its proxy."""
    servers = []
    for s in launcher.servers:
        steps = s.plan.steps or 0
        setting = Setting(steps=steps, table=options.tables.get(steps, ()))
        servers.append((s.plan.name, setting, launcher.ready_after.get(s.plan.name, 60.0)))
    actuator = Actuator(reconfigure.mode, servers)
    # --allow-adaptive: SGLang's tiers, or vLLM's K per batch size (tables the planner writes).
    adaptive = reconfigure.allow_adaptive and options.engine == "sglang"
    return Reconfigurer(
        reconfigure,
        ProxyLink(launcher.plan.proxy.url, admin_key),
        actuator,
        ServerRestarts(launcher, options, actuator),
        limit=options.running_limit,
        adaptive=(capped_tiers(reconfigure.allowed_steps),) if adaptive else (),
        tables=reconfigure.allow_adaptive and options.engine == "vllm",
    )


def with_admin_key(plan: LaunchPlan, admin_key: str | None) -> tuple[LaunchPlan, str]:
    """The plan with an admin key the proxy and the loop share: the operator's, else a fresh
    random one in the proxy's environment (hidden like every key)."""
    key, env = admin_key_for(admin_key)
    if not env:
        return plan, key
    proxy = msgspec.structs.replace(
        plan.proxy,
        env={**plan.proxy.env, **env},
        secrets=tuple(sorted({*plan.proxy.secrets, *env})),
    )
    return msgspec.structs.replace(plan, proxy=proxy), key


def attach(
    launcher: Launcher, options: LaunchOptions, reconfigure: ReconfigureOptions, admin_key: str
) -> None:
    """Run the depth loop beside the launched pool (nothing with `--reconfigure off`)."""
    if reconfigure.mode == "off":
        return

    async def loop(stop: asyncio.Event) -> None:
        reconfigurer = depth_loop(launcher, options, reconfigure, admin_key)
        try:
            await reconfigurer.run(stop)
        finally:
            await reconfigurer.link.aclose()

    launcher.background.append(loop)

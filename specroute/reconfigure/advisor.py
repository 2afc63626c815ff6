"""The planner alone, for deployments that `specroute launch` does not run (Kubernetes): the one
planner of the deployment in `advise` mode, its servers whatever the proxy's pool holds, its
plan published to every proxy replica, where `specroute_plan_replicas` tells an autoscaler
(KEDA) how many servers each depth's Deployment should run.

    python -m specroute.reconfigure.advisor --proxy http://specroute:8000 \\
        --replicas specroute-replicas:8000     # admin key in SPECROUTE_ADMIN_KEY
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections.abc import Sequence

import httpx
import msgspec
import structlog

from specroute.logs import configure_logging
from specroute.planner import Setting
from specroute.reconfigure.actuator import Actuator, Slot
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer
from specroute.reconfigure.options import add_planner_arguments, allowed_steps, planner_fields
from specroute.speculation import SPECULATIVE_DEFAULT_MAX_RUNNING
from specroute.wire import PlanDocument, PoolSnapshot

__all__ = ["Advisor", "FanoutLink", "main"]

log = structlog.get_logger()


class FanoutLink(ProxyLink):
    """Reads /pool from `url`; publishes the plan to every address `replicas` (HOST:PORT,
    a headless Service) resolves to, so each proxy replica serves the same plan."""

    def __init__(self, url: str, admin_key: str, replicas: str | None) -> None:
        super().__init__(url, admin_key)
        self.replicas = replicas

    def _targets(self) -> list[str]:
        if self.replicas is None:
            return [str(self.client.base_url).rstrip("/")]
        host, _, port = self.replicas.rpartition(":")
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        hosts = sorted({str(info[4][0]) for info in found})
        return [f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}" for h in hosts]

    async def publish(self, document: PlanDocument) -> None:
        body = msgspec.json.encode(document)
        targets = await asyncio.to_thread(self._targets)
        for target in targets:
            try:
                answer = await self.client.put(f"{target}/plan", content=body)
                answer.raise_for_status()
            except httpx.HTTPError as exc:
                log.warning("plan_not_published", replica=target, error=str(exc))


class Advisor(Reconfigurer):
    """The planner in `advise` over the pool as it is: servers come and go with the pods."""

    def __init__(self, options: ReconfigureOptions, link: ProxyLink, startup_s: float) -> None:
        super().__init__(
            options,
            link,
            Actuator("advise", []),
            _never,
            limit=lambda k: SPECULATIVE_DEFAULT_MAX_RUNNING,
        )
        self.startup_s = startup_s

    async def tick(self) -> None:
        pool = await self.link.pool()
        self.follow(pool)
        await self.consider(pool)

    def follow(self, pool: PoolSnapshot) -> None:
        """The servers are the pool's reachable backends of known depth, at that depth."""
        now = self.actuator.clock()
        slots: dict[str, Slot] = {}
        for b in pool.backends:
            if b.steps is None or not b.healthy:
                continue
            setting = Setting(steps=b.steps)
            slot = self.actuator.slots.get(b.name)
            if slot is None or slot.setting != setting:
                slot = Slot(name=b.name, setting=setting, startup_s=self.startup_s, since=now)
            slots[b.name] = slot
        self.actuator.slots = slots


async def _never(name: str, setting: Setting) -> str | None:
    raise AssertionError("advise restarts nothing")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specroute.reconfigure.advisor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--proxy", required=True, help="a proxy's URL (its /pool is read)")
    add(
        "--replicas",
        default=None,
        metavar="HOST:PORT",
        help="a name resolving to every proxy replica; default: publish to --proxy only",
    )
    add("--startup", type=float, default=120.0, metavar="SECONDS", help="a server's start-up")
    add_planner_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    key = os.environ.get("SPECROUTE_ADMIN_KEY")
    if not key:
        print("advisor: SPECROUTE_ADMIN_KEY is not set (the proxy's admin key)", file=sys.stderr)
        return 2
    try:
        options = ReconfigureOptions(
            mode="advise", allowed_steps=allowed_steps(args.allowed_steps),
            min_dwell_s=args.min_dwell, planner=planner_fields(args.planner_option),
        )  # fmt: skip
        options.planner_options()
    except (msgspec.ValidationError, ValueError) as exc:
        print(f"advisor: {exc}", file=sys.stderr)
        return 2
    configure_logging()
    return asyncio.run(_run(options, FanoutLink(args.proxy, key, args.replicas), args.startup))


async def _run(options: ReconfigureOptions, link: ProxyLink, startup_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await Advisor(options, link, startup_s).run(stop)
    finally:
        await link.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

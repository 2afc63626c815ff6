"""Serving the proxy with uvicorn: the limited HTTP protocol (with the descriptors its connection
limit needs), and a graceful shutdown that stops accepting at once, lets requests in flight finish
for a grace period, then ends the rest with an error (an error event and `[DONE]` in a stream)
before the pool and its connections close."""

from __future__ import annotations

import asyncio
import gc
import math
import resource
import socket

import structlog
import uvicorn

from specroute.children import inherited_socket
from specroute.config import Config
from specroute.proxy.app import ProxyApp
from specroute.proxy.protocol import limited_protocol
from specroute.tasks import cancel

__all__ = ["serve"]

log = structlog.get_logger()

# uvicorn's own deadline comes after ours: it cancels tasks without ending their streams.
_BACKSTOP_S = 10.0
_SPARE_FDS = 64  # listeners, log files, DNS, the loop's own


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: ProxyApp, grace_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._grace_s = grace_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # runs the lifespan (the pool's first look), then binds
        if self.started:
            self._listening()

    def _listening(self) -> None:
        """The one line that says where the proxy serves, with what, in front of what."""
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        state = self._app.state
        log.info(
            "proxy_listening",
            host=host,
            port=port,
            policy=state.config.policy,
            backends={b.name: b.url for b in state.pool.backends},
            healthy=sorted(b.name for b in state.pool.backends if b.healthy),
        )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("shutdown_started", grace_s=self._grace_s)
        drain = asyncio.create_task(self._app.drain(self._grace_s))
        try:
            await super().shutdown(sockets)  # closes the listeners, waits for connections
        finally:
            await cancel([drain])
        log.info("shutdown_finished")


def _raise_fd_limit(config: Config) -> None:
    """Each client and upstream connection is a descriptor: lift the soft limit (often 1024)
    toward the hard one, so that the connection limits, not `accept` failing, decide."""
    need = config.limits.max_connections + config.client.max_connections + _SPARE_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        log.warning("fd_limit_low", need=need, limit=target)


def serve(app: ProxyApp, config: Config, fd: int | None = None) -> None:
    """Run `app` on `config.host:config.port`, or on the inherited socket `fd`, until SIGINT
    or SIGTERM."""
    # Everything built so far (the imported libraries, the app) lives as long as the process:
    # out of the collector's sight, a full collection takes a millisecond, not fifty, and no
    # longer stalls every request in flight (benchmarks/proxy_overhead.py, p99 at 64).
    gc.collect()
    gc.freeze()
    limits = config.limits
    _raise_fd_limit(config)
    server_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http=limited_protocol(limits, app.state.auth),
        ws="none",  # no upgrade may hand a connection to a protocol without these limits
        proxy_headers=False,  # a peer is the socket's address (per-peer limit), never a header
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=math.ceil(limits.shutdown_grace_s + _BACKSTOP_S),
    )
    sockets = None if fd is None else [inherited_socket(fd)]
    _Server(server_config, app, limits.shutdown_grace_s).run(sockets=sockets)

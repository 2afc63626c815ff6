"""The proxy's runtime objects, built in the app's lifespan and passed explicitly."""

from __future__ import annotations

import time

from specroute.config import Config
from specroute.policies import Policy, create
from specroute.pool import Pool, UpstreamClient
from specroute.proxy.admission import Admission
from specroute.proxy.auth import Auth
from specroute.proxy.bodies import BodyBudget
from specroute.proxy.decisions import RecentDecisions
from specroute.proxy.depths import DepthWatch
from specroute.proxy.lane_stats import LaneStats
from specroute.proxy.metrics import ProxyGauges, ProxyMetrics
from specroute.proxy.paced import PacedRender
from specroute.proxy.process import ProcessMonitor
from specroute.proxy.request_log import RequestLogSampler
from specroute.proxy.vllm_counters import VllmCounters

__all__ = ["ProxyState"]


class ProxyState:
    """Config, the upstream client, the pool, the current policy, admission, auth, the cap on
    request bodies held at once, metrics."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.client = UpstreamClient(config.timeouts, config.client)
        self.pool = Pool(config, self.client)
        # The current policy: PUT /policy replaces it; each request keeps the one it came in
        # under (the relay binds it once per request).
        self.policy: Policy = create(config.policy)
        self.admission = Admission(self.pool, config.admission, config.lanes.reserve)
        self.auth = Auth(config.api_keys, config.admin_key, config.class_keys)
        limits = config.limits
        self.bodies = BodyBudget(
            limits.max_body_bytes_in_flight, limits.body_wait_s, config.admission.retry_after_s
        )
        self.metrics = ProxyMetrics()
        self.lanes = LaneStats(self.metrics.registry, config.lanes.target)
        self.decisions = RecentDecisions()
        self.request_log = RequestLogSampler(config.request_log_share)
        self.process = ProcessMonitor()
        self.depths = DepthWatch(self.pool, config.health.interval_s)
        self.metrics.registry.register(
            ProxyGauges(self.pool, self.admission, self.bodies, self.process)
        )
        self.vllm_counters = VllmCounters(
            lambda: self.pool.backends,
            self.client,
            config.health.timeout_s,
            interval_s=limits.metrics_render_s,
        )
        """The vLLM backends' spec-decode counters, on `/metrics` for vLLM's own tools."""
        self.metrics.registry.register(self.vllm_counters)
        self.metrics_text = PacedRender(self.metrics.render, limits.metrics_render_s)
        """`/metrics`, rendered at most once per `limits.metrics_render_s` however many ask."""
        self.started = time.time()  # wall clock only for `created` in /v1/models

    async def start(self) -> None:
        await self.pool.start()
        self.process.start()
        self.depths.start(lambda: self.policy)

    async def stop(self) -> None:
        await self.depths.stop()
        await self.process.stop()
        await self.pool.stop()
        await self.client.aclose()

"""The proxy's relay of vLLM spec-decode counters (`proxy/vllm_counters.py`) against a loopback
server that counts its scrapes: concurrent `/metrics` share one reading, readings are paced, and
a reading always begins after the request that waits for it (fresh figures)."""

from __future__ import annotations

import asyncio

from specroute.config import (
    AdmissionConfig,
    BackendConfig,
    BreakerConfig,
    ClientConfig,
    HealthConfig,
    TimeoutConfig,
)
from specroute.pool import Backend, UpstreamClient
from specroute.proxy.vllm_counters import VllmCounters


class CountingServer:
    """Answers every request with vLLM's drafts counter at `drafts`; counts the requests."""

    def __init__(self) -> None:
        self.hits = 0
        self.drafts = 10

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.hits += 1
        body = f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}\n'.encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()


def _drafts(counters: VllmCounters) -> float:
    (family,) = list(counters.collect())
    (sample,) = [s for s in family.samples if s.name.endswith("_total")]
    return sample.value


def test_concurrent_reads_share_one_scrape_and_each_sees_what_came_before_it() -> None:
    async def run() -> None:
        server = CountingServer()
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        config = BackendConfig(url=f"http://127.0.0.1:{port}", engine="vllm")
        backend = Backend(
            config, health=HealthConfig(), admission=AdmissionConfig(), breaker=BreakerConfig()
        )
        client = UpstreamClient(TimeoutConfig(), ClientConfig())
        counters = VllmCounters(lambda: [backend], client, timeout_s=5.0, interval_s=0.2)
        try:
            await asyncio.gather(*(counters.refresh() for _ in range(20)))
            # The first reading, and one more for those who asked while it was under way.
            assert server.hits == 2
            assert _drafts(counters) == 10
            server.drafts = 25  # new work, then readers ask at once: paced, but fresh
            await asyncio.gather(*(counters.refresh() for _ in range(20)))
            assert server.hits == 3  # one reading, after the interval, for all twenty
            assert _drafts(counters) == 25
        finally:
            await client.aclose()
            listener.close()
            await listener.wait_closed()

    asyncio.run(run())

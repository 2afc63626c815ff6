"""Several proxies over one pool: two replicas that know each other never admit, together,
more than a backend's capacity in a burst (each takes its share of the slots and holds the
rest), and a backend counts the requests that waited for one of its slots (SGLang's
`sglang:queue_time_seconds`, which the N-replica harness reads)."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from servers import bound_socket, run_server, start_emulator

from specroute.prometheus import sglang_values

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

CAPACITY = 4
BURST = 12
CONFIG = """
[health]
interval_s = 0.2
success_threshold = 1
metrics_interval_s = 0.5
[replicas]
peers = {peers}
read_every_s = 0.2
resolve_every_s = 0.2
scrape_min_interval_s = 0.1
"""


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The N-replica harness, imported as its script is run (benchmarks/ on the path)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("replicas", None)
    return importlib.import_module("replicas")


def test_a_backend_counts_the_requests_that_waited_for_a_slot(harness: ModuleType) -> None:
    one_slot = ("--max-running-requests", "1", "--time-scale", "0.5", "--model-name", "m")
    with start_emulator(1, *one_slot) as backend:

        async def two_at_once() -> str:
            async with httpx.AsyncClient(timeout=60.0) as client:
                await asyncio.gather(*(_stream(client, backend.url) for _ in range(2)))
                return (await client.get(backend.url + "/metrics")).text

        waits = harness.queue_waits(asyncio.run(two_at_once()))
    assert waits["requests"] == 2
    assert waits["waited"] == 1  # the second waited for the first to end
    assert waits["wait_s"] > 0.1


async def _stream(client: httpx.AsyncClient, url: str) -> int:
    body = {
        "model": "m", "messages": [{"role": "user", "content": "write a long story"}],
        "max_tokens": 200, "ignore_eos": True, "temperature": 0.0, "stream": True,
    }  # fmt: skip
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
        async for _ in reply.aiter_bytes():
            pass
        return reply.status_code


async def _burst(proxies: list[str], backend: str) -> tuple[list[int], list[int], list[int]]:
    """BURST streams split over the proxies at once; the sum of the proxies' in-flight counts
    on the backend and the requests the backend holds (running and queued), sampled while the
    first wave runs."""
    async with httpx.AsyncClient(timeout=60.0) as client:
        for _ in range(100):  # each knows the other and its rank before the burst
            pools = [(await client.get(p + "/pool")).json() for p in proxies]
            if all(p["replicas"]["replicas"] == 2 and p["replicas"]["rank"] is not None
                   for p in pools):  # fmt: skip
                break
            await asyncio.sleep(0.1)
        tasks = [asyncio.create_task(_stream(client, proxies[i % 2])) for i in range(BURST)]
        sums, held = [], []
        for _ in range(20):
            await asyncio.sleep(0.05)
            pools = [(await client.get(p + "/pool")).json() for p in proxies]
            sums.append(sum(b["in_flight"] for p in pools for b in p["backends"]))
            text = (await client.get(backend + "/metrics")).text
            found = sglang_values(text, ["num_running_reqs", "num_queue_reqs"]) or {}
            held.append(int(sum(v[0] for v in found.values())))
        statuses = list(await asyncio.gather(*tasks))
    return sums, held, statuses


def test_two_proxies_over_one_backend_never_both_admit_past_its_capacity_in_a_burst(
    tmp_path: Path,
) -> None:
    socks = [bound_socket(), bound_socket()]  # the proxies' ports, held until they listen
    peers = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in socks]
    config = tmp_path / "proxy.toml"
    config.write_text(CONFIG.format(peers=str(peers).replace("'", '"')))
    emulate = ("--max-running-requests", str(CAPACITY), "--decode-log-interval", "1",
               "--time-scale", "0.5", "--model-name", "m")  # fmt: skip
    with start_emulator(3, *emulate) as backend:
        serve = ["serve", "--config", str(config), "--backend", backend.url]
        with run_server(serve, sock=socks[0]), run_server(serve, sock=socks[1]):
            for sock in socks:
                sock.close()  # the proxies hold them now
            sums, held, statuses = asyncio.run(_burst(peers, backend.url))
    assert statuses == [200] * BURST  # the rest waited in the proxies, then ran
    assert max(sums) == CAPACITY  # every slot was used, by both together, none twice...
    assert max(held) <= CAPACITY  # ...so the backend never held more than it runs

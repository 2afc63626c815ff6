"""Per-decision cost of every built-in policy as the pool grows: 3, 30, 300 and 1,000 servers
over 4 depth groups, each server part full.

    .venv/bin/python benchmarks/policy_scale.py [--sizes 3 30 300 1000] [--repeat 5]

Two numbers per policy and size, each the best of `--repeat` timed runs (CPU microseconds of
this process, so that the machine's other load counts as little as it can):
`choose` is the policy alone on the pool's live view; `decision` is the request's whole path
through the pool: its routing view, the policy, and the lease taken and given back (the view
of that backend patched both times). A hand-built view (a tuple of every backend, as a test or
a simulator passes) is grouped per call: its cost, `tuple view`, grows with the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections import deque
from collections.abc import Callable

from specroute.config import BackendConfig, Config
from specroute.policies import PoolView, RouteRequest, create
from specroute.policies.registry import BUILTIN
from specroute.pool import Lease, Pool, UpstreamClient
from specroute.speculation import expected_tokens

DEPTHS = (1, 2, 3, 4)
CAPACITY = {1: 26, 2: 21, 3: 17, 4: 15}  # the seed profile's R(k) = floor(106 / (k + 3))
REQUESTS = (
    RouteRequest(route="chat", model="m", workload_class="m:greedy", stream=True),
    RouteRequest(route="chat", model="m", workload_class="m:sampled", stream=True),
)


def build_pool(size: int, seed: int = 0) -> tuple[Pool, list[Lease]]:
    """`size` servers round the depth groups, each up to 60% full with leases of its own, and
    two classes' acceptance at every depth learned."""
    config = Config(
        backends=tuple(
            BackendConfig(url=f"http://127.0.0.1:{10000 + i}", name=f"b{i}") for i in range(size)
        )
    )
    pool = Pool(config, UpstreamClient(config.timeouts, config.client))
    for klass, alpha in (("m:greedy", 0.95), ("m:sampled", 0.6)):  # as learned from outcomes
        for k in DEPTHS:
            accept = expected_tokens(alpha, k)
            pool.telemetry.acceptance.observe(klass, steps=k, accept_length=accept, verifies=100)
        pool.telemetry.lengths.observe(klass, 300)
    rng = random.Random(seed)
    leases = []
    for i, backend in enumerate(pool.backends):
        steps = DEPTHS[i % len(DEPTHS)]
        info = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps,
                "max_running_requests": CAPACITY[steps], "served_model_name": "m"}  # fmt: skip
        backend.apply_server_info(info)
        for _ in range(config.health.success_threshold):
            backend.on_probe(True)
        pool.index.add(backend)
        leases += [pool.lease(backend) for _ in range(rng.randint(0, CAPACITY[steps] * 6 // 10))]
    return pool, leases


def best_of(repeat: int, calls: int, run: Callable[[int], None]) -> float:
    """CPU microseconds per call (this process's time: other work on the machine does not
    count), the fastest of `repeat` timed runs of `calls` calls each."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run(calls)
        times.append((time.process_time() - started) / calls)
    return 1e6 * min(times)


def measure(name: str, size: int, repeat: int) -> tuple[float, float, float]:
    """(choose, decision, tuple view) microseconds for policy `name` at `size` servers."""
    pool, leases = build_pool(size)
    policy = create(name)
    view = pool.routing_view("m")
    assert view is not None
    calls = 2000

    def choose(n: int) -> None:
        for i in range(n):
            policy.choose(REQUESTS[i & 1], view)

    held = deque(leases)

    def decide(n: int) -> None:
        for i in range(n):
            live = pool.routing_view("m")
            assert live is not None
            chosen = policy.choose(REQUESTS[i & 1], live)
            held.append(pool.lease(pool.by_name[chosen.backend]))
            held.popleft().release()

    flat = PoolView(
        backends=tuple(view.backends), classes=view.classes,
        in_flight_total=view.in_flight_total, capacity_total=view.capacity_total,
    )  # fmt: skip

    def by_tuple(n: int) -> None:
        for i in range(n):
            policy.choose(REQUESTS[i & 1], flat)

    tuple_calls = max(20, calls * 3 // max(3, size))
    return (
        best_of(repeat, calls, choose),
        best_of(repeat, calls, decide),
        best_of(repeat, tuple_calls, by_tuple),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 30, 300, 1000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", action="append", help="only these (default: every built-in)")
    args = parser.parse_args()
    names = args.policy or list(BUILTIN)
    rows = {name: [measure(name, size, args.repeat) for size in args.sizes] for name in names}
    sizes = args.sizes
    at = sizes.index(300) if 300 in sizes else len(sizes) - 1
    head = " | ".join(f"{s:,} servers" for s in sizes)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; CPU microseconds "
          "per decision: choose / decision / tuple view")  # fmt: skip
    print(f"| policy | {head} | decision, {sizes[at]:,} vs {sizes[0]} |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for name, cells in rows.items():
        text = " | ".join(f"{c:.1f} / {d:.1f} / {t:.0f}" for c, d, t in cells)
        print(f"| `{name}` | {text} | {cells[at][1] / cells[0][1]:.2f}x |")


if __name__ == "__main__":
    asyncio.run(main())

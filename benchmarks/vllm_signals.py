"""Per-class acceptance the proxy learns from emulated vLLM servers, from each signal vLLM
offers, against the truth (the server's own spec-decode counters over the run).

Signals: `request_metrics` (`--per-request-spec-decode-metrics summary`: each reply's
`metrics.speculative_decoding`, in streams on the usage chunk), `chunks` (tokens per stream
chunk, one chunk per engine step) and `scraped` (the counters' window accept length, for whole
replies without per-request metrics). One fresh server per (signal, class): the truth of a
class is then its server's counters.

    python benchmarks/vllm_signals.py            # prints the table
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from harness import Emulator, Proxy

from specroute.children import wait_ready
from specroute.prometheus import vllm_values

MODEL = "emulated/vllm-mtp"
CLASSES = {"greedy": 0.0, "sampled": 1.0}
SIGNALS = {
    # signal: (emulator flags, streamed)
    "request_metrics": (["--per-request-spec-decode-metrics", "summary"], True),
    "chunks": ([], True),
    "scraped": ([], False),
}
_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_accepted_tokens_total")


async def _counters(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    values = vllm_values((await client.get(url + "/metrics")).text, _COUNTERS) or {}
    return sum(values.get(_COUNTERS[0], ())), sum(values.get(_COUNTERS[1], ()))


async def _traffic(
    client: httpx.AsyncClient, url: str, args: argparse.Namespace, temperature: float, stream: bool
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "write"}],
        "max_tokens": args.max_tokens,
        "temperature": temperature,
        "stream": stream,
    }
    gate = asyncio.Semaphore(args.concurrency)

    async def one() -> None:
        async with gate, client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
            reply.raise_for_status()
            async for _ in reply.aiter_raw():
                pass

    async with asyncio.TaskGroup() as group:
        for _ in range(args.requests):
            group.create_task(one())


async def _depth_found(client: httpx.AsyncClient, proxy: Proxy, steps: int) -> None:
    """Until the pool knows the server's K (from its per-position counters); 30 s at most."""
    for _ in range(300):
        backends: list[dict[str, Any]] = (await proxy.pool(client))["backends"]  # type: ignore[assignment]
        if backends[0].get("steps") == steps:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the proxy never learned the server's depth")


async def measure(args: argparse.Namespace, signal: str, klass: str, work: Path) -> dict[str, Any]:
    """One server at K = `args.steps` behind the proxy, one class of traffic: learned vs truth."""
    flags, stream = SIGNALS[signal]
    common = ["--engine", "vllm", "--time-scale", str(args.time_scale), "--model-name", MODEL]
    server = Emulator(args.steps, [*common, "--decode-log-interval", "1", *flags], work)
    proxy = Proxy(work / f"{signal}-{klass}.toml", work / f"proxy-{signal}-{klass}.log")
    proxy.config.write_text(
        "[health]\ninterval_s = 0.2\nmetrics_interval_s = 0.3\n"
        f'[[backends]]\nurl = "{server.url}"\n'
    )
    server.start()
    try:
        assert server.process is not None
        await wait_ready(server.url + "/health", process=server.process, output=server.log)
        await proxy.start()
        async with httpx.AsyncClient(timeout=60) as client:
            await _depth_found(client, proxy, args.steps)
            before = await _counters(client, server.url)
            await _traffic(client, proxy.url, args, CLASSES[klass], stream)
            after = await _counters(client, server.url)
            estimates: dict[str, Any] = (await proxy.pool(client))["estimates"]  # type: ignore[assignment]
    finally:
        proxy.stop()
        server.stop()
    truth = 1 + (after[1] - before[1]) / (after[0] - before[0])
    learned = estimates["local_classes"][f"{MODEL}:{klass}"]["accept_length"][str(args.steps)]
    return {"signal": signal, "class": klass, "sources": estimates["acceptance_sources"],
            "learned": learned, "truth": truth, "error": learned / truth - 1}  # fmt: skip


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="vllm-signals-"))
    return [await measure(args, s, k, work) for s in SIGNALS for k in CLASSES]


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="K (num_speculative_tokens)")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--time-scale", type=float, default=50.0)
    args = parser.parse_args()
    rows = asyncio.run(main(args))
    print(f"{'signal':<16} {'class':<8} {'learned':>8} {'truth':>8} {'error':>7}  sources")
    worst = 0.0
    for r in rows:
        worst = max(worst, abs(r["error"]))
        print(f"{r['signal']:<16} {r['class']:<8} {r['learned']:>8.3f} {r['truth']:>8.3f} "
              f"{r['error']:>+7.1%}  {r['sources']}")  # fmt: skip
    print(f"worst error {worst:.1%} ({'within' if worst <= 0.05 else 'NOT within'} 5%)")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(cli())

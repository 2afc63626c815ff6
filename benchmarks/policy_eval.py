"""The policy evaluation of issue #4, over HTTP: emulated pools behind the real proxy, driven by
`specroute bench trace scenarios/policy-eval.toml`, one run per pool x policy x profile.

    .venv/bin/python benchmarks/policy_eval.py --time-scale 2 --duration-scale 0.25

Each run starts three emulators (`specroute.emulator.fleet`), a proxy (`specroute serve`) and
the trace as child processes; saves the trace JSON and the proxy's final GET /pool under
results/policy-eval-<stamp>/, then prints one table (phase by phase and whole trace: aggregate
tok/s, mean and p10 per-request tok/s) and writes it with the run's settings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from specroute.bench.stats import percentile
from specroute.children import free_port, spawn, stop_async, wait_ready
from specroute.emulator.fleet import emulated_fleet
from specroute.emulator.profiles import get_profile, sampling_class

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "policy-eval.toml"
HETERO = (1, 2, 3)
POLICIES = (
    "round_robin",
    "least_loaded",
    "threshold",
    "throughput:objective=throughput",
    "throughput:objective=latency",
    "throughput:objective=goodput,floor_tok_s={floor}",
    "bandit",
)


def runs(
    selected: set[str] | None, floor: float = 60.0
) -> list[tuple[str, tuple[int, ...], bool, str]]:
    """(pool label, depths, adaptive, policy) in the order they run: baselines first. The
    goodput floor is in wall-clock tok/s, so it scales with the emulators' time scale."""
    plan = [("hetero-1-2-3", HETERO, False, p.format(floor=floor)) for p in POLICIES]
    plan += [(f"homo-{k}", (k, k, k), False, "least_loaded") for k in (1, 2, 3)]
    plan += [("adaptive-3", (3, 3, 3), True, "least_loaded")]
    order = {"least_loaded": 0, "round_robin": 1, "threshold": 2}
    plan.sort(key=lambda r: (order.get(r[3], 3), r[3].startswith("bandit")))
    if selected:
        plan = [r for r in plan if f"{r[0]}/{r[3]}" in selected or r[3] in selected]
    return plan


def _config(path: Path, urls: list[str], policy: str, port: int) -> None:
    lines = [
        f"port = {port}",
        f'policy = "{policy}"',
        'log_level = "warning"',
        "[health]",
        "interval_s = 0.5",
        "metrics_interval_s = 1.0",
        "discovery_interval_s = 5.0",
    ]
    lines += [f'[[backends]]\nurl = "{u}"\nname = "b{i}"' for i, u in enumerate(urls)]
    path.write_text("\n".join(lines) + "\n")  # fmt: skip


async def one_run(
    out: Path, profile: str, run: tuple[str, tuple[int, ...], bool, str], args: argparse.Namespace
) -> dict[str, Any]:
    label, depths, adaptive, policy = run
    tag = f"{profile}__{label}__{policy.replace(':', '_').replace(',', '_').replace('=', '-')}"
    extra = ["--time-scale", str(args.time_scale)] + (
        ["--speculative-adaptive"] if adaptive else []
    )
    async with emulated_fleet(depths, profile=profile, extra_args=extra) as servers:
        port = free_port()
        config = out / f"{tag}.toml"
        _config(config, [s.url for s in servers], policy, port)
        proxy = spawn(
            [sys.executable, "-m", "specroute", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url + "/ready", process=proxy, poll_s=0.2, name="the proxy")
            await asyncio.sleep(1.5)  # discovery of every backend
            trace = out / f"{tag}.json"
            cmd = [sys.executable, "-m", "specroute", "bench", "trace", str(SCENARIO), url,
                   "--duration-scale", str(args.duration_scale), "--json", str(trace),
                   "--no-chunks", "--seed", str(args.seed)]  # fmt: skip
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            await proc.wait()
            async with httpx.AsyncClient(timeout=5.0) as client:
                pool = (await client.get(url + "/pool")).json()
                metrics = (await client.get(url + "/metrics")).text
            (out / f"{tag}.pool.json").write_text(json.dumps(pool, indent=1))
            (out / f"{tag}.metrics.txt").write_text(metrics)
        finally:
            await stop_async(proxy)
    row = summarize(json.loads(trace.read_text()))
    row.update(profile=profile, pool=label, policy=policy, tag=tag)
    return row


def _speeds(records: list[dict[str, Any]]) -> list[float]:
    out = []
    for r in records:
        first, end, tokens = r.get("first_token"), r.get("finished"), r.get("completion_tokens", 0)
        if r.get("error") is None and first is not None and tokens > 1 and end > first:
            out.append((tokens - 1) / (end - first))
    return out


def _p10(values: list[float]) -> float:
    return percentile(values, 10) if values else 0.0


def summarize(trace: dict[str, Any]) -> dict[str, Any]:
    phases = []
    tokens = wall = 0.0
    every: list[float] = []
    errors = 0
    for level in trace["levels"]:
        s = level["summary"]
        speeds = _speeds(level.get("records", []))
        every += speeds
        tokens += s["completion_tokens"]
        wall += s["wall_s"]
        errors += s["errors"]
        mean = statistics.fmean(speeds) if speeds else 0.0
        phases.append(
            {
                "phase": level["phase"],
                "agg": s["aggregate_tok_s"],
                "mean": mean,
                "p10": _p10(speeds),
            }
        )
    total = {"agg": tokens / wall if wall else 0.0,
             "mean": statistics.fmean(every) if every else 0.0, "p10": _p10(every)}  # fmt: skip
    return {"phases": phases, "total": total, "errors": errors}


def acceptance_check(out: Path) -> str:
    """Each run's learned accept length per class and depth against the emulator's truth."""
    lines = ["| run | class | depth | learned | emulator | error |", "|---|---|---|---|---|---|"]
    for path in sorted(out.glob("*.pool.json")):
        profile = get_profile(path.name.split("__")[0])
        classes = json.loads(path.read_text()).get("estimates", {}).get("classes", {})
        for name, est in sorted(classes.items()):
            emulated = sampling_class(0.0 if name.endswith(":greedy") else 0.8)
            for depth, learned in sorted(est["accept_length"].items()):
                truth = profile.expected_tokens(emulated, int(depth))
                lines.append(
                    f"| {path.name.removesuffix('.pool.json')} | {name.rsplit(':', 1)[1]} | "
                    f"{depth} | {learned:.3f} | {truth:.3f} | {learned / truth - 1:+.1%} |"
                )
    return "\n".join(lines)


def by_depth(out: Path) -> str:
    """Requests per class and depth under each policy, from the proxy's routed counter."""
    lines = ["| run | class | depth 1 | depth 2 | depth 3 |", "|---|---|---|---|---|"]
    for path in sorted(out.glob("*hetero*.metrics.txt")):
        counts: dict[str, dict[str, float]] = {}
        for line in path.read_text().splitlines():
            if line.startswith("specroute_routed_requests_total{"):
                labels, value = line.rsplit(" ", 1)
                klass = labels.split('workload_class="')[1].split('"')[0].rsplit(":", 1)[1]
                steps = labels.split('steps="')[1].split('"')[0]
                counts.setdefault(klass, {})[steps] = float(value)
        run = path.name.removesuffix(".metrics.txt")
        for klass, row in sorted(counts.items()):
            cells = " | ".join(f"{row.get(k, 0):.0f}" for k in ("1", "2", "3"))
            lines.append(f"| {run} | {klass} | {cells} |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    names = [p["phase"] for p in rows[0]["phases"]]
    head = "| profile | pool | policy | whole trace agg / mean / p10 | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (4 + len(names))]
    for r in rows:
        t = r["total"]
        cells = [f"{p['agg']:.0f} / {p['mean']:.0f} / {p['p10']:.0f}" for p in r["phases"]]
        lines.append(
            f"| {r['profile']} | {r['pool']} | {r['policy']} | "
            f"**{t['agg']:.0f}** / {t['mean']:.0f} / {t['p10']:.0f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", default=[])
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--duration-scale", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--floor", type=float, default=60.0, help="goodput floor, emulated tok/s")
    parser.add_argument("--only", action="append", default=[], help="pool/policy or policy")
    parser.add_argument("--out", help="results directory (default results/policy-eval-<stamp>)")
    parser.add_argument("--report", metavar="DIR", help="only print the checks of a saved run")
    args = parser.parse_args()
    if args.report:
        print(acceptance_check(Path(args.report)))
        print(by_depth(Path(args.report)))
        return
    profiles = args.profile or ["seed-qwen35-122b", "costly-drafts"]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or ROOT / "results" / f"policy-eval-{stamp}")
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  # once, before any run
    settings = {"scenario": str(SCENARIO.relative_to(ROOT)), "profiles": profiles,
                "time_scale": args.time_scale, "duration_scale": args.duration_scale,
                "seed": args.seed, "goodput_floor_emulated_tok_s": args.floor,
                "started_at": stamp}  # fmt: skip
    rows: list[dict[str, Any]] = []
    for run in runs(set(args.only) or None, floor=args.floor * args.time_scale):
        for profile in profiles:
            started = time.monotonic()
            row = await one_run(out, profile, run, args)
            rows.append(row)
            print(f"{row['tag']}: {row['total']['agg']:.0f} tok/s "
                  f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
            (out / "rows.json").write_text(json.dumps({"settings": settings, "rows": rows}))
    rows.sort(key=lambda r: (r["profile"], r["pool"] != "hetero-1-2-3", r["pool"], r["policy"]))
    text = table(rows)
    print(text)
    (out / "table.md").write_text(
        f"settings: {json.dumps(settings)}\n\nEach cell: aggregate tok/s / mean per-request tok/s"
        f" / p10 per-request tok/s (times are wall-clock with the emulators at time scale "
        f"{args.time_scale}).\n\n{text}\n"
    )


if __name__ == "__main__":
    asyncio.run(main())

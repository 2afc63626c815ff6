"""The policy evaluation of issue #4, over HTTP: emulated pools behind the real proxy, driven by
`specroute bench trace scenarios/policy-eval.toml`, one run per pool x policy x profile.

    .venv/bin/python benchmarks/policy_eval.py --time-scale 2 --duration-scale 0.2

Pools: three servers at one fixed depth (0 to 3) and three SGLang-adaptive servers (default
tiers; capped at 3 by `examples/adaptive-capped-3.json`), behind least_loaded, and the 1/2/3 mix
under every policy. Each run starts three emulators (`specroute.emulator.fleet`), a proxy
(`specroute serve`) and the trace as child processes, and saves the trace JSON and the proxy's
final GET /pool and /metrics under results/policy-eval-<stamp>/. It prints the table (phase by
phase and whole trace: aggregate tok/s, mean and p10 per-request tok/s) and every row's change
against its profile's best alternative, and writes both with the run's settings.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specroute.bench.stats import percentile
from specroute.children import free_port, spawn, stop_async, wait_ready
from specroute.emulator.fleet import emulated_fleet
from specroute.emulator.profiles import get_profile, sampling_class
from specroute.prometheus import read_samples

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "policy-eval.toml"
CAPPED = ROOT / "examples" / "adaptive-capped-3.json"
HETERO = "hetero-1-2-3"
BASELINE = "least_loaded"
POLICIES = (
    "round_robin",
    "least_loaded",
    "threshold",
    "throughput:objective=throughput",
    "throughput:objective=latency",
    "throughput:objective=goodput,floor_tok_s={floor}",
    "bandit",
)


@dataclass(frozen=True)
class Run:
    """One pool behind one policy: its depths and the flags every emulator of it gets."""

    pool: str
    depths: tuple[int, ...]
    policy: str
    flags: tuple[str, ...] = ()


def alternatives() -> list[Run]:
    """What an operator runs without specroute, behind least_loaded: three servers at one
    depth, or three SGLang-adaptive ones (default tiers, or capped at 3) started at depth 3."""
    adaptive = ("--speculative-adaptive",)
    pools = [Run(f"homo-{k}", (k, k, k), BASELINE) for k in (0, 1, 2, 3)]
    pools.append(Run("adaptive", (3, 3, 3), BASELINE, adaptive))
    capped = (*adaptive, "--speculative-adaptive-config", str(CAPPED))
    pools.append(Run("adaptive-capped-3", (3, 3, 3), BASELINE, capped))
    return pools


def runs(selected: set[str] | None, floor: float = 60.0) -> list[Run]:
    """Every run in the order they go: baselines first. The goodput floor is in wall-clock
    tok/s, so it scales with the emulators' time scale."""
    plan = [Run(HETERO, (1, 2, 3), p.format(floor=floor)) for p in POLICIES] + alternatives()
    order = {BASELINE: 0, "round_robin": 1, "threshold": 2}
    plan.sort(key=lambda r: (order.get(r.policy, 3), r.policy.startswith("bandit")))
    if selected:
        plan = [r for r in plan if f"{r.pool}/{r.policy}" in selected or r.policy in selected]
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


async def one_run(out: Path, profile: str, run: Run, args: argparse.Namespace) -> dict[str, Any]:
    policy = run.policy
    tag = f"{profile}__{run.pool}__{policy.replace(':', '_').replace(',', '_').replace('=', '-')}"
    extra = ["--time-scale", str(args.time_scale), *run.flags]
    async with emulated_fleet(run.depths, profile=profile, extra_args=extra) as servers:
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
    capacities = [b.get("capacity") for b in pool.get("backends", [])]
    row.update(profile=profile, pool=run.pool, policy=policy, tag=tag, capacity=capacities)
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
    for path in sorted(out.glob(f"*{HETERO}*.metrics.txt")):
        counts: dict[str, dict[str, float]] = {}
        for sample in read_samples(path.read_text()) or []:
            if sample.name == "specroute_routed_requests_total":
                klass = sample.labels["workload_class"].rsplit(":", 1)[1]
                row = counts.setdefault(klass, {})
                row[sample.labels["steps"]] = row.get(sample.labels["steps"], 0.0) + sample.value
        run = path.name.removesuffix(".metrics.txt")
        for klass, row in sorted(counts.items()):
            cells = " | ".join(f"{row.get(k, 0):.0f}" for k in ("1", "2", "3"))
            lines.append(f"| {run} | {klass} | {cells} |")
    return "\n".join(lines)


def _cells(m: dict[str, float]) -> str:
    return f"{m['agg']:.0f} / {m['mean']:.0f} / {m['p10']:.0f}"


def _capacity(row: dict[str, Any]) -> str:
    caps = row.get("capacity") or []
    return "/".join("?" if c is None else str(c) for c in caps) or "?"


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    names = [p["phase"] for p in rows[0]["phases"]]
    head = "| profile | pool | policy | capacity | whole trace agg / mean / p10 | "
    lines = [head + " | ".join(names) + " |", "|" + "---|" * (5 + len(names))]
    for r in rows:
        cells = " | ".join(_cells(p) for p in r["phases"])
        lines.append(
            f"| {r['profile']} | {r['pool']} | {r['policy']} | {_capacity(r)} | "
            f"**{r['total']['agg']:.0f}** / {r['total']['mean']:.0f} / "
            f"{r['total']['p10']:.0f} | {cells} |"
        )
    return "\n".join(lines)


def best_alternatives(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per profile, the pool without specroute (fixed depth or adaptive, behind least_loaded)
    with the highest whole-trace aggregate."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["pool"] != HETERO and r["policy"] == BASELINE:
            held = best.get(r["profile"])
            if held is None or r["total"]["agg"] > held["total"]["agg"]:
                best[r["profile"]] = r
    return best


def _change(new: float, old: float) -> str:
    return f"{new / old - 1:+.1%}" if old else "n/a"


def _against(r: dict[str, Any], base: dict[str, Any]) -> str:
    whole = " / ".join(_change(r["total"][k], base["total"][k]) for k in ("agg", "mean", "p10"))
    phases = " ".join(
        _change(p["agg"], b["agg"]) for p, b in zip(r["phases"], base["phases"], strict=True)
    )
    return f"{whole} | {phases}"


def changes(rows: list[dict[str, Any]]) -> str:
    """Every row against its profile's best alternative, and each hetero policy against
    least_loaded on the same pool: whole trace agg / mean / p10, then aggregate per phase."""
    best = best_alternatives(rows)
    baseline = {r["profile"]: r for r in rows if r["pool"] == HETERO and r["policy"] == BASELINE}
    head = "| profile | pool | policy | against | whole trace agg / mean / p10 | per phase agg |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        bases = [best.get(r["profile"])]
        if r["pool"] == HETERO and r["policy"] != BASELINE:
            bases.append(baseline.get(r["profile"]))
        for base in (b for b in bases if b is not None and b is not r):
            against = f"{base['pool']}/{base['policy']}"
            lines.append(
                f"| {r['profile']} | {r['pool']} | {r['policy']} | {against} | "
                f"{_against(r, base)} |"
            )
    return "\n".join(lines)


def _report(rows: list[dict[str, Any]]) -> str:
    rows = sorted(rows, key=lambda r: (r["profile"], r["pool"] != HETERO, r["pool"], r["policy"]))
    best = best_alternatives(rows)
    named = ", ".join(
        f"{p}: {r['pool']} ({r['total']['agg']:.0f} tok/s)" for p, r in sorted(best.items())
    )
    return f"{table(rows)}\n\nBest alternative per profile: {named}\n\n{changes(rows)}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", default=[])
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--duration-scale", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--floor", type=float, default=60.0, help="goodput floor, emulated tok/s")
    parser.add_argument("--only", action="append", default=[], help="pool/policy or policy")
    parser.add_argument("--out", help="results directory (default results/policy-eval-<stamp>)")
    parser.add_argument("--report", metavar="DIR", help="only print the tables of a saved run")
    return parser


async def main() -> None:
    args = _parser().parse_args()
    if args.report:
        saved = Path(args.report)
        print(_report(json.loads((saved / "rows.json").read_text())["rows"]))
        print(acceptance_check(saved))
        print(by_depth(saved))
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
            print(f"{row['tag']}: {row['total']['agg']:.0f} tok/s, capacity {_capacity(row)} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
            (out / "rows.json").write_text(json.dumps({"settings": settings, "rows": rows}))
    text = _report(rows)
    print(text)
    (out / "table.md").write_text(
        f"settings: {json.dumps(settings)}\n\nEach cell: aggregate tok/s / mean per-request tok/s"
        f" / p10 per-request tok/s (times are wall-clock with the emulators at time scale "
        f"{args.time_scale}).\n\n{text}\n"
    )


if __name__ == "__main__":
    asyncio.run(main())

"""Depth follows load over real HTTP: `specroute launch --emulate --reconfigure auto` (start-up
time on, time-scaled) replaying a trace with `specroute bench trace`, while /plan is watched.
Prints every restart as /plan and the launcher's log show it, the proxy's errors, and tok/s per
phase, with the load average beside them (the machine is shared: it bounds what the numbers say).

    .venv/bin/python benchmarks/live_reconfigure.py --out results/live-reconfigure

Everything listens on 127.0.0.1 and stops at the end (the launcher gets SIGINT).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from specroute.children import free_port, spawn, stop, wait_ready_sync

ROOT = Path(__file__).resolve().parent.parent


def _launch(args: argparse.Namespace, out: Path, port: int) -> subprocess.Popen[bytes]:
    scale, phase_s = args.time_scale, 3600 * args.duration_scale
    planner = {
        # The planner's clock is the wall's: its times shrink with the emulator's.
        "settle_s": 120 / scale,
        "window_s": max(8.0, 60 / scale),
        "confirm_s": 30 / scale,
        "regime_prior_s": phase_s,
    }
    argv = [sys.executable, "-m", "specroute", "launch", "--emulate", "--steps", args.steps]
    argv += ["--port", str(port), "--base-port", str(free_port()), "--log-dir", str(out / "logs")]
    argv += ["--policy", "throughput", "--reconfigure", "auto", "--drain", str(args.drain)]
    argv += [
        "--min-dwell",
        str(phase_s / 3),
        "--max-unavailable",
        "1",
        "--allowed-steps",
        "0,1,2,3",
    ]
    argv += [f"--emulator-arg=--time-scale={scale}", "--emulator-arg=--startup-s=profile"]
    argv += [f"--emulator-arg=--profile={args.profile}", "--admin-key", "live-admin"]
    argv += [f"--planner-option={k}={v:g}" for k, v in planner.items()]
    with (out / "launch.log").open("wb") as log:
        return spawn(argv, stdout=log, stderr=subprocess.STDOUT)


def _watch(url: str, bench: subprocess.Popen[bytes], out: Path) -> list[dict[str, Any]]:
    """/plan every 2 s while the bench runs, with the load average."""
    seen: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, timeout=10) as client, (out / "plans.jsonl").open("w") as f:
        while bench.poll() is None:
            try:
                plan = client.get("/plan").json()
            except httpx.HTTPError:
                plan = {}
            row = {
                "t": round(time.monotonic(), 1),
                "load": os.getloadavg()[0],
                "servers": plan.get("servers"),
                "verdict": (plan.get("plan") or {}).get("verdict"),
                "history": len(plan.get("history") or []),
            }
            seen.append(row)
            f.write(json.dumps(row) + "\n")
            time.sleep(2)
    return seen


def _proxy_errors(metrics: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("specroute_requests_total{") and 'status="200"' not in line:
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _logged_changes(out: Path) -> list[dict[str, Any]]:
    lines = []
    for line in (out / "launch.log").read_text(errors="replace").splitlines():
        if '"reconfigured"' in line or '"reconfigure_started"' in line:
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return lines


def _report(out: Path, url: str, watched: list[dict[str, Any]]) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=10) as client:
        plan = client.get("/plan").json()
        metrics = client.get("/metrics").text
    bench = json.loads((out / "trace.json").read_text())
    phases = [
        {"phase": lv["phase"], "users": lv["concurrency"], **{k: lv["summary"][k] for k in (
            "requests", "errors", "aggregate_tok_s", "per_request_tok_s")},
         "error_samples": lv["summary"]["error_samples"][:3]}
        for lv in bench["levels"]
    ]  # fmt: skip
    loads = [w["load"] for w in watched]
    logged = [c for c in _logged_changes(out) if c.get("event") == "reconfigured"]
    return {
        "history": plan.get("history"),
        "outcomes": plan.get("outcomes"),
        "logged_changes": [
            {k: c.get(k) for k in ("server", "before", "after", "outcome", "took_s")}
            for c in logged
        ],
        "proxy_errors": _proxy_errors(metrics),
        "phases": phases,
        "load_average": {
            "mean": sum(loads) / len(loads) if loads else None,
            "max": max(loads, default=None),
            "cores": os.cpu_count(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "depth-swing.toml"))
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--steps", default="1,2,3")
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--duration-scale", type=float, default=1 / 40)
    parser.add_argument("--drain", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "live-reconfigure")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launcher = _launch(args, out, port)
    try:
        wait_ready_sync(url + "/ready", process=launcher, within=300, poll_s=0.5, name="pool")
        bench_argv = [sys.executable, "-m", "specroute", "bench", "trace", args.scenario, url,
                      "--duration-scale", f"{args.duration_scale:g}", "--no-chunks",
                      "--json", str(out / "trace.json")]  # fmt: skip
        with (out / "bench.log").open("wb") as log:
            bench = spawn(bench_argv, stdout=log, stderr=subprocess.STDOUT)
        watched = _watch(url, bench, out)
        report = _report(out, url, watched)
    finally:
        stop(launcher, sig=signal.SIGINT, grace_s=60)
    report["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""`make vllm-check`: every vLLM command line `launch` and `tune` make (MTP, EAGLE and EAGLE3 at
several depth sets and tensor-parallel sizes, per-depth limits and extra flags, K-per-batch
tables at launch and on a restart) parsed and validated by vLLM itself (`launch.vllm_check`),
plus lines vLLM must refuse.

Lives under `tune` because it builds tune's plans too (tune may import launch, not the other
way). Needs the `vllm` package (deploy/vllm-check/), no GPU, no model download: parsing and
validating arguments reads no model.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Literal

from specroute.launch.argv import LaunchOptions, ProcessPlan, build_plan
from specroute.launch.depth_flags import server_at
from specroute.launch.vllm_argv import PER_REQUEST_SPEC_METRICS, vllm_ranges
from specroute.launch.vllm_check import VllmRejected, check_args
from specroute.planner import Setting
from specroute.tune.layout import TuneOptions, server_plans, traffic_kinds

__all__ = ["main"]

DEPTHS = ((0,), (1,), (1, 2, 3), (2, 4), (5,))
TP_SIZES = (1, 2, 8)
Algorithm = Literal["NEXTN", "EAGLE", "EAGLE3"]
_DRAFTS: dict[Algorithm, str | None] = {
    "NEXTN": None,
    "EAGLE": "/models/llama-eagle",
    "EAGLE3": "/models/llama-eagle3",
}
_TARGETS = {"NEXTN": "/models/deepseek-mtp", "EAGLE": "/models/llama", "EAGLE3": "/models/llama"}
TABLES = {3: ((1, 3), (9, 2)), 5: ((1, 5), (3, 3), (17, 1), (40, 0))}
"""K per batch size: at launch for the deepest server of a case, on restart for depth 5."""


def _options() -> Iterator[LaunchOptions]:
    for algorithm, draft in _DRAFTS.items():
        for steps in DEPTHS:
            for tp in TP_SIZES:
                yield LaunchOptions(
                    model=_TARGETS[algorithm], steps=steps, algorithm=algorithm, draft_model=draft,
                    tp=tp, gpus=tuple(range(len(steps) * tp)), engine="vllm",
                    max_running_by_depth={steps[-1]: 32},
                    vllm_args=("--gpu-memory-utilization=0.85",),
                    vllm_args_by_depth={steps[0]: ("--max-model-len", "8192")},
                    tables={k: TABLES[k] for k in steps if k in TABLES},
                )  # fmt: skip


def _plans() -> Iterator[tuple[str, ProcessPlan]]:
    """("launch"|"restart"|"tune", server plan) for every case."""
    traffic = traffic_kinds([0.0], max_tokens=64, top_p=1.0, ignore_eos=False)
    for options in _options():
        servers = build_plan(options).servers
        for server in servers:
            yield "launch", server
        yield "restart", server_at(options, servers[0], Setting(steps=5, table=TABLES[5]))
        tune = TuneOptions(launch=options, traffic=traffic)
        for planned in server_plans(tune):
            yield "tune", planned.process


def _check_one(plan: ProcessPlan) -> str | None:
    """None when vLLM accepts the line and reads back the depth and limit it says."""
    try:
        resolved = check_args(plan.argv)
    except VllmRejected as exc:
        return str(exc)
    argv = list(plan.argv)
    limit = int(argv[argv.index("--max-num-seqs") + 1])
    table = TABLES.get(plan.steps or 0) if "per_batch_size" in " ".join(argv) else None
    wanted = {
        "num_speculative_tokens": plan.steps or None,
        "max_num_seqs": limit,
        "per_request_spec_decode_metrics": PER_REQUEST_SPEC_METRICS if plan.steps else "none",
        "num_speculative_tokens_per_batch_size": (
            None if table is None else [tuple(r) for r in vllm_ranges(table, limit)]
        ),
    }
    wrong = {k: resolved.get(k) for k, v in wanted.items() if resolved.get(k) != v}
    return f"read differently: {wrong}" if wrong else None


def _expect_rejections() -> int:
    """Lines vLLM must refuse, so that a pass above means something; returns the failures."""
    serve = ["serve", "/models/llama", "--port", "30000"]
    bad_lines = {
        "a speculative config that is not JSON": [*serve, "--speculative-config", "{method: mtp"],
        "a non-integer --max-num-seqs": [*serve, "--max-num-seqs", "many"],
        "an unknown flag": [*serve, "--speculative-num-steps", "3"],
        "a K-per-batch table not from batch size 1": [
            *serve,
            "--speculative-config",
            '{"method": "mtp", "num_speculative_tokens": 3, '
            '"num_speculative_tokens_per_batch_size": [[2, 8, 3], [9, 64, 1]]}',
        ],
    }
    failures = 0
    for what, argv in bad_lines.items():
        try:
            check_args(argv)
        except VllmRejected as exc:
            print(f"{what}: rejected as expected, vLLM says: {str(exc).splitlines()[-1]}")
        else:
            print(f"{what}: ACCEPTED, but vLLM should refuse it")
            failures += 1
    return failures


def main() -> int:
    """Check every line; one line of output per server and a summary; non-zero if any failed."""
    started = time.monotonic()
    failures = checked = 0
    for source, plan in _plans():
        checked += 1
        problem = _check_one(plan)
        verdict = "ok" if problem is None else f"REJECTED: {problem}"
        tp = plan.argv[plan.argv.index("--tensor-parallel-size") + 1]
        print(f"{source:<7} {plan.argv[4]:<22} tp={tp} steps={plan.steps}  {verdict}", flush=True)
        failures += problem is not None
    failures += _expect_rejections()
    elapsed = time.monotonic() - started
    print(f"{checked - failures}/{checked} command lines accepted by vLLM ({elapsed:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

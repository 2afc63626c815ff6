"""Decode-step cost of the seed model's shapes on one GPU, random weights: verify and draft steps.

Builds a subset of Qwen3.5-122B-A10B's layers (no download, no network), captures each step in a
CUDA graph, times its replays with CUDA events after warm-up (median of repeats), and writes
every setting and timing as JSON and CSV. `benchmarks/gpu_fit.py` turns that into a profile.

    python3 benchmarks/gpu_step_cost.py --out benchmarks/results/h200-qwen35-122b
    .venv/bin/python benchmarks/gpu_step_cost.py --device cpu --shape tiny --out /tmp/step-cost
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import decode_attention
import torch
from gdn_recurrence import relative_error, triton, tune_block
from qwen35_model import (
    SHAPES,
    Batch,
    DecoderLayer,
    Ends,
    Kernels,
    MoE,
    MTPHead,
    Shape,
    attend,
    build_layers,
    expected_distinct,
    weight_bytes,
)
from step_timer import Timer, kernel_profile

VARIANTS = ("hybrid", "no_linear_attention")
"""hybrid: every layer as the model has it; no_linear_attention: Gated DeltaNet mixers left out."""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen35-122b")
    p.add_argument("--layers", type=int, default=8, help="layers built and timed (the subset)")
    p.add_argument("--batches", type=_ints, default=_ints("1,2,4,8,16,24,32,48,64"))
    p.add_argument("--depths", type=_ints, default=_ints("0,1,2,3,4"), help="draft steps k")
    p.add_argument("--contexts", type=_ints, default=_ints("512,4096,32768"))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--state-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--gdn-kernel", choices=("auto", "triton", "torch"), default="auto")
    p.add_argument(
        "--split-max-b",
        type=int,
        default=None,
        help="split-KV attention up to this batch (default: measured; CPU: none)",
    )
    p.add_argument("--no-graphs", action="store_true", help="time eagerly even on a GPU")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no point after this")
    p.add_argument("--out", type=Path, required=True, help="directory for result.json/.csv")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    return args


def environment(device: torch.device) -> dict[str, Any]:
    """Device name and software versions, as the result file records them."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "triton": getattr(triton, "__version__", None),
        "platform": platform.platform(), "device": str(device),
    }  # fmt: skip
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, multiprocessors=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}")  # fmt: skip
        try:
            query = [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.max.sm",
                "--format=csv,noheader",
            ]
            env["nvidia_smi"] = subprocess.run(
                query, capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            env["nvidia_smi"] = f"unavailable: {exc}"
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def transformers_config(shape: Shape) -> dict[str, Any] | str:
    """The shape through transformers' own config class, when it is there: the names must fit."""
    try:
        from transformers import Qwen3_5MoeTextConfig
    except ImportError as exc:
        return f"unavailable: {exc}"
    fields = {k: v for k, v in shape.as_dict().items() if k != "partial_rotary_factor"}
    try:
        config = Qwen3_5MoeTextConfig(**fields)
    except (TypeError, ValueError) as exc:
        return f"refused: {exc}"
    kept = {k: getattr(config, k, None) for k in fields}
    kept["layer_types"] = list(getattr(config, "layer_types", []) or [])
    return kept


class Model:
    """The timed parts: `count` target layers, the ends (embedding, LM head) and the MTP head."""

    def __init__(self, args: argparse.Namespace, device: torch.device, kernels: Kernels) -> None:
        self.shape: Shape = SHAPES[args.shape]
        self.device, self.dtype = device, torch.bfloat16
        cache_b, max_t = max(args.batches), max(args.depths) + 1
        cache_len = max(args.contexts) + max_t
        state_dtype = getattr(torch, args.state_dtype)
        self.layers: list[DecoderLayer] = build_layers(
            self.shape, args.layers, cache_b, cache_len, max_t, device, self.dtype, state_dtype,
            kernels,
        )  # fmt: skip
        self.ends = Ends(self.shape, device, self.dtype)
        self.mtp = MTPHead(self.shape, self.ends, cache_b, cache_len, device, self.dtype, kernels)
        self.linear = [not self.shape.is_full_attention(i) for i in range(args.layers)]

    def hidden(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.shape.hidden_size, device=self.device, dtype=self.dtype)

    def ids(self, n: int) -> torch.Tensor:
        return torch.randint(0, self.shape.vocab_size, (n,), device=self.device)

    def layers_step(
        self, batch: Batch, variant: str, count: int | None = None
    ) -> Callable[[], object]:
        """The first `count` timed layers (all by default) over `batch`."""
        x0 = self.hidden(batch.tokens)
        layers = self.layers[:count]
        keep = [variant == "hybrid" or not lin for lin in self.linear[: len(layers)]]

        def step() -> torch.Tensor:
            x = x0
            for layer, mixer in zip(layers, keep, strict=True):
                x = layer(x, batch, mixer=mixer)
            return x

        return step

    def ends_step(self, tokens: int) -> Callable[[], object]:
        ids = self.ids(tokens)
        return lambda: self.ends.logits_argmax(self.ends.embed[ids])

    def draft_step(self, batch: Batch) -> Callable[[], object]:
        ids, hidden = self.ids(batch.tokens), self.hidden(batch.tokens)
        return lambda: self.mtp(ids, hidden, batch)


def grid(args: argparse.Namespace) -> Iterator[tuple[str, str, Batch]]:
    """Every point, most needed first: ends, then per context hybrid verify, drafts, the rest."""
    seen = sorted({b * (k + 1) for b in args.batches for k in args.depths})
    for n in seen:
        yield "ends", "-", Batch(n, 1, 0)
    for ctx in args.contexts:
        for variant in args.variants:
            for b in args.batches:
                for k in args.depths:
                    yield "layers", variant, Batch(b, k + 1, ctx)
        for b in args.batches:
            yield "draft_step", "-", Batch(b, 1, ctx)
            for k in args.depths:
                if k > 0:
                    yield "draft_extend", "-", Batch(b, k + 1, ctx)


def checks(model: Model, kernel: str) -> dict[str, Any]:
    """Correctness and sanity before timing: the recurrence kernel, GQA, grouped GEMM, routing."""
    dev, s = model.device, model.shape
    out: dict[str, Any] = {"gdn_kernel": kernel}
    out["gdn_rel_error"] = relative_error(kernel, dev)
    q = torch.randn(2, 3, s.num_attention_heads, s.head_dim, device=dev, dtype=model.dtype)
    kv = torch.randn(2, s.num_key_value_heads, 50, s.head_dim, device=dev, dtype=model.dtype)
    rep = s.num_attention_heads // s.num_key_value_heads
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), kv.repeat_interleave(rep, 1).float(),
        kv.repeat_interleave(rep, 1).float(),
    ).transpose(1, 2)  # fmt: skip
    got = attend(q, kv, kv).float()
    out["gqa_rel_error"] = float((got - ref).norm() / ref.norm())
    moe: MoE = model.layers[0].moe
    x = model.hidden(37)
    weights, ids = moe.route(x)
    naive = torch.zeros_like(x, dtype=torch.float32)
    for slot in range(ids.shape[1]):
        up = torch.einsum("nh,noh->no", x.float(), moe.w13[ids[:, slot]].float())
        act = torch.nn.functional.silu(up[:, : moe.inter]) * up[:, moe.inter :]
        down = torch.einsum("ni,nhi->nh", act, moe.w2[ids[:, slot]].float())
        naive += weights[:, slot, None].float() * down
    sh = x.float() @ moe.shared13.float().T
    half = sh.shape[1] // 2
    naive += (torch.nn.functional.silu(sh[:, :half]) * sh[:, half:]) @ moe.shared2.float().T * (
        torch.sigmoid(x.float() @ moe.shared_gate.float().T))  # fmt: skip
    out["moe_rel_error"] = float((moe(x).float() - naive).norm() / naive.norm())
    out["distinct_experts"] = [
        {"tokens": n, "seen": moe.distinct_experts(model.hidden(n)),
         "expected_uniform": round(expected_distinct(s.num_experts, s.num_experts_per_tok, n), 1)}
        for n in (1, 8, 64, 320)
    ]  # fmt: skip
    return out


def layer_scaling(model: Model, args: argparse.Namespace, timer: Timer) -> list[dict[str, Any]]:
    """Time of all timed layers over the first half of them: 2.0 if cost scales by count."""
    half, ctx = len(model.layers) // 2, args.contexts[0]
    out = []
    for batch in (Batch(1, 1, ctx), Batch(max(args.batches), max(args.depths) + 1, ctx)):
        whole = timer.median_ms(model.layers_step(batch, "hybrid"))
        part = timer.median_ms(model.layers_step(batch, "hybrid", half))
        out.append({"b": batch.b, "t": batch.t, "ratio": round(whole / part, 3)})
    return out


def profiles(model: Model, args: argparse.Namespace, timer: Timer) -> list[dict[str, Any]]:
    """Kernel-level profiles of the hybrid layers at the smallest and largest verify batches."""
    ctx, most = args.contexts[0], max(args.batches)
    out = []
    for batch in (Batch(1, 1, ctx), Batch(most, 1, ctx), Batch(most, max(args.depths) + 1, ctx)):
        step = model.layers_step(batch, "hybrid")
        try:
            prof = kernel_profile(step, timer.median_ms(step))
        except RuntimeError as exc:  # no CUPTI on this machine: the timings still stand
            prof = {"error": str(exc)}
        out.append({"b": batch.b, "t": batch.t, "context": ctx, **prof})
    return out


def record(
    part: str, variant: str, batch: Batch, samples: list[float], graph: bool
) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "part": part, "variant": variant, "b": batch.b, "t": batch.t, "context": batch.context,
        "tokens": batch.tokens, "median_ms": round(statistics.median(samples), 5),
        "p10_ms": round(ordered[len(ordered) // 10], 5),
        "p90_ms": round(ordered[min(len(ordered) - 1, (9 * len(ordered)) // 10)], 5),
        "graph": graph, "samples_ms": [round(x, 5) for x in samples],
    }  # fmt: skip


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = result["timings"]
    with (out / "result.csv").open("w", newline="") as fh:
        fields = [k for k in (rows[0] if rows else {}) if k != "samples_ms"]
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def measure(model: Model, args: argparse.Namespace, timer: Timer, result: dict[str, Any]) -> None:
    """Time every grid point until the budget runs out, writing the file after each context."""
    began = time.monotonic()
    deadline = began + args.budget_s
    last_ctx = None
    for part, variant, batch in grid(args):
        if time.monotonic() > deadline:
            result["stopped_early"] = f"budget of {args.budget_s} s spent before {part} {batch}"
            break
        if batch.context != last_ctx:
            write(args.out, result)
            last_ctx = batch.context
        if part == "layers":
            step = model.layers_step(batch, variant)
        elif part == "ends":
            step = model.ends_step(batch.tokens)
        else:
            step = model.draft_step(batch)
        samples, graph = timer(step)
        row = record(part, variant, batch, samples, graph)
        result["timings"].append(row)
        where = f"b={batch.b} t={batch.t} ctx={batch.context}"
        print(f"{part} {variant} {where}: {row['median_ms']} ms", flush=True)
        del step
    result["elapsed_s"] = round(time.monotonic() - began, 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, write `result.json` and `result.csv` under `--out`, print a short table."""
    with torch.inference_mode():
        return _run(argv)


def _run(argv: list[str] | None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    timer = Timer(device, args.warmup, args.repeats, graphs=not args.no_graphs)
    kernels, choices = choose_kernels(args, device, timer)
    model = Model(args, device, kernels)
    words = sys.argv[1:] if argv is None else argv
    result: dict[str, Any] = {
        "command": " ".join(["python3", "benchmarks/gpu_step_cost.py", *words]),
        "environment": environment(device),
        "settings": settings(args, model, kernels, timer),
        "checks": {
            **checks(model, kernels.gdn),
            **choices,
            "layer_scaling": layer_scaling(model, args, timer),
        },
        "kernel_profile": profiles(model, args, timer) if device.type == "cuda" else [],
        "timings": [],
    }
    measure(model, args, timer, result)
    write(args.out, result)
    print(summary(result))
    return result


def choose_kernels(
    args: argparse.Namespace, device: torch.device, timer: Timer
) -> tuple[Kernels, dict[str, Any]]:
    """The fastest correct kernels on this device: GDN tiling, split-KV or SDPA attention."""
    s, gpu = SHAPES[args.shape], device.type == "cuda" and triton is not None
    gdn = args.gdn_kernel if args.gdn_kernel != "auto" else ("triton" if gpu else "torch")
    split_max_b, block, report = args.split_max_b or 0, (32, 4), {}
    if gdn == "triton":
        dims = (s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim)
        block, report["gdn_block_ms"] = tune_block(
            *dims, s.linear_value_head_dim, device, timer.median_ms
        )
    if args.split_max_b is None and gpu:
        heads = (s.num_attention_heads, s.num_key_value_heads, s.head_dim)
        depths = sorted({1, max(args.depths) + 1})
        split_max_b, report["attention"] = decode_attention.choose(
            *heads, args.batches, depths, max(args.contexts), device, timer.median_ms
        )
    return Kernels(split_max_b=split_max_b, gdn=gdn, gdn_block=block), report


def settings(
    args: argparse.Namespace, model: Model, kernels: Kernels, timer: Timer
) -> dict[str, Any]:
    """Every setting of the run, and what the timed subset stands for."""
    shape = model.shape
    return {
        "shape": args.shape, "config": shape.as_dict(),
        "transformers_config": transformers_config(shape),
        "layers_timed": args.layers, "linear_attention_layers_timed": sum(model.linear),
        "layer_scale": shape.num_hidden_layers / args.layers,
        "batches": args.batches, "depths": args.depths, "contexts": args.contexts,
        "variants": args.variants, "warmup": args.warmup, "repeats": args.repeats,
        "dtype": "bfloat16", "state_dtype": args.state_dtype,
        "kernels": {
            "experts": "torch._grouped_mm", "graphs": timer.graphs,
            "attention": "decode_attention.split_attention (Triton, split KV) for b <= "
            f"{kernels.split_max_b}, F.scaled_dot_product_attention above",
            "linear_attention": f"gdn_recurrence:{kernels.gdn}",
            "gdn_block": kernels.gdn_block,
        },
        "weight_bytes": weight_bytes(shape),
    }  # fmt: skip


def summary(result: dict[str, Any]) -> str:
    """A short table of the hybrid verify layers at the first context, ms per timed layer set."""
    rows = [r for r in result["timings"] if r["part"] == "layers" and r["variant"] == "hybrid"]
    if not rows:
        return "no layer timings"
    ctx = rows[0]["context"]
    depths = sorted({r["t"] - 1 for r in rows})
    lines = [f"checks: {json.dumps(result['checks'])}", f"layers (ms, context {ctx}):",
             "b    " + " ".join(f"k={k:<7}" for k in depths)]  # fmt: skip
    for b in sorted({r["b"] for r in rows}):
        cells = {r["t"] - 1: r["median_ms"] for r in rows if r["b"] == b and r["context"] == ctx}
        lines.append(f"{b:<4} " + " ".join(f"{cells.get(k, float('nan')):<9.3f}" for k in depths))
    return "\n".join(lines)


if __name__ == "__main__":
    main()

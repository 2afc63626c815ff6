"""`make sglang-check`: the launcher's plans for NEXTN, EAGLE and EAGLE3 at several depths and
tensor-parallel sizes, each server's command line parsed and resolved by SGLang itself.

Needs the `sglang` package (see the Makefile's separate environment), no GPU and no download:
the models are small local directories holding only a `config.json`, made here.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from specroute.launch.argv import LaunchOptions, build_plan
from specroute.launch.sglang_check import SglangRejected, check_args

__all__ = ["main", "write_models"]

DEPTHS = ((1,), (1, 2, 3), (2, 4), (5,))
TP_SIZES = (1, 2, 4, 8)

_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}
# A DeepSeek-V3-shaped model with one built-in MTP layer: what NEXTN speculates with.
_DEEPSEEK = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_nextn_predict_layers": 1,
    "kv_lora_rank": 128,
    "q_lora_rank": 256,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}
_MODELS = {
    "deepseek-mtp": _DEEPSEEK,
    "llama": _LLAMA,
    "llama-eagle": {**_LLAMA, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1},
    "llama-eagle3": {
        **_LLAMA,
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": 32000,
    },
}


def write_models(root: Path) -> dict[str, Path]:
    """Model directories with a config.json each (no weights: resolving needs none)."""
    paths = {}
    for name, config in _MODELS.items():
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1))
        paths[name] = path
    return paths


def _cases(models: dict[str, Path]) -> Iterator[LaunchOptions]:
    for algorithm in ("NEXTN", "EAGLE", "EAGLE3"):
        target = models["deepseek-mtp" if algorithm == "NEXTN" else "llama"]
        draft = {"NEXTN": None, "EAGLE": "llama-eagle", "EAGLE3": "llama-eagle3"}[algorithm]
        for steps in DEPTHS:
            for tp in TP_SIZES:
                yield LaunchOptions(
                    model=str(target),
                    steps=steps,
                    algorithm=algorithm,
                    draft_model=None if draft is None else str(models[draft]),
                    tp=tp,
                    gpus=tuple(range(len(steps) * tp)),
                )


def _check_one(argv: tuple[str, ...], steps: int | None) -> str | None:
    """None when SGLang accepts the line and resolves the depth we asked for."""
    try:
        resolved = check_args(argv)
    except SglangRejected as exc:
        return str(exc)
    wanted = {"speculative_num_steps": steps, "speculative_eagle_topk": 1}
    wanted["speculative_num_draft_tokens"] = None if steps is None else steps + 1
    wrong = {k: resolved.get(k) for k, v in wanted.items() if resolved.get(k) != v}
    return f"resolved differently: {wrong}" if wrong else None


def _expect_rejections(models: dict[str, Path]) -> int:
    """Lines SGLang must refuse, so a pass above means something; returns the failures."""
    model = str(models["llama"])
    bad_lines = {
        "a non-integer TP size": ["--model-path", model, "--tp-size", "zero"],
        "steps without topk and draft tokens": [
            "--model-path", model, "--speculative-algorithm", "EAGLE",
            "--speculative-draft-model-path", str(models["llama-eagle"]),
            "--speculative-num-steps", "2",
        ],
    }  # fmt: skip
    failures = 0
    for what, argv in bad_lines.items():
        try:
            check_args(argv)
        except SglangRejected as exc:
            print(f"{what}: rejected as expected, SGLang says: {exc}")
        else:
            print(f"{what}: ACCEPTED, but SGLang should refuse it")
            failures += 1
    return failures


def main() -> int:
    """Check every case; print one line per server and a summary; non-zero if any failed."""
    started = time.monotonic()
    failures = checked = 0
    with tempfile.TemporaryDirectory(prefix="sglang-check-") as tmp:
        models = write_models(Path(tmp))
        for options in _cases(models):
            for server in build_plan(options).servers:
                checked += 1
                problem = _check_one(server.argv, server.steps)
                verdict = "ok" if problem is None else f"REJECTED: {problem}"
                label = f"{options.algorithm:<6} tp={options.tp} steps={server.steps}"
                print(f"{label:<24} {verdict}", flush=True)
                failures += problem is not None
        failures += _expect_rejections(models)
    elapsed = time.monotonic() - started
    print(f"{checked - failures}/{checked} command lines accepted by SGLang ({elapsed:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

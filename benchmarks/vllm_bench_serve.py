"""vLLM's own benchmark client, `vllm bench serve` (vLLM 0.33, from `make vllm-check`'s
environment), through the proxy in front of emulated vLLM servers, its accept length beside
`specroute bench`'s on the same pool and the servers' own counters (the truth).

`vllm bench serve` measures acceptance from `{base_url}/metrics` before and after its run
(vllm/benchmarks/serve.py, `fetch_spec_decode_metrics`): the proxy's `/metrics` relays the vLLM
backends' spec-decode counters (`specroute/proxy/vllm_counters.py`). Its tokenizer is a tiny
word-level one built here (no download): the random dataset only needs one to make prompts.

    make vllm-bench-serve
    python benchmarks/vllm_bench_serve.py --vllm-venv .venv-vllm --steps 1,3 --num-prompts 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from harness import Emulator, Proxy

from specroute.children import wait_ready
from specroute.prometheus import vllm_values

MODEL = "emulated/vllm-mtp"
TOLERANCE = 0.05
"""The issue's bar: vLLM's accept length within 5% of specroute bench's."""
_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": 3 + i for i in range(4000)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                        eos_token="</s>", model_max_length=1 << 20).save_pretrained(sys.argv[1])
"""
_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_accepted_tokens_total")


def make_tokenizer(python: Path, where: Path) -> Path:
    """A word-level tokenizer directory (`tokenizers` and `transformers` of vLLM's env)."""
    subprocess.run([str(python), "-c", _TOKENIZER, str(where)], check=True)
    return where


async def counters(servers: list[Emulator]) -> list[tuple[float, float]]:
    """(drafts, accepted tokens) of each server, summed over its series."""
    found = []
    async with httpx.AsyncClient(timeout=10) as client:
        for server in servers:
            text = (await client.get(server.url + "/metrics")).text
            values = vllm_values(text, _COUNTERS) or {}
            found.append((sum(values.get(_COUNTERS[0], ())), sum(values.get(_COUNTERS[1], ()))))
    return found


async def truth(servers: list[Emulator], before: list[tuple[float, float]]) -> float | None:
    """1 + accepted / drafts over every server since `before`: what the servers accepted."""
    after = await counters(servers)
    drafts = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    accepted = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return 1 + accepted / drafts if drafts > 0 else None


async def run(argv: list[str], log: Path) -> None:
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
        if await process.wait() != 0:
            raise SystemExit(f"{argv[0]} failed; see {log}")


def _config(servers: list[Emulator]) -> str:
    text = "[health]\ninterval_s = 0.5\nmetrics_interval_s = 0.5\n"
    return text + "".join(f'[[backends]]\nurl = "{s.url}"\n' for s in servers)


async def main(args: argparse.Namespace, venv: Path, work: Path, tokenizer: Path) -> dict[str, Any]:
    common = ["--engine", "vllm", "--time-scale", str(args.time_scale), "--model-name", MODEL]
    servers = [Emulator(k, [*common, "--seed", str(i)], work) for i, k in enumerate(args.steps)]
    proxy = Proxy(work / "proxy.toml", work / "proxy.log")
    proxy.config.write_text(_config(servers))
    try:
        for server in servers:
            server.start()
        for server in servers:
            assert server.process is not None
            await wait_ready(server.url + "/health", process=server.process, output=server.log)
        await proxy.start()
        result: dict[str, Any] = {"steps": args.steps, "work": str(work)}
        before = await counters(servers)
        vllm_argv = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm",
                     "--base-url", proxy.url, "--model", MODEL, "--tokenizer", str(tokenizer),
                     "--dataset-name", "random", "--random-input-len", "64",
                     "--random-output-len", str(args.output_len), "--ignore-eos",
                     "--num-prompts", str(args.num_prompts), "--max-concurrency",
                     str(args.concurrency), "--temperature", "1.0", "--save-result",
                     "--result-dir", str(work), "--result-filename", "vllm.json"]  # fmt: skip
        await run(vllm_argv, work / "vllm-bench.log")
        vllm = json.loads((work / "vllm.json").read_text())
        result["vllm_bench_serve"] = {
            "completed": vllm["completed"],
            "failed": vllm.get("failed", 0),
            "acceptance_length": vllm.get("spec_decode_acceptance_length"),
            "per_position": vllm.get("spec_decode_per_position_acceptance_rates"),
        }
        result["truth_vllm_run"] = await truth(servers, before)
        before = await counters(servers)
        bench_argv = [sys.executable, "-m", "specroute", "bench", "sweep", f"pool={proxy.url}",
                      "-c", str(args.concurrency), "-n", str(args.num_prompts), "--api",
                      "completions", "--temperature", "1.0", "--max-tokens",
                      str(args.output_len), "--prompt-words", "64", "--json",
                      str(work / "specroute.json")]  # fmt: skip
        await run(bench_argv, work / "specroute-bench.log")
        (level,) = json.loads((work / "specroute.json").read_text())["levels"]
        result["specroute_bench"] = {
            "succeeded": level["summary"]["succeeded"],
            "accept": level["summary"]["accept"],
        }
        result["truth_specroute_run"] = await truth(servers, before)
        return result
    finally:
        proxy.stop()
        for server in servers:
            server.stop()


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report(result: dict[str, Any]) -> bool:
    """Print the comparison; True when vLLM's figure is within 5% of specroute bench's."""
    vllm, ours = result["vllm_bench_serve"], result["specroute_bench"]
    theirs = vllm["acceptance_length"]
    accept = ours["accept"]
    reference = accept.get("metrics") or accept.get("chunks")
    print(
        f"pool: emulated vLLM servers at K = {result['steps']} behind the proxy ({result['work']})"
    )
    print(
        f"vllm bench serve : {vllm['completed']} completed, {vllm['failed']} failed, "
        f"acceptance length {_num(theirs)} (servers' truth {_num(result['truth_vllm_run'])})"
    )
    counted, chunks = accept.get("metrics"), accept.get("chunks")
    print(
        f"specroute bench  : {ours['succeeded']} succeeded, accept length "
        f"{_num(counted)} (counters), {_num(chunks)} (tokens per chunk) "
        f"(servers' truth {_num(result['truth_specroute_run'])})"
    )
    if theirs is None or reference is None:
        print("FAIL: an accept length is missing")
        return False
    gap = abs(theirs - reference) / reference
    ok = bool(gap <= TOLERANCE and vllm["failed"] == 0)
    print(f"{'OK' if ok else 'FAIL'}: vLLM's accept length is {gap:.1%} from specroute bench's")
    return ok


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-venv", default=".venv-vllm", help="make vllm-check's environment")
    parser.add_argument(
        "--steps",
        type=lambda s: [int(k) for k in s.split(",")],
        default=[1, 3],
        help="one emulated vLLM server per K (num_speculative_tokens)",
    )
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--time-scale", type=float, default=10.0, help="emulated seconds per wall second"
    )
    parser.add_argument("--json", default=None, help="write the result here too")  # fmt: skip
    args = parser.parse_args()
    if not (Path(args.vllm_venv) / "bin" / "vllm").exists():
        print(f"no vLLM at {args.vllm_venv}/bin/vllm: run `make vllm-check` first")
        return 2
    venv = Path(args.vllm_venv).resolve()
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-serve-"))
    tokenizer = make_tokenizer(venv / "bin" / "python", work / "tokenizer")
    result = asyncio.run(main(args, venv, work, tokenizer))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if report(result) else 1


if __name__ == "__main__":
    sys.exit(cli())

"""Decode attention split along the KV cache (flash-decoding), as SGLang's decode kernels do.

PyTorch's flash kernel gives each (request, KV head) one program per 128 query rows: with one
request and two KV heads, two programs read a 32k-token cache, far under the memory bandwidth.
Here a Triton kernel splits the cache into chunks over enough programs to fill the GPU, and a
log-sum-exp merge combines the chunks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: attention goes through PyTorch's SDPA
    triton = None

TARGET_PROGRAMS = 264
"""Two programs per SM of an H100/H200 (132 SMs)."""

if triton is not None:

    @triton.jit
    def _chunk_kernel(
        q, k, v, o_part, lse_part, length, rows, chunk, scale,
        sqb, sqh, skb, skh, skl, svb, svh, svl,
        NKV: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # type: ignore[no-untyped-def]  # fmt: skip
        i_r, i_s, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        i_b = i_bh // NKV
        i_h = i_bh % NKV
        splits = tl.num_programs(1)
        offs_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, D)
        mask_r = offs_r < rows
        q_ptr = q + i_b.to(tl.int64) * sqb + i_h * sqh + offs_r[:, None] * D + offs_d[None, :]
        qt = tl.load(q_ptr, mask=mask_r[:, None], other=0.0)
        k_base = k + i_b.to(tl.int64) * skb + i_h.to(tl.int64) * skh
        v_base = v + i_b.to(tl.int64) * svb + i_h.to(tl.int64) * svh
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        lsum = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, D], tl.float32)
        start = i_s * chunk
        end = tl.minimum(start + chunk, length)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            kt = tl.load(
                k_base + offs_n[:, None] * skl + offs_d[None, :], mask=mask_n[:, None], other=0.0
            )
            qk = tl.dot(qt, tl.trans(kt)) * scale
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            m_new = tl.maximum(m, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m - m_new)
            vt = tl.load(
                v_base + offs_n[:, None] * svl + offs_d[None, :], mask=mask_n[:, None], other=0.0
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            lsum = lsum * alpha + tl.sum(p, 1)
            m = m_new
        part = (i_bh.to(tl.int64) * splits + i_s) * rows + offs_r
        tl.store(
            o_part + part[:, None] * D + offs_d[None, :], acc / lsum[:, None], mask=mask_r[:, None]
        )
        tl.store(lse_part + part, m + tl.log(lsum), mask=mask_r)


def plan_splits(programs: int, length: int, block_n: int) -> tuple[int, int]:
    """(splits, chunk) so that `programs` x splits fills the GPU and no chunk is empty."""
    want = max(1, min(math.ceil(TARGET_PROGRAMS / programs), math.ceil(length / block_n)))
    chunk = math.ceil(math.ceil(length / want) / block_n) * block_n
    return math.ceil(length / chunk), chunk


def split_attention(
    rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, block_r: int = 16,
    block_n: int = 64, num_warps: int = 4,
) -> torch.Tensor:  # fmt: skip
    """softmax(q k^T / sqrt(d)) v without a mask. `rows` [b, kv, r, d] contiguous; `keys`,
    `values` [b, kv, len, d] with a contiguous last dimension (a view of a longer cache)."""
    assert triton is not None, "Triton is not installed"
    b, nkv, r, d = rows.shape
    length = keys.shape[2]
    row_blocks = math.ceil(r / block_r)
    splits, chunk = plan_splits(b * nkv * row_blocks, length, block_n)
    o_part = torch.empty(b * nkv * splits * r, d, device=rows.device, dtype=torch.float32)
    lse = torch.empty(b * nkv * splits * r, device=rows.device, dtype=torch.float32)
    _chunk_kernel[(row_blocks, splits, b * nkv)](
        rows, keys, values, o_part, lse, length, r, chunk, d**-0.5,
        rows.stride(0), rows.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        NKV=nkv, D=d, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=num_warps,
    )  # fmt: skip
    weights = torch.softmax(lse.view(b, nkv, splits, r), dim=2).unsqueeze(-1)
    out = (o_part.view(b, nkv, splits, r, d) * weights).sum(dim=2)
    return out.to(rows.dtype)


def sdpa(rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(rows, keys, values)


def choose(
    heads: int, kv_heads: int, dim: int, batches: list[int], depths: list[int], length: int,
    device: torch.device, time_ms: Callable[[Callable[[], object]], float],
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """The largest batch up to which "split" is right (bf16 against float64) and faster than
    PyTorch's SDPA at every depth and every smaller batch (0: never), with every timing."""
    report: dict[str, Any] = {}
    split_max_b = 0
    for b in sorted(batches):
        wins = []
        for t in depths:
            rows = torch.randn(b, kv_heads, heads // kv_heads * t, dim, device=device).bfloat16()
            keys = torch.randn(b, kv_heads, length + 8, dim, device=device).bfloat16()[
                :, :, :length
            ]
            values = torch.randn_like(keys)
            kv_bytes = 2 * keys.numel() * keys.element_size()
            ref = sdpa(rows[:1].double(), keys[:1].double(), values[:1].double())
            ms = {}
            for name, fn in (("sdpa", sdpa), ("split", split_attention)):
                err = float((fn(rows, keys, values)[:1].double() - ref).norm() / ref.norm())
                ms[name] = time_ms(functools.partial(fn, rows, keys, values))
                report[f"{name}_b{b}_t{t}_len{length}"] = {
                    "rel_error": round(err, 5), "ms": round(ms[name], 4),
                    "kv_read_gbps": round(kv_bytes / ms[name] / 1e6, 1),
                }  # fmt: skip
            right = report[f"split_b{b}_t{t}_len{length}"]["rel_error"] < 2e-2
            wins.append(right and ms["split"] < ms["sdpa"])
        if not all(wins):
            break
        split_max_b = b
    return split_max_b, report

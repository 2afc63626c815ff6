"""The gated delta rule over a few new tokens per request: a fused Triton kernel and its reference.

The kernel keeps each (request, head, value block) state tile in registers across the `t` tokens,
reads the state once and writes it once (or once per token into a scratch buffer in a verify
step), as SGLang's fused recurrent kernel does. The PyTorch reference runs everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: the reference alone
    triton = None


def gdn_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, scratch: torch.Tensor | None, *, scale: float,
) -> torch.Tensor:  # fmt: skip
    """Token-by-token delta rule. q, k [n, hk, dk]; v [n, hv, dv]; g, beta [n, hv] (n = b*t);
    state [b, hv, dk, dv], updated in place, or left as it is when `scratch` [b, t, hv, dk, dv]
    takes every position's state. Returns o [n, hv, dv] in v's dtype."""
    b, hv = state.shape[0], state.shape[1]
    t = q.shape[0] // b
    rep = hv // q.shape[1]
    qf = q.float().view(b, t, -1, q.shape[-1]).repeat_interleave(rep, dim=2) * scale
    kf = k.float().view(b, t, -1, k.shape[-1]).repeat_interleave(rep, dim=2)
    vf, gf, bf = v.float().view(b, t, hv, -1), g.float().view(b, t, hv), beta.float().view(b, t, hv)
    s = state.float()
    out = []
    for i in range(t):
        s = s * gf[:, i].exp()[..., None, None]
        kv = torch.einsum("bhk,bhkv->bhv", kf[:, i], s)
        delta = (vf[:, i] - kv) * bf[:, i][..., None]
        s = s + kf[:, i][..., None] * delta[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", qf[:, i], s))
        if scratch is not None:
            scratch[:, i] = s.to(scratch.dtype)
    if scratch is None:
        state.copy_(s.to(state.dtype))
    return torch.stack(out, dim=1).reshape(b * t, hv, -1).to(v.dtype)


if triton is not None:

    @triton.jit
    def _gdn_kernel(
        q, k, v, g, beta, o, state, scratch, t, scale,
        HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
        BV: tl.constexpr, SCRATCH: tl.constexpr,
    ):  # type: ignore[no-untyped-def]  # fmt: skip
        i_v, i_bh = tl.program_id(0), tl.program_id(1)
        i_b = i_bh // HV
        i_h = i_bh % HV
        i_hk = i_h // (HV // HK)
        ok = tl.arange(0, DK)
        ov = i_v * BV + tl.arange(0, BV)
        tile = ok[:, None] * DV + ov[None, :]
        s_ptr = state + i_bh.to(tl.int64) * DK * DV + tile
        s = tl.load(s_ptr).to(tl.float32)
        for i in range(t):
            n = i_b.to(tl.int64) * t + i
            kt = tl.load(k + (n * HK + i_hk) * DK + ok).to(tl.float32)
            qt = tl.load(q + (n * HK + i_hk) * DK + ok).to(tl.float32) * scale
            vt = tl.load(v + (n * HV + i_h) * DV + ov).to(tl.float32)
            gt = tl.load(g + n * HV + i_h).to(tl.float32)
            bt = tl.load(beta + n * HV + i_h).to(tl.float32)
            s = s * tl.exp(gt)
            delta = (vt - tl.sum(s * kt[:, None], 0)) * bt
            s = s + kt[:, None] * delta[None, :]
            ot = tl.sum(s * qt[:, None], 0)
            tl.store(o + (n * HV + i_h) * DV + ov, ot.to(o.dtype.element_ty))
            if SCRATCH:
                dst = scratch + (n * HV + i_h) * DK * DV + tile
                tl.store(dst, s.to(scratch.dtype.element_ty))
        if not SCRATCH:
            tl.store(s_ptr, s.to(state.dtype.element_ty))


def gdn_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, scratch: torch.Tensor | None, *, scale: float,
    block: tuple[int, int] = (32, 4),
) -> torch.Tensor:  # fmt: skip
    """The fused kernel; the same contract as `gdn_reference` (state and scratch contiguous).
    `block`: value columns per program and warps per program."""
    assert triton is not None, "Triton is not installed"
    b, hv, dk, dv = state.shape
    t = q.shape[0] // b
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty_like(v)
    block_v, warps = min(block[0], dv), block[1]
    grid = (dv // block_v, b * hv)
    _gdn_kernel[grid](
        q, k, v, g, beta, o, state, scratch if scratch is not None else state, t, scale,
        HK=q.shape[1], HV=hv, DK=dk, DV=dv, BV=block_v, SCRATCH=scratch is not None,
        num_warps=warps,
    )  # fmt: skip
    return o


def gdn_recurrence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, scratch: torch.Tensor | None, *, scale: float, kernel: str,
    block: tuple[int, int] = (32, 4),
) -> torch.Tensor:  # fmt: skip
    """Dispatch to `kernel`: "triton" (the fused kernel, tiled by `block`) or "torch"."""
    if kernel == "triton":
        return gdn_triton(q, k, v, g, beta, state, scratch, scale=scale, block=block)
    return gdn_reference(q, k, v, g, beta, state, scratch, scale=scale)


BLOCKS = ((8, 1), (16, 1), (16, 2), (32, 2), (32, 4), (64, 4), (128, 8))
"""Tilings tried: FLA's (SGLang's) is 8 value columns on one warp."""


def tune_block(
    hk: int, hv: int, dk: int, dv: int, device: torch.device,
    time_ms: Callable[[Callable[[], object]], float], b: int = 64, t: int = 5,
) -> tuple[tuple[int, int], dict[str, float]]:  # fmt: skip
    """The fastest tiling for a verify step of `b` requests x `t` tokens, and every timing."""
    n = b * t
    q = torch.nn.functional.normalize(torch.randn(n, hk, dk, device=device), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(n, hk, dk, device=device), dim=-1).bfloat16()
    v = torch.randn(n, hv, dv, device=device).bfloat16()
    g, beta = -torch.rand(n, hv, device=device), torch.rand(n, hv, device=device)
    state = torch.randn(b, hv, dk, dv, device=device) * 0.1
    scratch = torch.empty(b, t, hv, dk, dv, device=device)
    times = {}
    for block in BLOCKS:
        if block[0] > dv:
            continue
        run = functools.partial(
            gdn_triton, q, k, v, g, beta, state, scratch, scale=0.1, block=block
        )
        times[f"{block[0]}x{block[1]}"] = round(time_ms(run), 4)
    best = min(times, key=times.__getitem__)
    cols, warps = best.split("x")
    return (int(cols), int(warps)), times


def relative_error(kernel: str, device: torch.device, b: int = 3, t: int = 4) -> float:
    """|kernel - float64 reference| / |reference| on fresh random inputs, outputs and states."""
    hk, hv, dk, dv = 4, 8, 64, 64
    n = b * t
    gen = torch.Generator(device="cpu").manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    q = torch.nn.functional.normalize(rand(n, hk, dk), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(rand(n, hk, dk), dim=-1).bfloat16()
    v, g = rand(n, hv, dv).bfloat16(), -rand(n, hv).abs() * 0.3
    beta = torch.sigmoid(rand(n, hv))
    state = rand(b, hv, dk, dv) * 0.1
    errors = []
    for with_scratch in (False, True):
        ref_state = state.double().clone()
        ref_scratch = torch.zeros(b, t, hv, dk, dv, device=device, dtype=torch.float64)
        got_state = state.clone()
        got_scratch = torch.full((b, t, hv, dk, dv), float("nan"), device=device)
        args = (q.double(), k.double(), v.double(), g.double(), beta.double())
        ref = gdn_reference(*args, ref_state, ref_scratch if with_scratch else None, scale=0.125)
        got = gdn_recurrence(
            q, k, v, g, beta, got_state, got_scratch if with_scratch else None, scale=0.125,
            kernel=kernel,
        )  # fmt: skip
        pairs = [(got.double(), ref.double())]
        pairs.append(
            (got_scratch.double(), ref_scratch) if with_scratch else (got_state.double(), ref_state)
        )
        for a, r in pairs:
            errors.append(float((a - r).norm() / r.norm()))
    return max(errors)

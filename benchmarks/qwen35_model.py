"""The seed model's decode-time layers, Qwen3.5-122B-A10B's shapes with random weights.

Gated DeltaNet and gated full-attention mixers, the routed-plus-shared MoE, the LM head and the
MTP draft head, laid out as SGLang runs a verify or a draft step. Only shapes and bytes matter.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from decode_attention import sdpa, split_attention
from gdn_recurrence import gdn_recurrence


@dataclass(frozen=True)
class Shape:
    """A Qwen3.5-MoE text model's sizes (the names of its `config.json` where they exist)."""

    hidden_size: int = 3072
    num_hidden_layers: int = 48
    full_attention_interval: int = 4
    num_attention_heads: int = 32
    num_key_value_heads: int = 2
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 64
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 1024
    shared_expert_intermediate_size: int = 1024
    vocab_size: int = 248320
    mtp_num_hidden_layers: int = 1

    def is_full_attention(self, layer: int) -> bool:
        """Layer `layer` (0-based) has full attention: every `full_attention_interval`-th."""
        return (layer + 1) % self.full_attention_interval == 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


QWEN35_122B = Shape()
"""Qwen/Qwen3.5-122B-A10B's text model: 48 layers (36 Gated DeltaNet, 12 full attention)."""

TINY = Shape(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, vocab_size=512,
)  # fmt: skip
"""A few-kilobyte stand-in with the same structure, for the CPU path and its test."""

SHAPES = {"qwen35-122b": QWEN35_122B, "tiny": TINY}


@dataclass(frozen=True)
class Batch:
    """One step's geometry: `b` requests, `t` new tokens each, `context` cached tokens each."""

    b: int
    t: int
    context: int

    @property
    def tokens(self) -> int:
        return self.b * self.t


@dataclass(frozen=True)
class Kernels:
    """Which implementation runs each mixer: attention split along the KV cache (Triton) for
    batches up to `split_max_b` and PyTorch's SDPA above; the Gated DeltaNet recurrence "torch"
    (reference) or "triton" (fused), tiled by `gdn_block`."""

    split_max_b: int = 0
    gdn: str = "torch"
    gdn_block: tuple[int, int] = (32, 4)


def _weight(*shape: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Random weights scaled by fan-in, so activations stay of order one through the layers."""
    return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, shape[-1] ** -0.5)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension (PyTorch's fused kernel where it has one)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _norm_weight(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Qwen3.5 scales by (1 + w) with w zero at init: the effective weight is ones."""
    return torch.ones(n, device=device, dtype=dtype)


class MoE:
    """256 routed experts (top-8, renormalised) and one gated shared expert, one grouped GEMM."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype) -> None:
        h, e, i, si = (
            s.hidden_size,
            s.num_experts,
            s.moe_intermediate_size,
            s.shared_expert_intermediate_size,
        )
        self.top_k, self.inter = s.num_experts_per_tok, i
        self.router = _weight(e, h, device=device, dtype=dtype)
        self.w13 = _weight(e, 2 * i, h, device=device, dtype=dtype)  # [E, out, in]
        self.w2 = _weight(e, h, i, device=device, dtype=dtype)
        self.shared13 = _weight(2 * si, h, device=device, dtype=dtype)
        self.shared2 = _weight(h, si, device=device, dtype=dtype)
        self.shared_gate = _weight(1, h, device=device, dtype=dtype)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax((x @ self.router.T).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        return (weights / weights.sum(-1, keepdim=True)).to(x.dtype), ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        # Group sizes without a host sync (bincount would read the max back), for graph capture.
        counts = torch.zeros(self.w13.shape[0], dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)
        rows = order // self.top_k
        up = torch._grouped_mm(x[rows], self.w13.transpose(-2, -1), offs=offs)
        act = F.silu(up[:, : self.inter]) * up[:, self.inter :]
        down = torch._grouped_mm(act, self.w2.transpose(-2, -1), offs=offs)
        down = down * weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(x).index_add_(0, rows, down)
        sh = x @ self.shared13.T
        sh = (F.silu(sh[:, : sh.shape[1] // 2]) * sh[:, sh.shape[1] // 2 :]) @ self.shared2.T
        return out + sh * torch.sigmoid(x @ self.shared_gate.T)

    def distinct_experts(self, x: torch.Tensor) -> int:
        """How many experts `x`'s tokens read (a check that random routing spreads)."""
        return int(torch.unique(self.route(x)[1]).numel())


class FullAttention:
    """Gated GQA attention (32 query heads on 2 KV heads of 256) over a per-request KV cache."""

    def __init__(
        self, s: Shape, cache_b: int, cache_len: int, device: torch.device, dtype: torch.dtype,
        kernels: Kernels,
    ) -> None:  # fmt: skip
        h, nq, nkv, d = s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim
        self.nq, self.nkv, self.d = nq, nkv, d
        self.split_max_b = kernels.split_max_b
        self.rot = int(d * s.partial_rotary_factor)
        self.wq = _weight(2 * nq * d, h, device=device, dtype=dtype)  # query and output gate
        self.wk = _weight(nkv * d, h, device=device, dtype=dtype)
        self.wv = _weight(nkv * d, h, device=device, dtype=dtype)
        self.wo = _weight(h, nq * d, device=device, dtype=dtype)
        self.q_norm = _norm_weight(d, device, dtype)
        self.k_norm = _norm_weight(d, device, dtype)
        shape = (cache_b, nkv, cache_len, d)
        self.k_cache = torch.randn(shape, device=device, dtype=dtype)
        self.v_cache = torch.randn(shape, device=device, dtype=dtype)
        half = self.rot // 2
        inv = 1e7 ** (-torch.arange(0, half, device=device, dtype=torch.float32) / half)
        angles = torch.arange(cache_len, device=device, dtype=torch.float32)[:, None] * inv
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def _rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Partial rotary embedding on the first `rot` dims, from the precomputed tables."""
        t, half = x.shape[-3], self.rot // 2
        cos, sin = self.cos[start : start + t, None, :], self.sin[start : start + t, None, :]
        x1, x2, rest = x[..., :half], x[..., half : self.rot], x[..., self.rot :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    def __call__(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        b, t, ctx = batch.b, batch.t, batch.context
        qg = (x @ self.wq.T).view(b, t, self.nq, 2 * self.d)
        q, gate = qg[..., : self.d], qg[..., self.d :]
        q = self._rope(rms_norm(q, self.q_norm), ctx)
        k = self._rope(rms_norm((x @ self.wk.T).view(b, t, self.nkv, self.d), self.k_norm), ctx)
        v = (x @ self.wv.T).view(b, t, self.nkv, self.d)
        self.k_cache[:b, :, ctx : ctx + t] = k.transpose(1, 2)
        self.v_cache[:b, :, ctx : ctx + t] = v.transpose(1, 2)
        keys = self.k_cache[:b, :, : ctx + t]
        values = self.v_cache[:b, :, : ctx + t]
        o = attend(q, keys, values, split=b <= self.split_max_b)
        o = o.reshape(b * t, self.nq * self.d) * torch.sigmoid(gate.reshape(b * t, -1))
        return o @ self.wo.T


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, split: bool = False
) -> torch.Tensor:
    """GQA as plain attention: each KV head's query heads stacked as rows, one kernel call.

    `q` [b, t, heads, d]; `keys`/`values` [b, kv_heads, len, d]. The causal mask among the `t`
    new tokens is left out: it changes no byte read and at most t*t of len*t products.
    """
    b, t, nq, d = q.shape
    nkv = keys.shape[1]
    rows = q.view(b, t, nkv, nq // nkv, d).permute(0, 2, 3, 1, 4).reshape(b, nkv, -1, d)
    o = split_attention(rows, keys, values) if split else sdpa(rows, keys, values)
    return o.view(b, nkv, nq // nkv, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, nq, d)


class GatedDeltaNet:
    """Qwen3.5's linear-attention mixer: projections, causal conv, delta-rule recurrence, gate.

    In a verify step (`t` > 1) every position's state goes to a scratch buffer and the accepted
    one is copied back afterwards, as SGLang does for hybrid models under speculation.
    """

    def __init__(
        self, s: Shape, cache_b: int, max_t: int, device: torch.device, dtype: torch.dtype,
        state_dtype: torch.dtype, kernels: Kernels,
    ) -> None:  # fmt: skip
        h = s.hidden_size
        self.kernel, self.block = kernels.gdn, kernels.gdn_block
        self.hk, self.hv = s.linear_num_key_heads, s.linear_num_value_heads
        self.dk, self.dv = s.linear_key_head_dim, s.linear_value_head_dim
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        width = s.linear_conv_kernel_dim
        self.w_qkv = _weight(self.conv_dim, h, device=device, dtype=dtype)
        self.w_z = _weight(self.hv * self.dv, h, device=device, dtype=dtype)
        self.w_b = _weight(self.hv, h, device=device, dtype=dtype)
        self.w_a = _weight(self.hv, h, device=device, dtype=dtype)
        self.conv = _weight(self.conv_dim, width, device=device, dtype=dtype)
        self.a_log = torch.zeros(self.hv, device=device, dtype=torch.float32)
        self.dt_bias = torch.ones(self.hv, device=device, dtype=torch.float32)
        self.norm = _norm_weight(self.dv, device, dtype)
        self.wo = _weight(h, self.hv * self.dv, device=device, dtype=dtype)
        self.conv_state = torch.zeros(cache_b, self.conv_dim, width - 1, device=device, dtype=dtype)
        state = (cache_b, self.hv, self.dk, self.dv)
        self.state = torch.zeros(state, device=device, dtype=state_dtype)
        self.scratch = torch.zeros(cache_b * max_t * math.prod(state[1:]), device=device,
                                   dtype=state_dtype)  # fmt: skip
        # Which draft position each request accepted: fixed, any value moves the same bytes.
        self.accepted = torch.randint(0, max_t, (cache_b,), device=device)

    def _conv(self, qkv: torch.Tensor, b: int, t: int) -> torch.Tensor:
        window = torch.cat([self.conv_state[:b], qkv.view(b, t, -1).transpose(1, 2)], dim=-1)
        out = (window.unfold(-1, self.conv.shape[1], 1) * self.conv[:, None, :]).sum(-1)
        self.conv_state[:b] = window[..., -(self.conv.shape[1] - 1) :]
        return F.silu(out).transpose(1, 2).reshape(b * t, -1)

    def __call__(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        b, t, n = batch.b, batch.t, batch.tokens
        mixed = self._conv(x @ self.w_qkv.T, b, t)
        q, k, v = torch.split(mixed, [self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], -1)
        q = F.normalize(q.reshape(n, self.hk, self.dk).float(), dim=-1).to(x.dtype)
        k = F.normalize(k.reshape(n, self.hk, self.dk).float(), dim=-1).to(x.dtype)
        beta = torch.sigmoid((x @ self.w_b.T).float())
        g = -self.a_log.exp() * F.softplus((x @ self.w_a.T).float() + self.dt_bias)
        per_token = self.hv * self.dk * self.dv
        scratch = self.scratch[: b * t * per_token].view(b, t, self.hv, self.dk, self.dv)
        scratch = scratch if t > 1 else None
        o = gdn_recurrence(
            q, k, v.reshape(n, self.hv, self.dv), g, beta, self.state[:b], scratch,
            scale=self.dk**-0.5, kernel=self.kernel, block=self.block,
        )  # fmt: skip
        if scratch is not None:
            pick = self.accepted[:b] % t
            self.state[:b] = scratch[torch.arange(b, device=x.device), pick]
        z = (x @ self.w_z.T).view(n, self.hv, self.dv)
        o = rms_norm(o, self.norm) * F.silu(z)
        return o.reshape(n, -1) @ self.wo.T


class DecoderLayer:
    """Pre-norm residual block: a token mixer (or none, to leave it out), then the MoE."""

    def __init__(self, mixer: FullAttention | GatedDeltaNet, moe: MoE, hidden: int) -> None:
        self.mixer, self.moe = mixer, moe
        dev, dt = moe.router.device, moe.router.dtype
        self.norm1 = _norm_weight(hidden, dev, dt)
        self.norm2 = _norm_weight(hidden, dev, dt)

    def __call__(self, x: torch.Tensor, batch: Batch, mixer: bool = True) -> torch.Tensor:
        if mixer:
            x = x + self.mixer(rms_norm(x, self.norm1), batch)
        return x + self.moe(rms_norm(x, self.norm2))


class Ends:
    """Embedding, final norm and LM head (shared by the target and its MTP head)."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype) -> None:
        self.embed = _weight(s.vocab_size, s.hidden_size, device=device, dtype=dtype)
        self.lm_head = _weight(s.vocab_size, s.hidden_size, device=device, dtype=dtype)
        self.norm = _norm_weight(s.hidden_size, device, dtype)

    def logits_argmax(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(rms_norm(x, self.norm) @ self.lm_head.T, dim=-1)


class MTPHead:
    """Qwen3.5's one-layer MTP draft head: fc over [embedding; hidden], a full-attention layer."""

    def __init__(
        self, s: Shape, ends: Ends, cache_b: int, cache_len: int, device: torch.device,
        dtype: torch.dtype, kernels: Kernels,
    ) -> None:  # fmt: skip
        h = s.hidden_size
        self.ends = ends
        self.fc = _weight(h, 2 * h, device=device, dtype=dtype)
        self.norm_e = _norm_weight(h, device, dtype)
        self.norm_h = _norm_weight(h, device, dtype)
        attn = FullAttention(s, cache_b, cache_len, device, dtype, kernels)
        self.layer = DecoderLayer(attn, MoE(s, device, dtype), h)

    def __call__(self, ids: torch.Tensor, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """One draft forward over `batch`; logits for each request's last token only."""
        e = rms_norm(self.ends.embed[ids], self.norm_e)
        x = torch.cat([e, rms_norm(hidden, self.norm_h)], dim=-1) @ self.fc.T
        x = self.layer(x, batch)
        last = x.view(batch.b, batch.t, -1)[:, -1]
        return self.ends.logits_argmax(last)


def build_layers(
    s: Shape, count: int, cache_b: int, cache_len: int, max_t: int, device: torch.device,
    dtype: torch.dtype, state_dtype: torch.dtype, kernels: Kernels,
) -> list[DecoderLayer]:  # fmt: skip
    """The first `count` layers of the stack, with the model's own hybrid pattern."""
    layers = []
    for i in range(count):
        mixer: FullAttention | GatedDeltaNet
        if s.is_full_attention(i):
            mixer = FullAttention(s, cache_b, cache_len, device, dtype, kernels)
        else:
            mixer = GatedDeltaNet(s, cache_b, max_t, device, dtype, state_dtype, kernels)
        layers.append(DecoderLayer(mixer, MoE(s, device, dtype), s.hidden_size))
    return layers


def expected_distinct(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts `tokens` independent uniform top-k routings read, on average."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def weight_bytes(s: Shape, dtype_bytes: int = 2) -> dict[str, float]:
    """Weight bytes of the parts (one expert, one layer's mixers, the LM head), for rooflines."""
    h = s.hidden_size
    kd = s.linear_num_key_heads * s.linear_key_head_dim
    vd = s.linear_num_value_heads * s.linear_value_head_dim
    parts = {
        "expert": 3 * h * s.moe_intermediate_size,
        "shared_expert": 3 * h * s.shared_expert_intermediate_size + h,
        "router": s.num_experts * h,
        "linear_attention": (2 * kd + 3 * vd + 2 * s.linear_num_value_heads) * h,
        "full_attention": (3 * s.num_attention_heads + 2 * s.num_key_value_heads) * s.head_dim * h,
        "lm_head": s.vocab_size * h,
    }
    return {name: float(n * dtype_bytes) for name, n in parts.items()}

"""Token-local pieces of the K31 reference model in plain torch (docs/model.md): norms, RoPE, the
quantisation points (FP8 latent tiles, MXFP8 indexer, bf16 rounding), AttnRes, the MoE.

Activations are fp32 (any float dtype works for the norms and AttnRes: the fp64 tests use them);
`lin` multiplies in the weight's dtype, so bf16 weights give bf16 matmuls with fp32 results.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
_COMPILED: dict = {}


def maybe_compiled(fn, on: bool):
    """fn, or its torch.compile'd version (dynamic shapes; one per function, shared by all models)
    when `on`: the model's Python loops (layers, chunks, query blocks, experts) stay eager and the
    tensor pieces between them are compiled."""
    if not on:
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


def lin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T in w's dtype, returned in x's dtype."""
    if x.dtype == w.dtype:
        return F.linear(x, w)
    return F.linear(x.to(w.dtype), w).to(x.dtype)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.to(x.dtype)


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps) * w.to(x.dtype) + b.to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last axis (KDA's q/k normalisation)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


# ---------------------------------------------------------------- RoPE (NeoX half split, 64 dims)

def rope_tables(positions: torch.Tensor, theta: float, half: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin fp32 [..., half] of absolute positions: angles in fp64 (pos * theta^(-2i/64) loses
    ~1e-3 rad in fp32 at 32K tokens), rounded to fp32 once."""
    i = torch.arange(half, dtype=torch.float64, device=positions.device)
    ang = positions.to(torch.float64)[..., None] * theta ** (-2.0 * i / (2 * half))
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first 2*half dims of the last axis (pairs i, i + half); cos/sin [T, half]
    broadcast over the axes between the token axis and the last one."""
    half = cos.shape[-1]
    shape = cos.shape[:1] + (1,) * (x.dim() - 2) + (half,)
    c, s = cos.reshape(shape).to(x.dtype), sin.reshape(shape).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], dim=-1)


def hadamard(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix (symmetric), n a power of two."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(device=device, dtype=dtype)


# ---------------------------------------------------------------- quantisation points

def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to bfloat16 (nearest even), back in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def _e4m3(y: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to E4M3 (nearest even, saturating at +-448)."""
    return y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def fp8_tile_qdq(x: torch.Tensor, tile: int = 128, eps: float = 1e-4) -> torch.Tensor:
    """The FP8 latent cache round trip (ops.quant fp8_tile, DeepGEMM recipe): per tile of `tile`
    along the last axis s = fp32(max(amax, eps) / 448), r = fp32(1 / s), codes = E4M3(x * r),
    value = fp32(code * s). fp32 result."""
    x = x.float()
    xt = x.reshape(x.shape[:-1] + (x.shape[-1] // tile, tile))
    s = xt.abs().amax(-1, keepdim=True).clamp_min(eps) / E4M3_MAX
    r = 1.0 / s
    return (_e4m3(xt * r) * s).reshape(x.shape)


def mxfp8_qdq(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """The MXFP8 round trip of the indexer (RCEIL): per group of 32, e = the smallest integer with
    amax <= 448 * 2^e (clamped to [-127, 127]; amax == 0 -> -127), codes = E4M3(x * 2^-e),
    value = code * 2^e (exact). fp32 result."""
    x = x.float()
    xg = x.reshape(x.shape[:-1] + (x.shape[-1] // group, group))
    amax = xg.abs().amax(-1, keepdim=True)
    m, e2 = torch.frexp(amax)                        # amax = m 2^e2, m in [0.5, 1); 448 = 0.875 2^9
    e = e2 - 9 + (m > 0.875).to(e2.dtype)
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127).float()
    return (_e4m3(xg * torch.exp2(-e)) * torch.exp2(e)).reshape(x.shape)


# ---------------------------------------------------------------- AttnRes

def attnres(sources: list[torch.Tensor], query: torch.Tensor, norm: torch.Tensor, eps: float) -> torch.Tensor:
    """h = sum_i softmax_i(z_i) v_i, z_i = (query * norm) . v_i / sqrt(mean(v_i^2) + eps), per token."""
    if len(sources) == 1:
        return sources[0]
    v = torch.stack(sources)                                        # [n, T, d]
    q = (query * norm).to(v.dtype)
    z = (v @ q) * torch.rsqrt(v.pow(2).mean(-1) + eps)              # [n, T]
    a = torch.softmax(z, dim=0)
    return (a[..., None] * v).sum(0)


# ---------------------------------------------------------------- MoE

def swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """(silu(x @ G^T) * (x @ U^T)) @ down^T, gate_up = [G; U] rows [2F, d]."""
    g, u = lin(x, gate_up).chunk(2, dim=-1)
    return lin(F.silu(g) * u, down)


def route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k], weights [T, k]): softmax over experts in fp32, the k largest (ties to
    the lower expert index: a stable descending sort), renormalised."""
    p = torch.softmax(lin(x, router).float(), dim=-1)
    p_sorted, ids = torch.sort(p, dim=-1, descending=True, stable=True)
    top = p_sorted[:, :top_k]
    return ids[:, :top_k], top / top.sum(-1, keepdim=True)


def moe(x: torch.Tensor, w: dict, prefix: str, top_k: int, compile: bool = False) -> torch.Tensor:
    """Routed experts (tokens grouped by expert; only selected experts run) + the shared expert."""
    expert = maybe_compiled(swiglu, compile)
    ids, wgt = maybe_compiled(route, compile)(x, w[prefix + "router"], top_k)
    out = expert(x, w[prefix + "shared_gate_up"], w[prefix + "shared_down"])
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w[prefix + "router"].shape[0]).tolist()   # one host sync
    tok = order // top_k
    gates = wgt.reshape(-1)[order].to(x.dtype)
    start = 0
    gate_up, down = w[prefix + "gate_up"], w[prefix + "down"]
    for e, n in enumerate(counts):
        if n:
            t = tok[start:start + n]
            out.index_add_(0, t, expert(x[t], gate_up[e], down[e]) * gates[start:start + n, None])
        start += n
    return out


# ---------------------------------------------------------------- KDA helpers

def causal_conv(full: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv, kernel 4: full [..., 3 + n, C] = (the 3 earlier inputs, this
    segment's n inputs) -> y [..., n, C], y[t, c] = sum_j w[c, j] full[t + j, c]."""
    win = full.unfold(-2, w.shape[1], 1)                            # [..., n, C, 4]
    return (win * w.to(full.dtype)).sum(-1)


def kda_gate(raw: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, kind: str, lb: float) -> torch.Tensor:
    """Natural-log decay [..., HV, K] from the raw gate [..., HV, K]; a_log [HV], dt_bias [HV, K]."""
    z = raw + dt_bias.to(raw.dtype)
    scale = torch.exp(a_log.to(raw.dtype))[:, None]
    if kind == "lower_bound":
        return lb * torch.sigmoid(scale * z)
    return -scale * F.softplus(z)

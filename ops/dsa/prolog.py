"""DSA indexer prolog: three independent chains from one layer's inputs (research/dsa.md §1.2).

  q chain   q = qr @ wq_b^T -> [T, H, 128]; RoPE on dims [0, 64) (NeoX half-split); orthonormal
            Hadamard over the 128 dims; MXFP8 -> q_codes [T, H, 128], q_scales [T, H, 4]
  k chain   k = LayerNorm(x @ wk^T) (weight, bias, eps); RoPE; Hadamard; MXFP8; written into the
            paged indexer cache at slot_mapping (layout: ops/dsa/indexer.py)
  w chain   head weights = (x @ weights_proj^T) * H^-1/2, fp32 [T, H]

Each chain is one fused kernel: the projection accumulates three column blocks (rope halves
[0, 32), [32, 64) and the rest [64, 128)) so that RoPE pairs meet lane by lane, then the Hadamard
rotation is three k.dots against row blocks of the orthonormal Sylvester matrix, and the MXFP8
groups use quant.mxfp8_groups (RCEIL). Everything after the bf16 projection is fp32.
RoPE tables: cos/sin fp32 [T, 32] (per token, already gathered at its position); the caller
builds them (YaRN or plain) — NeoX pairs (i, i + 32) share frequency i.

`indexer_prolog` runs the chains as a graph of three independent calls; on Triton with CUDA
each gets its own stream (events join them), elsewhere they run in order.
"""
from __future__ import annotations

import math

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, cache_slots, require_same_device, require_target_device, require_tensor, \
    resolve_target
from k31dsl.ops.dsa.indexer import GROUPS, HEAD_DIM, PAGE, _check_cache, store_keys
from k31dsl.ops.quant import mxfp8_groups

ROPE_HALF = 32


# ---------------------------------------------------------------- shared pieces (@k.func)

@k.func
def dot_mixed(a, b, AT, WT):
    """a @ b; activations and weights of different dtypes meet in f32 (a dot takes one dtype)."""
    if AT is WT:
        return k.dot(a, b)
    return k.dot(a.to(k.f32), b.to(k.f32))


@k.func
def project3(a, w, r0, row0, BM, BK, AT, WT):
    """a[r0:r0+BM, :] @ w[row0:row0+128, :]^T as three f32 column blocks [BM,32], [BM,32], [BM,64]."""
    p1 = k.zeros((BM, 32), k.f32)
    p2 = k.zeros((BM, 32), k.f32)
    p3 = k.zeros((BM, 64), k.f32)
    for kk in range(k.cdiv(a.shape[1], BK)):
        at = a[k.span(r0, BM), k.span(kk * BK, BK, other=0.0)]
        p1 += dot_mixed(at, w[k.span(row0, 32), k.span(kk * BK, BK, other=0.0)].T, AT, WT)
        p2 += dot_mixed(at, w[k.span(row0 + 32, 32), k.span(kk * BK, BK, other=0.0)].T, AT, WT)
        p3 += dot_mixed(at, w[k.span(row0 + 64, 64), k.span(kk * BK, BK, other=0.0)].T, AT, WT)
    return p1, p2, p3


@k.func
def sign_dot(x, had, row0, n):
    """x [BM, n] fp32 @ sign(had[row0:row0+n, :]) [n, 128] on bf16 tensor cores, as exact as an
    fp32 dot: x = hi + mid + lo exactly (three bf16 parts, 8 significant bits each), the +-1
    signs are exact in bf16, the MMA accumulates in fp32. (fp32 "ieee" dots run on FMA units
    with the operands in registers: 255 registers and spills at 16 rows per program.)"""
    sgn = k.where(had[k.span(row0, n), k.span(0, 128)] > 0.0, 1.0, -1.0).to(k.bf16)
    hi = x.to(k.bf16)
    r = x - hi.to(k.f32)
    mid = r.to(k.bf16)
    lo = (r - mid.to(k.f32)).to(k.bf16)
    return k.dot(hi, sgn) + k.dot(mid, sgn) + k.dot(lo, sgn)


@k.func
def rope_hadamard_mx(p1, p2, p3, cos, sin, had, r0, BM):
    """NeoX RoPE on (p1, p2), then [p1 p2 p3] @ had (the orthonormal Sylvester matrix: entries
    +-128^-1/2, so its signs times 128^-1/2), then MXFP8: (codes f8e4m3 [BM, 4, 32], scales
    e8m0 [BM, 4])."""
    c = cos[k.span(r0, BM), k.span(0, 32, other=1.0)]
    s = sin[k.span(r0, BM), k.span(0, 32, other=0.0)]
    x1 = p1 * c - p2 * s
    x2 = p2 * c + p1 * s
    y = sign_dot(x1, had, 0, 32) + sign_dot(x2, had, 32, 32) + sign_dot(p3, had, 64, 64)
    return mxfp8_groups(k.reshape(y * 0.08838834764831845, (BM, 4, 32)))


@k.func
def norm_rope_store_keys(p1, p2, p3, ln_w, ln_b, cos, sin, had, slots, cache, eps, r0, BM):
    """The k chain after its projection [p1 p2 p3] (rows r0..r0+BM): LayerNorm, RoPE, Hadamard,
    MXFP8, stored into the paged cache at the rows' slots."""
    mean = (k.sum(p1, axis=1) + k.sum(p2, axis=1) + k.sum(p3, axis=1)) / 128.0
    d1 = p1 - mean[:, None]
    d2 = p2 - mean[:, None]
    d3 = p3 - mean[:, None]
    var = (k.sum(d1 * d1, axis=1) + k.sum(d2 * d2, axis=1) + k.sum(d3 * d3, axis=1)) / 128.0
    r = k.rsqrt(var + eps)[:, None]
    n1 = d1 * r * ln_w[k.span(0, 32)][None, :] + ln_b[k.span(0, 32)][None, :]
    n2 = d2 * r * ln_w[k.span(32, 32)][None, :] + ln_b[k.span(32, 32)][None, :]
    n3 = d3 * r * ln_w[k.span(64, 64)][None, :] + ln_b[k.span(64, 64)][None, :]
    codes, scales = rope_hadamard_mx(n1, n2, n3, cos, sin, had, r0, BM)
    sl = slots[k.span(r0, BM, other=-1)]
    store_keys(cache, sl, k.reshape(codes, (BM, 128)), scales, BM)


# ---------------------------------------------------------------- the three chains

# BM 64 (prefill) takes 8 warps: 184 registers, no spill on sm_90a (4 warps: 255 + 36 B spill);
# BM 16 (decode): 4 warps, 136 registers.
PROJ_CONFIGS = [{"BM": 16, "BK": 64, "num_warps": 4}, {"BM": 64, "BK": 64, "num_warps": 8},
                {"BM": 32, "BK": 64, "num_warps": 4}]


@k.kernel(configs=PROJ_CONFIGS)
def indexer_q_chain(qr: k.Tensor["AT", "T", "QL"], wq_b: k.Tensor["WT", "HD", "QL"], cos: k.Tensor[k.f32, "T", "R"],
                    sin: k.Tensor[k.f32, "T", "R"], had: k.Tensor[k.f32, "128", "128"],
                    q_codes: k.Tensor[k.f8e4m3, "T", "H", "128"], q_scales: k.Tensor[k.e8m0, "T", "H", "4"],
                    AT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                    BM: k.constexpr = 16, BK: k.constexpr = 64):
    for pm, h in k.grid(k.cdiv(qr.shape[0], BM), q_codes.shape[1]):
        p1, p2, p3 = project3(qr, wq_b, pm * BM, h * 128, BM, BK, AT, WT)
        codes, scales = rope_hadamard_mx(p1, p2, p3, cos, sin, had, pm * BM, BM)
        q_codes[k.span(pm * BM, BM), h, k.span(0, 128)] = k.reshape(codes, (BM, 128))
        q_scales[k.span(pm * BM, BM), h, k.span(0, 4)] = scales


@k.kernel(configs=PROJ_CONFIGS)
def indexer_k_chain(x: k.Tensor["AT", "T", "DM"], wk: k.Tensor["WT", "128", "DM"], ln_w: k.Tensor[k.f32, "128"],
                    ln_b: k.Tensor[k.f32, "128"], cos: k.Tensor[k.f32, "T", "R"], sin: k.Tensor[k.f32, "T", "R"],
                    had: k.Tensor[k.f32, "128", "128"], slots: k.Tensor[k.i32, "T"], cache: k.Tensor[k.u8, "NB"],
                    eps: k.f32, AT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                    BM: k.constexpr = 16, BK: k.constexpr = 64):
    for pm in k.grid(k.cdiv(x.shape[0], BM)):
        p1, p2, p3 = project3(x, wk, pm * BM, 0, BM, BK, AT, WT)
        norm_rope_store_keys(p1, p2, p3, ln_w, ln_b, cos, sin, had, slots, cache, eps, pm * BM, BM)


@k.kernel(configs=PROJ_CONFIGS)
def indexer_k_chain_parts(part: k.Tensor[k.f32, "S", "T", "128"], ln_w: k.Tensor[k.f32, "128"],
                          ln_b: k.Tensor[k.f32, "128"], cos: k.Tensor[k.f32, "T", "R"], sin: k.Tensor[k.f32, "T", "R"],
                          had: k.Tensor[k.f32, "128", "128"], slots: k.Tensor[k.i32, "T"], cache: k.Tensor[k.u8, "NB"],
                          eps: k.f32, BM: k.constexpr = 16, BK: k.constexpr = 64):   # BK: unused (shared configs)
    # The k chain after a split-K projection (ops/nn.py linear_rows_splitk of x @ wk^T into
    # fp32 partials): sum the partials, then LayerNorm, RoPE, Hadamard, MXFP8 into the cache.
    # Decode on a GPU: the 128 x dim weight streams through many programs instead of one.
    for pm in k.grid(k.cdiv(part.shape[1], BM)):
        r0 = pm * BM
        p1 = k.zeros((BM, 32), k.f32)
        p2 = k.zeros((BM, 32), k.f32)
        p3 = k.zeros((BM, 64), k.f32)
        for sg in range(part.shape[0]):
            p1 += part[sg, k.span(r0, BM, other=0.0), k.span(0, 32)]
            p2 += part[sg, k.span(r0, BM, other=0.0), k.span(32, 32)]
            p3 += part[sg, k.span(r0, BM, other=0.0), k.span(64, 64)]
        norm_rope_store_keys(p1, p2, p3, ln_w, ln_b, cos, sin, had, slots, cache, eps, r0, BM)


@k.kernel(configs=PROJ_CONFIGS)
def indexer_head_weights(x: k.Tensor["AT", "T", "DM"], wp: k.Tensor["WT", "H", "DM"], w: k.Tensor[k.f32, "T", "H"],
                         scale: k.f32, AT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                         H: k.constexpr = 64, BM: k.constexpr = 16, BK: k.constexpr = 64):
    for pm in k.grid(k.cdiv(x.shape[0], BM)):
        acc = k.zeros((BM, H), k.f32)
        for kk in range(k.cdiv(x.shape[1], BK)):
            acc += dot_mixed(x[k.span(pm * BM, BM), k.span(kk * BK, BK, other=0.0)],
                             wp[k.span(0, H), k.span(kk * BK, BK, other=0.0)].T, AT, WT)
        w[k.span(pm * BM, BM), k.span(0, H)] = acc * scale


# ---------------------------------------------------------------- public function

_HADAMARD: dict = {}


def hadamard_matrix(device=None):
    """The orthonormal 128 x 128 Sylvester Hadamard matrix (fp32, symmetric), cached per device."""
    import torch
    key = str(device)
    if key not in _HADAMARD:
        h = torch.ones(1, 1)
        while h.shape[0] < HEAD_DIM:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _HADAMARD[key] = (h * HEAD_DIM ** -0.5).to(device=device, dtype=torch.float32).contiguous()
    return _HADAMARD[key]


def _shape(op, name, t, want):
    if tuple(t.shape) != tuple(want):
        raise K31Error(f"{op}: `{name}` must have shape {list(want)}, got {list(t.shape)}")


def _check_inputs(x, qr, wq_b, wk, k_norm_w, k_norm_b, weights_proj, cos, sin, cache, slot_mapping, eps, target):
    op = "indexer_prolog"
    for name, t in (("x", x), ("qr", qr), ("wq_b", wq_b), ("wk", wk), ("weights_proj", weights_proj)):
        require_tensor(op, name, t, FLOAT_INPUTS, 2)
        if t.dim() != 2:
            raise K31Error(f"{op}: `{name}` must be a matrix (2-D), got shape {list(t.shape)}",
                           hint="activations are [tokens, features], weights [out, in]")
    for name, t in (("k_norm_w", k_norm_w), ("k_norm_b", k_norm_b), ("cos", cos), ("sin", sin)):
        require_tensor(op, name, t, (k.f32,))
    _check_cache(op, cache)
    require_same_device(op, x=x, qr=qr, wq_b=wq_b, wk=wk, k_norm_w=k_norm_w, k_norm_b=k_norm_b,
                        weights_proj=weights_proj, cos=cos, sin=sin, cache=cache,
                        slot_mapping=slot_mapping if hasattr(slot_mapping, "device") else None)
    require_target_device(op, target, x.device)
    t, dm = x.shape
    h = weights_proj.shape[0]
    if h & (h - 1) or not 16 <= h <= 128:
        raise K31Error(f"{op}: weights_proj has {h} rows (heads); a power of two in [16, 128] is needed")
    _shape(op, "qr", qr, (t, qr.shape[1]))
    _shape(op, "wq_b", wq_b, (h * HEAD_DIM, qr.shape[1]))
    _shape(op, "wk", wk, (HEAD_DIM, dm))
    _shape(op, "weights_proj", weights_proj, (h, dm))
    _shape(op, "k_norm_w", k_norm_w, (HEAD_DIM,))
    _shape(op, "k_norm_b", k_norm_b, (HEAD_DIM,))
    _shape(op, "cos", cos, (t, ROPE_HALF))
    _shape(op, "sin", sin, (t, ROPE_HALF))
    slots = cache_slots(op, slot_mapping, t, cache.shape[0], PAGE)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise K31Error(f"{op}: eps must be a finite number > 0, got {eps!r}")
    return slots


def prolog_program(t: int, dm: int, ql: int, h: int, nbytes: int, act_dt, w_dt, eps: float = 1e-6):
    """The prolog as a graph program of three independent calls (q chain, k chain into the flat
    cache, head weights); inputs x, qr, cos, sin, slots, cache (flat uint8) and the result
    tensors q_codes, q_scales, weights (all written in place, so results never alias the
    executable's own buffers); weights wq_b, wk, k_norm_w, k_norm_b, weights_proj, hadamard.
    The `streams` pass puts the chains on three streams."""
    from k31dsl.lowering.graph import Program
    bm = min(64, max(16, 1 << max(0, (t - 1).bit_length())))          # token rows per program
    p = Program("indexer_prolog")
    x = p.input("x", (t, dm), act_dt)
    qr = p.input("qr", (t, ql), act_dt)
    cos = p.input("cos", (t, ROPE_HALF), k.f32)
    sin = p.input("sin", (t, ROPE_HALF), k.f32)
    slots = p.input("slots", (t,), k.i32)
    cache = p.input("cache", (nbytes,), k.u8)
    wq_b = p.weight("wq_b", (h * HEAD_DIM, ql), w_dt)
    wk = p.weight("wk", (HEAD_DIM, dm), w_dt)
    ln_w = p.weight("k_norm_w", (HEAD_DIM,), k.f32)
    ln_b = p.weight("k_norm_b", (HEAD_DIM,), k.f32)
    wp = p.weight("weights_proj", (h, dm), w_dt)
    had = p.weight("hadamard", (HEAD_DIM, HEAD_DIM), k.f32)
    q_codes = p.input("q_codes", (t, h, HEAD_DIM), k.f8e4m3)      # outputs the caller allocates: results
    q_scales = p.input("q_scales", (t, h, GROUPS), k.e8m0)        # never alias the executable's buffers
    weights = p.input("weights", (t, h), k.f32)
    q_codes, q_scales = p.call(indexer_q_chain, qr, wq_b, cos, sin, had, q_codes, q_scales, BM=bm)
    cache = p.call(indexer_k_chain, x, wk, ln_w, ln_b, cos, sin, had, slots, cache, float(eps), BM=bm)
    weights = p.call(indexer_head_weights, x, wp, weights, float(h ** -0.5), H=h, BM=bm)
    p.output(q_codes, q_scales, weights, cache)
    return p


_EXECUTABLES: dict = {}


def indexer_prolog(x, qr, wq_b, wk, k_norm_w, k_norm_b, weights_proj, cos, sin, cache, slot_mapping,
                   eps: float = 1e-6, *, streams: bool = True, target: str | None = None):
    """The indexer prolog of one layer -> (q_codes f8e4m3 [T, H, 128], q_scales e8m0 [T, H, 4],
    weights fp32 [T, H]); the keys go into `cache` (uint8 [pages, 8448]) at slot_mapping.

    x [T, dim] and qr [T, q_lora] bf16/f16/f32; wq_b [H*128, q_lora], wk [128, dim],
    weights_proj [H, dim] (torch Linear layout [out, in]); k_norm_w/k_norm_b fp32 [128];
    cos/sin fp32 [T, 32] (NeoX RoPE tables at each token's position); slot_mapping int32 [T]
    (< 0: padding, not written). Runs `prolog_program` through the target's graph pipeline
    (three streams on CUDA); streams=False runs the calls in order (no streams pass)."""
    import torch
    from k31dsl.dsl import dtypes as D
    from k31dsl.lowering.graph import compile_program
    target = resolve_target(target)
    slots = _check_inputs(x, qr, wq_b, wk, k_norm_w, k_norm_b, weights_proj, cos, sin, cache, slot_mapping, eps,
                          target)
    t, dm = x.shape
    h = weights_proj.shape[0]
    if t == 0:
        return (torch.empty((0, h, HEAD_DIM), dtype=torch.float8_e4m3fn, device=x.device),
                torch.empty((0, h, GROUPS), dtype=torch.float8_e8m0fnu, device=x.device),
                torch.empty((0, h), dtype=torch.float32, device=x.device))
    if qr.dtype != x.dtype or wk.dtype != wq_b.dtype or weights_proj.dtype != wq_b.dtype:
        raise K31Error("indexer_prolog: x and qr must share a dtype, and so must wq_b, wk and weights_proj")
    key = (t, dm, qr.shape[1], h, cache.numel(), x.dtype, wq_b.dtype, float(eps), target, streams, str(x.device))
    exe = _EXECUTABLES.get(key)
    if exe is None:
        prog = prolog_program(t, dm, qr.shape[1], h, cache.numel(), D.from_torch(x.dtype), D.from_torch(wq_b.dtype), eps)
        passes = None if streams else ["build", "verify"]
        exe = _EXECUTABLES[key] = compile_program(prog, target, passes=passes)
    q_codes = torch.empty((t, h, HEAD_DIM), dtype=torch.float8_e4m3fn, device=x.device)
    q_scales = torch.empty((t, h, GROUPS), dtype=torch.float8_e8m0fnu, device=x.device)
    weights = torch.empty((t, h), dtype=torch.float32, device=x.device)
    exe({"q_codes": q_codes, "q_scales": q_scales, "weights": weights, "x": x, "qr": qr, "cos": cos, "sin": sin, "slots": slots, "cache": cache.view(-1), "wq_b": wq_b,
               "wk": wk, "k_norm_w": k_norm_w, "k_norm_b": k_norm_b, "weights_proj": weights_proj,
               "hadamard": hadamard_matrix(x.device)})
    return q_codes, q_scales, weights

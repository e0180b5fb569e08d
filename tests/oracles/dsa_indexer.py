"""fp64 oracles of the DSA indexer side (k31dsl.ops.dsa: prolog, indexer cache, lightning
indexer, top-k), written from research/dsa.md §1.2-1.4, §3.3 and §4.5, not from the kernels.

Prolog (per token): q = qr @ wq_b^T -> [H, 128]; k = LayerNorm(x @ wk^T) (weight, bias, eps);
RoPE on dims [0, 64) NeoX half-split (x1 = v[:32], x2 = v[32:64]: x1 cos - x2 sin, x2 cos + x1 sin);
orthonormal Hadamard (Sylvester, / sqrt(128)); MXFP8 (RCEIL, groups of 32). Head weights
w = (x @ weights_proj^T) * H^-1/2.
Cache: page of 64 tokens = [64 x 128 codes, token-major | 64 x 4 scale bytes, token-major].
Scores: I[t,s] = sum_j w[t,j] ReLU(sum_g sq[t,j,g] sk[s,g] (q8[t,j,g] . k8[s,g])) on [ks, ke), -inf
elsewhere. Top-k: the k largest scores, ties to the lower position, only finite scores count,
padded with -1 to k.
"""
from __future__ import annotations

import numpy as np

from .fp import e4m3_decode, e8m0_decode
from .quant import mxfp8_quantize

PAGE, D, G = 64, 128, 4


def hadamard(n: int = D) -> np.ndarray:
    """Sylvester Hadamard matrix / sqrt(n): orthonormal and symmetric."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def rope_neox(v, cos, sin):
    """RoPE on the first 2*len(cos) dims of the last axis, NeoX half-split; cos/sin [T, R/2]
    broadcast over any middle axes."""
    v = np.array(v, np.float64)
    half = cos.shape[-1]
    c = cos.reshape(cos.shape[:1] + (1,) * (v.ndim - 2) + (half,))
    s = sin.reshape(c.shape)
    x1, x2 = v[..., :half].copy(), v[..., half:2 * half].copy()
    v[..., :half] = x1 * c - x2 * s
    v[..., half:2 * half] = x2 * c + x1 * s
    return v


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def prolog_values(x, qr, wq_b, wk, k_norm_w, k_norm_b, weights_proj, cos, sin, eps=1e-6):
    """(q rotated [T, H, 128], k rotated [T, 128], head weights [T, H]) before quantization."""
    t = x.shape[0]
    h = weights_proj.shape[0]
    hd = hadamard()
    q = (qr @ wq_b.T).reshape(t, h, D)
    q = rope_neox(q, cos, sin) @ hd
    kk = layernorm(x @ wk.T, k_norm_w, k_norm_b, eps)
    kk = rope_neox(kk, cos, sin) @ hd
    w = (x @ weights_proj.T) * h ** -0.5
    return q, kk, w


def mx_values(codes, scale_bytes):
    """Dequantized MXFP8 values (fp64) of codes [..., 128] and scale bytes [..., 4]."""
    v = e4m3_decode(np.asarray(codes, np.uint8)).reshape(codes.shape[:-1] + (G, 32))
    return (v * e8m0_decode(np.asarray(scale_bytes, np.uint8))[..., None]).reshape(codes.shape)


def quantize(v):
    """MXFP8 (RCEIL) codes and scale bytes of fp64 values."""
    return mxfp8_quantize(v, "ceil")


def cache_token(cache_bytes, slot):
    """(codes [128], scale bytes [4]) of one slot, read from the raw page bytes."""
    page, off = divmod(int(slot), PAGE)
    row = np.asarray(cache_bytes[page], np.uint8)
    return row[off * D:(off + 1) * D], row[PAGE * D + off * G:PAGE * D + (off + 1) * G]


def indexer_scores(q_codes, q_scales, weights, cache_bytes, block_table, ks, ke, max_len):
    """Scores [T, max_len] in fp64; token t belongs to sequence t // (T // B)."""
    t_n = q_codes.shape[0]
    b_n = block_table.shape[0]
    n = t_n // b_n
    qv = e4m3_decode(np.asarray(q_codes, np.uint8)).reshape(t_n, -1, G, 32)
    qs = e8m0_decode(np.asarray(q_scales, np.uint8))
    out = np.full((t_n, max_len), -np.inf)
    for t in range(t_n):
        b = t // n
        lo, hi = max(int(ks[t]), 0), min(int(ke[t]), max_len)
        for s in range(lo, hi):
            kc, ksb = cache_token(cache_bytes, int(block_table[b, s // PAGE]) * PAGE + s % PAGE)
            kv = e4m3_decode(kc).reshape(G, 32)
            dots = np.einsum("hgd,gd->hg", qv[t], kv)            # [H, G]
            logits = (dots * qs[t] * e8m0_decode(ksb)[None, :]).sum(-1)
            out[t, s] = float((weights[t] * np.maximum(logits, 0.0)).sum())
    return out


def indexer_scores_magnitude(q_codes, q_scales, weights, cache_bytes, block_table, ks, ke, max_len):
    """sum_j |w| * sum_g |scaled group dots| per (t, s): the scale of fp32 rounding errors."""
    t_n = q_codes.shape[0]
    n = t_n // block_table.shape[0]
    qv = np.abs(e4m3_decode(np.asarray(q_codes, np.uint8))).reshape(t_n, -1, G, 32)
    qs = e8m0_decode(np.asarray(q_scales, np.uint8))
    out = np.zeros((t_n, max_len))
    for t in range(t_n):
        b = t // n
        for s in range(max(int(ks[t]), 0), min(int(ke[t]), max_len)):
            kc, ksb = cache_token(cache_bytes, int(block_table[b, s // PAGE]) * PAGE + s % PAGE)
            kv = np.abs(e4m3_decode(kc)).reshape(G, 32)
            mag = (np.einsum("hgd,gd->hg", qv[t], kv) * qs[t] * e8m0_decode(ksb)[None, :]).sum(-1)
            out[t, s] = float((np.abs(weights[t]) * mag).sum())
    return out


def topk(scores, k):
    """int64 [T, k]: positions of the k largest finite scores per row, ties to the lower position,
    padded with -1; returned in the order (score descending, position ascending)."""
    scores = np.asarray(scores, np.float64)
    out = np.full((scores.shape[0], k), -1, np.int64)
    for r, row in enumerate(scores):
        valid = np.flatnonzero(row > -np.inf)              # NaN and -inf never count
        order = sorted(valid.tolist(), key=lambda i: (-row[i], i))[:k]
        out[r, :len(order)] = order
    return out


def cache_write(cache_bytes, codes, scale_bytes, slots):
    """The cache bytes after writing token t's codes/scales at slots[t] (slots < 0 skipped)."""
    out = np.array(cache_bytes, np.uint8, copy=True)
    for t, slot in enumerate(np.asarray(slots)):
        if slot < 0:
            continue
        page, off = divmod(int(slot), PAGE)
        out[page, off * D:(off + 1) * D] = codes[t]
        out[page, PAGE * D + off * G:PAGE * D + (off + 1) * G] = scale_bytes[t]
    return out


def mx_roundtrip_ratio(xhat, x, scale_bytes, rel_slack=2.0 ** -12):
    """Worst |xhat - x| / bound for MXFP8 values xhat of exact values x (both [..., 128]):
    bound = 2^-4 (|x| + e) + e + 2^-10 s per element, with s the group scale (half an E4M3 step in
    the normal range, half the subnormal step below it) and e = rel_slack * max|x| of the vector
    (the fp32 arithmetic of the kernel before rounding). Saturation cannot happen with RCEIL."""
    s = np.repeat(e8m0_decode(np.asarray(scale_bytes, np.uint8)), 32, axis=-1)
    e = rel_slack * np.abs(x).max(axis=-1, keepdims=True)
    bound = 2.0 ** -4 * (np.abs(x) + e) + e + 2.0 ** -10 * s
    return float((np.abs(xhat - x) / bound).max()) if x.size else 0.0

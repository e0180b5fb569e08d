"""Sparse MLA attention with the keys on the MMA rows, the form for few heads per query
(attention.py has the heads-major kernels and the cache layout).

With H = 16 heads (the model's small preset, or 128 heads over tensor-parallel 8) the heads-major
kernels put 16 rows on every MMA: Hopper's wgmma needs 64, so Triton falls back to mma.sync and
each gathered record feeds one 16-row product. Here the BK gathered keys are the rows instead:

  scores  sᵀ [BK, BH]  = Σ_g scale_g · (code_g [BK, 128] @ q_gᵀ [128, BH]) + rope [BK, 64] @ q_ropeᵀ
  values  o_gᵀ [128, BH] += code_gᵀ [128, BK] @ (pᵀ · scale_g) [BK, BH]

so both products have 64 or 128 rows (BK, or a 128-column latent tile) and BH columns, the
softmax statistics run down the key axis (axis 0) and the output accumulates transposed
([512, BH] fp32 in four tiles: 32 registers per thread at 8 warps). Same math as the one-pass
kernel, same outputs; split > 1 writes the same fp32 partials for sparse_mla_attention_combine.
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.ops.dsa.attention import CacheCodes, CacheRope, CacheScales, finish, finish_segment, live_blocks, load_query, segment_blocks

# (BH, BK, warps): filled in from probes/sfa_heads16.py (H200, 16 heads). BK 64 is left out: on
# Triton 3.6 / sm_90a its wgmma reads shared memory past the allocation (compute-sanitizer,
# probes/sfa_km_check.py: BH 16 and 32 at 4 or 8 warps), while BK 32 and 128 give the one-pass
# kernel's outputs.
KEYS_CONFIGS = [{"BH": bh, "BK": bk, "num_warps": w} for bh, bk, w in
                ((16, 32, 4), (16, 128, 8), (16, 32, 8), (32, 128, 8), (32, 32, 4))]


@k.func
def keys_major_state(BH):
    """(running max, running sum, the four transposed [128, BH] output accumulators)."""
    return (k.full((BH,), float("-inf"), k.f32), k.zeros((BH,), k.f32), k.zeros((128, BH), k.f32),
            k.zeros((128, BH), k.f32), k.zeros((128, BH), k.f32), k.zeros((128, BH), k.f32))


@k.func
def keys_major_blocks(ql0, ql1, ql2, ql3, qr, codes, scales, rope, indices, t, first, count, n_slots, sm_scale,
                      m, l, a0, a1, a2, a3, BK):
    """Index blocks first .. first + count - 1 of query t folded into the transposed state."""
    for j in range(count):
        idx = indices[t, k.span((first + j) * BK, BK, other=-1)]
        valid = (idx >= 0) & (idx < n_slots)
        c0 = codes[idx, k.span(0, 128, other=0.0)].to(k.bf16)
        c1 = codes[idx, k.span(128, 128, other=0.0)].to(k.bf16)
        c2 = codes[idx, k.span(256, 128, other=0.0)].to(k.bf16)
        c3 = codes[idx, k.span(384, 128, other=0.0)].to(k.bf16)
        s0 = k.load(scales, (idx, 128), other=0.0)
        s1 = k.load(scales, (idx, 129), other=0.0)
        s2 = k.load(scales, (idx, 130), other=0.0)
        s3 = k.load(scales, (idx, 131), other=0.0)
        kr = rope[idx, k.span(264, 64, other=0.0)]
        st = k.dot(c0, ql0.T) * s0[:, None] + k.dot(c1, ql1.T) * s1[:, None] + \
            k.dot(c2, ql2.T) * s2[:, None] + k.dot(c3, ql3.T) * s3[:, None] + k.dot(kr, qr.T)       # [BK, BH]
        st = k.where(valid[:, None], st * sm_scale, float("-inf"))
        m_new = k.maximum(m, k.max(st, axis=0))
        m_safe = k.where(m_new == float("-inf"), 0.0, m_new)           # nothing valid yet: no NaN
        alpha = k.exp(m - m_safe)
        p = k.exp(st - m_safe[None, :])
        l = l * alpha + k.sum(p, axis=0)
        a0 = a0 * alpha[None, :] + k.dot(c0.T, (p * s0[:, None]).to(k.bf16))
        a1 = a1 * alpha[None, :] + k.dot(c1.T, (p * s1[:, None]).to(k.bf16))
        a2 = a2 * alpha[None, :] + k.dot(c2.T, (p * s2[:, None]).to(k.bf16))
        a3 = a3 * alpha[None, :] + k.dot(c3.T, (p * s3[:, None]).to(k.bf16))
        m = m_new
    return m, l, a0, a1, a2, a3


@k.kernel(configs=KEYS_CONFIGS)
def sfa_keys_major(q: k.Tensor["QT", "T", "H", "DQK"], codes: CacheCodes,
                   scales: CacheScales, rope: CacheRope,
                   indices: k.Tensor[k.i32, "T", "K"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                   lse: k.Tensor[k.f32, "T", "H"], sm_scale: k.f32,
                   QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 16, BK: k.constexpr = 32):
    # One program: query t, heads [h0, h0 + BH), all its live index blocks.
    for t, hb in k.grid(q.shape[0], k.cdiv(q.shape[1], BH)):
        h0 = hb * BH
        ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
        m, l, a0, a1, a2, a3 = keys_major_state(BH)
        n_slots = codes.shape[0]
        m, l, a0, a1, a2, a3 = keys_major_blocks(ql0, ql1, ql2, ql3, qr, codes, scales, rope, indices, t, 0,
                                                 live_blocks(indices, t, n_slots, BK), n_slots, sm_scale,
                                                 m, l, a0, a1, a2, a3, BK)
        finish(o, lse, t, h0, m, l, a0.T, a1.T, a2.T, a3.T, BH)


@k.kernel(configs=KEYS_CONFIGS)
def sfa_keys_major_split(q: k.Tensor["QT", "T", "H", "DQK"], codes: CacheCodes,
                         scales: CacheScales, rope: CacheRope,
                         indices: k.Tensor[k.i32, "T", "K"], part_o: k.Tensor[k.f32, "NS", "T", "H", "DV"],
                         part_lse: k.Tensor[k.f32, "NS", "T", "H"], sm_scale: k.f32,
                         QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 16, BK: k.constexpr = 32):
    # Flash-decoding segments as sparse_mla_attention_split (same partials: normalised o, lse or
    # -inf), merged by sparse_mla_attention_combine.
    for t, hb, sg in k.grid(q.shape[0], k.cdiv(q.shape[1], BH), part_o.shape[0]):
        h0 = hb * BH
        ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
        m, l, a0, a1, a2, a3 = keys_major_state(BH)
        n_slots = codes.shape[0]
        first, count = segment_blocks(indices, t, n_slots, BK, sg, part_o.shape[0])
        m, l, a0, a1, a2, a3 = keys_major_blocks(ql0, ql1, ql2, ql3, qr, codes, scales, rope, indices, t, first,
                                                 count, n_slots, sm_scale, m, l, a0, a1, a2, a3, BK)
        finish_segment(part_o, part_lse, sg, t, h0, m, l, a0.T, a1.T, a2.T, a3.T, BH)

"""The paged MLA latent cache (FlashMLA "V32" FP8 layout), its write op, and sparse MLA attention
(SFA) over it — the attention half of DSA (research/dsa.md sections 2-3).

Cache: uint8 [num_pages, 64, 656], token records contiguous (research 3.3, byte-exact):
  bytes [0, 512)    latent as E4M3 codes, 4 tiles of 128
  bytes [512, 528)  4 fp32 scales (little-endian), latent[128t + i] = code * scale[t]
  bytes [528, 656)  rope as 64 bfloat16
A physical slot is page * 64 + row. The kernels see one storage through three views of the
flattened [S, 656] records — E4M3 [S, 656], fp32 [S, 164] (scales at columns 128..131), bf16
[S, 328] (rope at columns 264..327) — so every field is one typed, aligned load (656 = 41 x 16).

SFA never materialises dequantized rows: for tile g of a gathered row, score contributions are
scale[g] * (q_g . code_g) and the value update is (p * scale[g]) @ code_g, with the E4M3 codes
converted exactly to bf16 for the MMA (the scale multiplies an [heads, keys] tile instead of the
[keys, 512] one). Softmax is online over blocks of BK indices, fp32, natural-log lse.
"""
from __future__ import annotations

import math

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, cache_slots, config_for, int32_tensor, require_tensor, resolve_target

PAGE = 64
LATENT = 512
ROPE = 64
TILE = 128
RECORD = 656
SCALE_COL = LATENT // 4            # first scale in the fp32 view
ROPE_COL = (LATENT + 16) // 2      # first rope value in the bf16 view

# The kernels' annotations of the cache's three typed views (cache_views). A record's 656 bytes are
# a multiple of 16, so every row of every view starts on a 16-byte boundary: k.aligned(16) says so
# (and every call checks it). Without it Triton sees rows of 164 fp32 / 328 bf16, no multiple of
# 16 elements, and gathers the rope one bf16 per load (sm_90a score pass: 16 LDG.U16 + 16 STS.U16
# per block and thread; with it 2 + 2 of 16 bytes, 2256 -> 1936 instructions, NOTES).
CacheCodes = k.Tensor[k.f8e4m3, "S", "R", k.aligned(16)]
CacheScales = k.Tensor[k.f32, "S", "R // 4", k.aligned(16)]
CacheRope = k.Tensor[k.bf16, "S", "R // 2", k.aligned(16)]

WRITE_CONFIGS = [{"BM": 4}, {"BM": 8}, {"BM": 16}, {"BM": 2}]
# BH heads x BK indices per step. BH=64 keeps the four [64, 128] fp32 accumulators in registers on
# Hopper (128 heads -> 2 programs per query, the second reading the gathered rows from L2).
# BH 16 (the small preset's 16 heads) needs 8 warps: 4 warps use 255 registers and spill
# (36 B at BK 32, 684 B at BK 64); 8 warps: 242 registers, no spill at BK 32 (sm_90a, ptxas -v).
# PREFETCH (the next block's gather before this block's dots): at BH 16 / BK 32 / 8 warps 202
# registers instead of 238 and 25 barriers instead of 32; at BH 64 it spills more (816 B vs 600).
SFA_CONFIGS = [{"BH": 64, "BK": 32, "num_warps": 8}, {"BH": 64, "BK": 64, "num_warps": 8},
               {"BH": 32, "BK": 64, "num_warps": 4}, {"BH": 64, "BK": 16, "num_warps": 4},
               {"BH": 16, "BK": 32, "num_warps": 8}, {"BH": 32, "BK": 32, "num_warps": 8},
               {"BH": 16, "BK": 32, "num_warps": 8, "PREFETCH": True}, {"BH": 32, "BK": 32, "num_warps": 8, "PREFETCH": True}]
SM_COUNT = 132                     # H200: the split heuristic's target of >= ~4 programs per SM


# ---------------------------------------------------------------- device helpers

@k.func
def fp8_tile_codes(xt, eps, BM, POW2):
    """[BM, 512] fp32 -> (E4M3 codes [BM, 512], fp32 scales [BM, 4]): the fp8_tile recipe of
    ops/quant.py (scale max(amax, eps) / 448, codes x * fp32(1 / scale), NaN tile -> NaN)."""
    xg = k.reshape(xt, (BM, 4, 128))
    abits = k.max(xg.bitcast(k.i32) & 0x7FFFFFFF, axis=2)
    bad = abits >= 0x7F800000
    sc = k.maximum(abits.bitcast(k.f32), eps) / 448.0
    if POW2:
        e8 = sc.to(k.e8m0)
        sc = e8.to(k.f32)
        y = xg * ((254 - e8.bitcast(k.u8).to(k.i32)) << 23).bitcast(k.f32)[:, :, None]
    else:
        y = xg * (1.0 / sc)[:, :, None]
    y = k.where(bad[:, :, None], float("nan"), y)
    return k.reshape(y, (BM, 512)).to(k.f8e4m3), k.where(bad, float("nan"), sc)


@k.func
def gather_records(codes, scales, rope, indices, t, j0, n_slots, BK):
    """The BK records of query t's indices [j0, j0 + BK): validity, E4M3 code tiles (as stored),
    tile scales and rope keys; invalid lanes (-1, out of range, past the list) read zeros."""
    return records_at(codes, scales, rope, indices[t, k.span(j0, BK, other=-1)], n_slots)


@k.func
def records_at(codes, scales, rope, idx, n_slots):
    """gather_records for an index tile already loaded (the two-pass score pass loads each
    block's indices one block early)."""
    valid = (idx >= 0) & (idx < n_slots)
    return (valid, codes[idx, k.span(0, 128, other=0.0)], codes[idx, k.span(128, 128, other=0.0)],
            codes[idx, k.span(256, 128, other=0.0)], codes[idx, k.span(384, 128, other=0.0)],
            k.load(scales, (idx, 128), other=0.0), k.load(scales, (idx, 129), other=0.0),
            k.load(scales, (idx, 130), other=0.0), k.load(scales, (idx, 131), other=0.0),
            rope[idx, k.span(264, 64, other=0.0)])


@k.func
def online_block(ql0, ql1, ql2, ql3, qr, codes, scales, rope, idx, valid, sm_scale, m, l, a0, a1, a2, a3):
    """One block of BK gathered records folded into the running softmax state (m, l, a0..a3);
    each code tile widened as it arrives (the AscendC Unified Buffer holds BH 32 this way)."""
    c0 = codes[idx, k.span(0, 128, other=0.0)].to(k.bf16)
    c1 = codes[idx, k.span(128, 128, other=0.0)].to(k.bf16)
    c2 = codes[idx, k.span(256, 128, other=0.0)].to(k.bf16)
    c3 = codes[idx, k.span(384, 128, other=0.0)].to(k.bf16)
    s0 = k.load(scales, (idx, 128), other=0.0)                         # [BK] per tile
    s1 = k.load(scales, (idx, 129), other=0.0)
    s2 = k.load(scales, (idx, 130), other=0.0)
    s3 = k.load(scales, (idx, 131), other=0.0)
    kr = rope[idx, k.span(264, 64, other=0.0)]
    return fold_records(ql0, ql1, ql2, ql3, qr, c0, c1, c2, c3, s0, s1, s2, s3, kr, valid, sm_scale, m, l, a0, a1, a2, a3)


@k.func
def score_tile(ql0, ql1, ql2, ql3, qr, c0, c1, c2, c3, s0, s1, s2, s3, kr, valid, sm_scale):
    """The [heads, keys] scaled scores of gathered records (code tiles as bf16, their scales [BK],
    rope keys); -inf where the index is not valid."""
    s = k.dot(ql0, c0.T) * s0[None, :] + k.dot(ql1, c1.T) * s1[None, :] + \
        k.dot(ql2, c2.T) * s2[None, :] + k.dot(ql3, c3.T) * s3[None, :] + k.dot(qr, kr.T)
    return k.where(valid[None, :], s * sm_scale, float("-inf"))


@k.func
def fold_records(ql0, ql1, ql2, ql3, qr, c0, c1, c2, c3, s0, s1, s2, s3, kr, valid, sm_scale, m, l, a0, a1, a2, a3):
    """Gathered records (code tiles c0..c3 as bf16: E4M3 -> bf16 is exact, their scales [BK],
    rope keys) folded into the running softmax state. No dequantized row is built: the scales
    multiply the score tile and the probability tile."""
    s = score_tile(ql0, ql1, ql2, ql3, qr, c0, c1, c2, c3, s0, s1, s2, s3, kr, valid, sm_scale)
    m_new = k.maximum(m, k.max(s, axis=1))
    m_safe = k.where(m_new == float("-inf"), 0.0, m_new)               # nothing valid yet: no NaN
    alpha = k.exp(m - m_safe)
    p = k.exp(s - m_safe[:, None])
    l = l * alpha + k.sum(p, axis=1)
    a0 = a0 * alpha[:, None] + k.dot((p * s0[None, :]).to(k.bf16), c0)
    a1 = a1 * alpha[:, None] + k.dot((p * s1[None, :]).to(k.bf16), c1)
    a2 = a2 * alpha[:, None] + k.dot((p * s2[None, :]).to(k.bf16), c2)
    a3 = a3 * alpha[:, None] + k.dot((p * s3[None, :]).to(k.bf16), c3)
    return m_new, l, a0, a1, a2, a3


@k.func
def finish(o, lse, t, h0, m, l, a0, a1, a2, a3, BH):
    """o = acc / l (0 for a query without a valid index), lse = m + log l (+inf there)."""
    ok = l > 0.0
    inv = 1.0 / k.where(ok, l, 1.0)
    o[t, k.span(h0, BH), k.span(0, 128)] = k.where(ok[:, None], a0 * inv[:, None], 0.0).to(k.bf16)
    o[t, k.span(h0, BH), k.span(128, 128)] = k.where(ok[:, None], a1 * inv[:, None], 0.0).to(k.bf16)
    o[t, k.span(h0, BH), k.span(256, 128)] = k.where(ok[:, None], a2 * inv[:, None], 0.0).to(k.bf16)
    o[t, k.span(h0, BH), k.span(384, 128)] = k.where(ok[:, None], a3 * inv[:, None], 0.0).to(k.bf16)
    lse[t, k.span(h0, BH)] = k.where(ok, m + k.log(k.where(ok, l, 1.0)), float("inf"))


@k.func
def finish_segment(part_o, part_lse, sg, t, h0, m, l, a0, a1, a2, a3, BH):
    """A flash-decoding segment's normalised output and lse (-inf: no valid index in the segment)
    into part_o[sg] / part_lse[sg], which sparse_mla_attention_combine merges."""
    ok = l > 0.0
    inv = 1.0 / k.where(ok, l, 1.0)
    part_o[sg, t, k.span(h0, BH), k.span(0, 128)] = a0 * inv[:, None]
    part_o[sg, t, k.span(h0, BH), k.span(128, 128)] = a1 * inv[:, None]
    part_o[sg, t, k.span(h0, BH), k.span(256, 128)] = a2 * inv[:, None]
    part_o[sg, t, k.span(h0, BH), k.span(384, 128)] = a3 * inv[:, None]
    part_lse[sg, t, k.span(h0, BH)] = k.where(ok, m + k.log(k.where(ok, l, 1.0)), float("-inf"))


@k.func
def load_query(q, t, h0, BH):
    """The query's [BH, 576] rows as bf16 tiles: latent part in 4 tiles of 128, rope part."""
    ql0 = q[t, k.span(h0, BH), k.span(0, 128, other=0.0)].to(k.bf16)
    ql1 = q[t, k.span(h0, BH), k.span(128, 128, other=0.0)].to(k.bf16)
    ql2 = q[t, k.span(h0, BH), k.span(256, 128, other=0.0)].to(k.bf16)
    ql3 = q[t, k.span(h0, BH), k.span(384, 128, other=0.0)].to(k.bf16)
    qr = q[t, k.span(h0, BH), k.span(512, 64, other=0.0)].to(k.bf16)
    return ql0, ql1, ql2, ql3, qr


# ---------------------------------------------------------------- kernels

@k.kernel(configs=WRITE_CONFIGS)
def mla_cache_write_rows(kv: k.Tensor["XT", "N", "DL"], kr: k.Tensor["RT", "N", "DR"], slots: k.Tensor[k.i32, "N"],
                         codes: CacheCodes, scales: CacheScales,
                         rope: CacheRope, eps: k.f32,
                         XT: k.constexpr[FLOAT_INPUTS] = k.bf16, RT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                         POW2: k.constexpr = False, BM: k.constexpr = 4):
    # One program quantizes BM tokens and scatters their records to their slots (slot < 0 or
    # past the cache: the lanes are out of bounds, nothing is stored).
    for pm in k.grid(k.cdiv(kv.shape[0], BM)):
        slot = slots[k.span(pm * BM, BM, other=-1)]
        xt = kv[k.span(pm * BM, BM), k.span(0, 512, other=0.0)].to(k.f32)
        c, sc = fp8_tile_codes(xt, eps, BM, POW2)
        codes[slot, k.span(0, 512)] = c
        scales[slot, k.span(128, 4)] = sc
        rope[slot, k.span(264, 64)] = kr[k.span(pm * BM, BM), k.span(0, 64, other=0.0)].to(k.bf16)


@k.func
def live_blocks(indices, t, n_slots, BK):
    """Blocks of BK indices of query t up to the last valid one: top-k lists come compacted
    (-1 padding at the end), so e.g. a 1024-token context under top-k 2048 walks half of them.
    (Any -1 / out-of-range entries before the last valid one are still masked block by block.)"""
    last = 0
    for j in range(k.cdiv(indices.shape[1], 1024)):
        idx = indices[t, k.span(j * 1024, 1024, other=-1)]
        ok = (idx >= 0) & (idx < n_slots)
        last = k.maximum(last, k.max(k.where(ok, j * 1024 + k.arange(0, 1024) + 1, 0)))
    return k.cdiv(last, BK)


@k.func
def segment_blocks(indices, t, n_slots, BK, sg, NS):
    """(first block, block count) of segment sg of NS over query t's live index blocks: blocks
    [sg * per, (sg + 1) * per) with per = cdiv(live, NS); the last segments may be short or empty."""
    live = live_blocks(indices, t, n_slots, BK)
    per = k.cdiv(live, NS)
    return sg * per, k.maximum(k.minimum(per, live - sg * per), 0)


@k.func
def attend_blocks(ql0, ql1, ql2, ql3, qr, codes, scales, rope, indices, t, first, count, n_slots, sm_scale,
                  m, l, a0, a1, a2, a3, BK, PREFETCH):
    """Index blocks first .. first + count - 1 of query t folded into the softmax state; with
    PREFETCH the next block's gather is issued before the current block's dots."""
    if PREFETCH:
        nxt = gather_records(codes, scales, rope, indices, t, first * BK, n_slots, BK)
        for j in range(count):
            cur = nxt
            # after the last block this gathers one block more (-1 padding or past the list: masked;
            # in a split segment, the next segment's first block): read, never folded
            nxt = gather_records(codes, scales, rope, indices, t, (first + j + 1) * BK, n_slots, BK)
            valid, c0, c1, c2, c3, s0, s1, s2, s3, kr = cur
            m, l, a0, a1, a2, a3 = fold_records(ql0, ql1, ql2, ql3, qr, c0.to(k.bf16), c1.to(k.bf16), c2.to(k.bf16),
                                                c3.to(k.bf16), s0, s1, s2, s3, kr, valid, sm_scale, m, l, a0, a1, a2, a3)
    else:
        for j in range(count):
            idx = indices[t, k.span((first + j) * BK, BK, other=-1)]
            valid = (idx >= 0) & (idx < n_slots)
            m, l, a0, a1, a2, a3 = online_block(ql0, ql1, ql2, ql3, qr, codes, scales, rope, idx, valid,
                                                sm_scale, m, l, a0, a1, a2, a3)
    return m, l, a0, a1, a2, a3


@k.func
def empty_online_state(BH):
    """(running max, running sum, the four 128-column output accumulators) before any key."""
    return (k.full((BH,), float("-inf"), k.f32), k.zeros((BH,), k.f32), k.zeros((BH, 128), k.f32),
            k.zeros((BH, 128), k.f32), k.zeros((BH, 128), k.f32), k.zeros((BH, 128), k.f32))


@k.kernel(configs=SFA_CONFIGS)
def sparse_mla_attention_fwd(q: k.Tensor["QT", "T", "H", "DQK"], codes: CacheCodes,
                             scales: CacheScales, rope: CacheRope,
                             indices: k.Tensor[k.i32, "T", "K"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                             lse: k.Tensor[k.f32, "T", "H"], sm_scale: k.f32,
                             QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64, BK: k.constexpr = 32,
                             PREFETCH: k.constexpr = False):
    # One program: query t, heads [h0, h0 + BH), all its indices in blocks of BK. PREFETCH: the
    # next block's records are gathered before this block's math (two gathers in flight).
    for t, hb in k.grid(q.shape[0], k.cdiv(q.shape[1], BH)):
        h0 = hb * BH
        ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
        m, l, a0, a1, a2, a3 = empty_online_state(BH)
        n_slots = codes.shape[0]
        m, l, a0, a1, a2, a3 = attend_blocks(ql0, ql1, ql2, ql3, qr, codes, scales, rope, indices, t, 0,
                                             live_blocks(indices, t, n_slots, BK), n_slots, sm_scale,
                                             m, l, a0, a1, a2, a3, BK, PREFETCH)
        finish(o, lse, t, h0, m, l, a0, a1, a2, a3, BH)


@k.kernel(configs=SFA_CONFIGS)
def sparse_mla_attention_split(q: k.Tensor["QT", "T", "H", "DQK"], codes: CacheCodes,
                               scales: CacheScales, rope: CacheRope,
                               indices: k.Tensor[k.i32, "T", "K"], part_o: k.Tensor[k.f32, "NS", "T", "H", "DV"],
                               part_lse: k.Tensor[k.f32, "NS", "T", "H"], sm_scale: k.f32,
                               QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64,
                               BK: k.constexpr = 32, PREFETCH: k.constexpr = False):
    # Flash-decoding: program (t, head block, segment s) folds index blocks
    # [s * per, (s + 1) * per) of query t (per = cdiv(live blocks, NS): the blocks up to the
    # last valid index are shared out; the last segments may be short or empty) and writes its
    # normalised output and lse (-inf: no valid index) to part_o[s] / part_lse[s];
    # sparse_mla_attention_combine merges the segments.
    for t, hb, sg in k.grid(q.shape[0], k.cdiv(q.shape[1], BH), part_o.shape[0]):
        h0 = hb * BH
        ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
        m, l, a0, a1, a2, a3 = empty_online_state(BH)
        n_slots = codes.shape[0]
        first, count = segment_blocks(indices, t, n_slots, BK, sg, part_o.shape[0])
        m, l, a0, a1, a2, a3 = attend_blocks(ql0, ql1, ql2, ql3, qr, codes, scales, rope, indices, t, first, count,
                                             n_slots, sm_scale, m, l, a0, a1, a2, a3, BK, PREFETCH)
        finish_segment(part_o, part_lse, sg, t, h0, m, l, a0, a1, a2, a3, BH)


# A program per (query, head block, column block) and SB segments per load: the first version
# (one program per query and head block, one [BH, 512] segment per loop step) had one load in
# flight at a time and took 141 us per call at B = 1 (64 segments, one program; run 7a).
# Configs by the caller's BH (sm_90a, ptxas): BH 16 at SB 4 / BD 128 / 4 warps 128 registers, no
# spill (SB 8: 181); BH 64 needs SB x BD <= 128 per 4 warps (SB 4 / BD 128 spills 2.2 KB).
COMBINE_CONFIGS = [{"SB": 4, "BD": 128, "num_warps": 4}, {"SB": 8, "BD": 128, "num_warps": 8},
                   {"SB": 2, "BD": 64, "num_warps": 4}, {"SB": 4, "BD": 64, "num_warps": 8},
                   {"SB": 8, "BD": 64, "num_warps": 4}, {"SB": 8, "BD": 32, "num_warps": 4}]


@k.kernel(configs=COMBINE_CONFIGS)
def sparse_mla_attention_combine(part_o: k.Tensor[k.f32, "NS", "T", "H", "DV"], part_lse: k.Tensor[k.f32, "NS", "T", "H"],
                                 o: k.Tensor[k.bf16, "T", "H", "DV"], lse: k.Tensor[k.f32, "T", "H"],
                                 BH: k.constexpr = 16, SB: k.constexpr = 4, BD: k.constexpr = 128):
    # o = sum_s w_s o_s / sum_s w_s with w_s = exp(lse_s - max lse); lse = max + log sum w
    # (a query without any valid index: o = 0, lse = +inf, as the unsplit kernel). Every column
    # block's program computes the same weights and writes the same lse.
    for t, hb, db in k.grid(o.shape[0], k.cdiv(o.shape[1], BH), k.cdiv(o.shape[2], BD)):
        h0 = hb * BH
        nsb = k.cdiv(part_o.shape[0], SB)
        mx = k.full((BH,), float("-inf"), k.f32)
        for i in range(nsb):
            ls = k.load(part_lse, (k.span(i * SB, SB), t, k.span(h0, BH)), other=float("-inf"))     # [SB, BH]
            mx = k.maximum(mx, k.max(ls, axis=0))
        ms = k.where(mx == float("-inf"), 0.0, mx)
        den = k.zeros((BH,), k.f32)
        acc = k.zeros((BH, BD), k.f32)
        for i in range(nsb):
            w = k.exp(k.load(part_lse, (k.span(i * SB, SB), t, k.span(h0, BH)), other=float("-inf")) - ms[None, :])
            den += k.sum(w, axis=0)
            po = k.load(part_o, (k.span(i * SB, SB), t, k.span(h0, BH), k.span(db * BD, BD)), other=0.0)
            acc += k.sum(w[:, :, None] * po, axis=0)
        ok = den > 0.0
        inv = 1.0 / k.where(ok, den, 1.0)
        o[t, k.span(h0, BH), k.span(db * BD, BD)] = k.where(ok[:, None], acc * inv[:, None], 0.0).to(k.bf16)
        lse[t, k.span(h0, BH)] = k.where(ok, ms + k.log(k.where(ok, den, 1.0)), float("inf"))


def combine_tiles(t: int, h: int, bh: int, sm_count: int = SM_COUNT) -> dict:
    """The combine's column block for a graph call (not tuned: it launches with the first config
    the constexprs match): 128 columns once the (query, head block, column block) programs fill the
    SMs, else narrower (down to 32) for more programs. Decode B=1 at 16 heads: 4 programs at BD 128
    took 93 us per call on an H200 (model profile, NOTES); BD 32 gives 16."""
    programs = t * -(-h // bh)
    bd = 128
    while bd > 32 and programs * (LATENT // bd) < sm_count:
        bd //= 2
    return {"BD": bd, "SB": 4 if bd == 128 else 8}


def sfa_split(t: int, h: int, topk: int, bh: int, bk: int = 32, sm_count: int = SM_COUNT) -> int:
    """Index-list segments per (query, head block) for a GPU: 1 (the unsplit kernel) when the
    queries x head blocks fill half the SMs or more; else enough segments for ~4 programs per SM,
    at least one BK block each, with the fp32 partials (segments x T x H x 512 x 4 B) kept within
    max(16 MB, the records the step gathers: T x topk x 656 B). Measured on an H200 (DSA run 10,
    128 heads, BH 64): 32 queries (64 programs) 0.295 ms unsplit, 0.209 split 4 with the combine;
    64 queries (128 programs, about one per SM) 0.344 unsplit, 0.415 split 4."""
    programs = t * -(-h // bh)
    if 2 * programs > sm_count:
        return 1
    blocks = -(-topk // bk)
    budget = max(16 << 20, t * topk * RECORD)
    split = 1
    while split * 2 <= blocks and programs * split * 2 <= 4 * sm_count and (split * 2) * t * h * LATENT * 4 <= budget:
        split *= 2
    return split


def sfa_form(t: int, h: int, topk: int, on_gpu: bool) -> str:
    """The form sparse_mla_attention, li_sfa_unfused and the model's steps take by default on a GPU:
    two passes for 64 heads or more when the fp32 score buffer fits sfa_two_pass.SCORE_BUDGET
    (decode-sized calls; DSA run 4 of the 12:56 UTC session, 1 Dec, 128 heads: 0.290 against 0.346 ms
    at 64 queries, 0.150 against 0.210 (split 4) at 32); keys-major for 16 heads or fewer when the
    calls need no split (prefill-sized: probes/sfa_heads16.py, 4096 causal queries at 16 heads, 3.96
    against 4.80 ms; at 64 decode queries, split 8, it lost: 0.151 against 0.128); else, and on
    every other target, one pass."""
    from k31dsl.ops.dsa import sfa_two_pass
    if not on_gpu:
        return "one_pass"
    if h >= 64 and sfa_two_pass.fits(t, h, topk):
        return "two_pass"
    if h <= 16 and sfa_split(t, h, topk, 16) == 1:
        return "keys_major"
    return "one_pass"


def max_head_block(target: str) -> int:
    """Heads per program: 64 on a GPU (the [64, 512] fp32 accumulators live in registers); 32 on
    ascendc, whose 192 KB Unified Buffer holds the BH = 32 tiles but not BH = 64 (~340 KB)."""
    return 32 if target == "ascendc" else 64


# ---------------------------------------------------------------- public functions

def new_mla_cache(num_pages: int, device=None):
    """An all-zero paged MLA latent cache: uint8 [num_pages, 64, 656]."""
    import torch
    if not (isinstance(num_pages, int) and num_pages >= 0):
        raise K31Error(f"new_mla_cache: num_pages must be an int >= 0, got {num_pages!r}")
    return torch.zeros((num_pages, PAGE, RECORD), dtype=torch.uint8, device=device)


def _require_cache(op: str, cache):
    import torch
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8 or cache.dim() != 3 \
            or tuple(cache.shape[1:]) != (PAGE, RECORD):
        got = f"{cache.dtype} {list(cache.shape)}" if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise K31Error(f"{op}: `cache` must be a uint8 tensor [num_pages, {PAGE}, {RECORD}] (the MLA latent "
                       f"cache), got {got}", hint="make one with new_mla_cache(num_pages)")
    if not cache.is_contiguous():
        raise K31Error(f"{op}: `cache` must be contiguous (token records {RECORD} bytes apart, pages "
                       f"{PAGE * RECORD} bytes apart)")


def cache_views(cache):
    """(E4M3 [S, 656], fp32 [S, 164], bf16 [S, 328]) views of one cache's storage, S = pages * 64."""
    import torch
    flat = cache.view(-1, RECORD)
    return flat.view(torch.float8_e4m3fn), flat.view(torch.float32), flat.view(torch.bfloat16)


def mla_cache_write(cache, kv_latent, k_rope, slot_mapping, *, pow2_scale: bool = False, eps: float = 1e-4,
                    target: str | None = None):
    """Write N tokens into the paged MLA cache in place: kv_latent [N, 512] and k_rope [N, 64]
    (bf16/f16/f32) at physical slots slot_mapping [N] (page * 64 + row; a negative slot is skipped,
    e.g. padding). Latent: per-128 tile FP8, scale max(amax, eps) / 448 in fp32 (pow2_scale: rounded
    up to a power of two, FlashMLA's test quantizer), codes E4M3; rope: bf16. Returns cache."""
    target = resolve_target(target)
    op = "mla_cache_write"
    _require_cache(op, cache)
    require_tensor(op, "kv_latent", kv_latent, FLOAT_INPUTS, 2)
    require_tensor(op, "k_rope", k_rope, FLOAT_INPUTS, 2)
    n = kv_latent.shape[0]
    if kv_latent.dim() != 2 or kv_latent.shape[1] != LATENT:
        raise K31Error(f"{op}: `kv_latent` must be [N, {LATENT}], got {list(kv_latent.shape)}")
    if k_rope.dim() != 2 or tuple(k_rope.shape) != (n, ROPE):
        raise K31Error(f"{op}: `k_rope` must be [{n}, {ROPE}] (one row per kv_latent row), got {list(k_rope.shape)}")
    slots = cache_slots(op, slot_mapping, n, cache.shape[0], PAGE)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise K31Error(f"{op}: eps must be a finite number > 0, got {eps!r}")
    if n == 0 or cache.numel() == 0:
        return cache
    c, s, r = cache_views(cache)
    kw = {"POW2": True} if pow2_scale else {}
    mla_cache_write_rows[target](kv_latent.contiguous(), k_rope.contiguous(), slots, c, s, r, float(eps), **kw)
    return cache


def _check_scale(op: str, sm_scale):
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) \
            or sm_scale <= 0:
        raise K31Error(f"{op}: sm_scale must be a finite number > 0, got {sm_scale!r}",
                       hint="pass the model's softmax scale explicitly (DeepSeek-V3.2: 192**-0.5 * mscale**2 "
                            "= 0.135234); there is no default")


FORMS = ("one_pass", "two_pass", "keys_major")
MAX_TWO_PASS_QUERIES = 65535      # sfa_two_pass's pass 2 has the queries on CUDA's z axis (at most 65535)


def sparse_mla_attention(q, cache, indices, sm_scale, *, split: int | None = None, form: str | None = None,
                         target: str | None = None, **config):
    """Sparse MLA attention (MQA mode) over the paged FP8 latent cache.

    q [T, H, 576] bf16/f32 (512 absorbed latent dims, then 64 rope dims; f32 is rounded to bf16,
    the MMA operand precision, like the dequantized cache side); indices [T, topk]
    int32 physical slots (page * 64 + row), -1 or any value outside the cache is ignored;
    sm_scale explicit. Returns (o [T, H, 512] bf16, lse [T, H] fp32, natural log); a query with
    no valid index gets o = 0 and lse = +inf. split > 1: the index list in that many segments
    (flash-decoding: fp32 partial outputs and lse per segment, then a combine kernel), the form
    for few queries on a GPU (sfa_split chooses it).
    form: "one_pass" (the above) or "two_pass" (sfa_two_pass.py: the scores and their softmax
    statistics first, then the value product per 128-column tile; split is then the score pass's
    segment count, by default ~2 programs per SM on a GPU, else 1; it keeps an fp32
    [T, H, topk] score buffer, so it suits decode-sized calls) or "keys_major" (sfa_keys_major.py:
    the gathered keys as the MMA rows, for few heads: up to 32 heads per program; split as for
    one_pass); None: sfa_form's choice.
    **config pins kernel constexprs (BH, BK, ...) and, on Triton, launch options (num_warps, ...)."""
    import torch
    target = resolve_target(target)
    op = "sparse_mla_attention"
    _require_cache(op, cache)
    require_tensor(op, "q", q, (k.bf16, k.f32), 3)
    if q.dim() != 3 or q.shape[2] != LATENT + ROPE:
        raise K31Error(f"{op}: `q` must be [T, H, {LATENT + ROPE}], got {list(q.shape)}")
    idx = int32_tensor(op, "indices", indices, 2)
    if idx.shape[0] != q.shape[0]:
        raise K31Error(f"{op}: `indices` must have one row per query ({q.shape[0]}), got {list(idx.shape)}")
    _check_scale(op, sm_scale)
    if split is not None and (isinstance(split, bool) or not isinstance(split, int) or split < 1):
        raise K31Error(f"{op}: split must be an int >= 1 (or None), got {split!r}")
    if form is None:
        form = sfa_form(q.shape[0], q.shape[1], idx.shape[1], target == "triton" and q.is_cuda)
    if form not in FORMS:
        raise K31Error(f"{op}: form must be one of {', '.join(FORMS)}, got {form!r}")
    T, H = q.shape[0], q.shape[1]
    if form == "two_pass" and T > MAX_TWO_PASS_QUERIES:
        raise K31Error(f"{op}: form=\"two_pass\" takes at most {MAX_TWO_PASS_QUERIES} queries per call, got {T}",
                       hint="use form=\"one_pass\" or split the call")
    o = torch.zeros((T, H, LATENT), dtype=torch.bfloat16, device=q.device)
    lse = torch.full((T, H), float("inf"), dtype=torch.float32, device=q.device)
    if T == 0 or H == 0:
        return o, lse
    c, s, r = cache_views(cache)
    kw = config_for(target, config)                   # launch options (num_warps, ...) reach Triton only
    cap = max_head_block(target)
    bh = min(max(16, 1 << (H - 1).bit_length()), cap)     # the smallest head block holding H, within cap
    if "BH" not in kw and (H < cap or cap < 64):          # else the GPU tuner picks BH among the configs
        kw["BH"] = bh
    if form == "two_pass":
        from k31dsl.ops.dsa import sfa_two_pass as TP
        if split is None:
            split = TP.score_segments(T, H, idx.shape[1], kw.get("BH", 64)) if q.device.type == "cuda" else 1
        return TP.sparse_mla_attention_two_pass(target, q.contiguous(), (c, s, r), idx, sm_scale, o, lse, split, kw)
    fwd, split_fwd = sparse_mla_attention_fwd, sparse_mla_attention_split
    if form == "keys_major":
        from k31dsl.ops.dsa import sfa_keys_major as KM
        kw.setdefault("BH", min(bh, 32))
        fwd, split_fwd = KM.sfa_keys_major, KM.sfa_keys_major_split
    if split is not None and split > 1:
        part_o = torch.empty((split, T, H, LATENT), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((split, T, H), dtype=torch.float32, device=q.device)
        split_fwd[target](q.contiguous(), c, s, r, idx, part_o, part_lse, float(sm_scale), **kw)
        sparse_mla_attention_combine[target](part_o, part_lse, o, lse, BH=kw.get("BH", bh))   # own tiling
        return o, lse
    fwd[target](q.contiguous(), c, s, r, idx, o, lse, float(sm_scale), **kw)
    return o, lse


# ---------------------------------------------------------------- checks against the oracle

def random_latent(n: int, gen, dtype):
    """Latent rows with a spread of magnitudes per 128-tile (one all-zero tile when n > 2)."""
    import torch
    x = torch.randn(n, LATENT, generator=gen) * torch.exp2(torch.randint(-4, 5, (n, 4), generator=gen).float()
                                                           ).repeat_interleave(TILE, dim=1)
    if n > 2:
        x[1, 128:256] = 0
    return x.to(dtype)


def sfa_errors(o, lse, want_o, want_lse) -> tuple[float, float]:
    """(max |o - want| / max |want|, max |lse - want| over finite lse; inf when +inf rows differ)."""
    import numpy as np
    from k31dsl.ops.testing import to_f64
    got_o, got_l = to_f64(o), to_f64(lse)
    lonely = np.isinf(want_lse)
    if not (np.isinf(got_l) == lonely).all() or (got_l[lonely] < 0).any() or (got_o[lonely] != 0).any():
        return float("inf"), float("inf")
    e_o = float(np.abs(got_o - want_o).max() / max(np.abs(want_o).max(), 1e-30)) if want_o.size else 0.0
    e_l = float(np.abs(got_l[~lonely] - want_lse[~lonely]).max()) if (~lonely).any() else 0.0
    return e_o, e_l

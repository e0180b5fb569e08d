"""DSA Lightning Indexer over a paged MXFP8 key cache: the cache layout, `indexer_cache_write`
and `lightning_indexer` (research/dsa.md §1.2-1.4, §3.3, §4.5).

INDEXER KEY CACHE (one per layer): a uint8 tensor [num_pages, 8448], contiguous. A page holds
PAGE = 64 tokens; slot = page * 64 + offset (offset = slot % 64). Per token: 128 E4M3 codes of the
key (after LayerNorm, RoPE, Hadamard) and 4 E8M0 scale bytes, one per group of 32 dims (MXFP8,
scale 2^(byte - 127)). The page is BLOCK-SPLIT, not token-interleaved:

    bytes [0, 8192)          codes, token-major: token i's dim d at byte i * 128 + d
    bytes [8192, 8448)       scales, token-major: token i's group g at byte 8192 + i * 4 + g

so the 64 x 128 code tile and the 64 x 4 scale tile of a page are each contiguous (one load
each). `indexer_cache_views(cache)` gives the two strided views the kernels read:
codes float8_e4m3fn [P, 64, 128] and scales float8_e8m0fnu [P, 64, 4] (page stride 8448).
Reads go through block tables [B, max_pages] int32 (logical block j of sequence b lives in page
block_table[b, j]; pages need not be contiguous or ordered). Byte offsets are i32: a cache must
stay below 2^31 bytes (254,000 pages, 16M tokens) per layer.

SCORES (per query token t, key position s of t's sequence, heads j, groups g of 32 dims):

    I[t, s] = sum_j w[t, j] * ReLU( sum_g s_q[t, j, g] * s_k[s, g] * (q8[t, j, g] . k8[s, g]) )

q8/k8 the E4M3 codes, s_q/s_k the E8M0 scales. The per-group scale products sit inside the ReLU,
so they cannot be folded into w (research §4.5); each 32-wide group is one k.dot (fp8 operands,
fp32 accumulate) scaled by the outer product of the two scale vectors. Positions outside
[ks[t], ke[t]) score -inf. Power-of-two scales make the scaling exact unless a product leaves the
fp32 range (|scale product| < 2^-126), which normal activations never reach.

`indexer_query` + `indexer_page_scores` (the @k.funcs below) are the scoring of a block of query
tokens against pages of keys; the fused LI+SFA decode kernel calls them too.
"""
from __future__ import annotations

import functools

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import cache_slots, config_for, int32_tensor, next_pow2, require_tensor, resolve_target

PAGE = 64                      # tokens per page
HEAD_DIM = 128                 # indexer head dim
GROUPS = HEAD_DIM // 32        # MXFP8 groups per key / per (token, head)
CODE_BYTES = PAGE * HEAD_DIM   # 8192: the code block of a page
PAGE_BYTES = PAGE * (HEAD_DIM + GROUPS)   # 8448
TOKEN_BYTES = HEAD_DIM + GROUPS           # 132


# ---------------------------------------------------------------- scoring helpers (@k.func)

@k.func
def indexer_query(q_codes, q_scales, weights, t0, NQ, H):
    """Query tokens t0 .. t0+NQ-1 (all heads) as the operands of `indexer_page_scores`: four code
    tiles [NQ*H, 32] (one per MX group), their scales [NQ*H] f32 and the head weights [NQ*H].
    Rows past the end of the tensors read code 0 / weight 0 (their scores are 0, masked later)."""
    M = NQ * H
    q0 = k.reshape(q_codes[k.span(t0, NQ), k.span(0, H), k.span(0, 32, other=0.0)], (M, 32))
    q1 = k.reshape(q_codes[k.span(t0, NQ), k.span(0, H), k.span(32, 32, other=0.0)], (M, 32))
    q2 = k.reshape(q_codes[k.span(t0, NQ), k.span(0, H), k.span(64, 32, other=0.0)], (M, 32))
    q3 = k.reshape(q_codes[k.span(t0, NQ), k.span(0, H), k.span(96, 32, other=0.0)], (M, 32))
    s0 = k.reshape(k.load(q_scales, (k.span(t0, NQ), k.span(0, H), 0), other=1.0).to(k.f32), (M,))
    s1 = k.reshape(k.load(q_scales, (k.span(t0, NQ), k.span(0, H), 1), other=1.0).to(k.f32), (M,))
    s2 = k.reshape(k.load(q_scales, (k.span(t0, NQ), k.span(0, H), 2), other=1.0).to(k.f32), (M,))
    s3 = k.reshape(k.load(q_scales, (k.span(t0, NQ), k.span(0, H), 3), other=1.0).to(k.f32), (M,))
    w = k.reshape(weights[k.span(t0, NQ), k.span(0, H, other=0.0)], (M,))
    return q0, q1, q2, q3, s0, s1, s2, s3, w


@k.func
def _group_logits(qg, sg, kc, ksc, pages, g, BS):
    # one MX group: fp8 dot [M, 32] x [32, BS], then the exact power-of-two scale products
    kg = k.reshape(kc[pages, k.span(0, 64), k.span(g * 32, 32, other=0.0)], (BS, 32))
    skg = k.reshape(k.load(ksc, (pages, k.span(ksc.shape[1] - PAGE, PAGE), g), other=1.0).to(k.f32), (BS,))
    return k.dot(qg, kg.T) * sg[:, None] * skg[None, :]


@k.func
def indexer_page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, NQ, H, PB):
    """Scores [NQ, PB*64] of the query block (from `indexer_query`) against the keys of the PB
    pages `pages` (an i32 index tile [PB] into the cache views; out-of-range pages read code 0).
    Column i is token i % 64 of page pages[i // 64]."""
    BS = PB * 64
    acc = _group_logits(q0, s0, kc, ksc, pages, 0, BS)
    acc += _group_logits(q1, s1, kc, ksc, pages, 1, BS)
    acc += _group_logits(q2, s2, kc, ksc, pages, 2, BS)
    acc += _group_logits(q3, s3, kc, ksc, pages, 3, BS)
    r = k.relu(acc) * w[:, None]
    return k.sum(k.reshape(r, (NQ, H, BS)), axis=1)


# ---------------------------------------------------------------- kernels

@k.func
def store_keys(cache, slots, codes, scales, BT):
    """Write BT tokens' codes (f8e4m3 [BT, 128]) and scales (e8m0 [BT, 4]) into the flat byte
    view of the indexer cache at `slots` (i32 [BT]; < 0 skips the token)."""
    ok = slots >= 0
    base = (slots // PAGE) * PAGE_BYTES
    off = slots % PAGE
    cidx = k.reshape(base[:, None] + off[:, None] * 128 + k.arange(128)[None, :], (BT * 128,))
    k.store(cache, (cidx,), k.reshape(codes.bitcast(k.u8), (BT * 128,)),
            mask=k.reshape(k.broadcast_to(ok[:, None], (BT, 128)), (BT * 128,)))
    sidx = k.reshape(base[:, None] + CODE_BYTES + off[:, None] * 4 + k.arange(4)[None, :], (BT * 4,))
    k.store(cache, (sidx,), k.reshape(scales.bitcast(k.u8), (BT * 4,)),
            mask=k.reshape(k.broadcast_to(ok[:, None], (BT, 4)), (BT * 4,)))


@k.kernel
def indexer_cache_write_rows(k_codes: k.Tensor[k.f8e4m3, "T", "128"], k_scales: k.Tensor[k.e8m0, "T", "4"],
                             slots: k.Tensor[k.i32, "T"], cache: k.Tensor[k.u8, "NB"], BT: k.constexpr = 16):
    for pt in k.grid(k.cdiv(k_codes.shape[0], BT)):
        store_keys(cache, slots[k.span(pt * BT, BT, other=-1)], k_codes[k.span(pt * BT, BT), k.span(0, 128)],
                   k_scales[k.span(pt * BT, BT), k.span(0, 4)], BT)



# The bf16 variant: a power-of-two scale times an E4M3 code is exact in bf16 (4 significant bits,
# the fp32 exponent range), so each operand can be dequantized once — the keys once per page for
# all heads instead of scaling every (head, key) logit per group — and scored with one K=128 bf16
# dot. Same products, fp32 accumulation in another order. (Exact unless a scaled value falls
# below 2^-126, far outside activations.)

@k.func
def indexer_query_bf16(q_codes, q_scales, weights, t0, NQ, H):
    """Query tokens t0 .. t0+NQ-1 as (dequantized values bf16 [NQ*H, 128], head weights [NQ*H])."""
    M = NQ * H
    c = k.reshape(q_codes[k.span(t0, NQ), k.span(0, H), k.span(0, 128, other=0.0)], (M, 4, 32)).to(k.f32)
    sc = k.reshape(k.load(q_scales, (k.span(t0, NQ), k.span(0, H), k.span(0, 4)), other=1.0).to(k.f32), (M, 4))
    w = k.reshape(weights[k.span(t0, NQ), k.span(0, H, other=0.0)], (M,))
    return k.reshape((c * sc[:, :, None]).to(k.bf16), (M, 128)), w


@k.func
def page_keys_bf16(kc, ksc, pages, BS):
    """The keys of the PB = BS / 64 pages `pages`, dequantized exactly: bf16 [BS, 128]."""
    c = k.reshape(kc[pages, k.span(0, 64), k.span(0, 128, other=0.0)], (BS, 4, 32)).to(k.f32)
    last = ksc.shape[1] - PAGE                        # a page's scales: its last 64 scale rows
    sc = k.reshape(k.load(ksc, (pages, k.span(last, PAGE), k.span(0, 4)), other=0.0).to(k.f32), (BS, 4))
    return k.reshape((c * sc[:, :, None]).to(k.bf16), (BS, 128))


@k.func
def indexer_page_scores_bf16(qd, w, kc, ksc, pages, NQ, H, PB):
    """Like `indexer_page_scores` from `indexer_query_bf16`'s operands: scores [NQ, PB*64]."""
    BS = PB * 64
    kd = page_keys_bf16(kc, ksc, pages, BS)
    r = k.relu(k.dot(qd, kd.T)) * w[:, None]
    return k.sum(k.reshape(r, (NQ, H, BS)), axis=1)


@k.func
def indexer_page_scores_keys_major(qd, w, kc, ksc, pages, NQ, H, PB):
    """`indexer_page_scores_bf16` with the keys as the dot's rows: logits [PB*64, NQ*H], so the
    sum over heads runs along the MMA's columns (inside a thread and its quad: no cross-warp
    reduction per page), and the dequantized key tile can feed the MMA from registers."""
    BS = PB * 64
    kd = page_keys_bf16(kc, ksc, pages, BS)
    r = k.relu(k.dot(kd, qd.T)) * w[None, :]
    return k.sum(k.reshape(r, (BS, NQ, H)), axis=2).T


# The f16 variant (F16) of the dequantized scoring: E4M3 -> f16 is one packed conversion per two
# codes (-> bf16 goes through f16 and f32: three instructions per code plus the scale multiply).
# f16 lacks bf16's exponent range, so each token's (and each query head's) four group scales are
# split into their largest power of two 2^E and the ratios 2^(e_g - E) <= 1: the codes times the
# ratios are exact in f16 (down to ratios of ~2^-15, below which a code's low bits fall under f16's
# subnormals), and 2^E, a positive factor, moves out of the ReLU: onto the head weights for the
# queries and onto each key's summed score for the keys.

@k.func
def split_scales(codes, scales, M):
    """codes E4M3 [M, 128] and their E8M0 scales [M, 4] -> (codes * 2^(e_g - E) as f16 [M, 128],
    2^E as f32 [M] with E the largest of the row's four exponents; NaN for a NaN scale)."""
    eb = scales.bitcast(k.u8).to(k.i32)
    top = k.max(eb, axis=1)
    # max(e - top, -126) as max(e, top - 126) - top: a min / max of no difference needs no guard on
    # the Triton target (gpu_guards.may_be_negation)
    ratio = ((k.maximum(eb, top[:, None] - 126) - top[:, None] + 127) << 23).bitcast(k.f32).to(k.f16)
    c = k.reshape(codes, (M, 4, 32)).to(k.f16) * ratio[:, :, None]
    return k.reshape(c, (M, 128)), top.to(k.u8).bitcast(k.e8m0).to(k.f32)


@k.func
def indexer_query_f16(q_codes, q_scales, weights, t0, NQ, H):
    """Query tokens t0 .. t0+NQ-1 as (f16 codes scaled by their scale ratios, transposed: [128,
    NQ*H], the dot's right operand as is; head weights times each head's 2^E [NQ*H]). Transposed
    here, before the key loop: with the transpose at the dot inside the loop, Triton 3.9 re-stores
    the operand to shared memory every page (sm_90a: 8 STS.128, a barrier and 32 registers held
    live, so the 128-register cap spills 14 loads and stores per page; hoisted: the loop 444 -> 403
    instructions, 6 -> 4 barriers, no spill). On the H200 (Triton 3.6) the time is the same
    either way: 0.130 / 0.257 ms at B=64 L=32K / B=32 L=128K (results/indexer_sweep_caps_hoist.md)."""
    M = NQ * H
    c = k.reshape(q_codes[k.span(t0, NQ), k.span(0, H), k.span(0, 128, other=0.0)], (M, 128))
    sc = k.reshape(k.load(q_scales, (k.span(t0, NQ), k.span(0, H), k.span(0, 4)), other=1.0), (M, 4))
    qh, qf = split_scales(c, sc, M)
    return qh.T, k.reshape(weights[k.span(t0, NQ), k.span(0, H, other=0.0)], (M,)) * qf


@k.func
def page_scales(ksc, pages, PB):
    """The E8M0 scales [PB*64, 4] of the keys of `pages`. A byte tile cannot be an async copy (4
    bytes at least), so the pipeliner leaves it a synchronous load; the key loop loads it one block
    ahead instead, from page numbers loaded two ahead. Pages past the cache read byte 0 (2^-127)
    beside codes of 0, so their scores are 0 as with any scale; a zero fill spares the Triton
    target the select a nonzero byte fill costs (1.7 % of the decode indexer on the H200)."""
    return k.reshape(k.load(ksc, (pages, k.span(ksc.shape[1] - PAGE, PAGE), k.span(0, 4)), other=0.0), (PB * 64, 4))


@k.func
def indexer_page_scores_f16(qh, w, kc, sc, pages, NQ, H, PB):
    """`indexer_page_scores_keys_major` on `indexer_query_f16`'s operands (qh already [128, NQ*H])
    and f16 keys (sc: their scales, `page_scales`): logits [PB*64, NQ*H] from one K=128 f16 dot,
    ReLU, head weights, the sum over heads, then each key's 2^E -> scores [NQ, PB*64]."""
    BS = PB * 64
    c = k.reshape(kc[pages, k.span(0, 64), k.span(0, 128, other=0.0)], (BS, 128))
    kh, kf = split_scales(c, sc, BS)
    r = k.relu(k.dot(kh, qh)) * w[None, :]
    return (k.sum(k.reshape(r, (BS, NQ, H)), axis=2) * kf[:, None]).T


# The decode indexer with dequantized scoring at 64 heads: f16 operands (F16, keys-major), one page
# per step, 4 warps, 5 pipeline stages, at most 128 registers (sm_90a: four programs per SM; the
# loop 598 -> 444 instructions per page against the bf16 operands). H200 (probes/indexer_sweep.py;
# NOTES, DSA indexer): B=64 L=32K 0.128 ms, B=32 L=128K 0.248, against 0.138 / 0.276 with bf16
# operands (3 or 4 stages: 0.145 / 0.283); bf16 uncapped 0.152 at 384 programs, 0.182 at 3 stages;
# the best heads-major config 0.250. Tried and taken out: the key scales as one i32 word per token
# (0.169 ms). The next page's scale bytes loaded during this page (`page_scales`; Nsight's PC
# samples had 21 % of the kernel's stalls on their synchronous load): 0.131 -> 0.122 ms at B=64
# L=32K, 0.257 -> 0.241 at B=32 L=128K (results/indexer_sweep_stages_sp_*.md); their page numbers
# loaded two pages ahead (the scale address no longer waits on a block-table load): 0.1207 ->
# 0.1192 / 0.2385 -> 0.236 (results/indexer_sweep_stages_pa_*.md).
DECODE_BF16 = {"NQ": 1, "PB": 1, "KEYS_MAJOR": True, "F16": True, "num_warps": 4, "num_stages": 5, "maxnreg": 128}
DECODE_BF16_PER_SM = 4

# (NQ query tokens, PB pages) per program -> warps. Decode fixes NQ/PB from the tokens per
# sequence (these then only set num_warps); prefill lets the autotuner choose among all of them.
# M = NQ * 64 rows of the dot, one warpgroup per 64 rows.
# KEYS_MAJOR and F16 (bf16 scoring only; the fp8 path ignores them): the keys on the dot's rows:
# sm_90a, NQ 1: 20 -> 10 barriers and 80 -> 4 shuffles per kernel, 128 -> 158 registers at PB 1.
# DECODE_BF16 is a config too, so the prefill tuner tries it (12:56 session: 7.42 ms at T=16384
# against 6.88 for NQ 2 / KEYS_MAJOR), and so is the f16 form of that winner.
# Graph-program calls (the model) are not tuned: they launch with the first entry their constexprs
# match, so DECODE_BF16 comes before the other one-token one-page entries.
LI_CONFIGS = [{"NQ": 1, "PB": 2, "num_warps": 4}, DECODE_BF16, {"NQ": 1, "PB": 1, "num_warps": 4},
              {"NQ": 2, "PB": 2, "num_warps": 8}, {"NQ": 2, "PB": 1, "num_warps": 4},
              {"NQ": 4, "PB": 1, "num_warps": 8},
              {"NQ": 1, "PB": 1, "KEYS_MAJOR": True, "num_warps": 4},
              {"NQ": 1, "PB": 2, "KEYS_MAJOR": True, "num_warps": 4},
              {"NQ": 1, "PB": 2, "KEYS_MAJOR": True, "num_warps": 8},
              {"NQ": 2, "PB": 1, "KEYS_MAJOR": True, "num_warps": 4},
              {"NQ": 2, "PB": 1, "KEYS_MAJOR": True, "F16": True, "num_warps": 4}]
PREFILL_F16 = {"NQ": 2, "PB": 1, "KEYS_MAJOR": True, "F16": True}     # the T = 16384 winner (6.56 ms)


@k.kernel(configs=LI_CONFIGS)
def lightning_indexer_paged(q_codes: k.Tensor[k.f8e4m3, "T", "H", "D"], q_scales: k.Tensor[k.e8m0, "T", "H", "D // 32"],
                            weights: k.Tensor[k.f32, "T", "H"], kc: k.Tensor[k.f8e4m3, "P", "PG", "D"],
                            ksc: k.Tensor[k.e8m0, "P", "PS", "D // 32", k.aligned(4)], block_table: k.Tensor[k.i32, "B", "MP"],
                            ks: k.Tensor[k.i32, "T"], ke: k.Tensor[k.i32, "T"], scores: k.Tensor[k.f32, "T", "L"],
                            n_per_seq: k.i32, nsplit: k.i32,
                            H: k.constexpr = 64, NQ: k.constexpr = 1, PB: k.constexpr = 1,
                            MMA_BF16: k.constexpr = False, KEYS_MAJOR: k.constexpr = False,
                            F16: k.constexpr = False):
    # kc / ksc: indexer_cache_views' strided views or indexer_page_views' whole pages (scale rows
    # taken from the end of each page). Program (b, qb, sp): tokens b*n + qb*NQ .. (+NQ) of
    # sequence b against the key blocks of split sp. Only blocks that hold some [ks, ke) position
    # are scored; the rest are filled with -inf (no runtime branches in the DSL: three loops with
    # computed bounds).
    BS = PB * 64
    for b, qb, sp in k.grid(block_table.shape[0], k.cdiv(n_per_seq, NQ), nsplit):
        j = qb * NQ + k.arange(NQ)
        tmask = j < n_per_seq
        t0 = b * n_per_seq + qb * NQ
        lo_t = k.load(ks, (k.span(t0, NQ),), mask=tmask, other=0)
        hi_t = k.load(ke, (k.span(t0, NQ),), mask=tmask, other=0)
        lo = k.maximum(k.min(k.where(tmask, lo_t, 2147483647)), 0)
        hi = k.minimum(k.max(k.where(tmask, hi_t, 0)), scores.shape[1])
        nblk = k.cdiv(scores.shape[1], BS)
        per = k.cdiv(nblk, nsplit)
        a = sp * per
        z = k.minimum(a + per, nblk)
        blo = lo // BS
        bhi = k.maximum(k.cdiv(hi, BS), blo)
        ninf = k.full((NQ, BS), float("-inf"), k.f32)
        for kb in range(a, k.minimum(z, blo)):
            k.store(scores, (k.span(t0, NQ), k.span(kb * BS, BS)), ninf, mask=tmask[:, None])
        for kb in range(k.maximum(a, bhi), z):
            k.store(scores, (k.span(t0, NQ), k.span(kb * BS, BS)), ninf, mask=tmask[:, None])
        if MMA_BF16 and F16:
            qd, w = indexer_query_f16(q_codes, q_scales, weights, t0, NQ, H)
            kb0 = k.maximum(a, blo)
            ksc_ahead = page_scales(ksc, block_table[b, k.span(kb0 * PB, PB, other=-1)], PB)
            pages_ahead = block_table[b, k.span(kb0 * PB + PB, PB, other=-1)]
        elif MMA_BF16:
            qd, w = indexer_query_bf16(q_codes, q_scales, weights, t0, NQ, H)
        else:
            q0, q1, q2, q3, s0, s1, s2, s3, w = indexer_query(q_codes, q_scales, weights, t0, NQ, H)
        for kb in range(k.maximum(a, blo), k.minimum(z, bhi)):
            pages = block_table[b, k.span(kb * PB, PB, other=-1)]
            if MMA_BF16:
                if F16:             # keys-major too; the next block's scales loaded during this one
                    # (`pages` is loaded here again, not carried from pages_ahead: the code gather's
                    # cp.async pipelining is keyed to an index load in the same iteration)
                    ksc_now = ksc_ahead
                    ksc_ahead = page_scales(ksc, pages_ahead, PB)
                    pages_ahead = block_table[b, k.span(kb * PB + 2 * PB, PB, other=-1)]
                    sc = indexer_page_scores_f16(qd, w, kc, ksc_now, pages, NQ, H, PB)
                elif KEYS_MAJOR:
                    sc = indexer_page_scores_keys_major(qd, w, kc, ksc, pages, NQ, H, PB)
                else:
                    sc = indexer_page_scores_bf16(qd, w, kc, ksc, pages, NQ, H, PB)
            else:
                sc = indexer_page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, NQ, H, PB)
            pos = kb * BS + k.arange(BS)
            ok = (pos[None, :] >= lo_t[:, None]) & (pos[None, :] < hi_t[:, None])
            k.store(scores, (k.span(t0, NQ), k.span(kb * BS, BS)), k.where(ok, sc, float("-inf")),
                    mask=tmask[:, None])


# ksc carries k.aligned(4): a token's four scale bytes are one aligned 4-byte word in both views
# (row stride 4, page stride 8448), which the JIT cannot see (4 is no multiple of 16), so each
# thread loaded its scale bytes one by one. With it (sm_90a): 6 LDG.U8 -> 2 LDG.U8 + 2 LDG.U16,
# 1536 -> 1512 instructions; H200 0.1146 -> 0.1106 ms at B=64 L=32K, 0.2279 -> 0.2187 at B=32
# L=128K (new, old, new; results/indexer_sweep_stages_ksc_*.json). The fused kernel's ksc is left
# without it until it is timed (a prologue change can reorder a loop: NOTES, the SFA value pass).

# Multiply-add contraction on Triton for lightning_indexer's launches: the head weights' products
# and the head sum's adds become FFMAs (sm_90a, the decode config: 425 -> 394 SASS per page, -7 %).
# H200: 0.1182 -> 0.1172 ms at B=64 L=32K, 0.2352 -> 0.2319 at B=32 L=128K (-1 %, two runs each,
# results/indexer_sweep_fp_fusion.md): the loop is less issue-bound than its count suggests. Off:
# for 1 % the unfused scores would round differently from the fused kernel's and the model's
# graph calls (near-tie selections could then differ between paths); the switch stays for A/Bs.
FP_FUSION = False


def paged_kernel(target: str):
    """lightning_indexer_paged for `target`, with multiply-add contraction on Triton when FP_FUSION."""
    return lightning_indexer_paged.compile(target, fp_fusion=True) if target == "triton" and FP_FUSION \
        else lightning_indexer_paged[target]


# ---------------------------------------------------------------- public functions

def new_indexer_cache(num_pages: int, device=None):
    """An all-zero indexer key cache: uint8 [num_pages, 8448] (layout in the module docstring)."""
    import torch
    if not (isinstance(num_pages, int) and num_pages > 0):
        raise K31Error(f"new_indexer_cache: num_pages must be a positive int, got {num_pages!r}")
    return torch.zeros((num_pages, PAGE_BYTES), dtype=torch.uint8, device=device)


def _check_cache(op: str, cache):
    import torch
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8 or cache.dim() != 2 \
            or cache.shape[1] != PAGE_BYTES or not cache.is_contiguous():
        got = f"{str(cache.dtype).replace('torch.', '')} {list(cache.shape)}" if isinstance(cache, torch.Tensor) \
            else type(cache).__name__
        raise K31Error(f"{op}: `cache` must be a contiguous uint8 tensor [num_pages, {PAGE_BYTES}], got {got}",
                       hint="allocate it with k31dsl.ops.dsa.new_indexer_cache(num_pages)")
    if cache.numel() >= 2 ** 31:
        raise K31Error(f"{op}: the cache has {cache.numel()} bytes; byte offsets are int32 (< 2^31)",
                       hint="use fewer pages per cache tensor")


def check_max_len(op: str, max_len, block_table) -> None:
    """max_len, the scored key width, is an int in [0, max_pages * 64]."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 0 <= max_len <= block_table.shape[1] * PAGE:
        raise K31Error(f"{op}: max_len={max_len!r} must be an int in [0, max_pages * {PAGE}]")


def indexer_cache_views(cache):
    """(codes float8_e4m3fn [P, 64, 128], scales float8_e8m0fnu [P, 64, 4]): strided views of the
    block-split pages (no copy)."""
    import torch
    _check_cache("indexer_cache_views", cache)
    p = cache.shape[0]
    codes = cache[:, :CODE_BYTES].view(torch.float8_e4m3fn).view(p, PAGE, HEAD_DIM)
    scales = cache[:, CODE_BYTES:].view(torch.float8_e8m0fnu).view(p, PAGE, GROUPS)
    return codes, scales


def indexer_page_views(cache):
    """(codes float8_e4m3fn [P, 66, 128], scales float8_e8m0fnu [P, 2112, 4]): each whole page as
    a contiguous typed view (no copy); a page's codes are its first 64 code rows, its scales its
    last 64 scale rows. lightning_indexer_paged reads these as it reads indexer_cache_views' (it
    takes the scale rows from the end): the form for graph programs, which pass whole tensors."""
    import torch
    _check_cache("indexer_page_views", cache)
    p = cache.shape[0]
    return (cache.view(torch.float8_e4m3fn).view(p, PAGE_BYTES // HEAD_DIM, HEAD_DIM),
            cache.view(torch.float8_e8m0fnu).view(p, PAGE_BYTES // GROUPS, GROUPS))


def indexer_cache_write(cache, k_codes, k_scales, slot_mapping, *, target: str | None = None):
    """Write keys into the paged cache in place: token t's 128 codes and 4 scale bytes go to slot
    slot_mapping[t] (page slot // 64, offset slot % 64); slots < 0 (padding) are skipped.
    k_codes float8_e4m3fn [T, 128], k_scales float8_e8m0fnu [T, 4], slot_mapping int32 [T].
    Duplicate slots: one of the writers wins. Returns `cache`."""
    target = resolve_target(target)
    op = "indexer_cache_write"
    _check_cache(op, cache)
    require_tensor(op, "k_codes", k_codes, (k.f8e4m3,))
    require_tensor(op, "k_scales", k_scales, (k.e8m0,))
    if k_codes.dim() != 2 or k_codes.shape[1] != HEAD_DIM:
        raise K31Error(f"{op}: `k_codes` must have shape [T, {HEAD_DIM}], got {list(k_codes.shape)}")
    t = k_codes.shape[0]
    if tuple(k_scales.shape) != (t, GROUPS):
        raise K31Error(f"{op}: `k_scales` must have shape [{t}, {GROUPS}], got {list(k_scales.shape)}")
    slots = cache_slots(op, slot_mapping, t, cache.shape[0], PAGE)
    if t:
        indexer_cache_write_rows[target](k_codes.contiguous(), k_scales.contiguous(), slots, cache.view(-1))
    return cache


SM_COUNT = 132                      # H200; the GPU's own count is used when there is one


def _li_config(n: int, h: int, mma: str) -> dict:
    """Tokens per program NQ (rows NQ*64 of the dot) and pages per step PB for decode: all n <= 4
    tokens of a sequence share each key page they load. One token per sequence with bf16 scoring
    at 64 heads pins DECODE_BF16 (the split count is then chosen for its occupancy); otherwise
    NQ = 1 leaves PB to the Triton runtime, which on a GPU tunes between the NQ = 1 configs
    (elsewhere the first). Prefill (n > 4) fixes nothing: the runtime tunes over every config."""
    if n == 1:
        return dict(DECODE_BF16) if mma == "bf16" and h == 64 else {"NQ": 1}
    if n <= 4:
        nq = next_pow2(n)
        return {"NQ": nq, "PB": 1 if nq == 4 else 2}
    return {}


def split_count(cfg: dict, b: int, n: int, max_len: int, sms: int = SM_COUNT) -> int:
    """Key splits of a call with config `cfg` over b sequences of n tokens and max_len keys: for
    DECODE_BF16 (known occupancy) whole waves (key_splits), else ~512 programs in all."""
    blocks = -(-max_len // (PAGE * cfg.get("PB", 1)))
    progs = b * -(-n // cfg.get("NQ", 1))
    if all(cfg.get(k_) == v for k_, v in DECODE_BF16.items() if k_ != "num_stages"):
        # (a config that overrides maxnreg is another occupancy: it gets the generic split below)
        return key_splits(progs, blocks, sms * DECODE_BF16_PER_SM)
    return max(1, min(blocks, -(-512 // progs)))      # counted for NQ = 1 in prefill


def graph_config(b: int, n: int, max_len: int, sms: int = SM_COUNT) -> tuple[dict, int]:
    """(constexprs, key splits) of a graph-program call of lightning_indexer_paged on a GPU (the
    model's step graphs) over b sequences of n tokens: f16 keys-major scoring, DECODE_BF16 for one
    token, PREFILL_F16 for more. Constexprs only: a graph call launches with the first config they
    match, so DECODE_BF16's stages and register cap come with it."""
    from k31dsl.targets.triton.emit import LAUNCH_KEYS
    cfg = DECODE_BF16 if n == 1 else PREFILL_F16
    return ({"MMA_BF16": True, **{key: val for key, val in cfg.items() if key not in LAUNCH_KEYS}},
            split_count(cfg, b, n, max_len, sms))


@functools.lru_cache(maxsize=256)
def key_splits(programs: int, blocks: int, slots: int, setup_blocks: int = 2) -> int:
    """Key splits per program row so that the grid fills whole waves: the split count s minimising
    waves(s) * (blocks per program + setup), where a program scores per = cdiv(blocks, s) key
    blocks, cdiv(blocks, per) programs per row have work and `slots` programs run at once. Ties go
    to fewer splits. (At three programs per SM on 132 SMs, 512 programs are 1.3 waves: 0.245 ms
    against 0.180 at 384.)"""
    best, best_cost = 1, None
    for s_ in range(1, max(1, min(blocks, 4 * -(-slots // programs))) + 1):     # up to 4 waves' worth
        per = -(-blocks // s_)
        if s_ > 1 and -(-blocks // per) < s_:        # same split as a smaller count: skip
            continue
        waves = -(-programs * -(-blocks // per) // slots)
        cost = waves * (per + setup_blocks)
        if best_cost is None or cost < best_cost:
            best, best_cost = s_, cost
    return best


def resolve_mma(op: str, mma, target: str, device) -> str:
    """The indexer scoring an `mma` argument names: "fp8" or "bf16" as given; "auto" (the ops'
    default) is "bf16" for the Triton target on a CUDA device, where it is the faster one (the DSA
    decode step on an H200, results/dsa.md: 0.418 against 0.709 ms at B=64 L=32K, 0.449 against 1.02
    at B=32 L=128K; the fused kernel gains too), else "fp8". Both are exact products of the codes;
    they differ in fp32 summation order only."""
    if mma not in ("auto", "fp8", "bf16"):
        raise K31Error(f"{op}: mma={mma!r} must be \"auto\", \"fp8\" or \"bf16\"")
    if mma == "auto":
        return "bf16" if target == "triton" and getattr(device, "type", None) == "cuda" else "fp8"
    return mma


def lightning_indexer(q_codes, q_scales, cache, block_table, weights, ks, ke, max_len: int | None = None, *,
                      mma: str = "auto", nsplit: int | None = None, config: dict | None = None,
                      target: str | None = None):
    """Indexer scores over the paged MXFP8 key cache -> fp32 [T, max_len].

    q_codes float8_e4m3fn [T, H, 128], q_scales float8_e8m0fnu [T, H, 4] (MXFP8 of the rotated
    queries), weights fp32 [T, H] (head weights), block_table int32 [B, max_pages], ks/ke int32 [T]
    (each token's key range [ks, ke) in logical positions of its sequence). T = B * n: tokens
    b*n .. b*n+n-1 belong to sequence b (n = 1..4 query tokens per sequence in decode with
    speculative drafts; B = 1, n = T for one prefill sequence). max_len defaults to
    max_pages * 64. Positions outside [ks, ke) score -inf. mma="auto" (default): "bf16" for Triton
    on a GPU, else "fp8" (`resolve_mma`). mma="fp8": four fp8 dots (K=32) per page,
    scale products applied to the logits; "bf16": operands dequantized exactly, one K=128 dot (fewer
    CUDA-core operations per key; the benchmark compares them): as bf16, or with F16 (the one-token
    decode config) as f16 codes times their scale ratios, each row's largest scale applied after the
    ReLU. `config` pins kernel constexprs (e.g. {"PB": 1, "KEYS_MAJOR": True, "F16": False}); by
    default decode fixes NQ (and PB for drafts) and the GPU tuner chooses the rest."""
    import torch
    target = resolve_target(target)
    op = "lightning_indexer"
    _check_cache(op, cache)
    require_tensor(op, "q_codes", q_codes, (k.f8e4m3,))
    require_tensor(op, "q_scales", q_scales, (k.e8m0,))
    require_tensor(op, "weights", weights, (k.f32,))
    if q_codes.dim() != 3 or q_codes.shape[2] != HEAD_DIM:
        raise K31Error(f"{op}: `q_codes` must have shape [T, H, {HEAD_DIM}], got {list(q_codes.shape)}")
    t, h = q_codes.shape[0], q_codes.shape[1]
    if h & (h - 1) or not 16 <= h <= 128:
        raise K31Error(f"{op}: {h} heads; the indexer needs a power of two between 16 and 128")
    if tuple(q_scales.shape) != (t, h, GROUPS):
        raise K31Error(f"{op}: `q_scales` must have shape [{t}, {h}, {GROUPS}], got {list(q_scales.shape)}")
    if tuple(weights.shape) != (t, h):
        raise K31Error(f"{op}: `weights` must have shape [{t}, {h}], got {list(weights.shape)}")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise K31Error(f"{op}: `block_table` must be an int32 tensor [B, max_pages], got "
                       f"{getattr(block_table, 'dtype', type(block_table).__name__)} "
                       f"{list(getattr(block_table, 'shape', []))}")
    b = block_table.shape[0]
    if b == 0 or t % b:
        raise K31Error(f"{op}: {t} query tokens do not split evenly over the {b} sequences of `block_table`",
                       hint="pass n query tokens per sequence, sequence-major (T = B * n)")
    ks, ke = int32_tensor(op, "ks", ks, 1, t), int32_tensor(op, "ke", ke, 1, t)
    mma = resolve_mma(op, mma, target, q_codes.device)
    if max_len is None:
        max_len = block_table.shape[1] * PAGE
    check_max_len(op, max_len, block_table)
    scores = torch.empty((t, max_len), dtype=torch.float32, device=q_codes.device)
    if t == 0 or max_len == 0:
        return scores
    n = t // b
    cfg = _li_config(n, h, mma)
    if mma == "fp8":                  # KEYS_MAJOR and F16 are bf16-scoring choices: not configs to tune here
        cfg["KEYS_MAJOR"] = cfg["F16"] = False
    if config:
        from k31dsl.targets.triton.emit import LAUNCH_KEYS
        allowed = ("NQ", "PB", "KEYS_MAJOR", "F16") + LAUNCH_KEYS
        unknown = set(config) - set(allowed)
        if unknown:
            raise K31Error(f"{op}: config keys {sorted(unknown)} are not indexer constexprs or launch options "
                           f"({', '.join(allowed)})")
        cfg = {**cfg, **config}
    if nsplit is None:
        sms = torch.cuda.get_device_properties(q_codes.device).multi_processor_count if q_codes.is_cuda else SM_COUNT
        nsplit = split_count(cfg, b, n, max_len, sms)
    kc, ksc = indexer_cache_views(cache)
    paged_kernel(target)(q_codes.contiguous(), q_scales.contiguous(), weights.contiguous(), kc, ksc,
                         block_table.contiguous(), ks, ke, scores, n, int(nsplit), H=h, **config_for(target, cfg),
                         **({"MMA_BF16": True} if mma == "bf16" else {}))
    return scores

"""Fused Lightning Indexer + top-k + sparse MLA attention for decode (`fused_li_sfa`), and the
unfused path it must agree with (`li_sfa_unfused`: lightning_indexer -> topk -> slots ->
sparse_mla_attention), with `li_sfa` choosing between them per shape.

DESIGN (one program per query token, or per (token, head block) for small batches; only o and
lse are outputs; a per-program scratch row of 2 * KP candidates is the one other global memory):
  1. select — the query's indexer operands (64 heads x 128, MXFP8) stay in registers; the keys of
     its range [ks, ke) are scored page by page straight from the paged MXFP8 key cache through
     the block table (indexer.indexer_page_scores, shared with lightning_indexer) in chunks of KC
     (256) scores. Each score becomes topk.py's order-preserving int32 key; keys above the running
     threshold are appended to the program's candidate buffer (cumsum compaction, a scatter
     store; positions ascend along the buffer). When the next chunk might not fit (n > 2*KP - KC)
     the buffer is cut back IN PLACE to its exact top-k by selection, no sort: a 32-step count
     search for the k-th largest key over the 2*KP-lane tile (topk.kth_in_tile), ties to the lower
     position by a cumsum over the equal keys, cumsum compaction; the threshold becomes that k-th
     key (a later key can only enter above it). A final cut leaves exactly min(topk, valid)
     winners, in position order — the set topk() selects.
     Scratch reads follow the writes of other threads of the program only after a block-wide
     reduction (`fence`: its barrier orders them on a GPU; the DSL has no barrier op).
  2. attend — the winners' positions are read back BK at a time, mapped to physical slots
     through the block table and attended exactly like sparse_mla_attention (same @k.funcs:
     per-128-tile scale folded into the score / probability tiles, online softmax).
Cost of the selection: per chunk a compare, a KC-lane cumsum and a masked store; per cut 32 block
reductions over 2*KP lanes (16 keys per thread at KP = 2048, 8 warps) plus two cumsums. Random
scores need ~k * ln(L / k) appends in all, i.e. a handful of cuts; keys ascending with position
(the worst case) one cut per (2*KP - k) / KC chunks. The earlier design merged every KP-key chunk
into a sorted running list with a 2*KP-wide k.topk, which Triton lowers to a sort with 1024 keys
per thread (~200 µs per merge on an H200; benchmarks/NOTES.md, DSA sections).

For tests the kernel can also write the selected logical positions (return_indices=True): the
same positions topk() returns, -1 padded.
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import int32_tensor, next_pow2, require_tensor, resolve_target
from k31dsl.ops.dsa import attention as A
from k31dsl.ops.dsa import slots as S
from k31dsl.ops.dsa.attention import CacheCodes, CacheRope, CacheScales, empty_online_state, finish, load_query, online_block
from k31dsl.ops.dsa.indexer import (indexer_page_scores, indexer_page_scores_bf16, indexer_query, indexer_query_bf16,
                                    resolve_mma)
from k31dsl.ops.dsa.topk import kth_in_tile, order_key, select_tile
from k31dsl.ops.registry import CaseResult, OpSpec, register

# One config (each specialisation compiles in ~30 s for sm_90).
FUSED_CONFIGS = [{"PB": 1, "BH": 64, "BK": 32, "num_warps": 8}]
# Longest context (keys per query) for which li_sfa picks the fused kernel by default: none. GPU
# run 3 (30 Nov, H200): fused 2.3x slower than unfused at L = 32K and 4.8x at 128K (each further
# 2048 keys cost one more merge in one program); results/dsa_short.md (1 Dec): slower at short
# contexts too, where it saves three launches: B=64 L=2048 0.573 ms against 0.317 (graph; bf16
# scoring 0.554 / 0.298), B=128 L=1024 0.627 against 0.348 (0.594 / 0.323). It stays as
# impl="fused".
FUSED_MAX_KEYS = 0
# Up to this many (token, head block) programs, each head block gets its own program (selection
# repeated per head block); beyond it one program per token does all head blocks. ~2 waves of
# an H200's 132 SMs.
HEAD_SPLIT_PROGRAMS = 264


INT_MIN = -2147483647 - 1


@k.func
def page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, HI, PB, MMA_BF16):
    """Scores [1, PB*64] of one query against the pages: fp8 dots per MX group, or (MMA_BF16) the
    operands dequantized exactly to bf16 and one K=128 dot (q0 holds the bf16 query then)."""
    if MMA_BF16:
        return indexer_page_scores_bf16(q0, w, kc, ksc, pages, 1, HI, PB)
    return indexer_page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, 1, HI, PB)


@k.func
def chunk_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, block_table, b, c, lo, hi, HI, KP, PB, MMA_BF16):
    """Scores [KP] of positions c*KP .. c*KP+KP-1 of sequence b (-inf outside [lo, hi))."""
    BS = PB * 64
    NSUB = KP // BS
    if NSUB == 1:
        pages = block_table[b, k.span(c * (KP // 64), PB, other=-1)]
        sc = k.reshape(page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, HI, PB, MMA_BF16), (KP,))
        pos = c * KP + k.arange(KP)
        return k.where((pos >= lo) & (pos < hi), sc, float("-inf"))
    rows = k.arange(NSUB)
    chunk = k.full((NSUB, BS), float("-inf"), k.f32)
    for u in range(NSUB):
        pages = block_table[b, k.span(c * (KP // 64) + u * PB, PB, other=-1)]
        sc = k.reshape(page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, HI, PB, MMA_BF16), (BS,))
        pos = c * KP + u * BS + k.arange(BS)
        sc = k.where((pos >= lo) & (pos < hi), sc, float("-inf"))
        chunk = k.where(rows[:, None] == u, sc[None, :], chunk)
    return k.reshape(chunk, (KP,))


@k.func
def fence(n, W):
    """n (in [0, W]) again, through a block-wide reduction of a W-lane tile: on a GPU all threads of
    the program meet at its barrier, so the scratch stores issued before it are visible to the
    loads after it that use the result (the DSL has no barrier op; a reduction is one)."""
    return k.sum((k.arange(W) < n).to(k.i32))


@k.func
def append_keys(cand_o, cand_p, g, n, thr, v, pos):
    """Append the scores v (positions pos, ascending, after every buffered one) whose order key
    is above thr to program g's buffer at columns n, n+1, ... (cumsum compaction); returns the
    new count. The count's reduction comes after the stores (see `fence`)."""
    okey = order_key(v)
    keep = okey > thr
    kept = keep.to(k.i32)
    dst = n + k.cumsum(kept, axis=0) - 1
    k.store(cand_o, (g, dst), okey, mask=keep)
    k.store(cand_p, (g, dst), pos, mask=keep)
    return n + k.sum(kept)


@k.func
def reselect(cand_o, cand_p, g, n, topk, CAP):
    """Reduce program g's candidate buffer (n entries, position order) to its top `topk` in place.
    Returns (entries kept, threshold order key: a later key enters only above it, the kept mask,
    their columns, positions and order keys as tiles over the CAP lanes)."""
    nn = fence(n, CAP)
    lane = k.arange(CAP)
    o = k.load(cand_o, (g, k.span(0, CAP)), mask=lane < nn, other=INT_MIN)
    p = k.load(cand_p, (g, k.span(0, CAP)), mask=lane < nn, other=-1)
    thr = kth_in_tile(o, topk)
    above = k.sum((o > thr).to(k.i32))
    chosen, col, kept, _ = select_tile(o, thr, topk - above, 0, 0)
    k.store(cand_o, (g, col), o, mask=chosen)
    k.store(cand_p, (g, col), p, mask=chosen)
    return kept, thr, chosen, col, p, o


@k.func
def select_keys(q_codes, q_scales, weights, kc, ksc, block_table, cand_o, cand_p, t, g, b, lo, hi, c_lo, c_hi, topk,
                HI, KP, KC, PB, MMA_BF16):
    """Token t's exact top-k over the keys of chunks [c_lo, c_hi) (of KC positions; -inf outside
    [lo, hi)) of sequence b, using scratch row g: keys above the running threshold are appended;
    a buffer that might not take the next chunk is cut back to its top-k (count search +
    compaction), which raises the threshold; a final cut. Returns (count, winner mask, their
    columns, positions, order keys) over the 2*KP buffer lanes; the buffer's first `count` entries are the
    winners in position order."""
    CAP = 2 * KP
    if MMA_BF16:
        q0, w = indexer_query_bf16(q_codes, q_scales, weights, t, 1, HI)
        q1, q2, q3, s0, s1, s2, s3 = w, w, w, w, w, w, w            # unused by the bf16 scoring
    else:
        q0, q1, q2, q3, s0, s1, s2, s3, w = indexer_query(q_codes, q_scales, weights, t, 1, HI)
    n = 0
    thr = INT_MIN
    for c in range(c_lo, c_hi):
        v = chunk_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, block_table, b, c, lo, hi, HI, KC, PB, MMA_BF16)
        for _ in range(k.where(n > CAP - KC, 1, 0)):       # room for this chunk first
            n, thr, _, _, _, _ = reselect(cand_o, cand_p, g, n, topk, CAP)
        n = append_keys(cand_o, cand_p, g, n, thr, v, c * KC + k.arange(KC))
    n_sel, _, chosen, col, pos, okey = reselect(cand_o, cand_p, g, n, topk, CAP)
    return n_sel, chosen, col, pos, okey


@k.func
def attend_chosen(q, codes, scales, rope, block_table, o, lse, cand_p, g, b, t, n_sel, hb_lo, hb_hi, sm_scale, BH,
                  BK):
    """Sparse MLA attention of token t (head blocks [hb_lo, hb_hi)) over the logical positions in
    cand_p[g, :n_sel] (sequence b), mapped to slots through the block table, BK at a time."""
    n_slots = codes.shape[0]
    for hb in range(hb_lo, hb_hi):
        h0 = hb * BH
        ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
        m, l, a0, a1, a2, a3 = empty_online_state(BH)
        for j in range(k.cdiv(n_sel, BK)):
            lane = j * BK + k.arange(BK)
            pj = k.load(cand_p, (g, k.span(j * BK, BK)), mask=lane < n_sel, other=-1)
            page = k.load(block_table, (b, k.where(pj >= 0, pj // 64, 0)), mask=pj >= 0, other=-1)
            idx = k.where(pj >= 0, page * 64 + pj % 64, -1)
            valid = (idx >= 0) & (idx < n_slots)
            m, l, a0, a1, a2, a3 = online_block(ql0, ql1, ql2, ql3, qr, codes, scales, rope, idx, valid,
                                                sm_scale, m, l, a0, a1, a2, a3)
        finish(o, lse, t, h0, m, l, a0, a1, a2, a3, BH)


@k.func
def write_sel(sel, t, chosen, col, pos, n_sel, KP):
    k.store(sel, (t, col), pos, mask=chosen)
    k.store(sel, (t, k.span(0, KP)), k.full((KP,), -1, k.i32), mask=k.arange(KP) >= n_sel)


@k.kernel(configs=FUSED_CONFIGS)
def fused_li_sfa_decode(q_codes: k.Tensor[k.f8e4m3, "T", "HI", "DI"], q_scales: k.Tensor[k.e8m0, "T", "HI", "DI // 32"],
                        weights: k.Tensor[k.f32, "T", "HI"], kc: k.Tensor[k.f8e4m3, "P", "PG", "DI"],
                        ksc: k.Tensor[k.e8m0, "P", "PG", "DI // 32"], q: k.Tensor["QT", "T", "H", "DQK"],
                        codes: CacheCodes, scales: CacheScales,
                        rope: CacheRope, block_table: k.Tensor[k.i32, "B", "MP"],
                        ks: k.Tensor[k.i32, "T"], ke: k.Tensor[k.i32, "T"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                        lse: k.Tensor[k.f32, "T", "H"], sel: k.Tensor[k.i32, "T", "KS"],
                        cand_o: k.Tensor[k.i32, "G", "CAP"], cand_p: k.Tensor[k.i32, "G", "CAP"],
                        n_per_seq: k.i32, topk: k.i32, sm_scale: k.f32,
                        QT: k.constexpr[k.bf16, k.f32] = k.bf16, HI: k.constexpr = 64, KP: k.constexpr = 2048,
                        KC: k.constexpr = 256, PB: k.constexpr = 1, BH: k.constexpr = 64, BK: k.constexpr = 32,
                        HB: k.constexpr = 1, WRITE_SEL: k.constexpr = False, MMA_BF16: k.constexpr = False):
    # Program (t, hp): query token t, head blocks [hp*HB, hp*HB + HB) of BH heads. With HB below
    # the number of head blocks, the programs of one token each redo the selection (same keys,
    # read from L2 by the second) to put more SMs on small batches. Program g = t * nhp + hp owns
    # row g of the candidate scratch (cand_o / cand_p: order keys / positions, 2 * KP columns).
    nhb = k.cdiv(q.shape[1], BH)
    nhp = k.cdiv(q.shape[1], BH * HB)
    for t, hp in k.grid(q.shape[0], nhp):
        g = t * nhp + hp
        b = t // n_per_seq
        lo = k.maximum(ks[t], 0)
        hi = k.minimum(ke[t], block_table.shape[1] * 64)
        n_sel, chosen, col, pos, _ = select_keys(q_codes, q_scales, weights, kc, ksc, block_table, cand_o, cand_p, t,
                                                 g, b, lo, hi, lo // KC, k.cdiv(hi, KC), topk, HI, KP, KC, PB,
                                                 MMA_BF16)
        if WRITE_SEL:
            write_sel(sel, t, chosen, col, pos, n_sel, KP)
        n_sel = fence(n_sel, 2 * KP)
        attend_chosen(q, codes, scales, rope, block_table, o, lse, cand_p, g, b, t, n_sel, hp * HB,
                      k.minimum(hp * HB + HB, nhb), sm_scale, BH, BK)


# Split-L variant (two launches): NS programs per token score and select over a share of its key
# range each (T * NS programs in the scoring phase instead of T); their winner lists (<= topk each,
# position order, split after split) meet in a second kernel that selects the final top-k from
# the NS * KP candidates and attends. Still no logits or indices in global memory, only the
# NS lists of order keys + positions (8 B per candidate).

# 8 warps: 255 registers (sm_90 ptxas); 16 warps: 128 — both one CTA per SM; the GPU autotunes.
@k.kernel(configs=[{"num_warps": 8}, {"num_warps": 16}])
def fused_li_select_split(q_codes: k.Tensor[k.f8e4m3, "T", "HI", "DI"], q_scales: k.Tensor[k.e8m0, "T", "HI", "DI // 32"],
                          weights: k.Tensor[k.f32, "T", "HI"], kc: k.Tensor[k.f8e4m3, "P", "PG", "DI"],
                          ksc: k.Tensor[k.e8m0, "P", "PG", "DI // 32"], block_table: k.Tensor[k.i32, "B", "MP"],
                          ks: k.Tensor[k.i32, "T"], ke: k.Tensor[k.i32, "T"],
                          cand_o: k.Tensor[k.i32, "G", "CAP"], cand_p: k.Tensor[k.i32, "G", "CAP"],
                          list_o: k.Tensor[k.i32, "T", "NL"], list_p: k.Tensor[k.i32, "T", "NL"],
                          n_per_seq: k.i32, topk: k.i32,
                          HI: k.constexpr = 64, KP: k.constexpr = 2048, KC: k.constexpr = 256, PB: k.constexpr = 1,
                          NS: k.constexpr = 4, MMA_BF16: k.constexpr = False):
    # Program (t, s): chunks [a, z) of token t's range (an equal share of them), scratch row t*NS+s;
    # its winners go to list_*[t, s*KP : s*KP + KP] (INT_MIN / -1 after the last).
    for t, s in k.grid(ks.shape[0], NS):
        g = t * NS + s
        b = t // n_per_seq
        lo = k.maximum(ks[t], 0)
        hi = k.minimum(ke[t], block_table.shape[1] * 64)
        c0 = lo // KC
        c1 = k.maximum(k.cdiv(hi, KC), c0)
        per = k.cdiv(c1 - c0, NS)
        a = c0 + s * per
        n_sel, chosen, col, pos, okey = select_keys(q_codes, q_scales, weights, kc, ksc, block_table, cand_o, cand_p,
                                                    t, g, b, lo, hi, a, k.minimum(a + per, c1), topk, HI, KP, KC, PB,
                                                    MMA_BF16)
        k.store(list_o, (t, s * KP + col), okey, mask=chosen)
        k.store(list_p, (t, s * KP + col), pos, mask=chosen)
        rest = k.arange(KP) >= n_sel
        k.store(list_o, (t, k.span(s * KP, KP)), k.full((KP,), INT_MIN, k.i32), mask=rest)
        k.store(list_p, (t, k.span(s * KP, KP)), k.full((KP,), -1, k.i32), mask=rest)


@k.kernel(configs=[{"BH": 64, "BK": 32, "num_warps": 8}])
def fused_sfa_merge(q: k.Tensor["QT", "T", "H", "DQK"], codes: CacheCodes,
                    scales: CacheScales, rope: CacheRope,
                    block_table: k.Tensor[k.i32, "B", "MP"], list_o: k.Tensor[k.i32, "T", "NL"],
                    list_p: k.Tensor[k.i32, "T", "NL"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                    lse: k.Tensor[k.f32, "T", "H"], sel: k.Tensor[k.i32, "T", "KS"],
                    win_p: k.Tensor[k.i32, "G", "KW"], n_per_seq: k.i32, topk: k.i32, sm_scale: k.f32,
                    QT: k.constexpr[k.bf16, k.f32] = k.bf16, KP: k.constexpr = 2048, NS: k.constexpr = 4,
                    BH: k.constexpr = 64, BK: k.constexpr = 32, HB: k.constexpr = 1,
                    WRITE_SEL: k.constexpr = False):
    # Program (t, hp): the final top-k of token t from its NS lists (one count search over the
    # NS*KP lanes, in position order), compacted into scratch row t*nhp+hp, then attention.
    nhb = k.cdiv(q.shape[1], BH)
    nhp = k.cdiv(q.shape[1], BH * HB)
    for t, hp in k.grid(q.shape[0], nhp):
        g = t * nhp + hp
        okey = list_o[t, k.span(0, NS * KP, other=INT_MIN)]
        pos = list_p[t, k.span(0, NS * KP, other=-1)]
        thr = kth_in_tile(okey, topk)
        above = k.sum((okey > thr).to(k.i32))
        chosen, col, n_sel, _ = select_tile(okey, thr, topk - above, 0, 0)
        k.store(win_p, (g, col), pos, mask=chosen)
        if WRITE_SEL:
            write_sel(sel, t, chosen, col, pos, n_sel, KP)
        n_sel = fence(n_sel, NS * KP)
        attend_chosen(q, codes, scales, rope, block_table, o, lse, win_p, g, t // n_per_seq, t, n_sel, hp * HB,
                      k.minimum(hp * HB + HB, nhb), sm_scale, BH, BK)


# ---------------------------------------------------------------- public functions

def _common_checks(op, q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache, block_table, ks, ke,
                   topk, sm_scale):
    import torch
    from k31dsl.ops.dsa.indexer import _check_cache
    _check_cache(op, idx_cache)
    A._require_cache(op, mla_cache)
    require_tensor(op, "q_idx_codes", q_idx_codes, (k.f8e4m3,), 3)
    require_tensor(op, "q_idx_scales", q_idx_scales, (k.e8m0,), 3)
    require_tensor(op, "idx_weights", idx_weights, (k.f32,), 2)
    require_tensor(op, "mla_q", mla_q, (k.bf16, k.f32), 3)
    t, hi = q_idx_codes.shape[0], q_idx_codes.shape[1]
    if q_idx_codes.shape[2] != 128 or tuple(q_idx_scales.shape) != (t, hi, 4) or tuple(idx_weights.shape) != (t, hi):
        raise K31Error(f"{op}: indexer query must be codes [T, H_I, 128], scales [T, H_I, 4], weights [T, H_I]; got "
                       f"{list(q_idx_codes.shape)}, {list(q_idx_scales.shape)}, {list(idx_weights.shape)}")
    if hi & (hi - 1) or not 16 <= hi <= 128:
        raise K31Error(f"{op}: {hi} indexer heads; a power of two between 16 and 128 is needed")
    if mla_q.shape[0] != t or mla_q.shape[2] != A.LATENT + A.ROPE:
        raise K31Error(f"{op}: `mla_q` must be [{t}, H, {A.LATENT + A.ROPE}], got {list(mla_q.shape)}")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise K31Error(f"{op}: `block_table` must be an int32 tensor [B, max_pages]")
    b = block_table.shape[0]
    if b == 0 or t % b:
        raise K31Error(f"{op}: {t} query tokens do not split evenly over the {b} sequences of `block_table`",
                       hint="pass n query tokens per sequence, sequence-major (T = B * n)")
    if not (isinstance(topk, int) and not isinstance(topk, bool) and 1 <= topk <= 4096):
        raise K31Error(f"{op}: topk={topk!r} must be an int in [1, 4096]")
    A._check_scale(op, sm_scale)
    ks32, ke32 = int32_tensor(op, "ks", ks, 1), int32_tensor(op, "ke", ke, 1)
    if ks32.shape[0] != t or ke32.shape[0] != t:
        raise K31Error(f"{op}: `ks` and `ke` need one limit per query token ({t}), got {ks32.shape[0]} and "
                       f"{ke32.shape[0]}", hint="token t sees the key positions [ks[t], ke[t]) of its sequence")
    return t, b, ks32, ke32


def fused_li_sfa(q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache, block_table, ks, ke,
                 topk: int, sm_scale, *, return_indices: bool = False, mma: str = "auto", splits: int = 1,
                 target: str | None = None, **config):
    """One decode step of DSA attention in one kernel: indexer scores of each query token over its
    key range [ks, ke) (logical positions of its sequence; T = B * n tokens, sequence-major),
    exact top-`topk` (ties to the lower position), sparse MLA attention over those keys.

    Indexer side as lightning_indexer (q_idx_codes e4m3 [T, H_I, 128], q_idx_scales e8m0
    [T, H_I, 4], idx_weights fp32 [T, H_I], idx_cache uint8 [P, 8448]); attention side as
    sparse_mla_attention (mla_q [T, H, 576], mla_cache uint8 [P, 64, 656]); both caches share
    block_table int32 [B, max_pages]. Returns (o [T, H, 512] bf16, lse [T, H] fp32), plus the
    selected logical positions int32 [T, topk] (in position order, -1 padded) when return_indices.
    mma: the indexer scoring, "auto" (bf16 for Triton on a GPU, else fp8), "fp8" or "bf16" (as
    lightning_indexer's). splits > 1 (1, 2, 4, 8):
    each token's key range is scored and pre-selected by `splits` programs, whose candidate lists
    a second kernel merges before attending (two launches, T * splits scoring programs)."""
    import torch
    target = resolve_target(target)
    op = "fused_li_sfa"
    t, b, ks32, ke32 = _common_checks(op, q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache,
                                      block_table, ks, ke, topk, sm_scale)
    h = mla_q.shape[1]
    o = torch.zeros((t, h, A.LATENT), dtype=torch.bfloat16, device=mla_q.device)
    lse = torch.full((t, h), float("inf"), dtype=torch.float32, device=mla_q.device)
    sel = torch.full((t, topk), -1, dtype=torch.int32, device=mla_q.device)
    if t == 0 or h == 0:
        return (o, lse, sel) if return_indices else (o, lse)
    from k31dsl.ops.dsa.indexer import indexer_cache_views
    kc, ksc = indexer_cache_views(idx_cache)
    c, s, r = A.cache_views(mla_cache)
    mma = resolve_mma(op, mma, target, mla_q.device)
    kw = {"HI": q_idx_codes.shape[1], "KP": max(64, next_pow2(topk)), **config}
    if mma == "bf16":
        kw["MMA_BF16"] = True
    if kw["KP"] < topk or kw["KP"] & (kw["KP"] - 1) or kw["KP"] % (64 * kw.get("PB", 1)):
        raise K31Error(f"{op}: KP={kw['KP']} must be a power of two >= topk ({topk}) and a multiple of 64 * PB")
    cap = A.max_head_block(target)
    if "BH" not in config and (h < cap or cap < 64):
        kw["BH"] = min(max(16, next_pow2(h)), cap)
    nhb = -(-h // kw.get("BH", 64))
    if "HB" not in config and t * nhb > HEAD_SPLIT_PROGRAMS:
        kw["HB"] = nhb                                   # enough tokens: one program per token
    kw.setdefault("KC", min(256, kw["KP"]))
    if kw["KC"] > kw["KP"] or kw["KC"] & (kw["KC"] - 1) or kw["KC"] % (64 * kw.get("PB", 1)):
        raise K31Error(f"{op}: KC={kw['KC']} must be a power of two <= KP ({kw['KP']}) and a multiple of 64 * PB")
    nhp = -(-nhb // kw.get("HB", 1))
    if splits not in (1, 2, 4, 8) or splits * kw["KP"] > 16384:
        raise K31Error(f"{op}: splits={splits!r} must be 1, 2, 4 or 8 with splits * KP <= 16384 (KP = {kw['KP']})")
    if return_indices:
        kw["WRITE_SEL"] = True
        sel_arg = sel
    else:
        sel_arg = torch.empty(1, dtype=torch.int32, device=mla_q.device).expand(t, 1)   # never touched
    dev, qc, qs, iw, bt = mla_q.device, q_idx_codes.contiguous(), q_idx_scales.contiguous(), idx_weights.contiguous(), \
        block_table.contiguous()
    if splits > 1:
        kp = kw["KP"]
        cand_o = torch.empty((t * splits, 2 * kp), dtype=torch.int32, device=dev)      # per-program scratch
        cand_p = torch.empty_like(cand_o)
        list_o = torch.empty((t, splits * kp), dtype=torch.int32, device=dev)
        list_p = torch.empty_like(list_o)
        sel_kw = {n: kw[n] for n in ("HI", "KP", "KC", "PB", "MMA_BF16") if n in kw}
        fused_li_select_split[target](qc, qs, iw, kc, ksc, bt, ks32, ke32, cand_o, cand_p, list_o, list_p, t // b,
                                      int(topk), NS=splits, **sel_kw)
        win_p = torch.empty((t * nhp, kp), dtype=torch.int32, device=dev)
        att_kw = {n: kw[n] for n in ("KP", "BH", "BK", "HB", "WRITE_SEL") if n in kw}
        fused_sfa_merge[target](mla_q.contiguous(), c, s, r, bt, list_o, list_p, o, lse, sel_arg, win_p, t // b,
                                int(topk), float(sm_scale), NS=splits, **att_kw)
        return (o, lse, sel) if return_indices else (o, lse)
    cand_o = torch.empty((t * nhp, 2 * kw["KP"]), dtype=torch.int32, device=dev)    # per-program scratch
    cand_p = torch.empty_like(cand_o)
    fused_li_sfa_decode[target](qc, qs, iw, kc, ksc, mla_q.contiguous(), c, s, r, bt, ks32, ke32, o, lse, sel_arg,
                                cand_o, cand_p, t // b, int(topk), float(sm_scale), **kw)
    return (o, lse, sel) if return_indices else (o, lse)


def li_sfa_unfused(q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache, block_table, ks, ke,
                   topk: int, sm_scale, *, return_indices: bool = False, max_len: int | None = None,
                   mma: str = "auto", sfa_split: int | None = None, sfa_form: str | None = None,
                   always_score: bool | None = None, target: str | None = None):
    """The same step as fused_li_sfa in four launches: lightning_indexer (fp32 logits [T, max_len]
    to global memory) -> topk -> slots_of_positions -> sparse_mla_attention. max_len (default:
    max(ke), a host sync) bounds the logits' width; mma as lightning_indexer's. Positions come
    out in position order (topk sorted=False: attention needs the set only). sfa_split: the
    attention's index-list segments (default: attention.sfa_split's choice on a GPU, else 1);
    sfa_form: sparse_mla_attention's form (default: attention.sfa_form's choice).

    When no query has more than topk keys in range, the top-k of each is all of its keys, so the
    indexer and the top-k are skipped and one launch writes the ranges' positions and slots (the
    same lists, hence the same o and lse). The call knows it without a sync when max_len <= topk,
    and from the sync it makes anyway when max_len is None. always_score=True scores regardless
    (default: K31_SHORT_RANGES=score, slots.short_ranges)."""
    from k31dsl.ops.dsa.indexer import check_max_len, lightning_indexer
    from k31dsl.ops.dsa.topk import topk as topk_op
    target = resolve_target(target)
    op = "li_sfa_unfused"
    t, b, ks32, ke32 = _common_checks(op, q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache,
                                      block_table, ks, ke, topk, sm_scale)
    if sfa_split is not None and (isinstance(sfa_split, bool) or not isinstance(sfa_split, int) or sfa_split < 1):
        raise K31Error(f"{op}: sfa_split must be an int >= 1 (or None: chosen per GPU), got {sfa_split!r}")
    synced = max_len is None
    if synced:
        max_len = min(block_table.shape[1] * A.PAGE, max(1, int(ke32.max()) if t else 1))
    check_max_len(op, max_len, block_table)
    if always_score is None:
        always_score = S.short_ranges() == "score"
    if not always_score and (max_len <= topk or synced and longest_range(ks32, ke32, max_len) <= topk):
        pos, slots = S.slots_of_range(ks32, ke32, block_table, t // b, topk, max_len, target=target)
    else:
        scores = lightning_indexer(q_idx_codes, q_idx_scales, idx_cache, block_table, idx_weights, ks32, ke32,
                                   max_len, mma=mma, target=target)
        pos = topk_op(scores, topk, sorted=False, target=target)            # a set (position order) suffices
        slots = S.slots_of_positions(pos, block_table, t // b, target=target)
    gpu = target == "triton" and mla_q.is_cuda
    if sfa_form is None:
        sfa_form = A.sfa_form(t, mla_q.shape[1], topk, gpu)
    if sfa_split is None and sfa_form == "one_pass":
        sfa_split = A.sfa_split(t, mla_q.shape[1], topk, A.max_head_block(target)) if gpu else 1
    o, lse = A.sparse_mla_attention(mla_q, mla_cache, slots, sm_scale, split=sfa_split, form=sfa_form, target=target)
    return (o, lse, pos) if return_indices else (o, lse)


def longest_range(ks32, ke32, max_len: int) -> int:
    """The most keys any query has in range: max over t of min(ke, max_len) - max(ks, 0) (a sync)."""
    if not ks32.numel():
        return 0
    return int((ke32.clamp(max=max_len) - ks32.clamp(min=0)).max())


def li_sfa(*args, impl: str = "auto", target: str | None = None, **kwargs):
    """fused_li_sfa or li_sfa_unfused (same arguments): impl="auto" takes the fused kernel when the
    longest key range is at most FUSED_MAX_KEYS (set from the GPU benchmark: 0, i.e. the unfused
    path whenever there are keys)."""
    if impl not in ("auto", "fused", "unfused"):
        raise K31Error(f"li_sfa: impl={impl!r} must be 'auto', 'fused' or 'unfused'")
    if impl == "auto":
        ke = args[8] if len(args) > 8 else kwargs["ke"]
        ks = args[7] if len(args) > 7 else kwargs["ks"]
        longest = int((ke.to(dtype=ks.dtype) - ks).max()) if ke.numel() else 0
        impl = "fused" if longest <= FUSED_MAX_KEYS else "unfused"
    fn = fused_li_sfa if impl == "fused" else li_sfa_unfused
    return fn(*args, target=target, **kwargs)


# ---------------------------------------------------------------- inputs and the registry check

def random_decode_step(g, ctx, n, heads_idx=16, heads=4, spare_pages=3, ks_from=None):
    """Random inputs of fused_li_sfa: caches holding B sequences of lengths ctx (pages shuffled over the pool), and n query tokens
    per sequence: token i of sequence b sees keys [ks, ctx[b] - n + i + 1). Returns the argument
    tuple up to ke (topk and sm_scale follow)."""
    import torch
    B = len(ctx)
    pages_of = [-(-c // A.PAGE) for c in ctx]
    P = sum(pages_of) + spare_pages
    perm = torch.randperm(P, generator=g).int()
    bt = torch.randint(0, P, (B, max(pages_of) + 1), generator=g, dtype=torch.int32)   # stale entries past the end
    used = 0
    for b, np_ in enumerate(pages_of):
        bt[b, :np_] = perm[used:used + np_]
        used += np_
    slots = torch.cat([bt[b, torch.arange(c) // A.PAGE] * A.PAGE + torch.arange(c) % A.PAGE
                       for b, c in enumerate(ctx)]).int()
    N = slots.numel()
    from k31dsl.ops.dsa.indexer import indexer_cache_write, new_indexer_cache
    icache = new_indexer_cache(P)
    kcodes = (torch.randn(N, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    kscales = torch.randint(122, 130, (N, 4), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    indexer_cache_write(icache, kcodes, kscales, slots, target="numpy")
    mcache = A.new_mla_cache(P)
    A.mla_cache_write(mcache, A.random_latent(N, g, torch.float32), torch.randn(N, A.ROPE, generator=g), slots,
                      target="numpy")
    T = B * n
    qc = (torch.randn(T, heads_idx, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    qs = torch.randint(122, 130, (T, heads_idx, 4), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    w = torch.randn(T, heads_idx, generator=g)
    q = torch.randn(T, heads, A.LATENT + A.ROPE, generator=g).bfloat16()
    ke = torch.tensor([ctx[t // n] - n + t % n + 1 for t in range(T)], dtype=torch.int32)
    ks = torch.zeros(T, dtype=torch.int32) if ks_from is None else ks_from(ke)
    return qc, qs, w, icache, q, mcache, bt, ks, ke


def _check_fused(target: str, seed: int = 0) -> list[CaseResult]:
    """fused_li_sfa on a small decode step: the selected positions against the fp64 oracle's
    top-k (swaps only between fp32-tied scores), o / lse against the fp64 attention oracle."""
    import numpy as np
    import torch
    from k31dsl.ops.testing import bytes_of, device_for, load_oracle, to_f64
    ref, iref = load_oracle("dsa_attention"), load_oracle("dsa_indexer")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    # the second case runs the split-L variant (two launches) except on ascendc (one g++ build per kernel)
    for ctx, n, topk, splits in (([100, 20], 1, 16, 1), ([70], 2, 16, 1 if target == "ascendc" else 2)):
        args = random_decode_step(g, ctx, n)
        qc, qs, w, icache, q, mcache, bt, ks, ke = args
        o, lse, sel = fused_li_sfa(*(a.to(dev) for a in args), topk, 0.135234, return_indices=True, splits=splits,
                                   target=target)
        sa = (bytes_of(qc), bytes_of(qs), to_f64(w), icache.numpy(), bt.numpy(), ks.numpy(), ke.numpy(),
              bt.shape[1] * A.PAGE)
        scores, mag = iref.indexer_scores(*sa), iref.indexer_scores_magnitude(*sa)
        want = iref.topk(scores, topk)
        bad = 0
        for r, row in enumerate(sel.cpu().numpy()):
            G, W = set(row.tolist()) - {-1}, set(want[r].tolist()) - {-1}
            kth = min((scores[r, i] for i in W), default=0.0)
            bad += len(G) != len(W) or any(abs(scores[r, i] - kth) > 1e-5 * (mag[r, i] + 1) for i in G ^ W)
        name = f"contexts {ctx}, next_n={n}, topk={topk}, splits={splits}"
        out.append(CaseResult(f"{name}: selected keys", bad, 0, bad == 0, "rows whose key set differs from top-k"))
        lat, rope = ref.mla_cache_decode(mcache.numpy())
        slots = ref.slots_of_positions(sel.cpu().numpy(), bt.numpy(), np.arange(q.shape[0]) // n)
        want_o, want_l = ref.sparse_mla_attention(to_f64(q), lat, rope, slots, 0.135234)
        e_o, e_l = A.sfa_errors(o, lse, want_o, want_l)
        out.append(CaseResult(f"{name}: o", e_o, 2e-2, e_o <= 2e-2, "max abs err / max |o| (bf16 output)"))
        out.append(CaseResult(f"{name}: lse", e_l, 1e-3, e_l <= 1e-3, "max abs err (natural log)"))
    return out


register(OpSpec("fused_li_sfa", "dsa", fused_li_sfa, [fused_li_sfa_decode, fused_li_select_split, fused_sfa_merge],
                "DSA decode step in one kernel: MXFP8 indexer scores, exact top-k, sparse MLA attention",
                _check_fused, tags=["dsa", "attention", "fused"]))

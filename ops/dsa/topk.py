"""Exact row-wise top-k for the DSA indexer scores (k up to 4096, rows up to ~128K and beyond),
by SELECTION (no sort).

Result of `topk`: int32 [R, k]; row r lists the positions of its min(k, valid) largest scores,
then -1. A score is valid when it is > -inf (the indexer writes -inf outside each token's key
range; NaN never counts). Ties go to the lower position, so the set is deterministic and
identical on every target. Order: sorted=True (the default) gives (score descending, position
ascending); sorted=False gives the same set in ascending position order (what sparse attention
needs: a set; one launch less).

Design. Scores map to an order-preserving int32 `o` (-0 as +0; NaN and -inf to INT_MIN: never
selected). Program (r, sp) of `topk_segments` takes a segment of its row (the first BL lanes in
registers, the rest streamed in BL-wide tiles) and finds the K-th largest `o` by a bitwise
binary search: 32 steps of "count the keys >= candidate" (tile compare + sum), building the
threshold from the top bit down (on o ^ INT_MIN, the unsigned image). Then, in position order,
keys above the threshold are selected plus the first (K - count above) keys equal to it (a
cumsum over the equal mask: ties to the lower position), and each selected key gets its output
column from a cumsum over the selection mask: a scatter store of the compacted list. Lanes that
are not written are padded (-inf / -1) by a disjoint masked store, so no lane is read back.
Levels: stage 1 reduces segments of SEG = 4 * KP scores to KP candidates each (values +
positions, in position order), each further launch reduces 4 lists to one, the last (FINAL)
selects exactly k and writes positions only. For sorted output `topk_rank_keys` gives each winner
one int64 that orders (score desc, position asc) and `topk_order` ranks them: rank(i) =
#{j : key_j > key_i}, counted in a [BI, BJ] tile summed once after the loop over j (no reduction
per step), then a scatter to column rank(i).
Cost per level: up to 32 x (compare + add) per key + 32 block reductions per program (the search
is a `while` loop that stops at an exact count: ~19 steps on distinct scores, kth_in_tile), then
one scan per SL-lane tile for the selection (the equal and the selected counts share it); no sort
anywhere.
When a level's segments fit one tile (ONE_TILE) the streaming code is left out, and the selection
re-reads the segment from L2 in SL-lane tiles instead of holding values and positions through the
search: half the registers, so two 8-warp programs share an SM (top-k -16 %, NOTES).
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import next_pow2, require_tensor, resolve_target

MAX_K = 4096
INT_MIN = -2147483647 - 1
GROUP = 4                 # candidate lists merged per program above stage 1 (and SEG = GROUP * KP)
MAX_BL = 8192             # lanes held in registers per program (32 per thread at 8 warps)
SELECT_LANES = 2048       # lanes per tile of the selection pass (SL); H200: 4096 +11 %, 1024 +3.5 % (NOTES)
SEARCH_EXIT = True        # the count search stops at an exact count (kth_in_tile); False: 32 steps
COUNT_FIRST = True        # ... and skips itself for rows of at most K valid keys (rows_with_k_or_fewer)


@k.func
def order_key(v):
    """int32 with the order of the fp32 scores v (-0 as +0); INT_MIN for -inf and NaN (never
    selected: every valid key is above it)."""
    b = v.bitcast(k.i32)
    o = k.where(v == 0.0, 0, b ^ ((b >> 31) & 0x7FFFFFFF))
    return k.where(v > float("-inf"), o, -2147483647 - 1)


@k.func
def seg_tile(vals, idx, r, start, n, j, BL, HAS_IDX):
    """Tile j of the segment vals[r, start : start + n]: (scores, order keys, positions); lanes
    past the segment read -inf (key INT_MIN)."""
    lane = j * BL + k.arange(BL)
    inside = lane < n
    v = k.load(vals, (r, k.span(start + j * BL, BL)), mask=inside, other=float("-inf"))
    if HAS_IDX:
        pos = k.load(idx, (r, k.span(start + j * BL, BL)), mask=inside, other=-1)
    else:
        pos = start + lane
    return v, order_key(v), pos


@k.func
def kth_key(vals, idx, r, start, n, o0, K, BL, HAS_IDX, EXIT=True, COUNT_FIRST=True):
    """The largest t with #{keys >= t} >= K over the segment (o0 = its first tile's keys, in
    registers; the other tiles are re-read per step), or INT_MIN when fewer than K are valid.
    Bitwise on the unsigned image u = o ^ INT_MIN, one counting step per bit from the top; EXIT
    and COUNT_FIRST as in kth_in_tile."""
    p = 0
    if not EXIT:
        for b in range(32):
            cand = p | (1 << (31 - b))
            cnt = seg_count(vals, idx, r, start, n, o0, cand ^ (-2147483647 - 1), BL, HAS_IDX)
            p = k.where(cnt >= K, cand, p)
        return p ^ (-2147483647 - 1)
    exact = -2147483647 - 1
    b = 0
    if COUNT_FIRST:
        exact, b = rows_with_k_or_fewer(seg_count(vals, idx, r, start, n, o0, -2147483647, BL, HAS_IDX), K)
    while b < 32:
        cand = p | (1 << (31 - b))
        cnt = seg_count(vals, idx, r, start, n, o0, cand ^ (-2147483647 - 1), BL, HAS_IDX)
        p = k.where(cnt >= K, cand, p)
        exact = k.where(cnt == K, cand ^ (-2147483647 - 1), exact)
        b = k.where(cnt == K, 32, b + 1)
    low = k.min(k.where(o0 >= exact, o0, 2147483647))
    for j in range(1, k.cdiv(n, BL)):
        _, o, _ = seg_tile(vals, idx, r, start, n, j, BL, HAS_IDX)
        low = k.minimum(low, k.min(k.where(o >= exact, o, 2147483647)))
    return k.where(exact != -2147483647 - 1, low, p ^ (-2147483647 - 1))


@k.func
def seg_count(vals, idx, r, start, n, o0, t, BL, HAS_IDX):
    """#{keys >= t} over the segment: its first tile in registers, the others streamed."""
    cnt = k.sum((o0 >= t).to(k.i32))
    for j in range(1, k.cdiv(n, BL)):
        _, o, _ = seg_tile(vals, idx, r, start, n, j, BL, HAS_IDX)
        cnt += k.sum((o >= t).to(k.i32))
    return cnt


@k.func
def rows_with_k_or_fewer(valid, K):
    """The search's start from the count of valid keys: (exact, first bit). With fewer than K
    valid keys the answer is INT_MIN and with exactly K the smallest valid key (exact = INT_MIN + 1,
    every valid key reaches it), so the bitwise steps are skipped: a decode row shorter than k (the
    model at short contexts, the first k rows of a causal prefill) costs one count, not 32."""
    short = valid <= K
    return k.where(valid == K, -2147483647, -2147483647 - 1), k.where(short, 32, 0)


@k.func
def kth_in_tile(o, K, EXIT=True, COUNT_FIRST=True):
    """kth_key for keys held in one tile: the largest t with #{o >= t} >= K, INT_MIN if fewer
    than K keys are valid. One block reduction per bit, from the top. EXIT: once a candidate t has
    exactly K keys >= t, the answer is the smallest of them (one more reduction) and the search
    stops there (a `while` loop): on distinct scores after ~19 of the 32 steps for 2048 of 8192
    (DSA-like and normal scores; ~21 log-normal), never on ties at the K-th key (33 then).
    COUNT_FIRST: the valid keys counted with the first step (rows_with_k_or_fewer: a row of at
    most K valid keys needs no search)."""
    p = 0
    if not EXIT:
        for b in range(32):
            cand = p | (1 << (31 - b))
            p = k.where(k.sum((o >= (cand ^ (-2147483647 - 1))).to(k.i32)) >= K, cand, p)
        return p ^ (-2147483647 - 1)
    exact = -2147483647 - 1          # the candidate that exactly K keys reach (INT_MIN: none)
    b = 0
    if COUNT_FIRST:
        # the valid keys and the first step's count (keys >= +0) in one reduction, 16 bits each
        assert o.shape[0] < 65536, "kth_in_tile packs two counts of the tile's lanes into 16 bits each"
        both = k.sum((o != -2147483647 - 1).to(k.i32) + ((o >= 0).to(k.i32) << 16))
        exact, b = rows_with_k_or_fewer(both & 0xFFFF, K)
        first = both >> 16
        p = k.where((b == 0) & (first >= K), -2147483647 - 1, p)          # bit 31 of the image
        exact = k.where((b == 0) & (first == K), 0, exact)
        b = k.where(b == 0, k.where(first == K, 32, 1), b)
    while b < 32:
        cand = p | (1 << (31 - b))
        cnt = k.sum((o >= (cand ^ (-2147483647 - 1))).to(k.i32))
        p = k.where(cnt >= K, cand, p)
        exact = k.where(cnt == K, cand ^ (-2147483647 - 1), exact)
        b = k.where(cnt == K, 32, b + 1)
    low = k.min(k.where(o >= exact, o, 2147483647))
    return k.where(exact != -2147483647 - 1, low, p ^ (-2147483647 - 1))


@k.func
def select_tile(o, thr, need_eq, eq_before, written):
    """The selection of one tile given the threshold: keys above it, and equal keys while the
    running count of equal keys (eq_before + this tile's, in position order) is <= need_eq.
    Returns (selected mask, output column of each lane, count selected, count equal).
    One scan serves both counts: above + (equal << 16) per lane (a tile has < 2^16 lanes), so the
    selected lanes up to i are above(i) + min(eq_before + equal(i), need_eq) - min(eq_before, need_eq).
    (Two scans before: sm_90a BL 8192 / 8 warps, 749 -> 661 instructions and 20 -> 16 barriers
    per 2048-lane tile; top-k 0.058 -> 0.050 ms at B=64 L=32K, 0.114 -> 0.098 at B=32 L=128K,
    results/topk_select.md.)"""
    above = o > thr
    eq = (o == thr) & (o != -2147483647 - 1)
    packed = above.to(k.i32) + (eq.to(k.i32) << 16)
    run = k.cumsum(packed, axis=0)
    run_eq = eq_before + (run >> 16)
    sel = above | (eq & (run_eq <= need_eq))
    skipped = k.minimum(eq_before, need_eq)
    col = written + (run & 0xFFFF) + k.minimum(run_eq, need_eq) - skipped - 1
    tot = k.sum(packed)
    ne = tot >> 16
    return sel, col, (tot & 0xFFFF) + k.minimum(eq_before + ne, need_eq) - skipped, ne


# Launch options by tile width (lanes held in registers per program); the caller fixes BL, the GPU
# tuner picks the warps. BL 8192 only at 8 warps: with one-tile levels (ONE_TILE) its search holds
# 32 keys per thread in 123 registers (sm_90a), two programs per SM, and every level of the DSA
# step's top-k is fastest so (results/topk_warps.md, all levels pinned: 0.058 ms at B=64 L=32K
# against 0.060 at 4 warps and 0.074 at 16; 0.114 / 0.120 / 0.149 at B=32 L=128K). The cold-L2
# tuner had picked 16 warps for stage 1 by noise (0.058 against 0.066 by its timing).
# Tried and taken out: counting 4 candidates per step (2 bits, 16 steps) — sm_90a: 290
# instructions, 4 barriers and 40 spill reloads per step against 81 and 2 for the bitwise step;
# three packed counts in one int64 reduction (results/topk_step2.md: 0.074 against 0.073 ms).
TOPK_CONFIGS = [{"BL": 8192, "num_warps": 8}, {"BL": 4096, "num_warps": 8}, {"BL": 2048, "num_warps": 4},
                {"BL": 1024, "num_warps": 4}, {"BL": 4096, "num_warps": 4}]


@k.kernel(configs=TOPK_CONFIGS)
def topk_segments(vals: k.Tensor[k.f32, "R", "N"], idx: k.Tensor[k.i32, "R", "N"], out_v: k.Tensor[k.f32, "R", "M"],
                  out_i: k.Tensor[k.i32, "R", "M"], ends: k.Tensor[k.i32, "R"], seg: k.i32,
                  KP: k.constexpr = 16, HAS_IDX: k.constexpr = False, FINAL: k.constexpr = False,
                  HAS_END: k.constexpr = False, BL: k.constexpr = 4096, SL: k.constexpr = 2048,
                  ONE_TILE: k.constexpr = False, EXIT: k.constexpr = True, COUNT_FIRST: k.constexpr = True):
    # Program (r, sp) reduces vals[r, sp*seg : (sp+1)*seg] to its top KP (FINAL: top M), written
    # compacted in position order to out_*[r, sp*KP : sp*KP + KP] (-inf / -1 after the last).
    # Positions are the column (HAS_IDX=False) or idx's entry (then the lists in the segment are
    # in position order, as the previous level wrote them). FINAL: positions only, M columns.
    # HAS_END: columns from ends[r] on count as -inf and are never read (a causal row's scan
    # stops at its own key range: about half the scores of a prefill's [T, T] block).
    for r, sp in k.grid(vals.shape[0], k.cdiv(vals.shape[1], seg)):
        start = sp * seg
        n = k.minimum(seg, vals.shape[1] - start)
        if HAS_END:
            n = k.maximum(k.minimum(n, ends[r] - start), 0)
        if FINAL:
            K = out_i.shape[1]
            base = 0
        else:
            K = KP
            base = sp * KP
        _, o0, _ = seg_tile(vals, idx, r, start, n, 0, BL, HAS_IDX)
        if ONE_TILE:                    # the caller promises n <= BL (tile_options): no streamed tiles
            thr = kth_in_tile(o0, K, EXIT, COUNT_FIRST)
        else:
            thr = kth_key(vals, idx, r, start, n, o0, K, BL, HAS_IDX, EXIT, COUNT_FIRST)
        above = k.sum((o0 > thr).to(k.i32))
        if not ONE_TILE:
            for j in range(1, k.cdiv(n, BL)):
                _, o, _ = seg_tile(vals, idx, r, start, n, j, BL, HAS_IDX)
                above += k.sum((o > thr).to(k.i32))
        need_eq = K - above
        # The selection re-reads the segment (from L2) in SL-lane tiles: its scans and masks over a
        # whole BL tile would set the program's register count (255 at BL 8192 / 8 warps).
        written = 0
        eq_seen = 0
        for j in range(k.cdiv(n, SL)):
            v, o, pos = seg_tile(vals, idx, r, start, n, j, SL, HAS_IDX)
            sel, col, ns, ne = select_tile(o, thr, need_eq, eq_seen, written)
            k.store(out_i, (r, base + col), pos, mask=sel)
            if not FINAL:
                k.store(out_v, (r, base + col), v, mask=sel)
            written += ns
            eq_seen += ne
        pad = k.arange(KP)
        k.store(out_i, (r, k.span(base, KP)), k.full((KP,), -1, k.i32), mask=(pad >= written) & (pad < K))
        if not FINAL:
            k.store(out_v, (r, k.span(base, KP)), k.full((KP,), float("-inf"), k.f32), mask=pad >= written)


@k.kernel
def topk_rank_keys(vals: k.Tensor[k.f32, "R", "N"], pos: k.Tensor[k.i32, "R", "M"], keys: k.Tensor[k.i64, "R", "M"],
                   BM: k.constexpr = 1024):
    # One int64 per selected entry that orders (score descending, position ascending) as one
    # number: order key << 32 | (2^31 - 1 - position); a -1 entry gets INT_MIN << 32, below every
    # selected one (their scores are > -inf, so their order keys are > INT_MIN).
    for r, mb in k.grid(pos.shape[0], k.cdiv(pos.shape[1], BM)):
        p = k.load(pos, (r, k.span(mb * BM, BM)), other=-1)
        o = order_key(k.load(vals, (r, p), mask=p >= 0, other=float("-inf")))
        kk = (o.to(k.i64) << 32) | (2147483647 - k.maximum(p, 0)).to(k.i64)
        keys[r, k.span(mb * BM, BM)] = k.where(p >= 0, kk, k.cast(-2147483647 - 1, k.i64) << 32)


@k.kernel
def topk_order(keys: k.Tensor[k.i64, "R", "M"], pos_in: k.Tensor[k.i32, "R", "M"], pos_out: k.Tensor[k.i32, "R", "M"],
               BI: k.constexpr = 64, BJ: k.constexpr = 64):
    # Program (r, ib): entries ib*BI .. +BI of the row's selected positions (valid ones first,
    # then -1) get their rank in (score descending, position ascending) order by counting the
    # entries with a larger rank key (topk_rank_keys: distinct for distinct positions), BJ at a
    # time; each is stored at column rank (-1 entries stay put). Against gathering both scores per
    # pair and summing each [64, 128] step (sm_90a: 936 instructions and 18 barriers per step for
    # 64 pairs a thread; now 175 and none for 32): sorted top-k 0.271 -> 0.119 ms at B=64 L=32K
    # (results/topk_select_order.md).
    for r, ib in k.grid(pos_in.shape[0], k.cdiv(pos_in.shape[1], BI)):
        pi = k.load(pos_in, (r, k.span(ib * BI, BI)), other=-1)
        ki = k.load(keys, (r, k.span(ib * BI, BI)), other=0)
        ahead = k.zeros((BI, BJ), k.i32)              # summed over its columns once, after the loop
        for jb in range(k.cdiv(pos_in.shape[1], BJ)):
            kj = k.load(keys, (r, k.span(jb * BJ, BJ)), other=-9223372036854775808)    # below every key
            ahead += (kj[None, :] > ki[:, None]).to(k.i32)
        rank = k.sum(ahead, axis=1)
        lane = ib * BI + k.arange(BI)
        k.store(pos_out, (r, k.where(pi >= 0, rank, lane)), pi, mask=lane < pos_in.shape[1])


def _bl(seg: int) -> int:
    return min(MAX_BL, max(16, next_pow2(seg)))


def tile_options(seg: int, bl: int | None = None) -> dict:
    """topk_segments' tile constexprs for segments of `seg` scores: BL (by default the smallest
    power of two holding a segment, at most MAX_BL), SL, and whether a segment fits one tile
    (ONE_TILE: no streaming code, ~half the registers: sm_90a BL 8192 / 8 warps 123 instead of 200)."""
    bl = _bl(seg) if bl is None else bl
    return {"BL": bl, "SL": min(SELECT_LANES, bl), "ONE_TILE": seg <= bl, "EXIT": SEARCH_EXIT,
            "COUNT_FIRST": COUNT_FIRST}


def topk(scores, k_: int, *, sorted: bool = True, ends=None, chunks: int | None = None, target: str | None = None):
    """Positions of the k largest valid scores of each row -> int32 [R, k] (see the module
    docstring for ties, order and -1 padding). scores: fp32 [R, L]. sorted=False returns the same
    set in position order (one launch less). ends: optional int32 [R]; row r considers columns
    [0, ends[r]) only (the rest is never read, as if -inf). chunks overrides the stage-1 segment
    length in units of KP (tests use it to force the multi-level path)."""
    import torch
    target = resolve_target(target)
    require_tensor("topk", "scores", scores, (k.f32,))
    if scores.dim() != 2:
        raise K31Error(f"topk: `scores` must be 2-D [rows, L], got shape {list(scores.shape)}")
    if not (isinstance(k_, int) and 1 <= k_ <= MAX_K):
        raise K31Error(f"topk: k={k_!r} must be an int in [1, {MAX_K}]")
    rows, length = scores.shape
    if ends is not None:
        require_tensor("topk", "ends", ends, (k.i32,))
        if tuple(ends.shape) != (rows,) or ends.device != scores.device:
            raise K31Error(f"topk: `ends` must be int32 [{rows}] on {scores.device}, got shape {list(ends.shape)} "
                           f"on {ends.device}")
    out = torch.empty((rows, k_), dtype=torch.int32, device=scores.device)
    if rows == 0:
        return out
    if length == 0:
        return out.fill_(-1)
    kp = max(16, next_pow2(k_))
    seg = (chunks if chunks is not None else GROUP) * kp        # stage 1: a GROUP:1 reduction per program
    x = scores.contiguous()
    kern = topk_segments[target]

    def unused(dtype, *n):           # a parameter the specialisation never touches (stride 0)
        return torch.empty(1, dtype=dtype, device=scores.device).expand(rows, *n)

    res = out if not sorted else torch.empty_like(out)
    lim = dict(HAS_END=ends is not None)
    end = ends.contiguous() if ends is not None else unused(torch.int32)
    if length <= seg:
        kern(x, unused(torch.int32, length), unused(torch.float32, k_), res, end, length, KP=kp, FINAL=True,
             **tile_options(length), **lim)
    else:
        ns = -(-length // seg)
        v1 = torch.empty((rows, ns * kp), dtype=torch.float32, device=scores.device)
        i1 = torch.empty((rows, ns * kp), dtype=torch.int32, device=scores.device)
        kern(x, unused(torch.int32, length), v1, i1, end, seg, KP=kp, **tile_options(seg), **lim)
        while ns > GROUP:                # GROUP neighbouring lists -> one
            ns = -(-ns // GROUP)
            v2 = torch.empty((rows, ns * kp), dtype=torch.float32, device=scores.device)
            i2 = torch.empty((rows, ns * kp), dtype=torch.int32, device=scores.device)
            kern(v1, i1, v2, i2, end, GROUP * kp, KP=kp, HAS_IDX=True, **tile_options(GROUP * kp))
            v1, i1 = v2, i2
        kern(v1, i1, unused(torch.float32, k_), res, end, ns * kp, KP=kp, HAS_IDX=True, FINAL=True,
             **tile_options(ns * kp))
    if sorted:
        keys = torch.empty((rows, k_), dtype=torch.int64, device=scores.device)
        topk_rank_keys[target](x, res, keys, BM=min(1024, kp))
        topk_order[target](keys, res, out, BI=min(64, kp), BJ=min(64, kp))
    return out

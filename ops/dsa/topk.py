"""Exact row-wise top-k for the DSA indexer scores (k up to 2048, rows up to ~128K and beyond).

Result: int32 [R, k]; row r lists the positions of its min(k, valid) largest scores ordered by
(score descending, position ascending), then -1. A score is valid when it is > -inf (the indexer
writes -inf outside each token's key range; NaN never counts). Ties go to the lower position, so
the result is deterministic and identical on every target.

Design (chunked merge, then a merge tree): KP = next power of two >= k. Stage 1 gives each
program a segment of SEG = CH * KP scores of one row; it sorts the first KP-wide chunk and merges
each further chunk into the running top-KP list (values + positions, in the order above) with one
k.topk over the 2*KP-long concatenation [running, chunk]. The running list always holds lower
positions than the chunk, and k.topk keeps the lower lane first on equal values, so ties resolve
to the lower position. Then launches of the same kernel merge neighbouring segment lists in pairs
(lower list first: the same tie rule) until one list per row is left; the last launch writes -1
for invalid entries. CH is chosen for ~512 stage-1 programs; the tree keeps the sequential chain
at CH + log2(L / SEG) merges (one program per row merging every list would be L / SEG).
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import next_pow2, require_tensor, resolve_target

MAX_K = 4096


@k.func
def merge_topk(run_v, run_i, v, i, KP):
    """Merge a chunk (values v, positions i, [KP]) into the running list (run_v, run_i, [KP],
    sorted by value descending, position ascending; all its positions below the chunk's)."""
    tv, tp = k.topk(k.cat(run_v, v), KP)
    return tv, k.take(k.cat(run_i, i), tp)


# Sorting networks of 2*KP int64 keys: more warps for long lists (a guess until measured on a GPU).
TOPK_CONFIGS = [{"KP": 4096, "num_warps": 16}, {"KP": 2048, "num_warps": 8}, {"KP": 1024, "num_warps": 8}]


@k.kernel(configs=TOPK_CONFIGS)
def topk_segments(vals: k.Tensor[k.f32, "R", "N"], idx: k.Tensor[k.i32, "R", "N"], out_v: k.Tensor[k.f32, "R", "M"],
                  out_i: k.Tensor[k.i32, "R", "M"], seg: k.i32,
                  KP: k.constexpr = 16, HAS_IDX: k.constexpr = False, FINAL: k.constexpr = False):
    # Program (r, sp) reduces vals[r, sp*seg : (sp+1)*seg] (seg a multiple of KP) to its top KP,
    # written to out_*[r, sp*KP : (sp+1)*KP]. Positions are the column (HAS_IDX=False) or idx's
    # entry (then every KP-wide chunk is already a sorted list: the first one needs no sort).
    # FINAL: only the positions, -1 where the value is not > -inf, columns past M dropped.
    for r, sp in k.grid(vals.shape[0], k.cdiv(vals.shape[1], seg)):
        start = sp * seg
        v = vals[r, k.span(start, KP, other=float("-inf"))]
        if HAS_IDX:
            run_v = v
            run_i = idx[r, k.span(start, KP, other=-1)]
        else:
            run_v, pos = k.topk(v, KP)
            run_i = start + pos
        for c in range(1, k.cdiv(k.minimum(seg, vals.shape[1] - start), KP)):
            col = start + c * KP
            v = vals[r, k.span(col, KP, other=float("-inf"))]
            if HAS_IDX:
                i = idx[r, k.span(col, KP, other=-1)]
            else:
                i = col + k.arange(KP)
            run_v, run_i = merge_topk(run_v, run_i, v, i, KP)
        if FINAL:
            out_i[r, k.span(sp * KP, KP)] = k.where(run_v > float("-inf"), run_i, -1)
        else:
            out_v[r, k.span(sp * KP, KP)] = run_v
            out_i[r, k.span(sp * KP, KP)] = run_i


def _plan(rows: int, length: int, kp: int, programs: int = 512) -> int:
    """Chunks per stage-1 segment: a power of two (at most 8) leaving about `programs` programs."""
    chunks = -(-length // kp)
    ch = 1
    while ch < 8 and rows * -(-chunks // (2 * ch)) >= programs:
        ch *= 2
    return ch


def topk(scores, k_: int, *, chunks: int | None = None, target: str | None = None):
    """Positions of the k largest valid scores of each row -> int32 [R, k] (see the module
    docstring for order, ties and -1 padding). scores: fp32 [R, L]. chunks overrides the
    stage-1 segment length in units of KP (tests use it to force the two-stage path)."""
    import torch
    target = resolve_target(target)
    require_tensor("topk", "scores", scores, (k.f32,))
    if scores.dim() != 2:
        raise K31Error(f"topk: `scores` must be 2-D [rows, L], got shape {list(scores.shape)}")
    if not (isinstance(k_, int) and 1 <= k_ <= MAX_K):
        raise K31Error(f"topk: k={k_!r} must be an int in [1, {MAX_K}]")
    rows, length = scores.shape
    out = torch.empty((rows, k_), dtype=torch.int32, device=scores.device)
    if rows == 0:
        return out
    if length == 0:
        return out.fill_(-1)
    kp = max(16, next_pow2(k_))
    ch = chunks if chunks is not None else _plan(rows, length, kp)
    seg = ch * kp
    ns = -(-length // seg)
    x = scores.contiguous()
    kern = topk_segments[target]
    def unused(dtype, n):            # a parameter the specialisation never touches (stride 0)
        return torch.empty(1, dtype=dtype, device=scores.device).expand(rows, n)

    if ns == 1:
        kern(x, unused(torch.int32, length), unused(torch.float32, k_), out, seg, KP=kp, FINAL=True)
        return out
    v1 = torch.empty((rows, ns * kp), dtype=torch.float32, device=scores.device)
    i1 = torch.empty((rows, ns * kp), dtype=torch.int32, device=scores.device)
    kern(x, unused(torch.int32, length), v1, i1, seg, KP=kp)
    while ns > 2:                    # pairwise merges of neighbouring lists
        ns = -(-ns // 2)
        v2 = torch.empty((rows, ns * kp), dtype=torch.float32, device=scores.device)
        i2 = torch.empty((rows, ns * kp), dtype=torch.int32, device=scores.device)
        kern(v1, i1, v2, i2, 2 * kp, KP=kp, HAS_IDX=True)
        v1, i1 = v2, i2
    kern(v1, i1, unused(torch.float32, k_), out, ns * kp, KP=kp, HAS_IDX=True, FINAL=True)
    return out

"""Block AttnRes phase 1 with a logit cache: the committed blocks are read once per block.

`attnres_prepare` must read every source row twice (the logits first, then the softmax-weighted
sum), and on a GPU the second read comes only partly from L2. But a block's logits
z[i, j, t] = q_j . v_i[t] / rms(v_i[t]) depend on nothing but block i and the (static)
pseudo-query j, so they can be computed once, when block i is new, for every query that will
ever attend over it. `attnres_prepare_cached` does that for the newest block and keeps the
numbers in a cache tensor; the older blocks' logits come from the cache, so their rows are read
once, for the weighted sum alone.

Two kernels (ops/attnres_prepare.py): `attnres_block_logits` scores the newest block as a
tensor-core GEMM over row tiles (operands split in bf16 pairs: about fp32 accuracy) into the
cache, then `attnres_prepare_cached_rows` is the prepare's second sweep alone, its logits read
from the cache. Bytes: the newest block once more (1/n of the blocks) instead of every block.
H200, n = 8, T = 8192, D = 7168, S = 6: 0.904 ms against 1.228 for attnres_prepare in the same
run (benchmarks/NOTES.md, AttnRes).

Usage, per AttnRes block b (queries: every pseudo-query of the model in order, [Q, D]; this
block's are queries[first : first + count], and all later blocks' follow them):

    logits = torch.empty(n_blocks, Q, T)                         # once per forward
    O, M, L = attnres_prepare_cached(blocks_b, queries, logits, first, count)

The call writes logits[n - 1, first:] (the newest of the n blocks against this and every later
query) and needs logits[i, first : first + count] for i < n - 1 from the earlier calls.
"""
from __future__ import annotations

import itertools

from k31dsl.dsl.errors import K31Error
from k31dsl.ops.attnres import (_check_sources, _eps, _fold, _queries, _rank, _rel, _sources,
                                madd_kernel, prepare_outputs, source_tiles)
from k31dsl.ops.attnres_prepare import (CACHED_CONFIGS, LOGIT_CONFIGS, attnres_block_logits,  # noqa: F401
                                        attnres_block_logits_rows, attnres_prepare_cached_rows)
from k31dsl.ops.common import next_pow2, require_same_device, require_tensor, resolve_target
from k31dsl.ops.registry import CaseResult, OpSpec, register

# bf16x3 logits keep each product to ~2^-16, so z is off by ~1e-5 of its scale and O / L move by
# that times the logit scale: at scale 20 up to 2.3e-4 in 60 seeds of _check_cached (numpy, which
# rounds the split operands exactly as the GPU does), 3.5e-5 at scale 2.
LOGIT_TOL = 1e-3
MAX_FUTURE = 256                # queries one call scores the newest block against ([BT, QB] in registers)


def logit_constexprs(future: int) -> dict:
    """attnres_block_logits' constexprs: QB covers the future queries (>= 16, the dot's minimum);
    past 128 the call pins 16-row tiles (sm_90a, QB 256 at the default 4 warps: 146 registers, no
    spill; constexprs only: graph programs pass no launch options)."""
    qb = max(16, next_pow2(future))
    return {"QB": qb, **({"BT": 16, "BK": 32} if qb > 128 else {})}


ROW_FORM_MAX_T = 256            # steps up to this many rows score the newest block in the row form
LOGIT_KERNELS = {"rows": attnres_block_logits_rows, "gemm": attnres_block_logits}
LOGIT_FORMS = tuple(LOGIT_KERNELS)


def logit_form(t: int) -> str:
    """The logit kernel for a T-row step: "rows" (attnres_block_logits_rows, one program per row
    and 16 queries) for decode-sized steps, "gemm" (attnres_block_logits, row tiles on tensor
    cores) above ROW_FORM_MAX_T rows."""
    return "rows" if t <= ROW_FORM_MAX_T else "gemm"


def form_constexprs(form: str, future: int, d: int) -> dict:
    """The constexprs of LOGIT_KERNELS[form] scoring the newest block against `future` queries."""
    if form == "rows":
        return {"QB": min(16, next_pow2(future)), "BD": min(256, max(16, next_pow2(d)))}
    return logit_constexprs(future)


def cached_constexprs(n: int, count: int) -> dict:
    """attnres_prepare_cached_rows' constexprs for the n sources and this block's count queries
    (source_tiles, as prepare_constexprs)."""
    return source_tiles(n, count, STAGES=None, DROP=None)


def kernels(target: str, form: str = "gemm"):
    """(logits, rows) compiled for `target` (madd_kernel, as the plain prepare); `form` picks the
    logit kernel (logit_form)."""
    return madd_kernel(LOGIT_KERNELS[form], target), madd_kernel(attnres_prepare_cached_rows, target)


def _index(op: str, name: str, value, lo: int, hi: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise K31Error(f"{op}: `{name}` must be an int in {lo}..{hi} ({what}), got {value!r}")
    return value


def attnres_prepare_cached(blocks, queries, logits, first: int, count: int, eps: float = 1e-6, *,
                           norm_weights=None, form: str | None = None, target: str | None = None):
    """Phase 1 of Block AttnRes reading the blocks once, with the logit cache (module docstring).

    blocks: [n, T, D] committed blocks (fp32; bf16/f16 accepted). queries: [Q, D], every
    pseudo-query from this block's on may be scored (norm_weights: optional [Q, D] or [D] gains,
    folded in). logits: fp32 [N >= n, Q, T], contiguous, updated in place: row n - 1 gets the
    newest block's logits for queries first .. Q - 1; rows i < n - 1 must already hold block i's
    logits for queries first .. first + count - 1. Returns fp32 (O [count, T, D], M, L [count, T])
    for those queries, as attnres_prepare(blocks, queries[first : first + count]) would.
    form: the logit kernel, "rows" or "gemm" (default: logit_form(T), by the number of rows)."""
    import torch
    op = "attnres_prepare_cached"
    target = resolve_target(target)
    _check_sources(op, "blocks", blocks)
    n, t, d = blocks.shape
    require_tensor(op, "queries", queries)
    _rank(op, "queries", queries, 2, "[Q, D]")
    nq = queries.shape[0]
    if nq < 1 or queries.shape[1] != d:
        raise K31Error(f"{op}: `queries` must be [Q >= 1, {d}] (D of the blocks), got {list(queries.shape)}")
    first = _index(op, "first", first, 0, nq - 1, "the index of this block's first query in `queries`")
    count = _index(op, "count", count, 1, nq - first, "this block's number of queries, from `first` on")
    if nq - first > MAX_FUTURE:
        raise K31Error(f"{op}: {nq - first} queries from `first` on; one call scores at most {MAX_FUTURE}",
                       hint="keep only the queries of this and the later blocks in the table")
    require_tensor(op, "logits", logits)
    if logits.dtype != torch.float32 or logits.dim() != 3 or logits.shape[0] < n or tuple(logits.shape[1:]) != (nq, t):
        raise K31Error(f"{op}: `logits` must be float32 [N >= {n}, {nq}, {t}] (blocks x queries x tokens), "
                       f"got {str(logits.dtype).replace('torch.', '')} {list(logits.shape)}")
    if not logits.is_contiguous():
        raise K31Error(f"{op}: `logits` must be contiguous (it is written in place)", hint="allocate it with "
                       "torch.empty and pass it whole; `first` selects the queries")
    if form is not None and form not in LOGIT_FORMS:
        raise K31Error(f"{op}: form={form!r} is not a logit form", hint=f"one of {', '.join(LOGIT_FORMS)}, or None "
                       f"to choose by the number of rows (row form up to {ROW_FORM_MAX_T})")
    q = _fold(op, queries, norm_weights, (nq, d))
    require_same_device(op, blocks=blocks, queries=q, logits=logits)
    eps = _eps(op, "eps", eps)
    o, m, l = prepare_outputs(count, t, d, blocks.device)
    if t:
        v = blocks.contiguous()
        form = form or logit_form(t)
        score, weigh = kernels(target, form)
        score(v, q, logits, eps, first, n, **form_constexprs(form, nq - first, d))
        weigh(v, logits, o, m, l, first, n, **cached_constexprs(n, count))
    return o, m, l


# ---------------------------------------------------------------- registered check

def _check_cached(target: str, seed: int = 0) -> list[CaseResult]:
    """A forward's worth of calls per case (one per block, the cache carried along) against the
    fp64 prepare of the same blocks and queries; the cache's rows against the oracle's logits.
    The cache starts as NaN: an entry read before it was written would show."""
    import torch
    from k31dsl.ops.testing import device_for, dtype_name, load_oracle, max_rel_err, to_f64
    ref = load_oracle("attnres")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    # (T, D), the queries of each block, blocks' dtype, logit scale
    cases = [((5, 200), (2, 3, 1), torch.float32, 2.0), ((3, 130), (4, 4, 4, 2), torch.float32, 20.0),
             ((2, 45), (1, 9), torch.bfloat16, 2.0), ((4, 64), (3,) * 5, torch.float32, 2.0)]
    out = []
    for ((t, d), plan, dt, scale), form in itertools.product(cases, LOGIT_FORMS):
        nb, nq = len(plan), sum(plan)
        v = _sources((nb, t, d), dt, g)
        q = _queries((nq, d), g, scale)
        z = torch.full((nb, nq, t), float("nan"), device=dev)
        name = f"T={t}, D={d}, queries per block {list(plan)}, {dtype_name(dt)}, logit scale {scale}, {form} logits"
        first, v_dev, q_dev = 0, v.to(dev), q.to(dev)
        for b, count in enumerate(plan):
            o, m, l = attnres_prepare_cached(v_dev[:b + 1], q_dev, z, first, count, 1e-6, form=form, target=target)
            want = ref.prepare(to_f64(v[:b + 1]), to_f64(q[first:first + count]), 1e-6)
            for what, got, w in zip("OML", (o, m, l), want):
                err = _rel(got, w, normwise=what != "L")
                out.append(CaseResult(f"{name}: block {b} {what}", err, LOGIT_TOL, err <= LOGIT_TOL))
            first += count
        first, err = 0, 0.0
        for b, count in enumerate(plan):            # row b: block b against its own and all later queries
            want = ref.logits(to_f64(q[first:]), to_f64(v[b:b + 1]), 1e-6)[:, 0]
            err = max(err, max_rel_err(to_f64(z[b, first:]), want, floor=max(1.0, float(abs(want).max()))))
            first += count
        out.append(CaseResult(f"{name}: the logit cache", err, LOGIT_TOL, err <= LOGIT_TOL))
    return out


register(OpSpec("attnres_prepare_cached", "attnres", attnres_prepare_cached,
                [attnres_block_logits, attnres_prepare_cached_rows],
                "Block AttnRes phase 1 with a logit cache: the newest block scored once for every later "
                "query, the blocks read once -> O, M, L (fp32)", _check_cached, tags=["attnres"]))

"""The AttnRes prepare kernel (phase 1): every pseudo-query of a block against the committed
blocks, one program per token row, two sweeps over the row's sources (ops/attnres.py describes
the op; benchmarks/NOTES.md, AttnRes, the measurements behind each config family)."""

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS

# - 3-D tiles (_prepare_one_row): [NB, BD] source chunks against [SB, BD] query chunks through
#   [SB, NB, BD] broadcasts. Its compiled loops move both tiles through shared memory (8 barriers
#   per chunk); kept: the configs GPU runs 1 and 4 picked (BD 128, 4 warps, with and without
#   PREFETCH) and one of each other sweep variant. 13 -> 4 configs: the dropped ones lost in runs
#   1 and 4, and each config costs ~20 s of compilation in the GPU autotuner.
# - 1-D row tiles (SOURCE_ROWS, _prepare_one_row_sources): BD = one element per thread, no layout
#   conversions or barriers in the chunk loops; RC chunks kept on chip between the sweeps, GROUP
#   chunks per load burst, PREFETCH of the next burst. One 16-warp program per SM keeps the rows in
#   flight (132 x 229 KB) inside the 50 MB L2 for the second sweep; 8 warps: two per SM; 4 warps:
#   four or five per SM (second sweep mostly from DRAM). sm_90 registers (96-128, spill-free at n = 8,
#   S = 6) and the reasoning: benchmarks/NOTES.md, AttnRes "v3".
PREPARE_CONFIGS = [{"BD": bd, "WARPS": w, "REDUCE_EACH": re, "UNROLL_SRC": un, "PREFETCH": pf, "SOURCE_ROWS": False,
                    "RC": 0, "GROUP": 1, "num_warps": w}
                   for bd, w, re, un, pf in (
                       (128, 4, False, False, False), (128, 4, False, False, True), (128, 4, True, False, True),
                       (512, 16, True, True, False))]
SOURCE_ROW_CONFIGS = ((512, 16, 0, 2, False), (512, 16, 0, 1, True), (512, 16, 2, 2, False), (512, 16, 4, 1, False),
                      (512, 16, 1, 1, True), (256, 8, 0, 2, False), (256, 8, 0, 1, True), (256, 8, 1, 2, False),
                      (128, 4, 0, 2, False), (128, 4, 0, 1, True))      # BD, warps, RC, GROUP, PREFETCH
PREPARE_CONFIGS += [{"BD": bd, "WARPS": w, "REDUCE_EACH": False, "UNROLL_SRC": False, "PREFETCH": pf,
                     "SOURCE_ROWS": True, "RC": rc, "GROUP": g, "num_warps": w}
                    for bd, w, rc, g, pf in SOURCE_ROW_CONFIGS]
# L2 hints on the 3-D variant: sweep 1 asks to keep the rows (sweep 2 reads them again), sweep 2
# and the O stores ask to drop theirs (1.41 GB of O otherwise pushes the rows out of the 50 MB
# L2). 8 and 16 warps: one program per SM, fewer rows in flight, so more of them are still in L2
# for sweep 2; DEPTH > 1 puts more chunks in flight per program to make up for it.
PREPARE_CONFIGS += [{"BD": bd, "WARPS": w, "REDUCE_EACH": False, "UNROLL_SRC": False, "PREFETCH": True,
                     "SOURCE_ROWS": False, "RC": 0, "GROUP": 1, "KEEP": keep, "DROP": "first", "DEPTH": depth,
                     "num_warps": w}
                    for bd, w, keep, depth in ((128, 4, None, 1), (256, 8, "last", 1), (256, 8, "last", 2),
                                               (256, 8, "last", 3), (128, 4, "last", 2), (512, 16, "last", 2))]
# WARPS is a constexpr the kernels do not read: it carries the warp count through graph-program
# calls (`p.call` passes constexprs, not launch options) into the fused kernel. Row kernels: BD is the
# whole row (fixed by the call); configs choose only the warp count. At D = 7168 (BD 8192) the
# update kernel needs 255 registers + 400 B spill at 4 warps, 194 at 8, 105 at 16, 56 at 32 (the
# fused kernel 255+368 B / 198 / 105 / 54): one program per SM from 8 warps up.

# ---------------------------------------------------------------- kernels

@k.func
def _prepare_one_row(v, q, o, m, l, eps, t, n, d, chunks, OT, NB, SB, BD, FINAL, REDUCE_EACH, UNROLL_SRC,
                     PREFETCH, DEPTH, KEEP, DROP):
    """attnres_prepare_rows for token row t. PREFETCH issues the next DEPTH chunks' loads before
    the current chunk's arithmetic (DEPTH + 1 chunks in flight per program: the loop is
    latency-bound, most of all with one program per SM).
    KEEP / DROP: L2 hints (None: none) on sweep 1's source loads (KEEP "last": read again by
    sweep 2) and on sweep 2's loads and the O stores (DROP "first": not read again)."""
    sq = k.zeros((NB, BD), k.f32)
    if REDUCE_EACH:
        qv = k.zeros((SB, NB), k.f32)
    else:
        qv = k.zeros((SB, NB, BD), k.f32)
    if PREFETCH:                            # DEPTH chunks in flight: a window of loaded tiles
        xw = ()
        qw = ()
        for u in k.static_range(DEPTH):
            xw = xw + (k.load(v, (k.span(0, NB), t, k.span(u * BD, BD)), other=0.0, evict=KEEP),)
            qw = qw + (q[k.span(0, SB, other=0.0), k.span(u * BD, BD, other=0.0)],)
    for j in range(chunks):
        if PREFETCH:
            x = xw[0].to(k.f32)
            qt = qw[0]                      # past D: no traffic
            xw = xw[1:] + (k.load(v, (k.span(0, NB), t, k.span((j + DEPTH) * BD, BD)), other=0.0, evict=KEEP),)
            qw = qw[1:] + (q[k.span(0, SB, other=0.0), k.span((j + DEPTH) * BD, BD, other=0.0)],)
        else:
            x = k.load(v, (k.span(0, NB), t, k.span(j * BD, BD)), other=0.0, evict=KEEP).to(k.f32)
            qt = q[k.span(0, SB, other=0.0), k.span(j * BD, BD, other=0.0)]
        sq += x * x
        if REDUCE_EACH:
            qv += k.sum(qt[:, None, :] * x[None, :, :], axis=2)
        else:
            qv += qt[:, None, :] * x[None, :, :]
    inv_rms = k.rsqrt(k.sum(sq, axis=1) / d.to(k.f32) + eps)              # [NB]
    if REDUCE_EACH:
        z = qv * inv_rms[None, :]                                         # [SB, NB]
    else:
        z = k.sum(qv, axis=2) * inv_rms[None, :]
    z = k.where((k.arange(NB) < n)[None, :], z, float("-inf"))           # padded sources drop out
    zmax = k.max(z, axis=1)
    e = k.exp(z - zmax[:, None])
    esum = k.sum(e, axis=1)
    if FINAL:
        e = e / esum[:, None]
    else:
        m[k.span(0, SB), t] = zmax
        l[k.span(0, SB), t] = esum
    if PREFETCH and not UNROLL_SRC:
        xw = ()
        for u in k.static_range(DEPTH):
            xw = xw + (k.load(v, (k.span(0, NB), t, k.span((chunks - 1 - u) * BD, BD)), other=0.0, evict=DROP),)
    for jj in range(chunks):
        j = chunks - 1 - jj                 # reverse: the chunks read last are still cached
        if UNROLL_SRC:
            acc = k.zeros((SB, BD), k.f32)
            for i in k.static_range(NB):
                wi = k.sum(k.where((k.arange(NB) == i)[None, :], e, 0.0), axis=1)     # e[:, i]
                xi = k.load(v, (i, t, k.span(j * BD, BD)), other=0.0, evict=DROP).to(k.f32)     # 0 past n
                acc += wi[:, None] * xi[None, :]
        else:
            if PREFETCH:
                x = xw[0].to(k.f32)          # below chunk 0: no traffic
                xw = xw[1:] + (k.load(v, (k.span(0, NB), t, k.span((j - DEPTH) * BD, BD)), other=0.0, evict=DROP),)
            else:
                x = k.load(v, (k.span(0, NB), t, k.span(j * BD, BD)), other=0.0, evict=DROP).to(k.f32)
            acc = k.sum(e[:, :, None] * x[None, :, :], axis=1)
        k.store(o, (k.span(0, SB), t, k.span(j * BD, BD)), acc.to(OT), evict=DROP)


@k.func
def _accumulate_rows(xs, qs, sq, acc, x0, q0, NB, SQ):
    """One chunk of sweep 1 on row tiles: sq[i] += x_i^2, acc[i * SQ + s] += q_s x_i (elementwise,
    reduced once per token), x_i = xs[x0 + i], q_s = qs[q0 + s]."""
    new_sq = ()
    new_acc = ()
    for i in k.static_range(NB):
        x = xs[x0 + i].to(k.f32)
        new_sq = new_sq + (sq[i] + x * x,)
        for s in k.static_range(SQ):
            new_acc = new_acc + (acc[i * SQ + s] + qs[q0 + s] * x,)
    return new_sq, new_acc


@k.func
def _load_rows(v, q, t, j0, NB, SQ, BD, GROUP):
    """Chunks j0 .. j0 + GROUP - 1 of every source row and every query (chunks past D: no traffic)."""
    xs = ()
    qs = ()
    for u in k.static_range(GROUP):
        for i in k.static_range(NB):
            xs = xs + (v[i, t, k.span((j0 + u) * BD, BD, other=0.0)],)
        for s in k.static_range(SQ):
            qs = qs + (q[s, k.span((j0 + u) * BD, BD, other=0.0)],)
    return xs, qs


@k.func
def _reload_rows(v, t, j_hi, RC, d, NB, BD, GROUP):
    """Sweep 2's loads: chunks j_hi, j_hi - 1, ... (GROUP of them) of every source row with their
    first columns; a chunk below RC (kept on chip, or before the row) starts at D: no traffic."""
    cols = ()
    xs = ()
    for u in k.static_range(GROUP):
        c0 = k.where(j_hi - u >= RC, (j_hi - u) * BD, d)
        cols = cols + (c0,)
        for i in k.static_range(NB):
            xs = xs + (v[i, t, k.span(c0, BD, other=0.0)],)
    return cols, xs


@k.func
def _stack(ts, x0, count, BD):
    """Tiles ts[x0] .. ts[x0 + count - 1] ([BD] each; count a power of two, at most 128) as one
    [count, BD] tile, built by a k.cat tree. Triton keeps the new axis in registers (a join adds a
    register dimension: no data moves), so a reduction over it stays in the thread and one over BD
    is a single cross-thread reduction however many rows there are."""
    cur = ()
    for r in k.static_range(count):
        cur = cur + (ts[x0 + r].to(k.f32),)
    width = count
    for _ in k.static_range(7):
        if width > 1:
            nxt = ()
            for p in k.static_range(width // 2):
                nxt = nxt + (k.cat(cur[2 * p], cur[2 * p + 1]),)
            cur = nxt
            width = width // 2
    return k.reshape(cur[0], (count, BD))


@k.func
def _store_rows(o, t, xs, x0, ws, c0, OT, NB, SQ, BD):
    """O[s, t, c0:c0+BD] = sum_i e[s, i] x_i for one chunk: scalar weights ws[s * NB + i] times the
    row tiles xs[x0 + i] (no tile but the rows' own, whatever layout the compiler gives them)."""
    for s in k.static_range(SQ):
        acc = xs[x0].to(k.f32) * ws[s * NB]
        for i in k.static_range(1, NB):
            acc = acc + xs[x0 + i].to(k.f32) * ws[s * NB + i]
        o[s, t, k.span(c0, BD)] = acc.to(OT)


@k.func
def _prepare_one_row_sources(v, q, o, m, l, eps, t, n, d, OT, NB, SB, SQ, BD, RC, GROUP, FINAL, PREFETCH):
    """attnres_prepare_rows for token row t on 1-D tiles: every source row's chunk and every query's
    chunk is its own [BD] tile, the NB x SQ dot products are NB * SQ elementwise accumulators
    reduced once per token, and O is a sum of scalar-weighted row tiles. All tiles have one shape,
    so the compiled loops need no layout conversions (the [SB, NB, BD] broadcasts of the other
    variants move every chunk through shared memory behind barriers). SQ: the exact query count
    (no padded query rows); sources past n load nothing and get weight 0. The first RC chunks of
    the row are loaded first and stay in registers between the sweeps (read once; RC * BD >= D:
    the whole row, the blocks read exactly once); the other chunks are read in bursts of GROUP,
    by sweep 1 and again, in reverse order (the most recently read first: L2), by sweep 2."""
    kept = ()
    for c in k.static_range(RC):
        for i in k.static_range(NB):
            kept = kept + (v[i, t, k.span(c * BD, BD, other=0.0)],)
    sq = ()
    acc = ()
    for i in k.static_range(NB):
        sq = sq + (k.zeros((BD,), k.f32),)
        for s in k.static_range(SQ):
            acc = acc + (k.zeros((BD,), k.f32),)
    chunks = k.cdiv(d, BD)
    if PREFETCH:
        xn, qn = _load_rows(v, q, t, RC, NB, SQ, BD, GROUP)
    for j0 in range(RC, chunks, GROUP):
        if PREFETCH:                          # the next group's loads go out before this group's math
            xs, qs = xn, qn
            xn, qn = _load_rows(v, q, t, j0 + GROUP, NB, SQ, BD, GROUP)
        else:
            xs, qs = _load_rows(v, q, t, j0, NB, SQ, BD, GROUP)
        for u in k.static_range(GROUP):
            sq, acc = _accumulate_rows(xs, qs, sq, acc, u * NB, u * SQ, NB, SQ)
    for c in k.static_range(RC):
        qs = ()
        for s in k.static_range(SQ):
            qs = qs + (q[s, k.span(c * BD, BD, other=0.0)],)
        sq, acc = _accumulate_rows(kept, qs, sq, acc, c * NB, 0, NB, SQ)
    if PREFETCH:                              # sweep 2's first burst goes out before the reduction
        cn, xn = _reload_rows(v, t, chunks - 1, RC, d, NB, BD, GROUP)
    # one cross-thread reduction for all NB * W sums: row i * W + w of the stack is source i's dot
    # with query w (w < SQ), its sum of squares (w = SQ) or zero
    if SQ < SB:
        W = SB
    else:
        W = 2 * SB
    parts = ()
    for i in k.static_range(NB):
        for w in k.static_range(W):
            if w < SQ:
                parts = parts + (acc[i * SQ + w],)
            elif w == SQ:
                parts = parts + (sq[i],)
            else:
                parts = parts + (k.zeros((BD,), k.f32),)
    sums = k.reshape(k.sum(_stack(parts, 0, NB * W, BD), axis=1), (NB, W))      # [NB, W], in registers
    slot = k.arange(W)
    inv_rms = k.rsqrt(k.sum(k.where(slot[None, :] == SQ, sums, 0.0), axis=1) / d.to(k.f32) + eps)   # [NB]
    z = k.where((k.arange(NB) < n)[:, None], sums * inv_rms[:, None], float("-inf"))   # padded sources drop out
    zmax = k.max(z, axis=0)                                               # [W]: column s < SQ is query s
    e = k.exp(z - zmax[None, :])
    esum = k.sum(e, axis=0)
    if FINAL:
        e = e / esum[None, :]
    else:
        m[k.span(0, W), t] = zmax                                         # columns past S are not stored
        l[k.span(0, W), t] = esum
    # the weights as scalars (e is held whole by every thread: picking an element is in-thread work)
    ws = ()
    for s in k.static_range(SQ):
        for i in k.static_range(NB):
            ws = ws + (k.sum(k.where((slot[None, :] == s) & (k.arange(NB)[:, None] == i), e, 0.0)),)
    # reverse: the chunks read last are still cached; a chunk below RC starts past D (no traffic)
    for jj in range(0, chunks - RC, GROUP):
        if PREFETCH:
            cols, xs = cn, xn
            cn, xn = _reload_rows(v, t, chunks - 1 - jj - GROUP, RC, d, NB, BD, GROUP)
        else:
            cols, xs = _reload_rows(v, t, chunks - 1 - jj, RC, d, NB, BD, GROUP)
        for u in k.static_range(GROUP):
            _store_rows(o, t, xs, u * NB, ws, cols[u], OT, NB, SQ, BD)
    for c in k.static_range(RC):
        _store_rows(o, t, kept, c * NB, ws, c * BD, OT, NB, SQ, BD)


@k.kernel(configs=PREPARE_CONFIGS)
def attnres_prepare_rows(v: k.Tensor["VT", "N", "T", "D"], q: k.Tensor[k.f32, "S", "D"],
                         o: k.Tensor["OT", "S", "T", "D"], m: k.Tensor[k.f32, "S", "T"],
                         l: k.Tensor[k.f32, "S", "T"], eps: k.f32,
                         VT: k.constexpr[FLOAT_INPUTS] = k.f32, OT: k.constexpr[FLOAT_INPUTS] = k.f32,
                         NB: k.constexpr = 4, SB: k.constexpr = 4, BD: k.constexpr = 128,
                         FINAL: k.constexpr = False, REDUCE_EACH: k.constexpr = False,
                         UNROLL_SRC: k.constexpr = False, PREFETCH: k.constexpr = False,
                         RC: k.constexpr = 0, GROUP: k.constexpr = 1, SOURCE_ROWS: k.constexpr = False,
                         SQ: k.constexpr = 0, WARPS: k.constexpr = 4, KEEP: k.constexpr = None,
                         DROP: k.constexpr = None, DEPTH: k.constexpr = 1):
    # FINAL (full AttnRes, S = 1): write O / L in OT and skip the statistics.
    # REDUCE_EACH: reduce the dot products over each chunk (registers SB * NB) instead of keeping
    # an [SB, NB, BD] accumulator. UNROLL_SRC: the second sweep unrolls over the sources, one
    # row load and one [SB, BD] multiply-add each (no reduction across threads).
    # PREFETCH: the next chunk's loads are issued before the current chunk's arithmetic.
    # KEEP / DROP: L2 hints of the 3-D variant (_prepare_one_row); DEPTH: its prefetch depth.
    # SOURCE_ROWS: 1-D row tiles (_prepare_one_row_sources), RC/GROUP apply to it; SQ = the exact
    # query count (0: SB). NB/SB (sources/queries, powers of two) are always passed by the callers;
    # the defaults (4) keep the unrolled IR of `kernel.ir()` (round-trip tests, `k31dsl compile`) small.
    for t in k.grid(v.shape[1]):
        if SOURCE_ROWS:
            if SQ > 0:
                _prepare_one_row_sources(v, q, o, m, l, eps, t, v.shape[0], v.shape[2], OT, NB, SB, SQ, BD, RC, GROUP,
                                         FINAL, PREFETCH)
            else:
                _prepare_one_row_sources(v, q, o, m, l, eps, t, v.shape[0], v.shape[2], OT, NB, SB, SB, BD, RC, GROUP,
                                         FINAL, PREFETCH)
        else:
            _prepare_one_row(v, q, o, m, l, eps, t, v.shape[0], v.shape[2], k.cdiv(v.shape[2], BD), OT, NB, SB,
                             BD, FINAL, REDUCE_EACH, UNROLL_SRC, PREFETCH, DEPTH, KEEP, DROP)

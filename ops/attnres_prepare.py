"""The AttnRes prepare kernel (phase 1): every pseudo-query of a block against the committed
blocks, one program per token row, two sweeps over the row's sources (ops/attnres.py describes
the op; benchmarks/NOTES.md, AttnRes, the measurements behind each config)."""

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS

# [NB, BD] source chunks against [SB, BD] query chunks through [SB, NB, BD] broadcasts. Each
# config costs ~20 s of compilation in the GPU autotuner. H200, n = 8, T = 8192, D = 7168, S = 6
# (NOTES, AttnRes): both sweeps pipelined by Triton (STAGES: cp.async through shared memory, the
# manual PREFETCH off) 1.200 ms at BD 128 / 4 warps / 6 or 10 stages and 1.221 at BD 256 / 8 warps
# / 6, against 1.448 for the best register-prefetch config (ROWS3D, BD 256 / 8 warps, L2 hints),
# kept as the fallback (probes/prepare_configs.py, runs 5-6 of the 12:56 UTC session; 8-12 stages
# and 2-warp BD 64 configs gave 1.21-1.25).
# Tried and taken out: REDUCE_EACH (each chunk's products reduced at once: 4.75 ms) and UNROLL_SRC
# (sweep 2 unrolled over the sources: 5.56 ms); 1-D source-row tiles with chunks kept on chip
# (2.3-3.9 ms), a deeper register prefetch window (2.0-2.1 ms), a TF32 tensor-core probe
# (6.7-12.7 ms), sweep 2 on [NB, 1, BD2] tiles (1.66-1.71 ms).
PIPELINED = {"PREFETCH": False, "DROP": "first", "ROWS3D": True}
PREPARE_CONFIGS = [dict(PIPELINED, BD=bd, WARPS=w, KEEP=keep, STAGES=st, num_warps=w)
                   for bd, w, keep, st in ((128, 4, None, 6), (128, 4, None, 10), (256, 8, "last", 6))]
PREPARE_CONFIGS += [{"BD": 256, "WARPS": 8, "PREFETCH": True, "KEEP": "last", "DROP": "first", "ROWS3D": True,
                     "num_warps": 8},
                    {"BD": 128, "WARPS": 4, "PREFETCH": True, "KEEP": None, "DROP": "first", "num_warps": 4}]
# WARPS is a constexpr the kernels do not read: it carries the warp count through graph-program
# calls (`p.call` passes constexprs, not launch options) into the fused kernel. Row kernels: BD is the
# whole row (fixed by the call); configs choose only the warp count. At D = 7168 (BD 8192) the
# update kernel needs 255 registers + 400 B spill at 4 warps, 194 at 8, 105 at 16, 56 at 32 (the
# fused kernel 255+368 B / 198 / 105 / 54): one program per SM from 8 warps up.

# ---------------------------------------------------------------- kernels

@k.func
def _source_chunk(v, t, j, NB, BD, hint, ROWS3D):
    """Chunk j of token row t's sources: [NB, BD], or [NB, 1, BD] with the token axis kept as a span
    of one (ROWS3D). Chunks outside [0, D) and sources past v's rows move no data and read 0."""
    if ROWS3D:
        return k.load(v, (k.span(0, NB), k.span(t, 1), k.span(j * BD, BD)), other=0.0, evict=hint)
    return k.load(v, (k.span(0, NB), t, k.span(j * BD, BD)), other=0.0, evict=hint)


@k.func
def _live_chunk(v, t, j, n, NB, BD, hint):
    """_source_chunk [NB, BD] of the first n sources only: v may be a buffer with more rows (the
    model's source buffer, filled block by block), whose later rows are not read."""
    return k.load(v, (k.span(0, NB), t, k.span(j * BD, BD)), mask=(k.arange(NB) < n)[:, None], other=0.0,
                  evict=hint)


@k.func
def _sweep1(v, q, eps, t, d, chunks, NB, SB, BD, PREFETCH, KEEP, ROWS3D, STAGES):
    """Sweep 1: every source's sum of squares and its dot with every query, the logits z [SB, NB]
    (before masking). [NB, BD] source chunks meet [SB, BD] query chunks through [SB, NB, BD]
    broadcasts; with ROWS3D the source chunk is loaded as [NB, 1, BD] against [1, SB, BD] queries,
    a tile that already has the layout of the [NB, SB, BD] product, so the loop needs no
    shared-memory layout conversions (sm_90, BD 256 / 8 warps: 28 barriers in the kernel against
    60)."""
    if ROWS3D:
        sq = k.zeros((NB, 1, BD), k.f32)
        qv = k.zeros((NB, SB, BD), k.f32)
    else:
        sq = k.zeros((NB, BD), k.f32)
        qv = k.zeros((SB, NB, BD), k.f32)
    if PREFETCH:
        x_next = _source_chunk(v, t, 0, NB, BD, KEEP, ROWS3D)
        q_next = q[k.span(0, SB, other=0.0), k.span(0, BD, other=0.0)]
    for j in k.range(chunks, stages=STAGES):
        if PREFETCH:
            x = x_next.to(k.f32)
            qt = q_next
            x_next = _source_chunk(v, t, j + 1, NB, BD, KEEP, ROWS3D)          # past D: no traffic
            q_next = q[k.span(0, SB, other=0.0), k.span((j + 1) * BD, BD, other=0.0)]
        else:
            x = _source_chunk(v, t, j, NB, BD, KEEP, ROWS3D).to(k.f32)
            qt = q[k.span(0, SB, other=0.0), k.span(j * BD, BD, other=0.0)]
        sq += x * x
        if ROWS3D:
            qv += qt[None, :, :] * x
        else:
            qv += qt[:, None, :] * x[None, :, :]
    if ROWS3D:
        inv_rms = k.rsqrt(k.reshape(k.sum(sq, axis=2), (NB,)) / d.to(k.f32) + eps)     # [NB]
        return (k.sum(qv, axis=2) * inv_rms[:, None]).T
    inv_rms = k.rsqrt(k.sum(sq, axis=1) / d.to(k.f32) + eps)              # [NB]
    return k.sum(qv, axis=2) * inv_rms[None, :]


@k.func
def _prepare_one_row(v, q, o, m, l, eps, t, n, d, chunks, OT, NB, SB, BD, FINAL, PREFETCH, KEEP, DROP, ROWS3D,
                     STAGES):
    """attnres_prepare_rows for token row t. PREFETCH issues the next chunk's loads before the
    current chunk's arithmetic (two chunks in flight per program: the loop is latency-bound);
    STAGES has Triton pipeline both sweeps' loads that deep instead. KEEP / DROP: L2 hints (None:
    none) on sweep 1's source loads (KEEP "last": read again by sweep 2) and on sweep 2's loads
    and the O stores (DROP "first": not read again)."""
    z = _sweep1(v, q, eps, t, d, chunks, NB, SB, BD, PREFETCH, KEEP, ROWS3D, STAGES)
    _weigh_sources(v, o, m, l, z, t, n, chunks, OT, NB, SB, BD, FINAL, PREFETCH, DROP, STAGES)


@k.func
def _weigh_sources(v, o, m, l, z, t, n, chunks, OT, NB, SB, BD, FINAL, PREFETCH, DROP, STAGES, LIVE=False):
    """Sweep 2 of token row t from its logits z [SB, NB]: the softmax over the n sources, the
    statistics M / L (or, FINAL, the normalised weights), and O = sum_i e_i v_i chunk by chunk,
    in reverse chunk order: the chunks read last are still in L2. LIVE: v may hold more than n
    rows (_live_chunk)."""
    z = k.where((k.arange(NB) < n)[None, :], z, float("-inf"))           # padded sources drop out
    zmax = k.max(z, axis=1)
    e = k.exp(z - zmax[:, None])
    esum = k.sum(e, axis=1)
    if FINAL:
        e = e / esum[:, None]
    else:
        m[k.span(0, SB), t] = zmax
        l[k.span(0, SB), t] = esum
    if PREFETCH:
        x_next = _source_chunk(v, t, chunks - 1, NB, BD, DROP, False)
    for jj in k.range(chunks, stages=STAGES):
        j = chunks - 1 - jj
        if PREFETCH:
            x = x_next.to(k.f32)
            x_next = _source_chunk(v, t, j - 1, NB, BD, DROP, False)          # j = 0: no traffic
        elif LIVE:
            x = _live_chunk(v, t, j, n, NB, BD, DROP).to(k.f32)
        else:
            x = _source_chunk(v, t, j, NB, BD, DROP, False).to(k.f32)
        acc = k.sum(e[:, :, None] * x[None, :, :], axis=1)
        k.store(o, (k.span(0, SB), t, k.span(j * BD, BD)), acc.to(OT), evict=DROP)


@k.kernel(configs=PREPARE_CONFIGS)
def attnres_prepare_rows(v: k.Tensor["VT", "N", "T", "D"], q: k.Tensor[k.f32, "S", "D"],
                         o: k.Tensor["OT", "S", "T", "D"], m: k.Tensor[k.f32, "S", "T"],
                         l: k.Tensor[k.f32, "S", "T"], eps: k.f32,
                         VT: k.constexpr[FLOAT_INPUTS] = k.f32, OT: k.constexpr[FLOAT_INPUTS] = k.f32,
                         NB: k.constexpr = 4, SB: k.constexpr = 4, BD: k.constexpr = 128,
                         FINAL: k.constexpr = False, PREFETCH: k.constexpr = False,
                         WARPS: k.constexpr = 4, KEEP: k.constexpr = None, DROP: k.constexpr = None,
                         ROWS3D: k.constexpr = False, STAGES: k.constexpr = None):
    # FINAL (full AttnRes, S = 1): write O / L in OT and skip the statistics.
    # PREFETCH: the next chunk's loads are issued before the current chunk's arithmetic.
    # KEEP / DROP: L2 hints (_prepare_one_row). ROWS3D: sweep 1 on [NB, 1, BD] source tiles
    # (_sweep1). STAGES: both sweeps' loops as k.range(stages=STAGES), so Triton software-pipelines
    # their loads STAGES deep through shared memory (cp.async).
    # NB/SB (sources/queries, powers of two) are always passed by the callers; the defaults (4)
    # keep the unrolled IR of `kernel.ir()` (round-trip tests, `k31dsl compile`) small.
    for t in k.grid(v.shape[1]):
        _prepare_one_row(v, q, o, m, l, eps, t, v.shape[0], v.shape[2], k.cdiv(v.shape[2], BD), OT, NB, SB, BD,
                         FINAL, PREFETCH, KEEP, DROP, ROWS3D, STAGES)


# ---------------------------------------------------------------- the cached form (one read)

# The newest block's logits as a tensor-core GEMM over BT-row tiles, so the query table is read
# once per tile: a row-wise logit pass (one program per row, fused with the sweep) read all its
# queries per row, 1.4 MB at 48 queries, and took 1.65 ms against 0.96 at 12 (H200, run 2 of the
# 14:48 session). The dot splits its fp32 operands (bf16x3: ~4e-6 of the largest logit) to stay
# at about fp32 accuracy; probes/logit_gemm.py (runs 6-7, results/attnres_logit_probe*.md) at 12 /
# 48 queries: bf16x3 0.112 / 0.167 ms at BT 64 / BK 64 / 5 stages, Triton's tf32x3 0.161 / 0.255,
# one tf32 pass 0.077 / 0.081 (but 7.7e-4 off), CUDA-core fp32 0.33 / 0.65; cuBLAS fp32 0.30 / 0.35.
LOGIT_CONFIGS = [{"BT": bt, "BK": bk, "num_warps": 4, "num_stages": st}
                 for bt, bk, st in ((64, 64, 5), (32, 64, 4), (64, 32, 4))]
CACHED_CONFIGS = [{"BD": bd, "WARPS": w, "STAGES": 6, "DROP": "first", "num_warps": w}
                  for bd, w in ((128, 4), (256, 8))]


@k.func
def _split_dot(a, b):
    """a @ b for fp32 tiles on bf16 tensor cores: each operand split into a bf16 head and the bf16
    of its remainder, three dots (head x head, head x tail, tail x head); the dropped tail x tail and
    the remainders' rounding leave ~2^-16 of each product."""
    a_hi = a.to(k.bf16)
    b_hi = b.to(k.bf16)
    a_lo = (a - a_hi.to(k.f32)).to(k.bf16)
    b_lo = (b - b_hi.to(k.f32)).to(k.bf16)
    return k.dot(a_hi, b_hi) + k.dot(a_hi, b_lo) + k.dot(a_lo, b_hi)


@k.kernel(configs=LOGIT_CONFIGS)
def attnres_block_logits(v: k.Tensor["VT", "N", "T", "D"], q: k.Tensor[k.f32, "Q", "D"],
                         z: k.Tensor[k.f32, "NZ", "Q", "T"], eps: k.f32, q0: k.i32, n: k.i32,
                         VT: k.constexpr[FLOAT_INPUTS] = k.f32, QB: k.constexpr = 16, BT: k.constexpr = 32,
                         BK: k.constexpr = 64, PREC: k.constexpr = "bf16x3"):
    # z[n - 1, q0 + j, t] = q[q0 + j] . v[n - 1, t] / rms(v[n - 1, t]) for the newest of the n
    # sources (v may have more rows: a buffer filled block by block) and every query from q0 on
    # (QB >= Q - q0; the dot needs QB, BT, BK >= 16). PREC: bf16x3 (_split_dot), tf32x3, or the
    # probes' "tf32" (~1e-3 off) and "ieee" (CUDA cores).
    for pt in k.grid(k.cdiv(v.shape[1], BT)):
        t0 = pt * BT
        newest = n - 1
        acc = k.zeros((BT, QB), k.f32)
        sq = k.zeros((BT,), k.f32)
        for j in range(k.cdiv(v.shape[2], BK)):
            x = k.load(v, (newest, k.span(t0, BT), k.span(j * BK, BK)), other=0.0).to(k.f32)
            qc = q[k.span(q0, QB, other=0.0), k.span(j * BK, BK, other=0.0)]
            if PREC == "bf16x3":
                acc += _split_dot(x, qc.T)
            else:
                acc += k.dot(x, qc.T, precision=PREC)
            sq += k.sum(x * x, axis=1)
        r = k.rsqrt(sq / v.shape[2].to(k.f32) + eps)
        z[newest, k.span(q0, QB), k.span(t0, BT)] = (acc * r[:, None]).T


# Steps of a few rows (decode): the GEMM above has cdiv(T, BT) programs, one at T <= 64, each a
# chain of dependent loads over D (H200, small preset decode: 43 us per call, four calls a step,
# results/model_profile_run4.json). The row form gives every (row, QB queries) its own program and
# sums the products on the CUDA cores in fp32 (exact products). It reads T * Q * D * 4 bytes of
# queries (from L2), so it is for small T only: ops/attnres_cached.py, logit_form.
@k.kernel
def attnres_block_logits_rows(v: k.Tensor["VT", "N", "T", "D"], q: k.Tensor[k.f32, "Q", "D"],
                              z: k.Tensor[k.f32, "NZ", "Q", "T"], eps: k.f32, q0: k.i32, n: k.i32,
                              VT: k.constexpr[FLOAT_INPUTS] = k.f32, QB: k.constexpr = 16, BD: k.constexpr = 256):
    # z[n - 1, j, t] as attnres_block_logits, for queries j = q0 + pq * QB + i < Q (programs past
    # the table store nothing).
    for t, pq in k.grid(v.shape[1], k.cdiv(q.shape[0], QB)):
        newest = n - 1
        j0 = q0 + pq * QB
        acc = k.zeros((QB,), k.f32)
        sq = k.zeros((BD,), k.f32)
        for c in range(k.cdiv(v.shape[2], BD)):
            x = v[newest, t, k.span(c * BD, BD, other=0.0)].to(k.f32)
            qc = q[k.span(j0, QB, other=0.0), k.span(c * BD, BD, other=0.0)]
            acc += k.sum(qc * x[None, :], axis=1)
            sq += x * x
        z[newest, k.span(j0, QB), t] = acc * k.rsqrt(k.sum(sq) / v.shape[2].to(k.f32) + eps)


@k.kernel(configs=CACHED_CONFIGS)
def attnres_prepare_cached_rows(v: k.Tensor["VT", "N", "T", "D"], z: k.Tensor[k.f32, "NZ", "Q", "T"],
                                o: k.Tensor[k.f32, "S", "T", "D"], m: k.Tensor[k.f32, "S", "T"],
                                l: k.Tensor[k.f32, "S", "T"], q0: k.i32, n: k.i32,
                                VT: k.constexpr[FLOAT_INPUTS] = k.f32, NB: k.constexpr = 4, SB: k.constexpr = 4,
                                BD: k.constexpr = 128, WARPS: k.constexpr = 4, DROP: k.constexpr = None,
                                STAGES: k.constexpr = None):
    # Sweep 2 alone over the first n rows of v: their logits for the S queries from q0 on come
    # from the cache z (SB >= S; rows past n and queries past S are masked or never stored).
    for t in k.grid(v.shape[1]):
        zt = k.load(z, (k.span(0, NB), k.span(q0, SB), t), other=0.0).T        # [SB, NB]
        _weigh_sources(v, o, m, l, zt, t, n, k.cdiv(v.shape[2], BD), k.f32, NB, SB, BD, False, False, DROP, STAGES,
                       True)

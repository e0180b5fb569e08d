"""The AttnRes prepare kernel (phase 1): every pseudo-query of a block against the committed
blocks, one program per token row, two sweeps over the row's sources (ops/attnres.py describes
the op; benchmarks/NOTES.md, AttnRes, the measurements behind each config)."""

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS

# [NB, BD] source chunks against [SB, BD] query chunks through [SB, NB, BD] broadcasts (the loops
# move both tiles through shared memory: 8 barriers per chunk). GPU runs 1, 4 and KDA-session runs
# 24-25 of 1 Dec (H200, n = 8, T = 8192, D = 7168, S = 6) kept these; each config costs ~20 s of
# compilation in the GPU autotuner. The L2 hints (KEEP on sweep 1's source loads, which sweep 2
# reads again; DROP on sweep 2's loads and the O stores) with 8 warps, one program per SM: 1.50 ms
# against 1.55 without hints at 4 warps; with the ROWS3D sweep 1, 1.465 ms (KDA-session run 30).
# Tried and taken out (NOTES, AttnRes): 1-D source-row tiles with chunks kept on chip (2.3-3.9 ms:
# 32-bit loads, one program per SM latency-bound), a deeper prefetch window (2.0-2.1 ms at 2-3
# chunks ahead), a TF32 tensor-core probe (6.7-12.7 ms), sweep 2 on [NB, 1, BD2] tiles with BD2 =
# 128 x warps so that the sum over the sources stays inside each thread (sm_90a: 28 -> 18 barriers,
# 179 registers; H200, probes/prepare_configs.py: 1.662 ms at BD2 1024 / 8 warps and 1.710 at
# BD2 512 / 4 warps against 1.451 for the config below).
PREPARE_CONFIGS = [{"BD": bd, "WARPS": w, "REDUCE_EACH": re, "UNROLL_SRC": un, "PREFETCH": pf, "num_warps": w}
                   for bd, w, re, un, pf in (
                       (128, 4, False, False, False), (128, 4, False, False, True), (128, 4, True, False, True),
                       (512, 16, True, True, False))]
PREPARE_CONFIGS += [{"BD": bd, "WARPS": w, "REDUCE_EACH": False, "UNROLL_SRC": False, "PREFETCH": True,
                     "KEEP": keep, "DROP": "first", "num_warps": w}
                    for bd, w, keep in ((128, 4, None), (256, 8, "last"))]
PREPARE_CONFIGS += [{"BD": bd, "WARPS": w, "REDUCE_EACH": False, "UNROLL_SRC": False, "PREFETCH": True,
                     "KEEP": keep, "DROP": "first", "ROWS3D": True, "num_warps": w}
                    for bd, w, keep in ((128, 4, None), (256, 8, "last"), (512, 16, "last"))]
# WARPS is a constexpr the kernels do not read: it carries the warp count through graph-program
# calls (`p.call` passes constexprs, not launch options) into the fused kernel. Row kernels: BD is the
# whole row (fixed by the call); configs choose only the warp count. At D = 7168 (BD 8192) the
# update kernel needs 255 registers + 400 B spill at 4 warps, 194 at 8, 105 at 16, 56 at 32 (the
# fused kernel 255+368 B / 198 / 105 / 54): one program per SM from 8 warps up.

# ---------------------------------------------------------------- kernels

@k.func
def _source_chunk(v, t, j, NB, BD, hint, ROWS3D):
    """Chunk j of token row t's sources: [NB, BD], or [NB, 1, BD] with the token axis kept as a span
    of one (ROWS3D). Chunks outside [0, D) and sources past n move no data and read 0."""
    if ROWS3D:
        return k.load(v, (k.span(0, NB), k.span(t, 1), k.span(j * BD, BD)), other=0.0, evict=hint)
    return k.load(v, (k.span(0, NB), t, k.span(j * BD, BD)), other=0.0, evict=hint)


@k.func
def _sweep1(v, q, eps, t, d, chunks, NB, SB, BD, REDUCE_EACH, PREFETCH, KEEP, ROWS3D, STAGES):
    """Sweep 1: every source's sum of squares and its dot with every query, the logits z [SB, NB]
    (before masking). [NB, BD] source chunks meet [SB, BD] query chunks through [SB, NB, BD]
    broadcasts; with ROWS3D the source chunk is loaded as [NB, 1, BD] against [1, SB, BD] queries,
    a tile that already has the layout of the [NB, SB, BD] product, so the loop needs no
    shared-memory layout conversions (sm_90, BD 256 / 8 warps: 28 barriers in the kernel against
    60). REDUCE_EACH (not with ROWS3D) reduces every chunk's products at once."""
    if ROWS3D:
        sq = k.zeros((NB, 1, BD), k.f32)
        qv = k.zeros((NB, SB, BD), k.f32)
    else:
        sq = k.zeros((NB, BD), k.f32)
        if REDUCE_EACH:
            qv = k.zeros((SB, NB), k.f32)
        else:
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
        elif REDUCE_EACH:
            qv += k.sum(qt[:, None, :] * x[None, :, :], axis=2)
        else:
            qv += qt[:, None, :] * x[None, :, :]
    if ROWS3D:
        inv_rms = k.rsqrt(k.reshape(k.sum(sq, axis=2), (NB,)) / d.to(k.f32) + eps)     # [NB]
        return (k.sum(qv, axis=2) * inv_rms[:, None]).T
    inv_rms = k.rsqrt(k.sum(sq, axis=1) / d.to(k.f32) + eps)              # [NB]
    if REDUCE_EACH:
        return qv * inv_rms[None, :]                                      # [SB, NB]
    return k.sum(qv, axis=2) * inv_rms[None, :]


@k.func
def _prepare_one_row(v, q, o, m, l, eps, t, n, d, chunks, OT, NB, SB, BD, FINAL, REDUCE_EACH, UNROLL_SRC,
                     PREFETCH, KEEP, DROP, ROWS3D, STAGES):
    """attnres_prepare_rows for token row t. PREFETCH issues the next chunk's loads before the
    current chunk's arithmetic (two chunks in flight per program: the loop is latency-bound).
    KEEP / DROP: L2 hints (None: none) on sweep 1's source loads (KEEP "last": read again by
    sweep 2) and on sweep 2's loads and the O stores (DROP "first": not read again)."""
    z = _sweep1(v, q, eps, t, d, chunks, NB, SB, BD, REDUCE_EACH, PREFETCH, KEEP, ROWS3D, STAGES)
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
        x_next = _source_chunk(v, t, chunks - 1, NB, BD, DROP, False)
    for jj in k.range(chunks, stages=STAGES):
        j = chunks - 1 - jj                 # reverse: the chunks read last are still cached
        if UNROLL_SRC:
            acc = k.zeros((SB, BD), k.f32)
            for i in k.static_range(NB):
                wi = k.sum(k.where((k.arange(NB) == i)[None, :], e, 0.0), axis=1)     # e[:, i]
                xi = k.load(v, (i, t, k.span(j * BD, BD)), other=0.0, evict=DROP).to(k.f32)     # 0 past n
                acc += wi[:, None] * xi[None, :]
        else:
            if PREFETCH:
                x = x_next.to(k.f32)
                x_next = _source_chunk(v, t, j - 1, NB, BD, DROP, False)      # j = 0: no traffic
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
                         FINAL: k.constexpr = False, REDUCE_EACH: k.constexpr = False,
                         UNROLL_SRC: k.constexpr = False, PREFETCH: k.constexpr = False,
                         WARPS: k.constexpr = 4, KEEP: k.constexpr = None, DROP: k.constexpr = None,
                         ROWS3D: k.constexpr = False, STAGES: k.constexpr = None):
    # FINAL (full AttnRes, S = 1): write O / L in OT and skip the statistics.
    # REDUCE_EACH: reduce the dot products over each chunk (registers SB * NB) instead of keeping
    # an [SB, NB, BD] accumulator. UNROLL_SRC: the second sweep unrolls over the sources, one
    # row load and one [SB, BD] multiply-add each (no reduction across threads).
    # PREFETCH: the next chunk's loads are issued before the current chunk's arithmetic.
    # KEEP / DROP: L2 hints (_prepare_one_row). ROWS3D: sweep 1 on [NB, 1, BD] source tiles
    # (_sweep1; REDUCE_EACH does not apply). STAGES: both sweeps' loops as k.range(stages=STAGES), so
    # Triton software-pipelines their loads STAGES deep through shared memory (cp.async).
    # NB/SB (sources/queries, powers of two) are always passed by the callers; the defaults (4)
    # keep the unrolled IR of `kernel.ir()` (round-trip tests, `k31dsl compile`) small.
    for t in k.grid(v.shape[1]):
        _prepare_one_row(v, q, o, m, l, eps, t, v.shape[0], v.shape[2], k.cdiv(v.shape[2], BD), OT, NB, SB, BD,
                         FINAL, REDUCE_EACH, UNROLL_SRC, PREFETCH, KEEP, DROP, ROWS3D, STAGES)

"""Probe (hand-written Triton, not a k31dsl kernel): does an AttnRes prepare whose source loads
feed tensor-core dots get cp.async pipelining and a sweep 2 served from L2, and how fast is it?

The kernel reads each token's [n, D] source rows as [2n, D/2-chunk] tiles (row (i, h) is half h of
source i's chunk), so the n = 8 rows fill the 16 rows an mma.sync tile needs with no padding:
sweep 1 accumulates the [2n, 2S] products with the queries and the [2n, 2n] Gram matrix (its
diagonal: the sums of squares) in TF32; sweep 2, in reverse chunk order, multiplies the softmax
weights (block-diagonal over the halves) with the rows again. CPU evidence (sm_90, Triton 3.9):
BD 512 at 8 warps is 92 registers, 64 KB shared memory, 36 cp.async per loop; exact-fp32
(tf32x3) operands spill. The question for the GPU is time and L2 reuse, not precision: TF32
operands leave ~1e-3 relative error, which the op's fp32 contract does not allow as a default.

    python benchmarks/probes/attnres_mma_probe.py      # GPU; prints a table, writes results/attnres_mma_probe.*
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@triton.jit
def _prepare_mma(v, q, o, m, l, T, D, n, S, eps, NB: tl.constexpr, SB: tl.constexpr, BD: tl.constexpr,
                 KEEP: tl.constexpr, DROP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    H: tl.constexpr = BD // 2
    i3 = tl.arange(0, NB)[:, None, None]
    h3 = tl.arange(0, 2)[None, :, None]
    c3 = tl.arange(0, H)[None, None, :]
    s3 = tl.arange(0, SB)[:, None, None]
    src = v + i3 * T * D + t * D + h3 * H + c3
    row_ok = (i3 < n) & (h3 >= 0) & (c3 >= 0)
    acc = tl.zeros((2 * NB, 2 * SB), tl.float32)
    gram = tl.zeros((2 * NB, 2 * NB), tl.float32)
    for j in range(0, D, BD):
        x = tl.reshape(tl.load(src + j, mask=row_ok, other=0.0, eviction_policy=KEEP), (2 * NB, H))
        qc = tl.reshape(tl.load(q + s3 * D + j + h3 * H + c3, mask=(s3 < S) & (h3 >= 0) & (c3 >= 0), other=0.0),
                        (2 * SB, H))
        acc += tl.dot(x, tl.trans(qc), input_precision="tf32")
        gram += tl.dot(x, tl.trans(x), input_precision="tf32")
    r = tl.arange(0, 2 * NB)
    cq = tl.arange(0, 2 * SB)
    sq = tl.sum(tl.reshape(tl.sum(tl.where(r[:, None] == r[None, :], gram, 0.0), axis=1), (NB, 2)), axis=1)
    dots = tl.sum(tl.sum(tl.reshape(tl.where((r[:, None] % 2) == (cq[None, :] % 2), acc, 0.0), (NB, 2, SB, 2)),
                         axis=3), axis=1)                                           # [NB, SB]
    rows = tl.arange(0, NB)
    qs = tl.arange(0, SB)
    z = tl.where(rows[:, None] < n, dots * tl.rsqrt(sq / D + eps)[:, None], float("-inf"))
    zmax = tl.max(z, axis=0)
    e = tl.exp(z - zmax[None, :])
    tl.store(m + qs * T + t, zmax, mask=qs < S)
    tl.store(l + qs * T + t, tl.sum(e, axis=0), mask=qs < S)
    same = (tl.arange(0, 2)[:, None] == tl.arange(0, 2)[None, :]).to(tl.float32)
    w2 = tl.reshape(tl.reshape(tl.trans(e), (SB, 1, NB, 1)) * tl.reshape(same, (1, 2, 1, 2)), (2 * SB, 2 * NB))
    dst = o + s3 * T * D + t * D + h3 * H + c3
    for jj in range(0, D, BD):
        j = D - BD - jj
        x = tl.reshape(tl.load(src + j, mask=row_ok, other=0.0, eviction_policy=DROP), (2 * NB, H))
        out = tl.reshape(tl.dot(w2, x, input_precision="tf32"), (SB, 2, H))
        tl.store(dst + j, out, mask=(s3 < S) & (h3 >= 0) & (c3 >= 0), eviction_policy=DROP)


VARIANTS = [(512, 8, 3, "", ""), (512, 8, 3, "evict_last", "evict_first"), (512, 8, 4, "evict_last", "evict_first"),
            (256, 4, 3, "", ""), (256, 4, 4, "evict_last", "evict_first"), (256, 8, 6, "evict_last", "evict_first")]


def main() -> int:
    import harness
    from attnres import torch_prepare
    n, t, d, s = 8, 8192, 7168, 6
    g = torch.Generator(device="cuda").manual_seed(0)
    v = torch.randn(n, t, d, device="cuda", generator=g)
    q = torch.randn(s, d, device="cuda", generator=g) / d ** 0.5
    want = torch_prepare(v, q, 1e-6)
    nbytes = (n + s) * t * d * 4
    rows = []
    for bd, warps, stages, keep, drop in VARIANTS:
        o, m, l = torch.empty(s, t, d, device="cuda"), torch.empty(s, t, device="cuda"), torch.empty(s, t, device="cuda")

        def run():
            _prepare_mma[(t,)](v, q, o, m, l, t, d, n, s, 1e-6, NB=8, SB=8, BD=bd, KEEP=keep, DROP=drop,
                               num_warps=warps, num_stages=stages)
        run()
        err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip((o, m, l), want))
        ms = triton.testing.do_bench(run, warmup=25, rep=200)
        rows.append({"BD": bd, "warps": warps, "stages": stages, "hints": f"{keep or '-'} / {drop or '-'}",
                     "ms": ms, "TB/s (read once + O)": nbytes / ms / 1e9, "max rel err vs eager fp32": err})
        print(rows[-1], flush=True)
    eager = triton.testing.do_bench(lambda: torch_prepare(v, q, 1e-6), warmup=10, rep=100)
    rows.append({"BD": "torch eager", "ms": eager, "TB/s (read once + O)": nbytes / eager / 1e9})
    cols = ["BD", "warps", "stages", "hints", "ms", "TB/s (read once + O)", "max rel err vs eager fp32"]
    harness.report("attnres_mma_probe", cols, rows,
                   notes="Hand-written Triton probe (benchmarks/probes/attnres_mma_probe.py): TF32 tensor-core "
                         "prepare, n=8 T=8192 D=7168 S=6 fp32, do_bench medians; byte floor 3.29 GB.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

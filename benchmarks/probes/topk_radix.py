"""Probe: the DSA decode step's top-k threshold by radix histograms instead of the bitwise search.

ops/dsa/topk.py finds each segment's K-th largest order key with 32 counting steps (compare +
block reduction each). A radix search takes BITS bits of the key per step: a masked histogram of
that digit over the keys that still match the prefix (`tl.histogram`, NB = 2^BITS bins), the
suffix sums of the bins, and the bin where they cross K: 32 / BITS steps. Written here in plain
Triton to time the idea before it becomes a DSL primitive; the levels and the selection are the
op's (same segments, same position-order compaction), so the positions must equal the op's.
CUDA-graph medians; writes results/topk_radix.json and .md.

    python benchmarks/probes/topk_radix.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INT_MIN = -2147483648


@triton.jit
def _order_key(v):
    b = v.to(tl.int32, bitcast=True)
    o = tl.where(v == 0.0, 0, b ^ ((b >> 31) & 0x7FFFFFFF))
    return tl.where(v > float("-inf"), o, -2147483647 - 1)


@triton.jit
def radix_segments(vals, idx, out_v, out_i, N, M, seg, K_ARG, KP: tl.constexpr, HAS_IDX: tl.constexpr,
                   FINAL: tl.constexpr, BL: tl.constexpr, BITS: tl.constexpr):
    r = tl.program_id(0)
    sp = tl.program_id(1)
    start = sp * seg
    n = tl.minimum(seg, N - start)
    lane = tl.arange(0, BL)
    inside = lane < n
    v = tl.load(vals + r * N + start + lane, mask=inside, other=float("-inf"))
    if HAS_IDX:
        pos = tl.load(idx + r * N + start + lane, mask=inside, other=-1)
    else:
        pos = start + lane
    o = _order_key(v)
    u = o ^ (-2147483647 - 1)
    K = K_ARG                                   # KP below the last level, k there (one segment: sp = 0)
    base = sp * KP
    NB: tl.constexpr = 1 << BITS
    bins = tl.arange(0, NB)
    live = lane >= 0
    p = 0
    kk = K
    for step in tl.static_range(32 // BITS):
        shift = 32 - BITS * (step + 1)
        d = (u >> shift) & (NB - 1)
        h = tl.histogram(d, NB, mask=live)
        ge = tl.sum(h, 0) - tl.cumsum(h, 0) + h            # keys with digit >= bin
        b = tl.sum((ge >= kk).to(tl.int32), 0) - 1          # ge falls with the bin: the crossing
        kk -= tl.sum(tl.where(bins > b, h, 0), 0)
        live = live & (d == b)
        p = p | (b << shift)
    thr = p ^ (-2147483647 - 1)
    above = tl.sum((o > thr).to(tl.int32), 0)
    eq = (o == thr) & (o != -2147483647 - 1)
    sel = (o > thr) | (eq & (tl.cumsum(eq.to(tl.int32), 0) <= K - above))
    si = sel.to(tl.int32)
    col = tl.cumsum(si, 0) - 1
    written = tl.sum(si, 0)
    tl.store(out_i + r * M + base + col, pos, mask=sel)
    if not FINAL:
        tl.store(out_v + r * M + base + col, v, mask=sel)
    pad = tl.arange(0, KP)
    tl.store(out_i + r * M + base + pad, tl.full((KP,), -1, tl.int32), mask=(pad >= written) & (pad < K))
    if not FINAL:
        tl.store(out_v + r * M + base + pad, tl.full((KP,), float("-inf"), tl.float32), mask=pad >= written)


def radix_topk(scores, k: int, bits: int = 8, warps: int = 16):
    """The op's level structure (GROUP 4, KP = k rounded to a power of two) with radix thresholds."""
    import torch
    rows, length = scores.shape
    kp = max(16, triton.next_power_of_2(k))
    seg = 4 * kp
    out = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
    dummy_i = torch.empty(1, dtype=torch.int32, device=scores.device)
    dummy_v = torch.empty(1, dtype=torch.float32, device=scores.device)
    ns = -(-length // seg)
    v1 = torch.empty((rows, ns * kp), dtype=torch.float32, device=scores.device)
    i1 = torch.empty((rows, ns * kp), dtype=torch.int32, device=scores.device)
    radix_segments[(rows, ns)](scores, dummy_i, v1, i1, length, ns * kp, seg, kp, KP=kp, HAS_IDX=False, FINAL=False,
                               BL=seg, BITS=bits, num_warps=warps)
    while ns > 4:
        n_in = ns * kp
        ns = -(-ns // 4)
        v2 = torch.empty((rows, ns * kp), dtype=torch.float32, device=scores.device)
        i2 = torch.empty((rows, ns * kp), dtype=torch.int32, device=scores.device)
        radix_segments[(rows, ns)](v1, i1, v2, i2, n_in, ns * kp, 4 * kp, kp, KP=kp, HAS_IDX=True, FINAL=False,
                                   BL=4 * kp, BITS=bits, num_warps=warps)
        v1, i1 = v2, i2
    n_in = ns * kp
    radix_segments[(rows, 1)](v1, i1, dummy_v, out, n_in, k, n_in, k, KP=kp, HAS_IDX=True, FINAL=True,
                              BL=triton.next_power_of_2(n_in), BITS=bits, num_warps=warps)
    return out


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_scores
    from k31dsl.ops.dsa.topk import topk
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        _, scores = step_scores(b, length)
        want = topk(scores, 2048, sorted=False, target="triton")
        ms = harness.graph_median_ms(lambda: topk(scores, 2048, sorted=False, target="triton"))
        rows.append({"B": b, "L": length, "form": "bitwise (op)", "set ms": ms, "same positions": True})
        print(rows[-1], flush=True)
        for bits, warps in ((8, 16), (8, 8), (4, 16), (4, 8)):
            try:
                got = radix_topk(scores, 2048, bits, warps)
                ms = harness.graph_median_ms(lambda: radix_topk(scores, 2048, bits, warps))
                same = bool(torch.equal(got, want))
            except Exception as exc:            # a bin count the lowering refuses: record and go on
                ms, same = float("nan"), f"error: {type(exc).__name__}: {str(exc)[:80]}"
            rows.append({"B": b, "L": length, "form": f"radix {bits} bits, {warps} warps", "set ms": ms,
                         "same positions": same})
            print(rows[-1], flush=True)
    harness.report("topk_radix", ["B", "L", "form", "set ms", "same positions"], rows,
                   notes="CUDA-graph medians of the whole top-k (every level), set form")
    return 0


if __name__ == "__main__":
    sys.exit(main())

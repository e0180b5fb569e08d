"""Probe: the cached AttnRes prepare's logit kernel (`attnres_block_logits`: the newest block
[T = 8192, D = 7168] fp32 against 12 or 48 queries) at pinned configs and dot precisions, next to
torch's fp32 matmul of the same product (cuBLAS, TF32 off) and the copy ceiling. Its byte floor is
one read of the block (235 MB, ~0.055 ms); run 5 of the 14:48 session timed the tuner's configs
at 0.164-0.41 ms. CUDA-graph medians; each result's logits against torch's in fp64.

    python benchmarks/probes/logit_gemm.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (BT, BK, warps, stages, precision)
# Run 6 (results/attnres_logit_probe_run6.md): tf32x3 0.161 / 0.255 ms (12 / 48 queries), tf32
# 0.077 / 0.079 (but 7.6e-4 off), ieee 0.33 / 0.65; other tilings slower. Run 7: bf16x3.
CONFIGS = [(64, 64, 4, 5, "tf32x3"), (64, 64, 4, 5, "tf32"), (64, 64, 4, 5, "bf16x3"), (64, 32, 4, 4, "bf16x3"),
           (128, 64, 8, 4, "bf16x3"), (64, 64, 8, 4, "bf16x3"), (32, 64, 4, 4, "bf16x3")]


def main() -> int:
    import torch

    import harness
    from k31dsl.ops import attnres_cached as ac
    n, t, d = 2, 8192, 7168
    v = torch.randn(n, t, d, device="cuda")
    score = ac.kernels("triton")[0]
    nbytes = t * d * 4
    rows = []
    for nq in (12, 48):
        q = torch.randn(nq, d, device="cuda") * (2.0 / d ** 0.5)
        z = torch.zeros(n, nq, t, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        want = ((q.double() @ v[1].double().T) * (v[1].double().square().mean(-1) + 1e-6).rsqrt())

        def ref():
            return (q @ v[1].T) * (v[1].square().mean(-1) + 1e-6).rsqrt()
        ms = harness.graph_median_ms(ref)
        rows.append({"queries": nq, "impl": "torch fp32 (cuBLAS, no TF32)", "graph ms": ms,
                     "TB/s": nbytes / (ms * 1e-3) / 1e12,
                     "max rel err": float((ref().double() - want).abs().max() / want.abs().max())})
        print(rows[-1], flush=True)
        for bt, bk, w, st, prec in CONFIGS:
            def call():
                score(v, q, z, 1e-6, 0, QB=max(16, 1 << (nq - 1).bit_length()), BT=bt, BK=bk, PREC=prec,
                      num_warps=w, num_stages=st)
            try:
                call()
                err = float((z[1].double() - want).abs().max() / want.abs().max())
                ms = harness.graph_median_ms(call)
            except Exception as e:  # noqa: BLE001 - a config that does not build is a row, not a stop
                print(f"BT={bt} BK={bk} w={w} st={st} {prec}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            rows.append({"queries": nq, "impl": f"k31dsl BT={bt} BK={bk} warps={w} stages={st} {prec}",
                         "graph ms": ms, "TB/s": nbytes / (ms * 1e-3) / 1e12, "max rel err": err})
            print(rows[-1], flush=True)
    harness.report("attnres_logit_probe", ["queries", "impl", "graph ms", "TB/s", "max rel err"], rows,
                   notes="attnres_block_logits at pinned configs (benchmarks/probes/logit_gemm.py); bytes: the "
                         "block read once (T x D fp32).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: the AttnRes prepare (n = 8, T = 8192, D = 7168, S = 6, fp32) at pinned configs, one
compile each (the full benchmark's tuner compiles all of PREPARE_CONFIGS, ~20 s apiece): a quick
A/B for a kernel change. CUDA-graph medians, each result checked against the first config's;
writes results/attnres_prepare_probe.json and .md. Run 8 of 1 Dec compared the tuned config with
two SWEEP2_3D configs (since taken out; results/attnres_prepare_probe.md).

    python benchmarks/probes/prepare_configs.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = dict(REDUCE_EACH=False, UNROLL_SRC=False, PREFETCH=True, DROP="first", ROWS3D=True)
# every constexpr pinned, so that no config is left to the tuner
# maxnreg 128 (sm_90a, no spill at either): two programs per SM at 8 warps (133 -> 127 registers),
# four at 4 warps (133 -> 128)
CONFIGS = [dict(BASE, BD=256, WARPS=8, KEEP="last", num_warps=8),
           dict(BASE, BD=256, WARPS=8, KEEP="last", num_warps=8, maxnreg=128),
           dict(BASE, BD=128, WARPS=4, KEEP=None, num_warps=4),
           dict(BASE, BD=128, WARPS=4, KEEP=None, num_warps=4, maxnreg=128)]


def main() -> int:
    import torch

    import harness
    from k31dsl.ops import attnres as ar
    n, t, d, s = 8, 8192, 7168, 6
    v = torch.randn(n, t, d, device="cuda")
    q = torch.randn(s, d, device="cuda") * (2.0 / d ** 0.5)
    kern = ar.prepare_kernel("triton")
    nbytes = (n * t * d + s * t * d + 2 * s * t) * 4
    rows, want = [], None
    for cfg in CONFIGS:
        o, m, l = torch.empty(s, t, d, device="cuda"), torch.empty(s, t, device="cuda"), torch.empty(s, t, device="cuda")

        def call():
            kern(v, q, o, m, l, 1e-6, NB=8, SB=8, **cfg)
        call()
        if want is None:
            want = o.clone()
        err = float((o - want).abs().max() / want.abs().max())
        ms = harness.graph_median_ms(call)
        rows.append({"config": " ".join(f"{k}={val}" for k, val in cfg.items()), "graph ms": ms,
                     "TB/s": nbytes / (ms * 1e-3) / 1e12, "max rel diff vs first": err})
        print(rows[-1], flush=True)
    cols = ["config", "graph ms", "TB/s", "max rel diff vs first"]
    harness.report("attnres_prepare_probe", cols, rows,
                   notes="AttnRes prepare n=8 T=8192 D=7168 S=6 fp32 at pinned configs "
                         "(benchmarks/probes/prepare_configs.py); bytes: blocks read once + O, M, L written.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

BASE = dict(PREFETCH=True, DROP="first", ROWS3D=True)
# every constexpr pinned, so that no config is left to the tuner. Run 5 of 1 Dec (12:56 UTC session):
# the tuned config against both sweeps as k.range(stages=N) loops, whose loads Triton then
# pipelines through shared memory (sm_90a: 18-24 cp.async per loop pair, no plain global loads;
# BD 256 / 8 warps: 146 registers, 32 / 48 / 80 KB smem at 3 / 4 / 6 stages; BD 128 / 4 warps:
# 142 registers, 16 / 24 / 40 KB), the manual prefetch off.
PIPE = dict(BASE, PREFETCH=False)
# Run 5 (results/attnres_prepare_probe_stages.md): 1.448 ms for the tuned config; 1.221 at BD 256 /
# 8 warps / 6 stages; 1.200 at BD 128 / 4 warps / 6 stages. Run 6: deeper (sm_90a: BD 128 / 4 warps
# at 10 stages 72 KB smem, 142 registers; at 8 stages capped to 128 registers 118, no spill;
# BD 64 / 2 warps at 12 stages 44 KB, 146 registers).
CONFIGS = [dict(PIPE, BD=128, WARPS=4, KEEP=None, STAGES=6, num_warps=4)]
CONFIGS += [dict(PIPE, BD=128, WARPS=4, KEEP=keep, STAGES=st, num_warps=4) for keep, st in ((None, 8), (None, 10),
                                                                                             ("last", 8))]
CONFIGS += [dict(PIPE, BD=128, WARPS=4, KEEP=None, STAGES=8, num_warps=4, maxnreg=128)]
CONFIGS += [dict(PIPE, BD=64, WARPS=2, KEEP=None, STAGES=st, num_warps=2) for st in (8, 12)]
CONFIGS += [dict(PIPE, BD=256, WARPS=8, KEEP="last", STAGES=8, num_warps=8)]

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

"""Probe: one kernel to profile under Nsight Compute (`ncu`), launched a few times with a fixed
config (no autotuning under the profiler). `decode`: the KDA decode step at N = 64, H = 96, [V,K]
pool, BV 16 / 1 warp (the tuned config of KDA runs 22-23); `decode_kv`: the [K,V] pool at BV 64 /
4 warps; `prepare`: the AttnRes prepare at n = 8, T = 8192, D = 7168, S = 6 in the tuned config
(BD 256, 8 warps, L2 hints, ROWS3D sweep 1: KDA-session run 30; run 26 profiled it without ROWS3D);
`dsa_step`: the unfused DSA decode step at B = 64, L = 32K (indexer, top-k, slots, one-pass SFA).
`sfa_two_pass`: the two passes of the two-pass SFA at the same shape.

    ncu --clock-control none -k regex:kda_decode_step --launch-skip 2 --launch-count 1 \\
        python3 benchmarks/probes/profile_target.py decode
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def decode(reps: int = 4, v_first: bool = True):
    import k31dsl.ops.kda.decode as dec
    from kda_decode import make_inputs
    x = make_inputs(64, 1, 96, 96, 128, 128, "cuda")
    pool = x["pool"].transpose(2, 3).contiguous() if v_first else x["pool"]
    cfg = {"BV": 16, "num_warps": 1, "PREFETCH": True} if v_first else {"BV": 64, "num_warps": 4, "PREFETCH": True}
    dec._small_grid_config = lambda *a, **kw: cfg              # one config: no tuner under the profiler
    for _ in range(reps):
        dec.kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], state_v_first=v_first,
                       A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0, target="triton")


def prepare(reps: int = 4):
    from k31dsl.ops import attnres as ar
    n, t, d, s = 8, 8192, 7168, 6
    v = torch.randn(n, t, d, device="cuda")
    q = torch.randn(s, d, device="cuda") * (2.0 / d ** 0.5)
    o, m, l = torch.empty(s, t, d, device="cuda"), torch.empty(s, t, device="cuda"), torch.empty(s, t, device="cuda")
    cfg = dict(BD=256, WARPS=8, PREFETCH=True,
               KEEP="last", DROP="first", ROWS3D=True, num_warps=8)
    kern = ar.prepare_kernel("triton")
    for _ in range(reps):
        kern(v, q, o, m, l, 1e-6, NB=8, SB=8, **cfg)


def dsa_step(reps: int = 4, b: int = 64, length: int = 32768):
    """The unfused DSA decode step's launches at B=64, L=32K (benchmarks/dsa.py's inputs): the
    indexer in its pinned decode config, top-k (set), slots, SFA at BH 64 / BK 32 / 8 warps (the
    tuned config of DSA runs 10-14): no tuner under the profiler."""
    from dsa import SM_SCALE, make_step
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import slots as S
    from k31dsl.ops.dsa.indexer import lightning_indexer
    from k31dsl.ops.dsa.topk import topk
    (qc, qs, w, icache, mq, mcache, table, ks, ke), _ = make_step(b, length, 2048, 64, 128, "cuda", anchors=False)
    for _ in range(reps):
        scores = lightning_indexer(qc, qs, icache, table, w, ks, ke, length, mma="bf16", target="triton")
        pos = topk(scores, 2048, sorted=False, target="triton")
        slots = S.slots_of_positions(pos, table, 1, target="triton")
        A.sparse_mla_attention(mq, mcache, slots, SM_SCALE, form="one_pass", target="triton", BH=64, BK=32,
                               num_warps=8)


def sfa_two_pass(reps: int = 4, b: int = 64, length: int = 32768):
    """The two-pass SFA at the DSA step's B=64, L=32K, each pass in its first config (the tuned ones
    of the 13:30 UTC probe run), two score segments: no tuner under the profiler."""
    from dsa import SM_SCALE, step_scores
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import slots as S
    from k31dsl.ops.dsa import sfa_two_pass as TP
    from k31dsl.ops.dsa.topk import topk
    (*_, mq, mcache, table, _ks, _ke), scores = step_scores(b, length)
    slots = S.slots_of_positions(topk(scores, 2048, sorted=False, target="triton"), table, 1, target="triton")
    views = A.cache_views(mcache)
    t, h, k = mq.shape[0], mq.shape[1], slots.shape[1]
    s, pm, pl = TP.new_buffers(t, h, k, 2, "cuda")
    o, lse = torch.empty((t, h, 512), dtype=torch.bfloat16, device="cuda"), torch.empty((t, h), device="cuda")
    for _ in range(reps):
        TP.sfa_scores["triton"](mq, *views, slots, s, pm, pl, SM_SCALE, **TP.SCORE_CONFIGS[0])
        TP.sfa_values["triton"](views[0], views[1], slots, s, pm, pl, o, lse, NSB=2, **TP.VALUE_CONFIGS[0])


if __name__ == "__main__":
    {"decode": decode, "decode_kv": lambda: decode(v_first=False), "prepare": prepare,
     "dsa_step": dsa_step, "sfa_two_pass": sfa_two_pass}[sys.argv[1]]()
    torch.cuda.synchronize()

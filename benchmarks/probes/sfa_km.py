"""Probe: the SFA score pass with the keys on the MMA rows (each code tile dequantized to bf16 as
the register operand, one chained [BK, BH] accumulator; sfa_km_kernel.py) against the committed
heads-major score pass, at the decode step's shapes and indices. CUDA-graph and do_bench medians.

    python benchmarks/probes/sfa_km.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SM_SCALE = 0.135234
KM = [(64, 4, 1)]   # run 1 also timed st2, w8 and BK 128 w8: slower


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_scores
    from sfa_km_kernel import sfa_scores_km
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import sfa_two_pass as TP
    from k31dsl.ops.dsa.topk import topk as topk_op
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        (_qc, _qs, _w, icache, q, mcache, table, _ks, _ke), scores = step_scores(b, length)
        slots = A.slots_of_positions(topk_op(scores, 2048, sorted=False, target="triton"), table, 1, target="triton")
        del scores
        views = A.cache_views(mcache)
        T, H, K = q.shape[0], q.shape[1], slots.shape[1]
        ns0 = TP.score_segments(T, H, K, 64)
        s = torch.empty((T, H, K), dtype=torch.float32, device="cuda")
        o = torch.empty((T, H, 512), dtype=torch.bfloat16, device="cuda")
        lse = torch.empty((T, H), dtype=torch.float32, device="cuda")
        ref_o, ref_l = A.sparse_mla_attention(q, mcache, slots, SM_SCALE, form="one_pass", target="triton")
        scale = float(ref_o.float().abs().max())
        variants = [("heads-major BH 64 BK 32 (committed)", TP.sfa_scores, dict(BH=64, BK=32, num_warps=4, num_stages=1),
                     ns0)]
        variants += [(f"heads-major BH 128 BK {bk} w8", TP.sfa_scores, dict(BH=128, BK=bk, num_warps=8, num_stages=1), ns)
                     for bk in (16, 32) for ns in (ns0 // 2, ns0, 2 * ns0)]
        variants += [(f"keys-major BK {bk} w{w} st{st}", sfa_scores_km, dict(BH=64, BK=bk, num_warps=w, num_stages=st),
                      ns0) for bk, w, st in KM]
        for name, kern, cfg, ns in variants:
            pm = torch.empty((ns, T, H), dtype=torch.float32, device="cuda")
            pl = torch.empty_like(pm)
            def p1(kern=kern, cfg=cfg, pm=pm, pl=pl):
                kern["triton"](q, *views, slots, s, pm, pl, SM_SCALE, **cfg)
            row = {"B": b, "L": length, "score pass": name, "segments": ns}
            try:
                p1()
                TP.sfa_values["triton"](views[0], views[1], slots, s, pm, pl, o, lse, NSB=1 << (ns - 1).bit_length(),
                                        BH=64, BK=64, num_warps=8, num_stages=1)
                row["o rel diff vs one pass"] = float((o.float() - ref_o.float()).abs().max()) / scale
                row["lse diff"] = float((lse - ref_l).abs().max())
                row["graph ms"] = harness.graph_median_ms(p1)
                row["do_bench ms"] = harness.median_ms(p1)
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                print("failed", name, type(e).__name__, str(e)[:300], flush=True)
            rows.append(row)
            print(row, flush=True)
        del mcache, icache
        torch.cuda.empty_cache()
    harness.report("sfa_km", ["B", "L", "score pass", "segments", "graph ms", "do_bench ms", "o rel diff vs one pass",
                              "lse diff"], rows,
                   notes="keys-major: each code tile x its scale rounded to bf16 as the wgmma register operand")
    return 0


if __name__ == "__main__":
    sys.exit(main())

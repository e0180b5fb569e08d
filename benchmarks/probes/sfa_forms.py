"""Probe: sparse MLA attention at the DSA decode step's shapes in its three forms — one pass
(sparse_mla_attention_fwd, tuned), flash-decoding split (sfa_split's choice + combine) and two
passes (sfa_two_pass.py: scores + softmax statistics, then the value product per 128-column
tile) — with each two-pass config pinned and timed pass by pass. The indices are the step's own
(bf16 indexer -> top-k -> slots). Every two-pass output is compared with the one-pass output
first. CUDA-graph medians; writes results/sfa_forms.json and .md.

    python benchmarks/probes/sfa_forms.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SM_SCALE = 0.135234
# every constexpr pinned (a config that leaves one open is tuned again)
# run 1 (13:02 UTC, results/sfa_forms_run1.md) timed more score configs and segment counts, and
# value configs with VT 2 / 4 column tiles per program (since removed: they lost).
# run 2 (13:30 UTC) timed value-pass variants (one stage won: 0.140 ms at B=64).
# run 7 (13:37 UTC, results/sfa_forms_stages.md; its "one pass" rows are the two-pass default: the
# probe did not yet pin form="one_pass") timed the passes' loops as k.range(stages=2 / 3): all lost,
# and the STAGES constexpr was taken out of the kernels again.
# run 1 of the 14:48 session (results/sfa_forms_late.md) timed a LATE score pass (each record field
# gathered right before its dot, the products summed as they come): 0.186 / 0.325 ms against 0.142;
# taken out of the kernel.
# Run 10 of the 14:48 session (results/sfa_forms_prefetch.md) timed a score pass that gathers the
# next block's records one block ahead: BK 16 0.186 ms (as without), BK 32 0.220 (spills) against
# 0.143; taken out of the kernel.
# Run 14 (results/sfa_forms_heads.md): smaller head blocks, more programs per SM (sm_90a: scores
# BH 32 / BK 64 170 registers, 40 KB, three per SM; BH 16 / BK 32 107, 22 KB, four; values BH 32 /
# BK 64 / 4 warps 139, BH 16 128, BH 64 at 4 warps 168), against the tuned BH 64 ones: all slower
# (B=64: scores 0.244 / 0.332 against 0.142, values 0.251 / 0.295 / 0.144 against 0.139): the
# 64-row MMAs (wgmma) and half the gathers outweigh the occupancy.
# Runs 1-2 of the 16:11 session (results/sfa_forms_order.md, sfa_forms_values_prefetch.md), both
# taken out of the kernels: each pass's programs on a flat grid in another order (a (query,
# segment)'s two head blocks side by side: scores 0.147 against 0.143 ms; a (query, head block)'s
# four column tiles side by side: values 0.120 / 0.139 against 0.125 / 0.141 in two runs at B=64,
# 0.062 / 0.072 against 0.060 / 0.070 at B=32: within the runs' spread), and the value pass loading
# block j + 1 into registers before block j's exp and dot (sm_90a BK 64 / 8 warps: 141 registers,
# one program per SM; capped at 128: two): 0.226 / 0.158 ms against 0.139 at B=64, BK 32 0.179.
# Run 4: the score pass's latent dots in f16 (E4M3 -> f16 is one packed conversion per two codes,
# -> bf16 two; the query tiles scaled by a power of two into f16's range; sm_90a: the loop 1212 ->
# 1007 instructions per block, 183 registers, but Triton keeps the computed f16 query as a register
# operand and reloads it with ldmatrix every block): 0.152 against 0.143 ms at B=64, 0.082 against
# 0.076 at B=32 (results/sfa_forms_f16.md); taken out.
SCORE_CONFIGS = [{"BH": bh, "BK": bk, "num_warps": 4, "num_stages": 1} for bh, bk in ((64, 32), (32, 64), (16, 32))]
VALUE_CONFIGS = [{"BH": bh, "BK": 64, "num_warps": w, "num_stages": 1} for bh, w in ((64, 8), (64, 4), (32, 4), (16, 4))]


def fmt(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_attention_inputs
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import sfa_two_pass as TP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--value-configs", default="",
                    help="value-pass configs to time instead of VALUE_CONFIGS, as BHxBKxWARPS[xMAXNREG[xSTAGES]] "
                         "joined by '+' (MAXNREG 0: no cap; one stage unless given), e.g. 64x64x8+64x32x4+64x64x8x128x2")
    ap.add_argument("--score-configs", default="",
                    help="score-pass configs to time instead of SCORE_CONFIGS, as BHxBKxWARPS joined by '+' "
                         "(one stage), e.g. 64x32x4+128x32x8")
    ap.add_argument("--segments", default="", help="score-pass segment counts to time, '+'-joined (default: "
                                                  "2 at B=64, 2 and 4 at B=32; with --scores=default the op's own)")
    ap.add_argument("--tag", default="", help="write results/sfa_forms_TAG.* instead")
    ap.add_argument("--scores", choices=("all", "default"), default="all",
                    help="'default': time only the committed score config (when only value configs are compared)")
    args = ap.parse_args(argv)
    value_configs = VALUE_CONFIGS if not args.value_configs else [
        {"BH": int(v[0]), "BK": int(v[1]), "num_warps": int(v[2]), "num_stages": int(v[4]) if len(v) > 4 else 1,
         **({"maxnreg": int(v[3])} if len(v) > 3 and int(v[3]) else {})}
        for v in (c.split("x") for c in args.value_configs.split("+"))]
    score_configs = SCORE_CONFIGS if args.scores == "all" else [SCORE_CONFIGS[0]]
    if args.score_configs:
        score_configs = [{"BH": int(v[0]), "BK": int(v[1]), "num_warps": int(v[2]), "num_stages": 1}
                         for v in (c.split("x") for c in args.score_configs.split("+"))]
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        q, mcache, views, slots = step_attention_inputs(b, length)
        T, H, K = q.shape[0], q.shape[1], slots.shape[1]
        ref_o, ref_l = A.sparse_mla_attention(q, mcache, slots, SM_SCALE, form="one_pass", target="triton")
        scale = float(ref_o.float().abs().max())
        base = {"B": b, "L": length}
        one = harness.graph_median_ms(lambda: A.sparse_mla_attention(q, mcache, slots, SM_SCALE, form="one_pass",
                                                                    target="triton"))
        rows.append({**base, "form": "one pass (tuned)", "ms": one})
        split = A.sfa_split(T, H, K, 64)
        if split > 1:
            ms = harness.graph_median_ms(lambda: A.sparse_mla_attention(q, mcache, slots, SM_SCALE, split=split,
                                                                       form="one_pass", target="triton"))
            rows.append({**base, "form": f"split {split} + combine", "ms": ms})
        print(rows[-2:], flush=True)
        s = torch.empty((T, H, K), dtype=torch.float32, device="cuda")
        o = torch.empty_like(ref_o)
        lse = torch.empty_like(ref_l)
        best_score = {}
        counts = ((2, 4) if b == 32 else (2,)) if args.scores == "all" else (TP.score_segments(T, H, K, 64, 32),)
        for ns in [int(n) for n in args.segments.split("+")] if args.segments else counts:
            pm = torch.empty((ns, T, H), dtype=torch.float32, device="cuda")
            pl = torch.empty_like(pm)
            for cfg in score_configs:
                def p1(cfg=cfg, pm=pm, pl=pl):
                    TP.sfa_scores["triton"](q, *views, slots, s, pm, pl, SM_SCALE, **cfg)
                try:
                    p1()
                    ms = harness.graph_median_ms(p1)
                except Exception as e:  # noqa: BLE001 - a config that fails to compile is a result
                    print("failed", ns, fmt(cfg), type(e).__name__, str(e)[:200], flush=True)
                    ms = float("nan")
                rows.append({**base, "form": "two pass: scores", "segments": ns, "config": fmt(cfg), "ms": ms})
                print(rows[-1], flush=True)
                if ms == ms and (ns not in best_score or ms < best_score[ns][1]):
                    best_score[ns] = (cfg, ms)
        ns, (scfg, sms) = min(best_score.items(), key=lambda e: e[1][1])       # values at the best count only
        pm = torch.empty((ns, T, H), dtype=torch.float32, device="cuda")
        pl = torch.empty_like(pm)
        TP.sfa_scores["triton"](q, *views, slots, s, pm, pl, SM_SCALE, **scfg)
        nsb = TP.segments_pow2(ns)
        for cfg in value_configs:
            def p2(cfg=cfg, pm=pm, pl=pl):
                TP.sfa_values["triton"](views[0], views[1], slots, s, pm, pl, o, lse, NSB=nsb, **cfg)
            try:
                o.fill_(float("nan"))
                p2()
                err = float((o.float() - ref_o.float()).abs().max()) / scale
                lerr = float((lse - ref_l).abs().max())
                ms = harness.graph_median_ms(p2)
            except Exception as e:  # noqa: BLE001
                print("failed", ns, fmt(cfg), type(e).__name__, str(e)[:200], flush=True)
                ms, err, lerr = float("nan"), float("nan"), float("nan")
            rows.append({**base, "form": "two pass: values", "segments": ns, "config": fmt(cfg), "ms": ms,
                         "total ms": sms + ms, "o rel diff vs one pass": err, "lse diff": lerr})
            print(rows[-1], flush=True)
        del mcache
        torch.cuda.empty_cache()
    for r in harness.compiled_resources("sfa_"):
        print("resources", r, flush=True)
    harness.report(f"sfa_forms_{args.tag}" if args.tag else "sfa_forms",
                   ["B", "L", "form", "segments", "config", "ms", "total ms", "o rel diff vs one pass", "lse diff"], rows,
                   notes="CUDA-graph medians of one launch each (the two-pass totals add the best scores config "
                         "at that segment count to each values config); o rel diff: max |o - o_one_pass| / max |o|")
    return 0


if __name__ == "__main__":
    sys.exit(main())

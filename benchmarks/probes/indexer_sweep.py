"""Probe: the decode Lightning Indexer (bf16 scoring, one query token per sequence) over pinned
configs x key splits, at the DSA benchmark's shapes. Heads-major (the dot [64 heads, 128] x
[128, keys], the head sum across warps) against KEYS_MAJOR ([keys, 128] x [128, 64 heads], the head
sum inside a quad), with PB pages per step and nsplit programs per sequence (the tail of the last
wave depends on programs per SM: 4 at 128 registers, 3 at 158, 2 at 239). Every variant's scores
are checked against the heads-major default first. CUDA-graph medians; writes
results/indexer_sweep.json and .md.

    python benchmarks/probes/indexer_sweep.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# every constexpr the tuner could vary is pinned (a config that leaves one open is tuned again)
CONFIGS = [{"PB": 1, "KEYS_MAJOR": False, "num_warps": 4}, {"PB": 1, "KEYS_MAJOR": True, "num_warps": 4},
           {"PB": 2, "KEYS_MAJOR": True, "num_warps": 4}]
SMS = 132


def splits_for(b: int) -> list[int]:
    """Key splits that fill whole waves at 2, 3 or 4 programs per SM (and their neighbours)."""
    out = set()
    for per_sm in (2, 3, 4):
        for waves in (1, 2):
            ns = SMS * per_sm * waves / b
            out.update({max(1, int(ns)), max(1, round(ns))})
    return sorted(out)


def main(argv=None) -> int:
    import harness
    from dsa import make_step
    from k31dsl.ops.dsa import indexer as I
    from k31dsl.ops.dsa.indexer import DECODE_BF16, lightning_indexer
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--stages", action="store_true",
                    help="only the pinned decode config at its own split count, at num_stages 2..6")
    ap.add_argument("--maxnreg", action="store_true",
                    help="the pinned decode config against it capped at 128 registers (four programs per SM)")
    ap.add_argument("--f16", action="store_true",
                    help="the pinned decode config (f16 operands, F16) at 3-6 stages against its bf16-operand form "
                         "(results/indexer_sweep_f16.md: run 6 of the 16:11 session)")
    ap.add_argument("--caps", action="store_true",
                    help="the pinned decode config at register caps 128 / 96 / 80 (four / five / six programs per "
                         "SM), each at the key split that fills whole waves at its occupancy")
    ap.add_argument("--fp-fusion", action="store_true",
                    help="the pinned decode config without and with multiply-add contraction (indexer.FP_FUSION), "
                         "twice each, alternating")
    ap.add_argument("--pb2", action="store_true",
                    help="the pinned decode config against two pages per step at 8 warps (one warpgroup per page; "
                         "sm_90a 126 registers at the 128 cap: two programs per SM, the same 16 warps), at the key "
                         "split that fills whole waves at two programs per SM, and at 4 / 6 stages")
    ap.add_argument("--tag", default="", help="append _TAG to the results' file name (A/B runs)")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        (qc, qs, w, icache, *_rest), _ = make_step(b, length, 2048, 64, 128, "cuda", anchors=False)
        table, ks, ke = _rest[2], _rest[3], _rest[4]
        floor_ms = b * length * 132 / 4.28e12 * 1e3

        def call(cfg, ns):
            return lightning_indexer(qc, qs, icache, table, w, ks, ke, length, mma="bf16", nsplit=ns, config=cfg,
                                     target="triton")
        want = call(CONFIGS[0], 8)
        scale = float(want.abs().max())
        plan = [(cfg, ns) for cfg in CONFIGS for ns in splits_for(b)]
        if args.stages:
            plan = [({**DECODE_BF16, "num_stages": st}, None) for st in (2, 3, 4, 5, 6)]
        if args.maxnreg:
            from k31dsl.ops.dsa.indexer import key_splits
            blocks = -(-length // 64)
            plan = [(DECODE_BF16, None), ({**DECODE_BF16, "maxnreg": 128}, key_splits(b, blocks, SMS * 4)),
                    ({**DECODE_BF16, "maxnreg": 128}, None)]
        if args.f16:
            plan = [({**DECODE_BF16, "F16": False}, None)] + [({**DECODE_BF16, "num_stages": st}, None)
                                                              for st in (3, 4, 5, 6)]
        if args.caps:
            from k31dsl.ops.dsa.indexer import key_splits
            blocks = -(-length // 64)
            plan = [({**DECODE_BF16, "maxnreg": cap}, key_splits(b, blocks, SMS * (65536 // (cap * 128))))
                    for cap in (128, 96, 80)]
        if args.pb2:
            from k31dsl.ops.dsa.indexer import key_splits
            two = {**DECODE_BF16, "PB": 2, "num_warps": 8}
            ns2 = key_splits(b, -(-length // 128), SMS * 2)
            plan = [(DECODE_BF16, None)] + [({**two, "num_stages": st}, ns2) for st in (4, 5, 6)] + [(DECODE_BF16, None)]
        contract = [False] * len(plan)           # indexer.FP_FUSION per entry
        if args.fp_fusion:
            plan, contract = [(DECODE_BF16, None)] * 4, [False, True, False, True]
        for (cfg, ns), on in zip(plan, contract):
            I.FP_FUSION = on
            got = call(cfg, ns)
            err = float((got - want).abs().max()) / scale
            ms = harness.graph_median_ms(lambda: call(cfg, ns))
            row = {"shape": f"B={b} L={length}", "config": " ".join(f"{k}={v}" for k, v in cfg.items())
                   + (" fp_fusion" if I.FP_FUSION else ""),
                   "nsplit": ns or "auto", "programs": b * ns if ns else "", "graph ms": ms, "x floor": ms / floor_ms,
                   "key TB/s": b * length * 132 / (ms * 1e-3) / 1e12, "max err / max|score|": err}
            rows.append(row)
            print(row, flush=True)
    I.FP_FUSION = False
    cols = ["shape", "config", "nsplit", "programs", "graph ms", "x floor", "key TB/s", "max err / max|score|"]
    name = "indexer_sweep_stages" if args.stages else "indexer_sweep_maxnreg" if args.maxnreg else \
        "indexer_sweep_f16" if args.f16 else "indexer_sweep_caps" if args.caps else \
        "indexer_sweep_fp_fusion" if args.fp_fusion else "indexer_sweep_pb2" if args.pb2 else "indexer_sweep"
    for r in harness.compiled_resources("lightning"):
        print("resources", r, flush=True)
    harness.report(name + (f"_{args.tag}" if args.tag else ""), cols, rows,
                   notes="Decode indexer, bf16 scoring, pinned configs x key splits (benchmarks/probes/indexer_sweep.py). "
                         "Floor: B*L*132 B at 4.28 TB/s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

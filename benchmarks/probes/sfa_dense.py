"""Probe: the staged form of sparse MLA attention (ops/dsa/sfa_staged.py: the selected records
copied into a contiguous bf16 buffer, then both products as dense GEMMs over it) at the DSA decode
step's shapes, kernel by kernel and config by config, against the committed two-pass form in the
same run. Each staged output is checked against the two-pass output first. CUDA-graph medians;
writes results/sfa_dense[_TAG].json and .md.

    python benchmarks/probes/sfa_dense.py [--shapes 64x32768,32x131072]
        [--score-configs BHxBNxSTAGESxWARPS[xMAXNREG]+...] [--value-configs BHxBKxSTAGESxWARPS[xMAXNREG]+...]
        [--stage-configs BRxWARPS+...] [--tag TAG]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SM_SCALE = 0.135234


def parse(text: str, names: tuple[str, ...]) -> list[dict]:
    """"64x64x2x4+..." -> [{BH: 64, BN: 64, STAGES: 2, num_warps: 4}, ...] (maxnreg 0 or absent: no cap)."""
    out = []
    for item in filter(None, text.split("+")):
        vals = [int(v) for v in item.split("x")]
        cfg = dict(zip(names, vals))
        if "maxnreg" in cfg and not cfg["maxnreg"]:
            del cfg["maxnreg"]
        out.append(cfg)
    return out


def fmt(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_attention_inputs
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import sfa_staged as ST
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--score-configs", default="64x64x2x4+64x64x3x4+128x64x2x8+64x128x2x4")
    ap.add_argument("--value-configs", default="64x64x2x4+64x64x2x4x168+64x64x3x4+64x64x2x8x128+128x64x2x8")
    ap.add_argument("--stage-configs", default="32x4+64x4+64x8")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    score_cfgs = parse(args.score_configs, ("BH", "BN", "STAGES", "num_warps", "maxnreg"))
    value_cfgs = parse(args.value_configs, ("BH", "BK", "STAGES", "num_warps", "maxnreg"))
    stage_cfgs = parse(args.stage_configs, ("BR", "num_warps"))
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        q, mcache, views, slots = step_attention_inputs(b, length)
        T, H, K = q.shape[0], q.shape[1], slots.shape[1]
        base = {"B": b, "L": length}
        ref_o, ref_l = A.sparse_mla_attention(q, mcache, slots, SM_SCALE, form="two_pass", target="triton")
        scale = float(ref_o.float().abs().max())

        def add(part, cfg, ms, **extra):
            rows.append({**base, "part": part, "config": fmt(cfg), "ms": ms, **extra})
            print(rows[-1], flush=True)

        def attempt(fn):
            try:
                fn()
                return harness.graph_median_ms(fn)
            except Exception as e:  # noqa: BLE001 - a config that fails to build is a result
                print("failed", type(e).__name__, str(e)[:300], flush=True)
                return float("nan")

        add("two-pass (committed)", {}, attempt(lambda: A.sparse_mla_attention(
            q, mcache, slots, SM_SCALE, form="two_pass", target="triton")))
        add("staged (op defaults)", {}, attempt(lambda: A.sparse_mla_attention(
            q, mcache, slots, SM_SCALE, form="staged", target="triton")))
        bufs = {bn: {n: torch.empty(s, dtype=getattr(torch, d), device="cuda")
                     for n, (s, d) in ST.buffers(T, H, K, bn).items()} for bn in {c["BN"] for c in score_cfgs}}
        first = next(iter(bufs.values()))
        c, sc, r = views
        staged_bytes = T * K * (656 + 1152 + 16)
        for cfg in stage_cfgs:
            ms = attempt(lambda cfg=cfg: ST.sfa_stage["triton"](c, sc, r, slots, first["keys"], first["key_scales"],
                                                                **cfg))
            add("stage", cfg, ms, **{"TB/s": staged_bytes / ms / 1e9 if ms == ms else None})
        for bn, bf in bufs.items():
            if bf is not first:
                bf["keys"].copy_(first["keys"])
                bf["key_scales"].copy_(first["key_scales"])
        best = {}
        for cfg in score_cfgs:
            bf = bufs[cfg["BN"]]
            ms = attempt(lambda cfg=cfg, bf=bf: ST.sfa_dense_scores["triton"](
                q, bf["keys"], bf["key_scales"], slots, bf["scores"], bf["part_m"], bf["part_l"], c.shape[0],
                SM_SCALE, **cfg))
            add("scores", cfg, ms, **{"TFLOP/s": 2 * T * H * K * 576 / ms / 1e9 if ms == ms else None})
            if ms == ms and (cfg["BN"] not in best or ms < best[cfg["BN"]][1]):
                best[cfg["BN"]] = (cfg, ms)
        bn, (scfg, sms) = min(best.items(), key=lambda e: e[1][1])
        bf = bufs[bn]
        ST.sfa_dense_scores["triton"](q, bf["keys"], bf["key_scales"], slots, bf["scores"], bf["part_m"],
                                      bf["part_l"], c.shape[0], SM_SCALE, **scfg)
        nsb = 1 << (ST.key_tiles(K, bn) - 1).bit_length()
        o, lse = torch.empty_like(ref_o), torch.empty_like(ref_l)
        for cfg in value_cfgs:
            def p2(cfg=cfg):
                ST.sfa_dense_values["triton"](bf["keys"], bf["key_scales"], bf["scores"], bf["part_m"], bf["part_l"],
                                              o, lse, NSB=nsb, **cfg)
            o.fill_(float("nan"))
            ms = attempt(p2)
            err = float((o.float() - ref_o.float()).abs().max()) / scale if ms == ms else float("nan")
            add("values", cfg, ms, **{"scores + values ms": sms + ms, "o rel diff vs two-pass": err,
                                      "lse diff": float((lse - ref_l).abs().max()) if ms == ms else float("nan"),
                                      "TFLOP/s": 2 * T * H * K * 512 / ms / 1e9 if ms == ms else None})
        torch.cuda.empty_cache()
    for res in harness.compiled_resources("sfa_"):
        print("resources", res, flush=True)
    harness.report(f"sfa_dense_{args.tag}" if args.tag else "sfa_dense",
                   ["B", "L", "part", "config", "ms", "TB/s", "TFLOP/s", "scores + values ms", "o rel diff vs two-pass",
                    "lse diff"], rows,
                   notes="CUDA-graph medians of one launch each; values run on the best scores config's buffers; "
                         "stage TB/s counts 656 B read + 1152 + 16 B written per record")
    return 0


if __name__ == "__main__":
    sys.exit(main())

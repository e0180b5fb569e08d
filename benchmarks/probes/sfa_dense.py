"""Probe: the staged form of sparse MLA attention (ops/dsa/sfa_staged.py: the selected records
copied into a contiguous bf16 buffer, then both products as dense GEMMs over it) at the DSA decode
step's shapes, kernel by kernel and config by config, against the committed two-pass form in the
same run. The kernels live here, not in ops/: the form lost (0.276 against 0.251 ms at B=64 L=32K,
0.145 against 0.133 at B=32 L=128K; NOTES, DSA attention, session of 07:47 UTC 2 Dec).

The design: the gather kernels (one-pass, two-pass) address each block of records through a
loaded index tile, so Triton keeps no copy in flight across blocks, and the E4M3 codes pass
through registers (widened to bf16) before an MMA reads them. Here `sfa_stage` first copies each
query's selected records into keys [T, K, 576] bf16 (codes widened exactly, rope) and key_scales
[T, K, 4] fp32 (zero rows for invalid indices); `sfa_dense_scores` (program: key tile of BN, head
block, query) then takes per latent tile g the [BH, 128] x [128, BN] product times the keys' scale g,
plus the rope product, masks invalid indices to -inf and writes the fp32 scores with each tile's
softmax (m, l); `sfa_dense_values` (program: 128-column tile, head block, query) takes lse from
every tile's (m, l) and sums (exp(s - lse) * scale_g) @ keys_g over key blocks. The numerics are the
two-pass form's (no product of code and scale is rounded). Every load of both products is at an
address computed from loop counters, so `k.range(stages=N)` pipelines them. Each staged output is checked against the two-pass output first. CUDA-graph medians;
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

import k31dsl as k  # noqa: E402
from k31dsl.ops.dsa.attention import LATENT, ROPE, TILE, CacheCodes, CacheRope, CacheScales  # noqa: E402
from k31dsl.ops.dsa.sfa_two_pass import fold_stats, segments_lse  # noqa: E402

SM_SCALE = 0.135234

DQK = LATENT + ROPE
STAGE_CONFIGS = [{"BR": 32, "num_warps": 4}]
SCORE_CONFIGS = [{"BH": 64, "BN": 64, "STAGES": 2, "num_warps": 4}]
VALUE_CONFIGS = [{"BH": 64, "BK": 64, "STAGES": 2, "num_warps": 4}]


@k.kernel(configs=STAGE_CONFIGS)
def sfa_stage(codes: CacheCodes, scales: CacheScales, rope: CacheRope, indices: k.Tensor[k.i32, "T", "K"],
              keys: k.Tensor[k.bf16, "T", "K", "DQK"], key_scales: k.Tensor[k.f32, "T", "K", "G"],
              BR: k.constexpr = 32):
    for rb, t in k.grid(k.cdiv(indices.shape[1], BR), indices.shape[0]):
        r0 = rb * BR
        idx = indices[t, k.span(r0, BR, other=-1)]
        valid = (idx >= 0) & (idx < codes.shape[0])
        keys[t, k.span(r0, BR), k.span(0, 512)] = k.where(
            valid[:, None], codes[idx, k.span(0, 512, other=0.0)].to(k.bf16), 0.0)
        keys[t, k.span(r0, BR), k.span(512, 64)] = k.where(valid[:, None], rope[idx, k.span(264, 64, other=0.0)], 0.0)
        key_scales[t, k.span(r0, BR), k.span(0, 4)] = k.where(
            valid[:, None], k.load(scales, (idx, k.span(128, 4)), other=0.0), 0.0)


@k.kernel(configs=SCORE_CONFIGS)
def sfa_dense_scores(q: k.Tensor["QT", "T", "H", "DQK"], keys: k.Tensor[k.bf16, "T", "K", "DQK"],
                     key_scales: k.Tensor[k.f32, "T", "K", "G"], indices: k.Tensor[k.i32, "T", "K"],
                     s: k.Tensor[k.f32, "T", "H", "K"], part_m: k.Tensor[k.f32, "NT", "T", "H"],
                     part_l: k.Tensor[k.f32, "NT", "T", "H"], n_slots: k.i32, sm_scale: k.f32,
                     QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64, BN: k.constexpr = 64,
                     STAGES: k.constexpr = 2):
    # Key tiles are the grid's fastest axis: a query's tiles run side by side and share its rows
    # of q from L2. The scale of tile g multiplies each tile's product (not the keys), so the dot
    # is a fresh one per tile and Triton waits on it; the loads of the next tiles are in flight.
    for n, hb, t in k.grid(k.cdiv(s.shape[2], BN), k.cdiv(s.shape[1], BH), s.shape[0]):
        h0 = hb * BH
        n0 = n * BN
        acc = k.zeros((BH, BN), k.f32)
        for g in k.range(4, stages=STAGES):
            a = q[t, k.span(h0, BH), k.span(g * TILE, TILE, other=0.0)].to(k.bf16)
            b = keys[t, k.span(n0, BN), k.span(g * TILE, TILE, other=0.0)]
            sg = k.load(key_scales, (t, k.span(n0, BN), g), other=0.0)
            acc += k.dot(a, b.T) * sg[None, :]
        a = q[t, k.span(h0, BH), k.span(LATENT, ROPE, other=0.0)].to(k.bf16)
        acc += k.dot(a, keys[t, k.span(n0, BN), k.span(LATENT, ROPE, other=0.0)].T)
        idx = indices[t, k.span(n0, BN, other=-1)]
        valid = (idx >= 0) & (idx < n_slots)
        sc = k.where(valid[None, :], acc * sm_scale, float("-inf"))
        s[t, k.span(h0, BH), k.span(n0, BN)] = sc
        m, l = fold_stats(k.full((BH,), float("-inf"), k.f32), k.zeros((BH,), k.f32), sc)
        part_m[n, t, k.span(h0, BH)] = m
        part_l[n, t, k.span(h0, BH)] = l


@k.kernel(configs=VALUE_CONFIGS)
def sfa_dense_values(keys: k.Tensor[k.bf16, "T", "K", "DQK"], key_scales: k.Tensor[k.f32, "T", "K", "G"],
                     s: k.Tensor[k.f32, "T", "H", "K"], part_m: k.Tensor[k.f32, "NT", "T", "H"],
                     part_l: k.Tensor[k.f32, "NT", "T", "H"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                     lse: k.Tensor[k.f32, "T", "H"], BH: k.constexpr = 64, BK: k.constexpr = 64,
                     NSB: k.constexpr = 1, STAGES: k.constexpr = 2):
    # NSB: the key-tile count of the score pass rounded up to a power of two (the caller passes
    # it). A masked score is -inf, so its probability is 0 whatever lse is (+inf for a lonely query).
    for g, hb, t in k.grid(k.cdiv(o.shape[2], TILE), k.cdiv(o.shape[1], BH), o.shape[0]):
        h0 = hb * BH
        row_lse = segments_lse(part_m, part_l, t, h0, BH, NSB)
        acc = k.zeros((BH, TILE), k.f32)
        for j in k.range(k.cdiv(s.shape[2], BK), stages=STAGES):
            sc = k.load(s, (t, k.span(h0, BH), k.span(j * BK, BK)), other=float("-inf"))
            sg = k.load(key_scales, (t, k.span(j * BK, BK), g), other=0.0)
            p = k.exp(sc - row_lse[:, None]) * sg[None, :]
            acc += k.dot(p.to(k.bf16), keys[t, k.span(j * BK, BK), k.span(g * TILE, TILE, other=0.0)])
        o[t, k.span(h0, BH), k.span(g * TILE, TILE)] = acc.to(k.bf16)
        lse[t, k.span(h0, BH)] = row_lse


def key_tiles(topk: int, bn: int) -> int:
    """The score pass's key tiles per query (its (m, l) partials)."""
    return -(-topk // bn)


def buffers(t: int, h: int, topk: int, bn: int) -> dict:
    """The staged form's intermediates by name -> (shape, dtype name)."""
    nt = key_tiles(topk, bn)
    return {"keys": ((t, topk, DQK), "bfloat16"), "key_scales": ((t, topk, 4), "float32"),
            "scores": ((t, h, topk), "float32"), "part_m": ((nt, t, h), "float32"),
            "part_l": ((nt, t, h), "float32")}




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
    ST = sys.modules[__name__]
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

        add("two-pass (committed)", {}, harness.try_graph_median_ms(lambda: A.sparse_mla_attention(
            q, mcache, slots, SM_SCALE, form="two_pass", target="triton")))
        bufs = {bn: {n: torch.empty(s, dtype=getattr(torch, d), device="cuda")
                     for n, (s, d) in ST.buffers(T, H, K, bn).items()} for bn in {c["BN"] for c in score_cfgs}}
        first = next(iter(bufs.values()))
        c, sc, r = views
        staged_bytes = T * K * (656 + 1152 + 16)
        for cfg in stage_cfgs:
            ms = harness.try_graph_median_ms(
                lambda cfg=cfg: ST.sfa_stage["triton"](c, sc, r, slots, first["keys"], first["key_scales"], **cfg))
            add("stage", cfg, ms, **{"TB/s": staged_bytes / ms / 1e9 if ms == ms else None})
        for bn, bf in bufs.items():
            if bf is not first:
                bf["keys"].copy_(first["keys"])
                bf["key_scales"].copy_(first["key_scales"])
        best = {}
        for cfg in score_cfgs:
            bf = bufs[cfg["BN"]]
            ms = harness.try_graph_median_ms(lambda cfg=cfg, bf=bf: ST.sfa_dense_scores["triton"](
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
            ms = harness.try_graph_median_ms(p2)
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

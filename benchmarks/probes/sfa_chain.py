"""Probe: what the SFA score pass loses to its five separately waited MMA groups. In sm_90a SASS
the committed pass (`sfa_two_pass.sfa_scores`) issues each block's four latent-tile products and
the rope product as five HGMMA groups, each fenced and waited to zero before the next (Triton waits
on every tl.dot outside a pipelined loop, even when `dot + dot` shares one accumulator). Two
variants here make the latent part ONE [BH, 512] x [512, BK] product (32 HGMMAs, one wait) plus
the rope product:

  UNSCALED  the tile scales left out: wrong scores, timed only as the bound of a two-group pass;
  DEQUANT   the code tile dequantized before the MMA (code * scale rounded to bf16): two groups,
            ~2^-9 relative error per key element (the committed pass is exact).

Timed against the committed pass at the DSA step's shapes (the step's own indices), CUDA-graph
medians; the committed pass first and last. Writes results/sfa_chain.json and .md.

    python benchmarks/probes/sfa_chain.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import k31dsl as k  # noqa: E402
from k31dsl.ops.dsa.attention import segment_blocks  # noqa: E402
from k31dsl.ops.dsa.sfa_two_pass import fold_stats  # noqa: E402

SM_SCALE = 0.135234
CONFIGS = [{"BH": 64, "BK": 32, "num_warps": 4, "num_stages": 1}]


@k.kernel(configs=CONFIGS)
def chain_scores(q: k.Tensor["QT", "T", "H", "DQK"], codes: k.Tensor[k.f8e4m3, "S", "R"],
                 scales: k.Tensor[k.f32, "S", "R // 4"], rope: k.Tensor[k.bf16, "S", "R // 2"],
                 indices: k.Tensor[k.i32, "T", "K"], s: k.Tensor[k.f32, "T", "H", "K"],
                 part_m: k.Tensor[k.f32, "NS", "T", "H"], part_l: k.Tensor[k.f32, "NS", "T", "H"], sm_scale: k.f32,
                 QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64, BK: k.constexpr = 32,
                 MODE: k.constexpr = 0):
    # sfa_scores with the latent part as ONE [BH, 512] x [512, BK] product (MODE 0: the codes
    # unscaled, 1: dequantized to bf16 first) and the rope product: two MMA groups per block.
    for t, hb, sg in k.grid(q.shape[0], k.cdiv(q.shape[1], BH), part_m.shape[0]):
        h0 = hb * BH
        ql = q[t, k.span(h0, BH), k.span(0, 512, other=0.0)].to(k.bf16)
        qr = q[t, k.span(h0, BH), k.span(512, 64, other=0.0)].to(k.bf16)
        n_slots = codes.shape[0]
        first, count = segment_blocks(indices, t, n_slots, BK, sg, part_m.shape[0])
        m = k.full((BH,), float("-inf"), k.f32)
        l = k.zeros((BH,), k.f32)
        ahead = indices[t, k.span(first * BK, BK, other=-1)]
        for j in range(count):
            j0 = (first + j) * BK
            idx = ahead
            valid = (idx >= 0) & (idx < n_slots)
            c = codes[idx, k.span(0, 512, other=0.0)]
            kr = rope[idx, k.span(264, 64, other=0.0)]
            if MODE == 0:
                kl = c.to(k.bf16)
            else:
                s4 = k.load(scales, (idx, k.span(128, 4)), other=0.0)
                kl = k.reshape(k.reshape(c.to(k.f32), (BK, 4, 128)) * s4[:, :, None], (BK, 512)).to(k.bf16)
            sc = k.where(valid[None, :], (k.dot(ql, kl.T) + k.dot(qr, kr.T)) * sm_scale, float("-inf"))
            ahead = indices[t, k.span(j0 + BK, BK, other=-1)]
            s[t, k.span(h0, BH), k.span(j0, BK)] = sc
            m, l = fold_stats(m, l, sc)
        part_m[sg, t, k.span(h0, BH)] = m
        part_l[sg, t, k.span(h0, BH)] = l


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_attention_inputs
    from k31dsl.ops.dsa import sfa_two_pass as TP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        q, mcache, views, slots = step_attention_inputs(b, length)
        T, H, K = q.shape[0], q.shape[1], slots.shape[1]
        ns = TP.score_segments(T, H, K, 64, 32)
        s, pm, pl = TP.new_buffers(T, H, K, ns, "cuda")

        def committed():
            TP.sfa_scores["triton"](q, *views, slots, s, pm, pl, SM_SCALE, **TP.SCORE_CONFIGS[0])
        committed()
        ref = s.clone()
        base = {"B": b, "L": length}
        rows.append({**base, "variant": "committed (five waited groups)", "ms": harness.graph_median_ms(committed)})
        print(rows[-1], flush=True)
        for mode, name in ((0, "two groups, unscaled (wrong scores)"), (1, "two groups, dequantized keys")):
            def fn(mode=mode):
                chain_scores["triton"](q, *views, slots, s, pm, pl, SM_SCALE, MODE=mode, **CONFIGS[0])
            try:
                fn()
                err = float((s - ref)[torch.isfinite(ref)].abs().max())
                ms = harness.graph_median_ms(fn)
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile is a result
                print("failed", name, type(e).__name__, str(e)[:300], flush=True)
                ms, err = float("nan"), float("nan")
            rows.append({**base, "variant": name, "ms": ms, "max |score - committed|": err})
            print(rows[-1], flush=True)
        rows.append({**base, "variant": "committed (again)", "ms": harness.graph_median_ms(committed)})
        print(rows[-1], flush=True)
        del mcache
        torch.cuda.empty_cache()
    harness.report("sfa_chain", ["B", "L", "variant", "ms", "max |score - committed|"], rows,
                   notes="CUDA-graph medians of the score pass alone (BH 64, BK 32, 4 warps, one stage), the "
                         "step's own indices")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: the DSA decode step (unfused, bf16 scoring) with the batch cut into G groups of sequences,
each group's chain (indexer -> top-k -> slots -> two-pass SFA) on its own CUDA stream. The chains
are independent, so one group's top-k (64 or 32 programs in its last level: a few SMs) and SFA can
run beside another group's indexer (bandwidth-bound). G = 1 is the step as dsa.py times it.
Outputs are checked against G = 1 (same positions as a set; o within bf16 rounding, since the
attention's segment count may follow T). CUDA-graph medians; writes results/step_streams.json/.md.

    python benchmarks/probes/step_streams.py [--shapes 64x32768,32x131072] [--groups 1,2,4] [--tag x]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def chain(args, rows: slice, length: int, sm_scale: float):
    from k31dsl.ops.dsa import fused as F
    qc, qs, w, icache, q, mcache, bt, ks, ke = args
    return F.li_sfa_unfused(qc[rows], qs[rows], w[rows], icache, q[rows], mcache, bt[rows], ks[rows], ke[rows], 2048,
                            sm_scale, return_indices=True, max_len=length, mma="bf16", target="triton")


def grouped(args, groups: int, streams, length: int, sm_scale: float):
    """Every group's chain on its own stream (forked from and joined to the current one)."""
    import torch
    b = args[0].shape[0]
    per = -(-b // groups)
    main = torch.cuda.current_stream()
    outs = []
    for g, s in zip(range(groups), streams):
        s.wait_stream(main)
        with torch.cuda.stream(s):
            outs.append(chain(args, slice(g * per, min(b, (g + 1) * per)), length, sm_scale))
    for s in streams[:groups]:
        main.wait_stream(s)
    return outs


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import SM_SCALE, make_step
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--groups", default="1,2,4")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    streams = [torch.cuda.Stream() for _ in range(8)]
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        step, _ = make_step(b, length, 2048, 64, 128, "cuda", anchors=False)
        o1, lse1, pos1 = chain(step, slice(0, b), length, SM_SCALE)
        serial = harness.graph_median_ms(lambda: chain(step, slice(0, b), length, SM_SCALE))
        for groups in (int(x) for x in args.groups.split(",")):
            outs = grouped(step, groups, streams, length, SM_SCALE)
            torch.cuda.synchronize()
            o, lse, pos = (torch.cat([x[i] for x in outs]) for i in range(3))
            same = all(set(a.tolist()) == set(c.tolist()) for a, c in zip(pos.cpu(), pos1.cpu()))
            rel = float((o.float() - o1.float()).abs().max() / o1.float().abs().max())
            ms = harness.graph_median_ms(lambda: grouped(step, groups, streams, length, SM_SCALE))
            rows.append({"B": b, "L": length, "groups": groups, "step ms": ms, "serial ms (same run)": serial,
                         "vs serial": serial / ms, "same positions": same, "o rel diff": rel,
                         "lse diff": float((lse - lse1).abs().max())})
            print(rows[-1], flush=True)
    harness.report(f"step_streams{args.tag}", ["B", "L", "groups", "step ms", "serial ms (same run)", "vs serial",
                                               "same positions", "o rel diff", "lse diff"], rows,
                   notes="CUDA-graph medians of the unfused bf16 step; groups of sequences, one stream each")
    return 0


if __name__ == "__main__":
    sys.exit(main())

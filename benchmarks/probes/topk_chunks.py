"""Probe: the DSA decode step's top-k (2048 of each row's indexer scores, set form) at several
stage-1 segment lengths (`topk(chunks=c)`: segments of c * 2048 scores, the lanes past the first
8192 streamed per counting step). Longer segments mean fewer stage-1 programs (B=32 L=128K at the
default 4: 512 programs, two waves at two per SM) and fewer merge levels, against more compare
work per step. Every variant must give the default's positions. CUDA-graph medians; writes
results/topk_chunks.json and .md.

    python benchmarks/probes/topk_chunks.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_scores
    from k31dsl.ops.dsa.topk import topk
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        _, scores = step_scores(b, length)
        want = topk(scores, 2048, sorted=False, target="triton")
        for chunks in (4, 8, 16):
            if chunks * 2048 > length:
                continue
            got = topk(scores, 2048, sorted=False, chunks=chunks, target="triton")
            ms = harness.graph_median_ms(lambda: topk(scores, 2048, sorted=False, chunks=chunks, target="triton"))
            rows.append({"B": b, "L": length, "chunks": chunks, "stage-1 programs": b * -(-length // (chunks * 2048)),
                         "set ms": ms, "same positions": bool(torch.equal(got, want))})
            print(rows[-1], flush=True)
    harness.report("topk_chunks", ["B", "L", "chunks", "stage-1 programs", "set ms", "same positions"], rows,
                   notes="CUDA-graph medians of the whole top-k (every level), set form; chunks 4 is the default")
    return 0


if __name__ == "__main__":
    sys.exit(main())

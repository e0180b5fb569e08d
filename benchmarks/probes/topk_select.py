"""Probe: the DSA decode step's top-k (2048 of each row's indexer scores, set and sorted, every
level) with whatever ops/dsa/topk.py is installed. To compare two versions of that file, run it
once per version in the same device call, swapping the file between runs (each version then
compiles and runs in its own process on the same seeded scores); --save writes the positions,
--against checks them against a saved run. The 00:00 session of 2 Dec ran new, old, new:

    bash benchmarks/gpu_run.sh "probes/topk_select:200:--tag=new1,--save=/tmp/new1.pt"
    git show 1cfcb15:ops/dsa/topk.py > ops/dsa/topk.py      # the old version (restore after)
    bash benchmarks/gpu_run.sh "probes/topk_select:200:--tag=old,--save=/tmp/old.pt,--against=/tmp/new1.pt"

--no-exit runs the count search all 32 steps (ops/dsa/topk.py SEARCH_EXIT = False) instead of
stopping at an exact count, in the same file:

    bash benchmarks/gpu_run.sh "probes/topk_select:200:--tag=exit,--save=/tmp/e.pt probes/topk_select:200:--tag=noexit,--no-exit,--against=/tmp/e.pt"

CUDA-graph medians; writes results/topk_select_<tag>.json and .md.
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
    ap.add_argument("--tag", default="new")
    ap.add_argument("--save", default="")
    ap.add_argument("--against", default="")
    ap.add_argument("--no-exit", action="store_true", help="the count search without its early exit")
    ap.add_argument("--select-lanes", type=int, default=0, help="SELECT_LANES (the selection pass's tile) to use")
    ap.add_argument("--no-count-first", action="store_true", help="no count of the valid keys before the search")
    args = ap.parse_args(argv)
    # the module itself: `import k31dsl.ops.dsa.topk as m` gives the package's re-exported topk
    # function of the same name
    topk_module = sys.modules["k31dsl.ops.dsa.topk"]
    if args.no_count_first:
        topk_module.COUNT_FIRST = False
    if args.select_lanes:
        topk_module.SELECT_LANES = args.select_lanes
    if args.no_exit:
        topk_module.SEARCH_EXIT = False
    print("tile options of a one-tile level:", topk_module.tile_options(8192), flush=True)
    rows, saved = [], {}
    ref = torch.load(args.against) if args.against else {}
    for b, length in harness.shape_pairs(args.shapes):
        _, scores = step_scores(b, length)
        got = topk(scores, 2048, sorted=False, target="triton")
        saved[(b, length)] = got.cpu()
        ms = harness.graph_median_ms(lambda: topk(scores, 2048, sorted=False, target="triton"))
        ms_sorted = harness.graph_median_ms(lambda: topk(scores, 2048, sorted=True, target="triton"))
        same = bool(torch.equal(got.cpu(), ref[(b, length)])) if (b, length) in ref else ""
        rows.append({"version": args.tag, "exit": not args.no_exit, "count first": not args.no_count_first,
                     "SL": topk_module.SELECT_LANES, "B": b, "L": length, "set ms": ms, "sorted ms": ms_sorted,
                     "same positions as --against": same})
        print(rows[-1], flush=True)
    if args.save:
        torch.save(saved, args.save)
    harness.report(f"topk_select_{args.tag}", ["version", "exit", "count first", "SL", "B", "L", "set ms", "sorted ms",
                                                "same positions as --against"], rows,
                   notes="CUDA-graph medians of the whole top-k (every level) on the DSA step's indexer scores")
    return 0


if __name__ == "__main__":
    sys.exit(main())

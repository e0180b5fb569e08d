"""Probe: the two-pass SFA of the DSA decode step with its queries cut into G groups and the passes
software-pipelined over two CUDA streams: group g's value pass runs beside group g + 1's score
pass. Each pass alone keeps an SM's issue slots about half busy at two programs per SM (NOTES,
DSA attention: one block's chain after another per warpgroup), and the two passes need different
resources (scores: 110 KB of shared memory and 4 warps; values: 24 KB and 8 warps at 127
registers), so one program of each fits an SM together. Outputs are checked against the serial
two-pass call. CUDA-graph medians; writes results/sfa_overlap.json and .md.

    python benchmarks/probes/sfa_overlap.py [--shapes 64x32768,32x131072] [--groups 2,4] [--segments 1,2]
(lists take "," or "+": gpu_run.sh passes "+")
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pipelined(q, views, slots, sm_scale, bufs, o, lse, groups: int, segments: int, streams):
    """Scores of every group on streams[0] in order; each group's values on streams[1] after its
    scores (an event per group), so values(g) and scores(g + 1) may run at once."""
    import torch

    from k31dsl.ops.dsa import sfa_two_pass as TP
    t = q.shape[0]
    per = -(-t // groups)
    main = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(main)
    for g in range(groups):
        rows = slice(g * per, min(t, (g + 1) * per))
        s_buf, pm, pl = bufs[g]
        done = torch.cuda.Event()
        with torch.cuda.stream(streams[0]):
            TP.sfa_scores["triton"](q[rows], *views, slots[rows], s_buf, pm, pl, sm_scale)
            done.record()
        streams[1].wait_event(done)
        with torch.cuda.stream(streams[1]):
            TP.sfa_values["triton"](views[0], views[1], slots[rows], s_buf, pm, pl, o[rows], lse[rows],
                                    NSB=TP.segments_pow2(segments))
    for s in streams:
        main.wait_stream(s)


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import SM_SCALE, step_attention_inputs
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import sfa_two_pass as TP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--groups", default="2,4")
    ap.add_argument("--segments", default="1,2", help="score-pass segments per group (each group's own count)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    streams = [torch.cuda.Stream() for _ in range(2)]
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        q, mcache, views, slots = step_attention_inputs(b, length)
        t, h, k = q.shape[0], q.shape[1], slots.shape[1]
        ref_o, ref_l = A.sparse_mla_attention(q, mcache, slots, SM_SCALE, form="two_pass", target="triton")
        serial = harness.graph_median_ms(lambda: A.sparse_mla_attention(q, mcache, slots, SM_SCALE, form="two_pass",
                                                                       target="triton"))
        rows.append({"B": b, "L": length, "form": "two pass, serial", "ms": serial})
        print(rows[-1], flush=True)
        scale = float(ref_o.float().abs().max())
        for groups in (int(x) for x in args.groups.replace("+", ",").split(",")):
            per = -(-t // groups)
            for segments in (int(x) for x in args.segments.replace("+", ",").split(",")):
                bufs = [TP.new_buffers(min(per, t - g * per), h, k, segments, q.device) for g in range(groups)]
                o, lse = torch.empty_like(ref_o), torch.empty_like(ref_l)

                def run(groups=groups, segments=segments, bufs=bufs, o=o, lse=lse):
                    pipelined(q, views, slots, SM_SCALE, bufs, o, lse, groups, segments, streams)
                run()
                torch.cuda.synchronize()
                err = float((o.float() - ref_o.float()).abs().max()) / scale
                lerr = float((lse - ref_l).abs().max())
                ms = harness.graph_median_ms(run)
                rows.append({"B": b, "L": length, "form": f"pipelined, {groups} groups", "segments": segments,
                             "ms": ms, "o rel diff vs serial": err, "lse diff": lerr})
                print(rows[-1], flush=True)
        del mcache
        torch.cuda.empty_cache()
    harness.report(f"sfa_overlap_{args.tag}" if args.tag else "sfa_overlap",
                   ["B", "L", "form", "segments", "ms", "o rel diff vs serial", "lse diff"], rows,
                   notes="CUDA-graph medians of the whole SFA (both passes); pipelined: the score pass of every "
                         "group on one stream, each group's value pass on a second stream after its scores")
    return 0


if __name__ == "__main__":
    sys.exit(main())

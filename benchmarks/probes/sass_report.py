"""Probe (CPU): the DSA decode step's kernels built for sm_90a as the H200's JIT builds them
(`targets/triton/aot.jit_like`: the same divisibility facts and offset widths from the call's own
tensors, here meta tensors at the step's shapes), with registers, spills, shared memory, SASS
instructions and the programs per SM those allow. Run it with the GPU's Triton (3.6), so the code is
the GPU's code: its registers and instruction counts then match Nsight's (SFA score pass at B=64,
every offset int64 there: 199 registers and 2256 instructions before its cache views carried
k.aligned; the indexer 118 and 1536). Tensor arguments whose row alignment the JIT cannot see
(`aot.blind_spots`) are listed before each build. `k31dsl resources` does this for any one
kernel and call shape; this probe builds the DSA step's three kernels at once.

    env -u TRITON_INTERPRET /work/venv36/bin/python benchmarks/probes/sass_report.py [--shapes 64x32768]
    ... --ops /path/to/variant.py     (an sfa_two_pass.py variant to build instead of the committed one)
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch

    import harness
    import k31dsl as k
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import indexer as I
    from k31dsl.targets.triton.aot import blind_spots, compile_for_gpu, jit_like
    from k31dsl.targets.triton.emit import LAUNCH_KEYS
    from k31dsl.targets.triton.resources import sass_facts
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--ops", default="", help="an sfa_two_pass.py variant to build instead of the committed one")
    args = ap.parse_args(argv)
    if args.ops:
        spec = importlib.util.spec_from_file_location("variant", args.ops)
        TP = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(TP)
    else:
        from k31dsl.ops.dsa import sfa_two_pass as TP
    meta = dict(device="meta")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for b, length in harness.shape_pairs(args.shapes):
            pages, topk, h = b * length // 64, 2048, 128
            cache = torch.empty((pages, 64 * A.RECORD), dtype=torch.uint8, **meta)
            codes, scales, rope = A.cache_views(cache)
            icache = torch.empty((pages, I.PAGE_BYTES), dtype=torch.uint8, **meta)
            kc, ksc = I.indexer_cache_views(icache)           # what lightning_indexer passes
            ns = TP.score_segments(b, h, topk, 64, 32)
            s, part_m, part_l = TP.new_buffers(b, h, topk, ns, "meta")
            t = dict(q=torch.empty((b, h, 576), dtype=torch.bfloat16, **meta), codes=codes, scales=scales, rope=rope,
                     indices=torch.empty((b, topk), dtype=torch.int32, **meta), s=s, part_m=part_m, part_l=part_l,
                     o=torch.empty((b, h, 512), dtype=torch.bfloat16, **meta),
                     lse=torch.empty((b, h), **meta),
                     q_codes=torch.empty((b, 64, 128), dtype=torch.float8_e4m3fn, **meta),
                     q_scales=torch.empty((b, 64, 4), dtype=torch.float8_e8m0fnu, **meta),
                     weights=torch.empty((b, 64), **meta), kc=kc, ksc=ksc,
                     block_table=torch.empty((b, length // 64), dtype=torch.int32, **meta),
                     ks=torch.empty((b,), dtype=torch.int32, **meta), ke=torch.empty((b,), dtype=torch.int32, **meta),
                     scores=torch.empty((b, length), **meta), nsplit=I.split_count(I.DECODE_BF16, b, 1, length))
            cx_li = {key: v for key, v in I.DECODE_BF16.items() if key not in LAUNCH_KEYS}
            builds = [("lightning_indexer_paged", I.lightning_indexer_paged.ir(H=64, MMA_BF16=True, **cx_li),
                       {key: v for key, v in I.DECODE_BF16.items() if key in LAUNCH_KEYS}),
                      ("sfa_scores", TP.sfa_scores.ir(QT=k.bf16, **{key: v for key, v in TP.SCORE_CONFIGS[0].items()
                                                                   if key not in LAUNCH_KEYS}),
                       {key: v for key, v in TP.SCORE_CONFIGS[0].items() if key in LAUNCH_KEYS}),
                      ("sfa_values", TP.sfa_values.ir(NSB=TP.segments_pow2(ns), **{
                          key: v for key, v in TP.VALUE_CONFIGS[0].items() if key not in LAUNCH_KEYS}),
                       {key: v for key, v in TP.VALUE_CONFIGS[0].items() if key in LAUNCH_KEYS})]
            for name, kern, launch in builds:
                call = {p.name: t[p.name] for p in kern.params if p.name in t}
                like = jit_like(kern, n_per_seq=1, **call)
                for line in blind_spots(kern, **call):
                    print(f"{name}: {line}", flush=True)
                compiled = compile_for_gpu(kern, folder, arch=90, **like, **launch)
                rows.append({"shape": f"B={b} L={length}", "kernel": name, "offsets": like["index_type"],
                             **sass_facts(compiled, folder)})
                print(rows[-1], flush=True)
    harness.print_table(["shape", "kernel", "offsets", "regs", "spill loads", "smem KB", "warps", "per SM", "limit",
                         "SASS", "MMA", "global loads"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

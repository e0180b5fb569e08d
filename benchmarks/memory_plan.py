"""What the memory plan makes of the model's step programs: bytes of intermediates without a
plan, the arena the `memory_plan` pass lays them out in, and the lower bound (the most bytes live
at one op in schedule order). A plan is a property of the program, not of the device, so this
runs on the CPU: it builds the step programs and runs the triton pipeline's graph passes, no
kernel (the figures are exact byte counts, not timings).

    python benchmarks/memory_plan.py                                  # small, prefill 4K..128K + decode
    python benchmarks/memory_plan.py --config tiny --tokens 256+4096  # quick look
    python benchmarks/memory_plan.py --cp 2 --tokens 131072+524288    # each rank's context-parallel step
Writes results/memory_plan.{json,md} (results/memory_plan_cpP.{json,md} with --cp P).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

from k31dsl.lowering.graph.explain import draw_memory  # noqa: E402
from k31dsl.model.assembler import ModelRunner  # noqa: E402
from k31dsl.model.config import PRESETS, pages_for  # noqa: E402
from k31dsl.model.distributed import cp_shape, zigzag_layout  # noqa: E402
from k31dsl.model.layers.common import ShapeClass  # noqa: E402
from k31dsl.model.weights import init_weights  # noqa: E402


def plan_row(runner, shape: ShapeClass, tokens: int, plot: bool = False) -> dict:
    t0 = time.perf_counter()
    p = runner._after_passes(shape)
    if plot:
        harness.RESULTS.mkdir(parents=True, exist_ok=True)
        draw_memory(p, str(harness.RESULTS / f"memory_plan_{shape.kind}_{tokens}.png"))
    plan = p.meta["memory_plan"]
    gb = 1e9
    kind = shape.kind + (f" (rank 0 of {shape.ranks})" if shape.kind == "cp_prefill" else "")
    return {"step": kind, "sequences": shape.n_seqs, "tokens": tokens, "intermediates": len(plan["offsets"]),
            "unplanned GB": plan["bytes_before"] / gb, "arena GB": plan["arena_bytes"] / gb,
            "peak live GB (lower bound)": plan["peak_live"] / gb,
            "arena / peak live": plan["arena_bytes"] / max(plan["peak_live"], 1),
            "passes s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small", choices=sorted(PRESETS))
    ap.add_argument("--tokens", default="4096+32768+131072", help="prefill lengths, '+'-separated")
    ap.add_argument("--decode", default="1+64", help="decode batch sizes, '+'-separated (context 32K)")
    ap.add_argument("--plot", action="store_true",
                    help="also draw each plan to results/memory_plan_<step>_<tokens>.png (lifetimes x arena bytes)")
    ap.add_argument("--cp", type=int, default=0, metavar="P",
                    help="plan rank 0's context-parallel prefill step over P ranks instead of the single-rank one")
    args = ap.parse_args()
    cfg = PRESETS[args.config]
    tokens = [int(t) for t in args.tokens.split("+") if t]
    batches = [int(b) for b in args.decode.split("+") if b]
    weights = init_weights(cfg, seed=0)
    rows = []
    for t in tokens:
        runner = ModelRunner(cfg, weights, "triton", num_pages=pages_for(t), num_slots=1, device="cpu")
        shape = cp_shape(runner, zigzag_layout(t, args.cp), 0) if args.cp else \
            ShapeClass("prefill", 1, t, pages_for(t))
        rows.append(plan_row(runner, shape, t, args.plot))
        print(rows[-1], flush=True)
    for b in batches:
        runner = ModelRunner(cfg, weights, "triton", num_pages=b * pages_for(32768), num_slots=b, device="cpu")
        rows.append(plan_row(runner, ShapeClass("decode", b, 1, pages_for(32768)), 1))
        print(rows[-1], flush=True)
    columns = list(rows[0])
    path = harness.write(f"memory_plan_cp{args.cp}" if args.cp else "memory_plan", {"env": harness.environment(), "config": args.config, "rows": rows},
                         columns, rows, notes=f"{args.config} preset, triton pipeline's graph passes "
                                              "(build, verify, superkernel, streams, memory_plan), on the CPU")
    print(path.read_text())


if __name__ == "__main__":
    main()

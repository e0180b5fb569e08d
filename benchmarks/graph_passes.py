"""Graph passes on a GPU: what streams, graph mode and superkernel fusion buy, on programs built
for the purpose (issue 4; the AttnRes step's own numbers are in benchmarks/attnres.py).

    python benchmarks/graph_passes.py            # GPU: medians, results/graph_passes.{json,md}
    python benchmarks/graph_passes.py --smoke    # CPU, Triton interpreter, tiny shapes, nothing written

1. streams: an indexer-prolog-shaped program (three independent chains of compute-heavy row
   kernels that each occupy only T of the SMs, joined at the end), in order on one stream vs the
   streams pass (three streams + events). Expect up to ~the chain-length ratio (6 ops in order vs
   3 on the longest chain): ~1.5-2x when each kernel leaves most SMs idle.
2. graph mode: a chain of row_shift kernels (each reads another program's row, so they cannot be
   inlined) at decode size: eager launches vs one launch group replayed as a CUDA graph. Expect
   the per-call time to fall from ~N x launch overhead (~4-6 us each) to ~one graph launch.
3. superkernel: a chain of row-local kernels at decode size, unfused (N launches, N-1
   intermediates through HBM) vs fused into one kernel.
Every case checks that the outputs of both runs are equal before timing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

import k31dsl as k  # noqa: E402
from k31dsl.lowering.graph import Program, compile_program  # noqa: E402


@k.kernel
def heavy_row(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], a: k.f32,
              BD: k.constexpr = 1024, REPS: k.constexpr = 64):
    for t in k.grid(x.shape[0]):
        for j in range(k.cdiv(x.shape[1], BD)):
            v = x[t, k.span(j * BD, BD, other=0.0)]
            for r in range(REPS):
                v = k.sigmoid(v) * a + 0.25
            y[t, k.span(j * BD, BD)] = v


@k.kernel
def row_add(x: k.Tensor[k.f32, "T", "D"], z: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"],
            BD: k.constexpr = 1024):
    for t in k.grid(x.shape[0]):
        for j in range(k.cdiv(x.shape[1], BD)):
            y[t, k.span(j * BD, BD)] = x[t, k.span(j * BD, BD, other=0.0)] + z[t, k.span(j * BD, BD, other=0.0)]


@k.kernel
def row_shift(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = 256):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[(t + 1) % x.shape[0], k.span(0, BD, other=0.0)] * 0.5 + 1.0


@k.kernel
def row_scale(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], a: k.f32, BD: k.constexpr = 256):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] * a + 0.125


def prolog(t: int, d: int, bd: int, reps: int) -> Program:
    p = Program("prolog")
    x = p.input("x", (t, d), k.f32)
    names = ("q1", "q2", "q3", "k1", "k2", "w1", "j", "out")
    q1, q2, q3, k1, k2, w1, j, out = (p.tensor(n, (t, d), k.f32) for n in names)
    cx = {"BD": bd, "REPS": reps}
    q1 = p.call(heavy_row, x, q1, 0.9, **cx)
    k1 = p.call(heavy_row, x, k1, 1.1, **cx)
    w1 = p.call(heavy_row, x, w1, 0.7, **cx)
    q2 = p.call(heavy_row, q1, q2, 1.2, **cx)
    k2 = p.call(heavy_row, k1, k2, 0.8, **cx)
    q3 = p.call(heavy_row, q2, q3, 1.0, **cx)
    j = p.call(row_add, q3, k2, j, BD=bd)
    out = p.call(row_add, j, w1, out, BD=bd)
    p.output(out)
    return p


def chain(kernel, n: int, t: int, d: int, **kw) -> Program:
    p = Program(f"{kernel.name}_chain")
    cur = p.input("x", (t, d), k.f32)
    for i in range(n):
        nxt = p.tensor(f"t{i}", (t, d), k.f32)
        cur = p.call(kernel, cur, nxt, *([1.01] if kernel is row_scale else []), **kw)
    p.output(cur)
    return p


class Timer:
    def __init__(self, smoke: bool):
        self.smoke = smoke

    def ms(self, fn) -> float:
        if not self.smoke:
            return harness.median_ms(fn)
        fn()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return sorted(ts)[1]


def compare(name, program, base_passes, passes, inputs, timer, rows, results):
    import torch
    base = compile_program(program, "triton", passes=base_passes)
    opt = compile_program(program, "triton", passes=passes)
    want = base({n: v.clone() for n, v in inputs.items()})
    got = opt({n: v.clone() for n, v in inputs.items()})
    got = opt({n: v.clone() for n, v in inputs.items()})          # second call: graph replay where grouped
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-5)
    t_base = timer.ms(lambda: base(inputs))
    t_opt = timer.ms(lambda: opt(inputs))
    row = {"case": name, "passes": "+".join(p for p in passes if p not in ("verify", "build")),
           "baseline ms": t_base, "with passes ms": t_opt, "speedup": t_base / t_opt,
           "kernels (base)": len(base.p.calls()), "kernels (passes)": len(opt.p.calls()),
           "graph replays": getattr(opt, "graph_replays", 0), "report": " | ".join(opt.p.report)[:300]}
    rows.append(row)
    results[name] = row
    print(f"{name}: {t_base:.4f} ms -> {t_opt:.4f} ms ({t_base / t_opt:.2f}x); {row['report'][:200]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    args = ap.parse_args()
    import torch
    dev = "cpu" if args.smoke else "cuda"
    timer = Timer(args.smoke)
    rows, results = [], {}
    if args.smoke:
        t, d, bd, reps, n, td = 2, 64, 64, 2, 3, (2, 64)
    else:
        t, d, bd, reps, n, td = 16, 8192, 1024, 64, 8, (4, 256)
    x = torch.randn(t, d, device=dev)
    compare("streams: indexer-prolog shape", prolog(t, d, bd, reps), ["verify"], ["verify", "streams"],
            {"x": x}, timer, rows, results)
    xs = torch.randn(*td, device=dev)
    compare("graph mode: row_shift chain", chain(row_shift, n, *td, BD=td[1]), ["verify"], ["verify", "superkernel"],
            {"x": xs}, timer, rows, results)
    compare("superkernel: row_scale chain", chain(row_scale, n, *td, BD=td[1]), ["verify"], ["verify", "superkernel"],
            {"x": xs}, timer, rows, results)
    if args.smoke:
        print("smoke run: nothing written")
        return
    cols = ["case", "passes", "baseline ms", "with passes ms", "speedup", "kernels (base)", "kernels (passes)"]
    path = harness.write("graph_passes", {"env": harness.environment(), "results": results}, cols, rows)
    harness.print_table(cols, rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

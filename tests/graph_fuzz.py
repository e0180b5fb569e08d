"""Random graph programs: a target's whole graph pipeline (superkernel, streams, memory_plan, and
nz_layout on AscendC) against the same program run call by call with `verify` alone.

The kernels below are the pieces: row kernels the superkernel pass may inline into each other,
one that reads the next row (it must not be inlined), a column-block kernel with another grid, a
row reduction, a product with a weight (AscendC's nz_layout converts it), and two that update a
tensor in place (a new version of the same storage, which
the memory plan and the streams must order). A program wires 3-9 of them at random over 1-3
inputs and returns 1-3 of the tensors it made. The arithmetic is the same with and without the
passes, so the outputs must agree bit for bit.

    python tests/graph_fuzz.py --count 300 --targets numpy,triton
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import dataclass

import numpy as np

import k31dsl as k
from program_fuzz import map_seeds, write_report

BD = 128            # row tile: every program's D is at most this


@k.kernel
def g_scale(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], a: k.f32, BD: k.constexpr = BD):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] * a + 0.5


@k.kernel
def g_add(x: k.Tensor[k.f32, "T", "D"], z: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"],
          BD: k.constexpr = BD):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] - z[t, k.span(0, BD, other=0.0)] * 0.5


@k.kernel
def g_next_row(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = BD):
    # row t reads row t + 1 (the last row reads zeros): another program's row
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t + 1, k.span(0, BD, other=0.0)] + x[t, k.span(0, BD, other=0.0)]


@k.kernel
def g_norm(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = BD):
    for t in k.grid(x.shape[0]):
        v = x[t, k.span(0, BD, other=0.0)]
        y[t, k.span(0, BD)] = v / (k.sum(k.abs(v)) + 1.0)


@k.kernel
def g_columns(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BT: k.constexpr = 16,
              BC: k.constexpr = 32):
    # one program per 32 columns, all rows: a running sum down each column
    for c in k.grid(k.cdiv(x.shape[1], BC)):
        v = x[k.span(0, BT, other=0.0), k.span(c * BC, BC, other=0.0)]
        y[k.span(0, BT), k.span(c * BC, BC)] = k.cumsum(v, axis=0)


@k.kernel
def g_accumulate(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = BD):
    # y += x: reads and writes y
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = y[t, k.span(0, BD, other=0.0)] + x[t, k.span(0, BD, other=0.0)]


@k.kernel
def g_clamp(y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = BD):
    for t in k.grid(y.shape[0]):
        y[t, k.span(0, BD)] = k.minimum(k.maximum(y[t, k.span(0, BD, other=0.0)], -3.0), 3.0)


@k.kernel
def g_matmul(x: k.Tensor[k.f32, "T", "D"], w: k.Tensor[k.f32, "D", "D"], y: k.Tensor[k.f32, "T", "D"],
             BT: k.constexpr = 16, BD: k.constexpr = BD):
    # 16 rows per program against a weight: AscendC's nz_layout pass converts w to FRACTAL_NZ
    for r in k.grid(k.cdiv(x.shape[0], BT)):
        a = x[k.span(r * BT, BT, other=0.0), k.span(0, BD, other=0.0)]
        b = w[k.span(0, BD, other=0.0), k.span(0, BD, other=0.0)]
        y[k.span(r * BT, BT), k.span(0, BD)] = k.dot(a, b)


MAKERS = ["scale", "add", "next_row", "norm", "columns", "matmul"]     # write a new tensor
UPDATERS = ["accumulate", "clamp"]                           # update an existing one


@dataclass
class GraphCase:
    seed: int
    program: object
    inputs: dict
    steps: list


def generate(seed: int) -> GraphCase:
    """The program of one seed (the same seed, the same program and inputs)."""
    from k31dsl.lowering.graph import Program
    rng = np.random.default_rng(seed)
    T, D = int(rng.integers(1, 17)), int(rng.integers(1, BD + 1))       # g_columns covers 16 rows
    p = Program(f"fuzz{seed}")
    pool = []                                  # (name, current version) of every tensor
    n_in = int(rng.integers(1, 4))
    for n in range(n_in):
        pool.append((f"x{n}", p.input(f"x{n}", (T, D), k.f32)))
    steps, temps, weights = [], [], {}
    for s in range(int(rng.integers(3, 10))):
        kind = str(rng.choice(MAKERS + UPDATERS if temps else MAKERS))

        def pick():
            return pool[int(rng.integers(len(pool)))][1] if rng.random() < 0.4 else pool[-1][1]
        if kind in UPDATERS:
            t = int(rng.integers(len(temps)))
            name = temps[t]
            at = next(i for i, (n, _) in enumerate(pool) if n == name)
            cur = pool[at][1]
            new = p.call(g_accumulate, pick(), cur) if kind == "accumulate" else p.call(g_clamp, cur)
            pool[at] = (name, new)
        else:
            name = f"t{s}"
            out = p.tensor(name, (T, D), k.f32)
            if kind == "scale":
                new = p.call(g_scale, pick(), out, float(rng.choice([0.5, -1.5, 2.0])))
            elif kind == "add":
                new = p.call(g_add, pick(), pick(), out)
            elif kind == "next_row":
                new = p.call(g_next_row, pick(), out)
            elif kind == "norm":
                new = p.call(g_norm, pick(), out)
            elif kind == "matmul":
                if "w" not in weights:
                    weights["w"] = p.weight("w", (D, D), k.f32)
                new = p.call(g_matmul, pick(), weights["w"], out)
            else:
                new = p.call(g_columns, pick(), out)
            pool.append((name, new))
            temps.append(name)
        steps.append(kind)
    made = [ref for name, ref in pool if name in temps]
    chosen = {id(made[-1]): made[-1]}
    for i in rng.choice(len(made), size=min(len(made), int(rng.integers(0, 3))), replace=False):
        chosen[id(made[int(i)])] = made[int(i)]
    p.output(*chosen.values())
    import torch
    g = torch.Generator().manual_seed(seed)
    inputs = {f"x{n}": torch.randn(T, D, generator=g) * 3 for n in range(n_in)}
    if weights:
        inputs["w"] = torch.randn(D, D, generator=g) / D ** 0.5
    return GraphCase(seed, p, inputs, steps)


@dataclass
class Outcome:
    seed: int
    status: str          # "ok" or "FAIL"
    detail: str = ""
    report: str = ""


def check(seed: int, targets) -> Outcome:
    """One program: each target's pipeline against the same target with `verify` alone, bit for bit."""
    import torch
    from k31dsl.lowering.graph import compile_program, run
    case = generate(seed)

    def fresh(dev):
        return {n: v.clone().to(dev) for n, v in case.inputs.items()}
    for target in targets:
        if target == "triton":
            from k31dsl.targets.triton.emit import detect_mode
            dev = "cuda" if detect_mode() == "gpu" else "cpu"
        else:
            dev = "cpu"
        try:
            with np.errstate(all="ignore"):
                # the same target call by call: its sums may round in another order than numpy's
                want = {n: v.cpu() for n, v in run(case.program, fresh(dev), target=target, passes=["verify"]).items()}
                exe = compile_program(case.program, target)
                got = exe(fresh(dev))
                got2 = exe(fresh(dev))              # a second call: kept arena, replayed CUDA graphs
        except Exception as e:                      # noqa: BLE001 - any failure is a finding
            return Outcome(seed, "FAIL", f"{target}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        report = " | ".join(exe.p.report)
        for run_no, out in enumerate((got, got2)):
            for name, ref in want.items():
                o = out[name].cpu()
                if not torch.equal(o.isnan(), ref.isnan()) or not torch.equal(o.nan_to_num(), ref.nan_to_num()):
                    diff = (o - ref).abs().nan_to_num(float("inf"))
                    at = torch.nonzero(diff == diff.max())[:3].tolist()
                    return Outcome(seed, "FAIL", f"{target} (call {run_no + 1}): {name} differs at {at}, "
                                   f"steps {case.steps}", report)
    return Outcome(seed, "ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=50, help="programs to run (default 50)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: a fresh one)")
    ap.add_argument("--targets", default="numpy,triton", help="targets (default numpy,triton)")
    ap.add_argument("--show", action="store_true", help="print the first program and stop")
    ap.add_argument("--jobs", type=int, default=1, help="programs checked in parallel processes (default 1)")
    ap.add_argument("--report", default=None, help="also write the outcome as a Markdown file here")
    args = ap.parse_args(argv)
    seed0 = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2 ** 31)
    if args.show:
        print(generate(seed0).program)
        return 0
    targets = [t for t in args.targets.split(",") if t]
    t0, lines = time.time(), []
    results = map_seeds(functools.partial(check, targets=targets), range(seed0, seed0 + args.count), args.jobs,
                        chunksize=2)
    for out in results:
        if out.status != "ok":
            lines.append(f"seed {out.seed}: {out.detail}; passes: {out.report}")
            print(lines[-1], flush=True)
    summary = (f"{args.count} graph programs from seed {seed0} on {', '.join(targets)}: "
               f"{args.count - len(lines)} agree, {len(lines)} failed ({time.time() - t0:.0f} s)")
    print(summary)
    write_report(args.report, "Random graph programs: passes on against call by call", summary, lines)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())

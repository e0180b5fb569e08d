"""Variants of the shrunk random programs that the H200 got wrong (benchmarks/probes/fuzz_cases/,
made by tests/program_shrink.py), to see which part of each the GPU miscompiles.

Each case is a seed (its inputs and outputs come from tests/program_fuzz.py), the shrunk DSL
source, DSL edits (a changed program: the numpy reference is recomputed for it) and Triton edits
(the same program in another form or launch: text replaced in the generated module). Every
combination runs on the GPU and is compared with the reference as the fuzzer compares.

    python benchmarks/probes/fuzz_variants.py [SEED ...]
"""
import dataclasses
import importlib.util
import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
import program_fuzz as F                       # noqa: E402

WARPS = [("w1", "enable_fp_fusion=enable_fp_fusion,", "enable_fp_fusion=enable_fp_fusion, num_warps=1,"),
         ("w2", "enable_fp_fusion=enable_fp_fusion,", "enable_fp_fusion=enable_fp_fusion, num_warps=2,"),
         ("w8", "enable_fp_fusion=enable_fp_fusion,", "enable_fp_fusion=enable_fp_fusion, num_warps=8,")]
CASES = {
    202878: dict(dsl=[("v4 = -v1", "v4 = -v2", "v4 = -v1"), ("no neg", "v4 = -v2", "v4 = v2"),
                      ("neg of i32", "v6 = v4.bitcast(k.i32)", "v6 = -(v2.bitcast(k.i32))"),
                      ("axis 1", "k.max(v6, axis=0)[None, :]", "k.max(v6, axis=1)[:, None]")],
                 triton=WARPS + [("0 - v2", "v4 = -v2", "v4 = 0 - v2"),
                                 ("max in i64", "v_6 = tl.max(v6, 0)", "v_6 = tl.max(v6.to(tl.int64), 0).to(tl.int32)")]),
    103512: dict(dsl=[("no neg", "v7 = -v3", "v7 = v3"), ("axis 1", "k.min(v7, axis=0)[None, :]", "k.min(v7, axis=1)[:, None]"),
                      ("no s_i", "v3 = v1 + s_i", "v3 = v1 - 1")],
                 triton=WARPS + [("0 - v3", "v7 = -v3", "v7 = 0 - v3"),
                                 ("min in i64", "v_6 = tl.min(v7, 0)", "v_6 = tl.min(v7.to(tl.int64), 0).to(tl.int32)")]),
    300771: dict(dsl=[("no cumsum", "v8 = k.cumsum(v4, axis=1, reverse=True)", "v8 = v4"),
                      ("forward", "reverse=True", "reverse=False"),
                      ("f32 cumsum", "v8 = k.cumsum(v4, axis=1, reverse=True)", "v8 = k.cumsum(v4.to(k.f32), axis=1, reverse=True).to(k.bf16)")],
                 triton=WARPS),
    301331: dict(dsl=[("no cumsum", "v5 = k.cumsum(v4, axis=1)", "v5 = v4"), ("no s_i", "v8 = v5 * s_i", "v8 = v5"),
                      ("f32 mul", "v8 = v5 * s_i", "v8 = (v5.to(k.f32) * s_i).to(k.bf16)")],
                 triton=WARPS),
    302679: dict(dsl=[("distinct", "v2 = v0.to(k.f32)", "v2 = v0.to(k.f32) * 64.0 + k.arange(0, BC)[None, :].to(k.f32)"),
                      ("BR 8", "BR: k.constexpr = 32", "BR: k.constexpr = 8"),
                      ("BR 1", "BR: k.constexpr = 32", "BR: k.constexpr = 1")],
                 triton=WARPS),
}

# second round (python fuzz_variants.py --forms): candidate fixes as Triton edits of the shrunk program
FORMS = {
    300771: dict(dsl=[], triton=[
        ("flip-scan-flip", "tl.cumsum(v4.to(tl.float32), 1, reverse=True)",
         "tl.flip(tl.cumsum(tl.flip(v4.to(tl.float32), 1), 1), 1)"),
        ("associative_scan", "tl.cumsum(v4.to(tl.float32), 1, reverse=True)",
         "tl.associative_scan(v4.to(tl.float32), 1, _add_f, reverse=True)"),
        ("total - scan + x", "tl.cumsum(v4.to(tl.float32), 1, reverse=True)",
         "(tl.sum(v4.to(tl.float32), 1)[:, None] - tl.cumsum(v4.to(tl.float32), 1) + v4.to(tl.float32))")]),
    302679: dict(dsl=[], triton=[
        ("key by * and +", "key = (order.to(tl.int64) << 32) | (L - 1 - lanes).to(tl.int64)",
         "key = order.to(tl.int64) * 4294967296 + (L - 1 - lanes).to(tl.int64)"),
        ("2-D lanes", "lanes = tl.arange(0, L)", "lanes = tl.arange(0, L)[None, :]"),
        ("order as i64 first", "key = (order.to(tl.int64) << 32)", "key = (tl.where(order == order, order, 0).to(tl.int64) << 32)")]),
}


def outputs_of(prog, got: dict, ref: dict, limit=6) -> str:
    for name, dt, _ in prog.outputs:
        a, b = ref[name], got[name]
        if dt in F.STORAGE:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        diff = torch.nonzero(~((a == b) | (a != a) & (b != b)))[:limit].tolist()
        if diff:
            return f"{name}: " + ", ".join(f"[{r},{c}] ref {a[r, c].item()} gpu {b[r, c].item()}" for r, c in diff)
    return ""


def run_case(seed: int, spec: dict, folder: str):
    from k31dsl.targets.triton.emit import detect_mode, emit
    dev = "cuda" if torch.cuda.is_available() else "cpu"       # (the interpreter: to try the script)
    base = F.generate(seed)
    source = open(os.path.join(HERE, "fuzz_cases", f"shrunk_{seed}.py")).read()
    inputs = F.draw_inputs(base)
    print(f"== seed {seed}: R={base.rows} C={base.cols} scalars={base.scalars}")
    for dname, old, new in [("as shrunk", "", "")] + spec["dsl"]:
        if old and old not in source:
            print(f"  [{dname}] edit does not apply")
            continue
        prog = dataclasses.replace(base, source=source.replace(old, new) if old else source, seed=seed * 100 + len(dname))
        kern, _ = F.load_kernel(prog, folder)
        with np.errstate(all="ignore"):
            ref = F.run_on("numpy", kern, prog, inputs)
        text = emit(kern.ir(), mode=detect_mode())
        for tname, told, tnew in [("", "", "")] + spec["triton"]:
            if told and told not in text:
                continue
            path = os.path.join(folder, f"v_{seed}_{abs(hash((dname, tname)))}.py")
            with open(path, "w") as f:
                src = text.replace(told, tnew) if told else text
                if "_add_f" in tnew:           # the combine function the edit calls
                    src = src.replace("\n@triton.jit", "\n@triton.jit\ndef _add_f(a, b):\n    return a + b\n\n\n@triton.jit", 1)
                f.write(src)
            mspec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
            mod = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(mod)
            outs = [torch.full((prog.rows, prog.cols), 77, dtype=torch.uint8, device=dev).view(F.torch_dtype(dt))
                    if dt in F.STORAGE else
                    torch.full((prog.rows, prog.cols), float("nan") if dt in F.FLOATS else 77,
                               dtype=F.torch_dtype(dt), device=dev) for _, dt, _ in prog.outputs]
            try:
                mod.fuzz_kernel(*[x.to(dev) for x in inputs], *outs, *prog.scalars)
                got = {n: o.cpu() for (n, _, _), o in zip(prog.outputs, outs)}
                why = F.mismatch(prog, ref, got)
                line = "OK " if not why else "BAD " + outputs_of(prog, got, ref)
            except Exception as e:         # noqa: BLE001
                line = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(f"  [{dname}{' | ' + tname if tname else ''}] {line}", flush=True)


def main():
    forms = "--forms" in sys.argv
    table = FORMS if forms else CASES
    seeds = [int(s) for s in sys.argv[1:] if s != "--forms"] or list(table)
    folder = tempfile.mkdtemp(prefix="k31var_")
    for seed in seeds:
        run_case(seed, table[seed], folder)


if __name__ == "__main__":
    main()

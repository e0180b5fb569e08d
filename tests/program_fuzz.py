"""Random kernels for differential testing: each compiled target against the numpy reference.

A program is a random chain of tile ops over loaded inputs, written out as DSL source (so a
failure is a file a person can read, run and shrink; tests/program_gen.py generates it). Every
value carries whether the semantics contract (dsl/ir.py, SEMANTICS) fixes its bits on every target:

  exact    loads, literals, IEEE + - * / and f32 sqrt, fmod, min / max, compares, where, floor / ceil,
           casts and bitcasts, integer math and integer sums, a loop of exact steps
  inexact  transcendentals, float sums and cumsums, dots, 16-bit sqrt: equal only up to rounding

Discontinuous ops (compares, floor / ceil, casts to an integer or fp8, //, %, shifts, bitcasts)
take exact operands only, so a last-bit difference never flips a branch; a division's denominator
is exact or kept >= 1. An output is compared bit for bit when exact, else within a tolerance by
dtype scaled to the output's largest finite value.

    python tests/program_fuzz.py --count 200 --targets triton,ascendc     # a long run
    python tests/program_fuzz.py --seed 1234 --show                        # one program's source
    env -u TRITON_INTERPRET python tests/program_fuzz.py --targets ptx     # the GPU's PTX, emulated

tests/test_random_programs.py runs a few per target in CI.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from ptxemu import Unsupported as NotEmulated      # tests/ptxemu: the `ptx` target's emulator
from program_gen import FLOATS, STORAGE, Program, generate    # the generator (tests/program_gen.py)

TOLERANCE = {"f32": 2e-4, "bf16": 4e-2, "f16": 4e-3}            # inexact outputs, relative


def draw_inputs(prog: Program):
    """The program's input tensors (torch, CPU): normal floats with a few specials, small integers
    with their extremes."""
    import torch
    rng = np.random.default_rng(prog.seed + 1)
    out = []
    for _, dt in prog.inputs:
        shape = (prog.rows, prog.cols)
        if dt in STORAGE:                # every byte: NaN, infinities and subnormals included
            x = rng.integers(0, 256, shape).astype(np.uint8)
            out.append(torch.from_numpy(x).view(torch_dtype(dt)))
            continue
        if dt in FLOATS:
            x = (rng.standard_normal(shape) * rng.choice([1.0, 4.0, 30.0])).astype(np.float32)
            specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -1.5], np.float32)
            pick = rng.random(shape) < 0.04
            x[pick] = rng.choice(specials, int(pick.sum()))
            t = torch.from_numpy(x).to(getattr(torch, {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dt]))
        else:
            info = np.iinfo({"i32": np.int32, "i8": np.int8, "i64": np.int64, "u32": np.uint32}[dt])
            x = rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape).astype(info.dtype)
            pick = rng.random(shape) < 0.04
            x[pick] = rng.choice(np.array([info.min, info.max, 0, 1], dtype=info.dtype), int(pick.sum()))
            t = torch.from_numpy(x)
        out.append(t)
    return out


def torch_dtype(dt: str):
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
            "i8": torch.int8, "i64": torch.int64, "u32": torch.uint32, "f8e4m3": torch.float8_e4m3fn,
            "f8e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu}[dt]


def load_kernel(prog: Program, directory: str):
    """Write the program's source to a file and import it (errors then point at its lines)."""
    path = os.path.join(directory, f"fuzz_{prog.seed}.py")
    with open(path, "w") as f:
        f.write(prog.source)
    spec = importlib.util.spec_from_file_location(f"k31_fuzz_{prog.seed}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fuzz_kernel, path


def run_on(target: str, kern, prog: Program, inputs) -> dict:
    """The kernel's outputs on one target (fresh NaN- or 77-filled output tensors, CPU copies)."""
    import torch
    import k31dsl as k
    dev = "cpu"
    if target == "triton":
        from k31dsl.targets.triton.emit import detect_mode
        dev = "cuda" if detect_mode() == "gpu" else "cpu"
    outs = [torch.full((prog.rows, prog.cols), 77, dtype=torch.uint8, device=dev).view(torch_dtype(dt))
            if dt in STORAGE else
            torch.full((prog.rows, prog.cols), float("nan") if dt in FLOATS else 77, dtype=torch_dtype(dt),
                       device=dev) for _, dt, _ in prog.outputs]
    if target == "ptx":                  # the H200's PTX, emulated on this CPU (tests/ptxemu)
        from ptxemu import run_gpu_code
        run_gpu_code(kern, *inputs, *outs, *prog.scalars, folder=os.path.join(tempfile.gettempdir(), "k31_ptx", str(prog.seed)))
    else:
        k.compile(kern, target=target)(*[x.to(dev) for x in inputs], *outs, *prog.scalars)
    return {name: o.cpu() for (name, _, _), o in zip(prog.outputs, outs)}


def mismatch(prog: Program, ref: dict, got: dict) -> str | None:
    """None when every output agrees (exact outputs bit for bit, inexact within tolerance), else why."""
    import torch
    for name, dt, exact in prog.outputs:
        a, b = ref[name], got[name]
        if dt in STORAGE:                  # codes, byte for byte, but -0 (0x80) as +0: the sign of a
            a, b = a.view(torch.uint8), b.view(torch.uint8)        # zero from max / min is left open
            if dt != "e8m0":
                a, b = a.masked_fill(a == 0x80, 0), b.masked_fill(b == 0x80, 0)
        if dt in FLOATS:
            na, nb = torch.isnan(a), torch.isnan(b)
            if not torch.equal(na, nb):
                return f"{name} ({dt}): NaN lanes differ at {torch.nonzero(na != nb)[:4].tolist()}"
            a, b = a.masked_fill(na, 0), b.masked_fill(nb, 0)
            if exact:
                bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
                a, b = a.masked_fill(a == 0, 0).view(bits), b.masked_fill(b == 0, 0).view(bits)
                if not torch.equal(a, b):
                    at = torch.nonzero(a != b)[:4].tolist()
                    return f"{name} ({dt}, exact): differs at {at}: {[a[i][j].item() for i, j in at]} vs {[b[i][j].item() for i, j in at]}"
                continue
            fa, fb = torch.isfinite(a), torch.isfinite(b)
            if not torch.equal(a[~fa], b[~fb]) or not torch.equal(fa, fb):
                return f"{name} ({dt}): infinities differ"
            ad, bd = a.double()[fa], b.double()[fb]
            scale = ad.abs().max().item() if ad.numel() else 0.0
            tol = TOLERANCE[dt]
            bad = (ad - bd).abs() > tol * (ad.abs() + scale) + 1e-30
            if bad.any():
                i = int(torch.nonzero(bad)[0])
                return f"{name} ({dt}): {ad[i].item()} vs {bd[i].item()} (tolerance {tol} x (|ref| + {scale:.3g}))"
        elif not torch.equal(a, b):
            at = torch.nonzero(a != b)[:4].tolist()
            return f"{name} ({dt}): differs at {at}: {[a[i][j].item() for i, j in at]} vs {[b[i][j].item() for i, j in at]}"
    return None


def text_round_trip(kern) -> str | None:
    """The kernel's IR through its `.k31` text form: print -> parse -> print must be the same text,
    and the parsed IR must emit the same numpy program. None when it holds, else what differs."""
    from k31dsl.dsl.parse import parse_kernel
    from k31dsl.dsl.text import print_kernel
    from k31dsl.targets.numpy.emit import emit
    ir = kern.ir()
    text = print_kernel(ir)
    try:
        parsed = parse_kernel(text, "<fuzz>")
    except Exception as e:                 # noqa: BLE001
        return f"the printed IR does not parse: {type(e).__name__}: {str(e).splitlines()[0]}"
    if print_kernel(parsed) != text:
        return "print(parse(print(ir))) differs from print(ir)"
    if emit(parsed) != emit(ir):
        return "the parsed IR emits another numpy program"
    return None


@dataclass
class Outcome:
    seed: int
    status: str          # "ok", "rejected" (a K31Error on the reference: the program is not valid DSL),
                         # "too big" (a target's CapacityError: its tiles do not fit), "FAIL"
    detail: str = ""
    path: str = ""


def check(seed: int, targets, directory: str, trace: bool = False) -> Outcome:
    """One program: the numpy reference first; a target that raises or disagrees is a failure.
    `trace`: every value is an output, so the first mismatch names the first wrong op."""
    import numpy as _np
    from k31dsl.dsl.errors import CapacityError, K31Error
    prog = generate(seed, trace=trace)
    inputs = draw_inputs(prog)
    try:
        kern, path = load_kernel(prog, directory)
        with _np.errstate(all="ignore"):
            ref = run_on("numpy", kern, prog, inputs)
    except K31Error as e:
        return Outcome(seed, "rejected", str(e).splitlines()[0])
    why = text_round_trip(kern)
    if why:
        return Outcome(seed, "FAIL", f"text form: {why}", path)
    for target in targets:
        try:
            with _np.errstate(all="ignore"):
                got = run_on(target, kern, prog, inputs)
        except CapacityError as e:         # a clear refusal, not a wrong result
            return Outcome(seed, "too big", f"{target}: {str(e).splitlines()[0]}", path)
        except NotEmulated as e:           # an instruction outside the emulator is no finding
            return Outcome(seed, "not emulated", str(e).splitlines()[0], path)
        except Exception as e:             # noqa: BLE001 - any failure of a valid program is a finding
            return Outcome(seed, "FAIL", f"{target}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", path)
        why = mismatch(prog, ref, got)
        if why and trace:                  # o<N> is v<N>: quote the line that made it
            v = "v" + why.split(" ", 1)[0][1:]
            why += "\n    first wrong value: " + next((line.strip() for line in prog.source.splitlines()
                                                        if line.strip().startswith(f"{v} =")), v)
        if why:
            return Outcome(seed, "FAIL", f"{target}: {why}", path)
    return Outcome(seed, "ok", path=path)


def map_seeds(check_one, seeds, jobs: int, chunksize: int = 4):
    """check_one(seed) over the seeds, in order: in `jobs` spawned processes when jobs > 1
    (check_one must then pickle: a module-level function or a functools.partial of one)."""
    if jobs <= 1:
        return map(check_one, seeds)
    import concurrent.futures as cf
    import multiprocessing as mp
    pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"))
    return pool.map(check_one, seeds, chunksize=chunksize)


def write_report(path: str | None, title: str, summary: str, lines: list[str]):
    """The run's summary and its failure lines as a Markdown file (nothing when path is None)."""
    if path:
        with open(path, "w") as f:
            f.write(f"# {title}\n\n{summary}\n\n" + "".join(f"- {line}\n" for line in lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Seeds run from --seed upwards; a failure prints the program's file, "
                                        "which `python tests/program_fuzz.py --seed N --show` reproduces.")
    ap.add_argument("--count", type=int, default=50, help="programs to run (default 50)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: a fresh one)")
    ap.add_argument("--targets", default="triton,ascendc",
                    help="compiled targets to check (default triton,ascendc); `ptx` runs the sm_90 PTX of this "
                         "process's Triton in tests/ptxemu (TRITON_INTERPRET unset; Triton 3.6 is the H200's)")
    ap.add_argument("--show", action="store_true", help="print the first program's source and stop")
    ap.add_argument("--dir", default=None, help="where the programs' files go (default: a temporary folder)")
    ap.add_argument("--jobs", type=int, default=1, help="programs checked in parallel processes (default 1)")
    ap.add_argument("--report", default=None, help="also write the outcome as a Markdown file here")
    ap.add_argument("--trace", action="store_true",
                    help="store every value of each program and name the first one a target gets wrong")
    args = ap.parse_args(argv)
    seed0 = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2 ** 31)
    if args.show:
        print(generate(seed0, trace=args.trace).source)
        return 0
    directory = args.dir or tempfile.mkdtemp(prefix="k31fuzz_")
    os.makedirs(directory, exist_ok=True)
    targets = [t for t in args.targets.split(",") if t]
    counts = {"ok": 0, "rejected": 0, "too big": 0, "not emulated": 0, "FAIL": 0}
    t0 = time.time()
    results = map_seeds(functools.partial(check, targets=targets, directory=directory, trace=args.trace),
                        range(seed0, seed0 + args.count), args.jobs)
    lines = []
    for n, out in enumerate(results):
        counts[out.status] += 1
        if out.status != "ok":
            lines.append(f"seed {out.seed}: {out.status}: {out.detail}" + (f"  [{out.path}]" if out.path else ""))
            print(lines[-1], flush=True)
        if (n + 1) % 100 == 0:
            print(f"  {n + 1} / {args.count} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    summary = (f"{args.count} programs from seed {seed0} on {', '.join(targets)}: {counts['ok']} agree, "
               f"{counts['rejected']} rejected by the frontend, {counts['too big']} too big for a target, "
               + (f"{counts['not emulated']} outside the PTX emulator, " if "ptx" in targets else "")
               + f"{counts['FAIL']} failed ({time.time() - t0:.0f} s)")
    print(summary)
    write_report(args.report, "Random programs against the numpy reference", summary, lines)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())

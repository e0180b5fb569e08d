"""Shrink a failing random program (tests/program_fuzz.py) to the statements its failure needs.

Greedy delta debugging over the kernel body: each statement (with the block it opens, if any) is
deleted in turn, last first, and the deletion is kept when the program is still valid DSL (the
numpy reference runs) and the target still fails the same way (a mismatch stays a mismatch; an
exception keeps its type). Passes repeat until nothing more can go. The inputs, the signature and
the helper functions stay as generated, so the shrunk program reads the same data.

    python tests/program_shrink.py --seed 202878 --targets triton --trace
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import program_fuzz as F                       # noqa: E402


def body_span(lines: list[str]) -> tuple[int, int]:
    """[first, end) of the grid loop's body lines in a generated program."""
    start = next(n for n, line in enumerate(lines) if line.lstrip().startswith("for i, j in k.grid(")) + 1
    end = start
    while end < len(lines) and (lines[end].startswith("        ") or not lines[end].strip()):
        end += 1
    return start, end


def statements(lines: list[str], start: int, end: int) -> list[tuple[int, int]]:
    """Every statement of the body as [first, end) line ranges, a block header with its block."""
    out = []
    for n in range(start, end):
        if not lines[n].strip():
            continue
        indent = len(lines[n]) - len(lines[n].lstrip())
        stop = n + 1
        while stop < end and (not lines[stop].strip() or len(lines[stop]) - len(lines[stop].lstrip()) > indent):
            stop += 1
        out.append((n, stop))
    return out


class Judge:
    """Runs a candidate source on the reference and the target; `verdict` is how it failed
    ("mismatch" or the exception's type name) or None when it agrees or is not valid DSL."""

    def __init__(self, prog: F.Program, target: str, directory: str):
        self.prog, self.target, self.directory = prog, target, directory
        self.inputs = F.draw_inputs(prog)
        self.tries = 0

    def verdict(self, source: str) -> str | None:
        import numpy as np
        from k31dsl.dsl.errors import CapacityError
        self.tries += 1
        prog = dataclasses.replace(self.prog, source=source)
        try:
            kern, _ = F.load_kernel(prog, self.directory)
            with np.errstate(all="ignore"):
                ref = F.run_on("numpy", kern, prog, self.inputs)
        except Exception:                  # noqa: BLE001 - the deletion broke the program: not a candidate
            return None
        try:
            with np.errstate(all="ignore"):
                got = F.run_on(self.target, kern, prog, self.inputs)
        except CapacityError:
            return None
        except Exception as e:             # noqa: BLE001
            return type(e).__name__
        return "mismatch" if F.mismatch(prog, ref, got) else None


def shrink(prog: F.Program, judge: Judge, log=print) -> str:
    """The smallest source (by greedy deletion) that fails as prog.source does."""
    lines = prog.source.splitlines()
    want = judge.verdict(prog.source)
    if want is None:
        raise SystemExit(f"seed {prog.seed}: the program does not fail on {judge.target}: nothing to shrink")
    changed = True
    while changed:
        changed = False
        n = len(statements(lines, *body_span(lines))) - 1
        while n >= 0:                      # last first: a value's uses go before its definition
            stmts = statements(lines, *body_span(lines))
            if n < len(stmts):
                first, stop = stmts[n]
                trial = lines[:first] + lines[stop:]
                if judge.verdict("\n".join(trial) + "\n") == want:
                    log(f"  - {lines[first].strip()}")
                    lines, changed = trial, True
            n -= 1
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[-1])
    ap.add_argument("--seed", type=int, required=True, help="the failing program's seed")
    ap.add_argument("--targets", default="triton", help="the target that fails (one)")
    ap.add_argument("--trace", action="store_true", help="shrink the traced form (every value stored)")
    ap.add_argument("--out", default=None, help="write the shrunk program here (default: print only); "
                    "for triton also its generated source, as NAME.triton.py")
    args = ap.parse_args(argv)
    prog = F.generate(args.seed, trace=args.trace)
    judge = Judge(prog, args.targets, tempfile.mkdtemp(prefix="k31shrink_"))
    t0 = time.time()
    small = shrink(prog, judge)
    before, after = (len(statements(s.splitlines(), *body_span(s.splitlines()))) for s in (prog.source, small))
    print(f"seed {args.seed} on {args.targets}: {before} -> {after} statements in {judge.tries} runs "
          f"({time.time() - t0:.0f} s)\n")
    print(small)
    if args.out:
        with open(args.out, "w") as f:
            f.write(small)
        if args.targets == "triton":       # and what the Triton target made of it, beside it
            from k31dsl.targets.triton.emit import detect_mode, emit
            kern, _ = F.load_kernel(dataclasses.replace(prog, source=small), judge.directory)
            with open(os.path.splitext(args.out)[0] + ".triton.py", "w") as f:
                f.write(emit(kern.ir(), mode=detect_mode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

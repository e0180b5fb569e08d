"""Dynamic instruction mix of ops' GPU code, from the PTX emulator (tests/ptxemu): each op runs its
oracle check with the library's Triton target emulated, and every kernel it launched reports its
warp-level issues per CTA by class. No GPU and no timing: a count of what the PTX asks for, to
compare forms of a kernel (an added instruction per element shows here as issues per CTA).

    env -u TRITON_INTERPRET python benchmarks/probes/ptx_profile.py topk mxfp8_quantize
    ... --op prmt.b32           # also the issues of one PTX op
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

CLASSES = [("global memory", ("ld.global", "st.global", "cp.async.ca", "cp.async.cg")),
           ("shared memory", ("ld.shared", "st.shared", "ldmatrix", "stmatrix")),
           ("tensor core", ("mma.", "wgmma.mma_async")),
           ("warp (shfl, vote, redux)", ("shfl", "vote", "redux")),
           ("barriers", ("bar.", "barrier.")),
           ("conversions", ("cvt",))]


def classify(op: str) -> str:
    for name, prefixes in CLASSES:
        if op.startswith(prefixes):
            return name
    return "other ALU / moves"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ops", nargs="+", help="registered op names (k31dsl.ops.registry)")
    ap.add_argument("--seed", type=int, default=1234, help="the oracle check's seed (default 1234)")
    ap.add_argument("--op", action="append", default=[], help="also report this PTX op's issues")
    args = ap.parse_args(argv)
    import ptxemu
    from ptxemu.launch import PROFILE
    ptxemu.emulate_triton_target(tempfile.mkdtemp())
    from k31dsl.ops.registry import all_ops
    ops = all_ops()
    names = [c for c, _ in CLASSES] + ["other ALU / moves"]
    print("| op | kernel | launches | CTAs | warp issues / CTA | "
          + " | ".join(names) + "".join(f" | {o}" for o in args.op) + " |")
    print("|---" * (5 + len(names) + len(args.op)) + "|")
    for name in args.ops:
        if name not in ops:
            print(f"unknown op {name!r}; registered: {', '.join(sorted(ops))}", file=sys.stderr)
            return 2
        PROFILE.clear()
        results = ops[name].check("triton", args.seed)
        status = "" if all(r.passed for r in results) else " (oracle check FAILED)"
        for kernel, st in PROFILE.items():
            ctas = max(st["ctas"], 1)
            by_class = {c: 0 for c in names}
            for op, n in st["issued"].items():
                by_class[classify(op)] += n
            total = sum(st["issued"].values())
            cells = [f"{by_class[c] / ctas:.0f}" for c in names] + [f"{st['issued'][o] / ctas:.0f}" for o in args.op]
            print(f"| {name}{status} | {kernel} | {st['launches']} | {st['ctas']} | {total / ctas:.0f} | "
                  + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

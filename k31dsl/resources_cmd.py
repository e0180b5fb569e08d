"""`k31dsl resources`: what a kernel costs on an NVIDIA GPU (registers, shared memory, programs
per SM, instructions, load widths), built on this machine as the GPU's JIT would build it for the
given argument shapes. The work is in targets/triton/resources.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from k31dsl.dsl.errors import K31Error

RESOURCES_HELP = """\
Build one kernel for an NVIDIA architecture (sm_90 by default) on this machine, no GPU needed,
exactly as Triton's JIT would build it for a call with the given argument shapes, and report per
config: registers, spills, shared memory, the programs one SM holds and what limits them, SASS
and tensor-core instruction counts, and the kernel's global loads by width. Without launch
options every config of the kernel's `configs` is built (what the GPU autotuner would time).
It also names the arguments whose row alignment the JIT cannot see (see k.aligned).

Arguments (one --arg per runtime parameter; tensors are shapes only, nothing is allocated):
  NAME=4096x328:bf16           a contiguous tensor
  NAME=64x128:f8e4m3:8448x128x1  a view with these element strides
  NAME=4096                    an integer (a float: NAME=0.5)

examples:
  k31dsl resources kernels.py::gather --arg x=4096x328:bf16 --arg idx=64:i32 --arg y=64x256:bf16
  k31dsl resources kernels.py::gather ... --constexpr C=256 --num-warps 4 --json
  k31dsl resources ops/dsa/sfa_two_pass.py::sfa_values --arg codes=2097152x656:f8e4m3 ...

Where a row says "registers" under `limit`, fewer registers (a smaller tile, or maxnreg) buy
more programs per SM; a "global loads" entry of 8b or 16b on rows of wider data usually means
Triton could not prove the alignment (see the blind-spot lines and k.aligned).
"""

COLUMNS = ("config", "offsets", "regs", "spill loads", "spill stores", "smem KB", "warps", "per SM", "limit",
           "SASS", "MMA", "global loads")


def add_parser(sub, fmt) -> None:
    p = sub.add_parser("resources", help="registers, shared memory and occupancy of a kernel on a GPU, from a CPU",
                       description=RESOURCES_HELP, formatter_class=fmt)
    p.add_argument("path", metavar="PATH::KERNEL", help="a .py file and the @k.kernel to build")
    p.add_argument("--arg", "-a", action="append", default=[], metavar="NAME=SPEC",
                   help="a runtime argument's shape and dtype, or a number (repeat for each)")
    p.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                   help="fix a constexpr (repeatable)")
    p.add_argument("--num-warps", type=int, metavar="N")
    p.add_argument("--num-stages", type=int, metavar="N")
    p.add_argument("--maxnreg", type=int, metavar="N", help="cap the registers per thread")
    p.add_argument("--arch", type=int, default=90, metavar="SM", help="80, 90 (default) or 100")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_resources)


def cmd_resources(args) -> int:
    from k31dsl.targets.triton.resources import interpreter_set
    if interpreter_set():
        return _without_interpreter(args.argv)
    from k31dsl.cli import _console
    from k31dsl.sources import _kernel_defs, import_path, parse_constexpr
    from k31dsl.targets.triton.resources import parse_arg, report
    path_text, _, selected = args.path.partition("::")
    path = Path(path_text)
    if path.suffix != ".py":
        raise K31Error(f"{path}: expected a Python file (.py) with @k.kernel functions")
    kdefs = _kernel_defs(import_path(path), path, selected or None)
    if len(kdefs) != 1:
        raise K31Error(f"{path} defines {len(kdefs)} kernels ({', '.join(d.name for d in kdefs)}); pick one "
                       f"with {path}::KERNEL")
    call = dict(parse_arg(a) for a in args.arg)
    fixed = dict(parse_constexpr(c) for c in args.constexpr)
    fixed.update({k: v for k, v in (("num_warps", args.num_warps), ("num_stages", args.num_stages),
                                    ("maxnreg", args.maxnreg)) if v is not None})
    import triton
    rows, spots = report(kdefs[0], call, fixed, args.arch)
    if args.json:
        print(json.dumps({"kernel": kdefs[0].name, "arch": args.arch, "triton": triton.__version__, "rows": rows,
                          "blind_spots": spots}, indent=1))
        return 1 if all("error" in r for r in rows) else 0
    from rich.table import Table
    console = _console()
    table = Table(title=f"{kdefs[0].name} on sm_{args.arch}")
    cols = [c for c in COLUMNS if any(c in r for r in rows)] + (["error"] if any("error" in r for r in rows) else [])
    for c in cols:
        table.add_column(c, justify="left" if c in ("config", "limit", "global loads", "error", "offsets") else "right")
    for r in rows:
        table.add_row(*(str(r.get(c, "")) for c in cols))
    console.print(table)
    for line in spots:
        console.print(f"blind spot: {line}", highlight=False)
    console.print(f"built by Triton {triton.__version__} (a GPU running another Triton version may build "
                  "other code)", highlight=False)
    return 1 if all("error" in r for r in rows) else 0


def _without_interpreter(argv: list[str]) -> int:
    """Run this command again in a process without TRITON_INTERPRET: Triton's real compiler cannot
    share a process with the interpreter (its library functions are then interpreted ones)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "k31dsl", *argv], env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode

"""The `k31dsl` command line: compile kernels to a target, explain graph programs, the compile
cache, the version. Commands with their own modules: `ops`, `check` and `selftest` (the op
library, library_cmd.py), `run` (run_cmd.py), `resources` (resources_cmd.py); each has an
`add_parser(sub, fmt)` that build_parser calls. `main(argv)` returns the exit code (0 ok, 1 a user error or a failed check,
2 a bad command line or a target that is not built yet, 3 an internal compiler error)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from k31dsl.dsl.errors import K31Error
from k31dsl.sources import load_kernels, parse_constexpr
from k31dsl.version import __version__

TARGETS = ("numpy", "triton", "ascendc")
TARGET_TITLES = {"numpy": "NumPy", "triton": "Triton", "ascendc": "AscendC"}
NOT_BUILT_ISSUE = {"ascendc": "issue 3"}


class TargetNotBuilt(Exception):
    """The target's runtime module does not exist yet (exit code 2)."""


# ---------------------------------------------------------------- terminal output

def _console(stderr: bool = False):
    from rich.console import Console
    stream = sys.stderr if stderr else sys.stdout
    # Off a terminal (CI logs, pipes) keep lines long rather than wrapping tables at 80 columns.
    width = None if stream.isatty() else 160
    return Console(file=stream, width=width, highlight=False, soft_wrap=stderr)


def _print_error(message: str) -> None:
    from rich.markup import escape
    _console(stderr=True).print(f"[bold red]error:[/] {escape(message)}")


# ---------------------------------------------------------------- targets

def require_target(target: str) -> None:
    if target not in TARGETS:
        raise K31Error(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    try:
        found = importlib.util.find_spec(f"k31dsl.targets.{target}.runtime") is not None
    except ImportError:
        found = False
    if not found:
        issue = f" ({NOT_BUILT_ISSUE[target]})" if target in NOT_BUILT_ISSUE else ""
        raise TargetNotBuilt(f"the {TARGET_TITLES[target]} target is not built yet{issue}")
    if target == "triton" and "triton" not in sys.modules:
        # Without a GPU the generated Triton runs in the interpreter, chosen before the import.
        try:
            import torch
            if not torch.cuda.is_available():
                os.environ.setdefault("TRITON_INTERPRET", "1")
        except ImportError:
            pass


# ---------------------------------------------------------------- compile

def _write_files(files: dict[str, str], out_dir: Path) -> None:
    """All files appear together: written to a temp folder beside them, then moved in."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".k31-tmp-"))
    try:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
        for name in files:
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


LEXERS = {".py": "python", ".cpp": "cpp", ".h": "cpp", ".cc": "cpp", ".hpp": "cpp", ".txt": "text"}


def _show(title: str, text: str, suffix: str) -> None:
    if sys.stdout.isatty():
        from rich.rule import Rule
        from rich.syntax import Syntax
        console = _console()
        console.print(Rule(title))
        console.print(Syntax(text, LEXERS.get(suffix, "text"), theme="ansi_dark", word_wrap=False))
    else:
        sys.stdout.write(f"# ===== {title} =====\n{text}")
        if not text.endswith("\n"):
            sys.stdout.write("\n")


def cmd_compile(args) -> int:
    from k31dsl.dsl.text import print_kernel
    from k31dsl.lowering.pipeline import pass_names, run_pipeline
    from k31dsl.targets import emit_source

    require_target(args.target)
    if args.dump_after is not None and args.dump_after not in pass_names(args.target):
        from k31dsl.lowering.graph.pipeline import PASSES
        graph = (f" (`{args.dump_after}` is a graph pass: `k31dsl explain PROGRAMS.py --target {args.target} "
                 f"--dump-after {args.dump_after}`)" if args.dump_after in PASSES else "")
        raise K31Error(f"--dump-after {args.dump_after}: no such pass for target {args.target}; "
                       f"the passes are: {', '.join(pass_names(args.target))}{graph}")
    constexprs = dict(parse_constexpr(c) for c in args.constexpr)
    kernels = load_kernels(args.path, constexprs)

    files: dict[str, str] = {}
    dumps: list[tuple[str, str]] = []
    for kernel in kernels:
        def after(name, k, kname=kernel.name):
            if name == args.dump_after:
                dumps.append((f"IR of `{kname}` after pass `{name}`", print_kernel(k)))
        kernel = run_pipeline(kernel, args.target, after)
        generated = dict(emit_source(kernel, args.target))
        generated[f"{kernel.name}.k31"] = print_kernel(kernel)
        for name, text in generated.items():
            if name in files and files[name] != text:     # shared files (ascendc helpers, CMake) are identical
                raise K31Error(f"two kernels would both write {name}; select one with PATH::KERNEL")
            files[name] = text

    for title, text in dumps:
        _show(title, text, ".k31")
    if args.print:
        for name, text in files.items():
            _show(name, text, Path(name).suffix)
    out_dir = args.output
    if out_dir is None and not args.print and args.dump_after is None:
        out_dir = "out"
    if out_dir is not None:
        _write_files(files, Path(out_dir))
        where = os.path.join(os.path.normpath(out_dir), "")
        names = f": {', '.join(files)}" if len(files) <= 6 else ""
        _console(stderr=True).print(f"wrote {len(files)} files to {where}{names}")
    return 0


# ---------------------------------------------------------------- graph programs and the cache

def cmd_explain(args) -> int:
    from k31dsl.lowering.graph.explain import draw, draw_memory, explain, load_programs
    require_target(args.target)
    programs = load_programs(args.path)
    for i, prog in enumerate(programs):
        texts, final = explain(prog, args.target, args.dump_after, args.kernels)
        for title, text in texts:
            _show(title, text, ".txt")
        if args.target == "ascendc" and args.dump_after is None:
            from k31dsl.targets.ascendc.program import host_files
            for fname, text in host_files(final).items():
                _show(f"program `{prog.name}`: {fname}", text, ".cpp")
        for target_file, drawer in ((args.png, draw), (args.memory_png, draw_memory)):
            if target_file:
                png = Path(target_file)
                if len(programs) > 1:
                    png = png.with_name(f"{png.stem}_{prog.name}{png.suffix or '.png'}")
                drawer(final, str(png))
                _console(stderr=True).print(f"wrote {png}")
    return 0


def cmd_cache(args) -> int:
    from k31dsl.lowering.cache import default_cache
    cache = default_cache()
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} entries from {cache.root}")
        return 0
    info = cache.info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"cache: {info['root']} (k31dsl {info['version']})")
    print(f"entries: {info['entries']}, {info['bytes']} bytes")
    for kind, k in sorted(info["kinds"].items()):
        print(f"  {kind}: {k['entries']} entries, {k['bytes']} bytes")
    return 0


# ---------------------------------------------------------------- version

def cmd_version(args) -> int:
    from importlib import metadata
    print(f"k31dsl {__version__}")
    if args.verbose:
        print(f"python {sys.version.split()[0]}")
        for dist in ("numpy", "ml_dtypes", "torch", "triton", "lark", "jinja2", "networkx", "rich"):
            try:
                print(f"{dist} {metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                print(f"{dist} (not installed)")
        for t in TARGETS:
            state = "available" if importlib.util.find_spec(f"k31dsl.targets.{t}.runtime") else "not built yet"
            print(f"target {t}: {state}")
    return 0


# ---------------------------------------------------------------- argument parsing

MAIN_HELP = """\
k31dsl compiles kernels written in a small Python-embedded DSL to NumPy (the reference),
Triton (GPU, or its interpreter on CPU) and AscendC, and checks its op library against
fp64 oracles.

examples:
  k31dsl compile my_kernels.py --target numpy -o out/      write generated code + .k31 IR
  k31dsl compile my_kernels.py::rms --target triton --print
  k31dsl ops                                             list the op library
  k31dsl check --target numpy                            check every op against its oracle
  k31dsl check mxfp8_quantize --target triton --seed 3
  k31dsl selftest                                        compile + check everything, every target
  k31dsl explain step.py --target triton                 a graph program after each pass
  k31dsl resources kern.py::k --arg x=4096x328:bf16 ...  registers and occupancy on sm_90, from a CPU
  k31dsl cache info                                      the compile cache
  k31dsl run --prompt "Hello"                            generate text with the tiny K31 model

`k31dsl COMMAND --help` explains each command."""

COMPILE_HELP = """\
Compile the @k.kernel functions of a Python file (or the kernels of a .k31 IR file) for one
target. Writes each kernel's generated source and its .k31 IR text into DIR; nothing is
written if any kernel fails to compile.

examples:
  k31dsl compile kernels.py --target numpy -o build/          every kernel in kernels.py
  k31dsl compile kernels.py::rms_quant --target triton --print  one kernel, shown on screen
  k31dsl compile kernels.py::rms_quant --target numpy --constexpr BD=64 -o build/
  k31dsl compile ops/quant.py::mxfp8_quantize_rows --target triton --constexpr XT=f16 --print
                                                              a dtype constexpr: f16 input, not bf16
  k31dsl compile build/rms_quant.k31 --target numpy --print   from the text IR
  k31dsl compile kernels.py --target numpy --dump-after verify  IR after a pass
  k31dsl compile ops/ --target triton -o build/ops           the whole op library"""

EXPLAIN_HELP = """\
Show a graph program (kernel calls, host ops and tensors; lowering/graph) after each graph pass
of the target's pipeline: superkernel fusion and launch groups, NZ weights, streams and events,
the memory plan, with each pass's report (what it fused, why it refused) as `#` lines.

A Python file defines programs as module-level Program objects, or as functions without
parameters returning one, decorated with @program:

    import k31dsl as k
    from k31dsl.lowering.graph import Program, program

    @program
    def step():
        p = Program("step")
        x = p.input("x", (8, 64), k.f32)
        ...                              # p.call(kernel, args..., CONSTEXPR=...)
        return p

examples:
  k31dsl explain step.py --target numpy                   every program, after every pass
  k31dsl explain step.py::step --target triton --dump-after superkernel
  k31dsl explain step.py --target ascendc --png step.png  also draw it (streams, fused groups coloured)
  k31dsl explain step.py --target triton --memory-png m.png  draw the memory plan (lifetimes x arena bytes)
  k31dsl explain step.py --target numpy --kernels         also print fused kernels' IR"""

CACHE_HELP = """\
The compile cache holds generated modules and builds keyed by a hash of IR text, target, options
and the k31dsl version ($K31_CACHE_DIR, default ~/.cache/k31dsl). Damaged entries are rebuilt.

examples:
  k31dsl cache info
  k31dsl cache info --json
  k31dsl cache clear"""


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="k31dsl", description=MAIN_HELP, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"k31dsl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("compile", help="compile kernels to a target", description=COMPILE_HELP,
                       formatter_class=fmt)
    p.add_argument("path", metavar="PATH[::KERNEL]",
                   help="a .py file with @k.kernel functions, a .k31 file or a folder of .py files; "
                        "::KERNEL picks one kernel")
    p.add_argument("--target", "-t", required=True, choices=TARGETS)
    p.add_argument("-o", "--output", metavar="DIR",
                   help="folder for the generated files (default: out/ unless --print or --dump-after)")
    p.add_argument("--print", action="store_true", help="print the generated files")
    p.add_argument("--dump-after", metavar="PASS",
                   help="print the IR after the named pass (see the error for the list)")
    p.add_argument("--constexpr", metavar="NAME=VALUE", action="append", default=[],
                   help="specialise a constexpr parameter (repeatable); VALUE is a number, true/false, "
                        "a string or a dtype name such as bf16")
    p.set_defaults(func=cmd_compile)

    from k31dsl import library_cmd, resources_cmd, run_cmd      # commands with their own modules
    library_cmd.add_parser(sub, fmt)       # ops, check, selftest: listed right after compile

    p = sub.add_parser("explain", help="show a graph program after each pass", description=EXPLAIN_HELP,
                       formatter_class=fmt)
    p.add_argument("path", metavar="PATH[::PROGRAM]", help="a .py file defining programs; ::PROGRAM picks one")
    p.add_argument("--target", "-t", required=True, choices=TARGETS)
    p.add_argument("--dump-after", metavar="PASS", help="only the graph after this pass")
    p.add_argument("--png", metavar="FILE", help="draw the final graph (or the --dump-after one) to FILE")
    p.add_argument("--memory-png", metavar="FILE",
                   help="draw the memory plan to FILE: each intermediate's lifetime over its arena bytes")
    p.add_argument("--kernels", action="store_true", help="also print the IR of fused kernels")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("cache", help="inspect or clear the compile cache", description=CACHE_HELP,
                       formatter_class=fmt)
    p.add_argument("action", choices=("info", "clear"))
    p.add_argument("--json", action="store_true", help="info as JSON")
    p.set_defaults(func=cmd_cache)

    run_cmd.add_parser(sub, fmt)
    resources_cmd.add_parser(sub, fmt)

    p = sub.add_parser("version", help="print the version", description="Print k31dsl's version.")
    p.add_argument("--verbose", "-v", action="store_true", help="also dependencies and targets")
    p.set_defaults(func=cmd_version)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)     # a command may re-run itself
    except SystemExit as e:          # --help, --version, usage errors
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except K31Error as e:
        _print_error(str(e))
        return 1
    except TargetNotBuilt as e:
        _print_error(str(e))
        return 2
    except KeyboardInterrupt:
        _print_error("interrupted")
        return 130
    except Exception:  # noqa: BLE001 - a compiler bug: say so, with the traceback to report
        _print_error("internal compiler error (a bug in k31dsl, not in your kernel); please report:")
        traceback.print_exc()
        return 3


if __name__ == "__main__":
    raise SystemExit(main())

"""The `k31dsl` command line: compile kernels to a target, list the op library, check every op
against its oracle. `main(argv)` returns the exit code (0 ok, 1 a user error or a failed check,
2 a bad command line or a target that is not built yet, 3 an internal compiler error)."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from k31dsl.dsl.errors import CapacityError, K31Error
from k31dsl.sources import import_path, load_kernels, parse_constexpr
from k31dsl.version import __version__

TARGETS = ("numpy", "triton", "ascendc")
TARGET_TITLES = {"numpy": "NumPy", "triton": "Triton", "ascendc": "AscendC"}
NOT_BUILT_ISSUE = {"ascendc": "issue 3"}
EXTRA_OPS_ENV = "K31_EXTRA_OPS"


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


# ---------------------------------------------------------------- op library

def load_extra_ops(extras: list[str]) -> None:
    """Import modules that register more OpSpecs: `--extra MODULE` (dotted name or .py path) and
    the comma-separated K31_EXTRA_OPS environment variable."""
    names = [e for e in os.environ.get(EXTRA_OPS_ENV, "").split(",") if e.strip()] + list(extras)
    for name in names:
        name = name.strip()
        if name.endswith(".py"):
            import_path(Path(name))
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise K31Error(f"--extra {name}: cannot import it ({e})",
                           hint="give a module importable from here or a path to a .py file") from None


def _all_ops(extras: list[str]) -> dict:
    from k31dsl.ops.registry import all_ops
    load_extra_ops(extras)
    return all_ops()


def cmd_ops(args) -> int:
    ops = _all_ops(args.extra)
    rows = [{"name": s.name, "module": s.module, "summary": s.summary,
             "kernels": [getattr(k, "name", str(k)) for k in s.kernels], "exact": bool(s.exact)}
            for s in sorted(ops.values(), key=lambda s: (s.module, s.name))]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table
    table = Table(title=f"k31dsl op library ({len(rows)} ops)")
    for col in ("op", "module", "summary", "kernels", "exact?"):
        table.add_column(col, overflow="fold")
    for r in rows:
        kernels = r["kernels"]
        shown = ", ".join(kernels) if len(kernels) <= 3 else f"{kernels[0]}, … ({len(kernels)} kernels)"
        table.add_row(r["name"], r["module"], r["summary"], shown,
                      "bit-exact" if r["exact"] else "tolerance")
    _console().print(table)
    return 0


def _run_check(spec, target: str, seed: int) -> list[dict]:
    try:
        results = spec.check(target, seed)
        if not results:
            raise RuntimeError("its check returned no cases")
        return [{"op": spec.name, "case": r.case, "max_err": float(r.max_err), "tol": float(r.tol),
                 "passed": bool(r.passed), "detail": r.detail} for r in results]
    except Exception as e:  # noqa: BLE001 - a crashing check is a failed check, reported as such
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        return [{"op": spec.name, "case": "(check raised)", "max_err": float("nan"),
                 "tol": float("nan"), "passed": False, "detail": f"{type(e).__name__}: {e}{at}"}]


def _quiet_interpreter() -> None:
    """The Triton interpreter computes masked-off lanes too and NumPy warns about their garbage;
    those warnings say nothing about the results, which the checks compare."""
    import warnings
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


def _with_progress(items: list, label, work, enabled: bool) -> list:
    """Run work(item) for each item, with a progress bar on a terminal; concatenates the results."""
    rows: list = []
    if not enabled:
        for item in items:
            rows += work(item)
        return rows
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=_console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=len(items))
        for item in items:
            bar.update(task, description=label(item))
            rows += work(item)
            bar.advance(task)
    return rows


def _check_rows(ops: dict, names: list[str], target: str, seed: int, progress: bool) -> list[dict]:
    _quiet_interpreter()
    return _with_progress(names, lambda n: f"{target}: {n}",
                          lambda n: _run_check(ops[n], target, seed), progress)


def _results_table(title: str, rows: list[dict]):
    from rich.markup import escape
    from rich.table import Table
    table = Table(title=title)
    for col, just in (("op", "left"), ("case", "left"), ("max error", "right"),
                      ("tolerance", "right"), ("result", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for r in rows:
        status = "[green]pass[/]" if r["passed"] else f"[bold red]FAIL[/] {escape(r['detail'])}".rstrip()
        table.add_row(escape(r["op"]), escape(r["case"]), f"{r['max_err']:.3g}", f"{r['tol']:.3g}", status)
    return table


def cmd_check(args) -> int:
    require_target(args.target)
    ops = _all_ops(args.extra)
    names = args.ops or sorted(ops)
    unknown = [n for n in names if n not in ops]
    if unknown:
        raise K31Error(f"unknown op{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                       f"the ops are: {', '.join(sorted(ops))}")
    rows = _check_rows(ops, names, args.target, args.seed, sys.stderr.isatty() and not args.json)
    failed = [r for r in rows if not r["passed"]]
    if args.json:
        print(json.dumps({"target": args.target, "seed": args.seed, "results": rows,
                          "passed": not failed}, indent=2))
        return 1 if failed else 0
    console = _console()
    console.print(_results_table(f"k31dsl check --target {args.target} --seed {args.seed}", rows))
    verdict = "[green]all passed[/]" if not failed else f"[bold red]{len(failed)} failed[/]"
    console.print(f"{len(names)} ops, {len(rows)} cases on {args.target}: {verdict}")
    return 1 if failed else 0


# ---------------------------------------------------------------- selftest

def _compile_library(ops: dict, target: str, progress: bool) -> tuple[dict[str, str], list[dict]]:
    """Every kernel the ops launch, through the pipeline and the emitter: (files, failures)."""
    from k31dsl.dsl.text import print_kernel
    from k31dsl.lowering.pipeline import run_pipeline
    from k31dsl.targets import emit_source
    kdefs = list({id(kd): kd for spec in ops.values() for kd in spec.kernels}.values())
    files: dict[str, str] = {}

    def one(kd):
        try:
            kernel = run_pipeline(kd.ir(), target)
            files.update(emit_source(kernel, target))
            files[f"{kernel.name}.k31"] = print_kernel(kernel)
            return []
        except CapacityError as e:    # too large at the default sizes; the checks run smaller ones
            return [{"kernel": kd.name, "error": e.message.splitlines()[0].split(" Largest live tiles")[0],
                     "capacity": True}]
        except Exception as e:  # noqa: BLE001 - reported per kernel, the run goes on
            return [{"kernel": kd.name, "error": f"{type(e).__name__}: {e}"}]
    failures = _with_progress(kdefs, lambda kd: f"{target}: compile {kd.name}", one, progress)
    return files, failures


def cmd_selftest(args) -> int:
    targets = args.target or [t for t in TARGETS
                              if importlib.util.find_spec(f"k31dsl.targets.{t}.runtime") is not None]
    for t in targets:
        require_target(t)
    ops = _all_ops(args.extra)
    progress = sys.stderr.isatty()
    n_kernels = len({id(kd) for spec in ops.values() for kd in spec.kernels})
    summary, bad_rows, compile_failures, capacity_notes = [], [], [], []
    for target in targets:
        files, failures = _compile_library(ops, target, progress)
        if args.output:
            _write_files(files, Path(args.output) / target)
        rows = _check_rows(ops, sorted(ops), target, args.seed, progress)
        failed = [r for r in rows if not r["passed"]]
        too_big = [f for f in failures if f.get("capacity")]
        summary.append((target, n_kernels - len(failures), n_kernels, len(too_big), len(rows) - len(failed), len(rows)))
        capacity_notes += [(target, f) for f in too_big]
        compile_failures += [(target, f) for f in failures if not f.get("capacity")]
        bad_rows += [dict(r, op=f"{target}: {r['op']}") for r in failed]

    from rich.markup import escape
    from rich.table import Table
    console = _console()
    table = Table(title=f"k31dsl selftest: {len(ops)} ops, seed {args.seed}")
    for col in ("target", "kernels compiled", "cases passed"):
        table.add_column(col, justify="left" if col == "target" else "right")
    for target, ok_k, all_k, big_k, ok_c, all_c in summary:
        good = ok_k + big_k == all_k and ok_c == all_c
        mark = "[green]" if good else "[bold red]"
        big = f" [yellow](+{big_k} too large at default sizes)[/]" if big_k else ""
        table.add_row(target, f"{mark}{ok_k}/{all_k}[/]{big}", f"{mark}{ok_c}/{all_c}[/]")
    console.print(table)
    for target, f in capacity_notes:
        console.print(f"[yellow]too large at its default constexprs[/] for {target}: {f['kernel']}: "
                      f"{escape(f['error'])} (the op's checks run it at smaller sizes; `k31dsl compile "
                      f"--constexpr` picks smaller tiles)")
    for target, f in compile_failures:
        console.print(f"[bold red]compile failed[/] {target}: {f['kernel']}: {escape(f['error'])}")
    if bad_rows:
        console.print(_results_table("failed cases", bad_rows))
    if args.output:
        console.print(f"generated code in {os.path.join(os.path.normpath(args.output), '')}<target>/")
    ok = not bad_rows and not compile_failures
    console.print("[green]selftest passed[/]" if ok else "[bold red]selftest FAILED[/]")
    return 0 if ok else 1


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

CHECK_HELP = """\
Run each op's equivalence check on a target: fresh random inputs (seeded), ragged shapes,
compared with an fp64 NumPy oracle under a per-dtype tolerance (bit-exact for quantizer codes).
Exits 1 if any case fails.

examples:
  k31dsl check --target numpy                     all ops
  k31dsl check rmsnorm swiglu --target triton     some ops (Triton interpreter without a GPU)
  k31dsl check --target numpy --seed 7 --json     machine-readable results
  k31dsl check --target numpy --extra my_ops.py   also check ops registered by my_ops.py"""

SELFTEST_HELP = """\
The main job in one command: compile every kernel of the op library for each target that is
built (numpy, triton — in its interpreter without a GPU — and ascendc once it lands), then check
every op on each against its fp64 oracle. Exits 1 on any compile error or failed case.

examples:
  k31dsl selftest
  k31dsl selftest --target numpy -o out/      keep the generated code in out/numpy/
  k31dsl selftest --seed 5"""

OPS_HELP = """\
List the op library: each op's name, module, summary, the kernels it launches and whether
its check is bit-exact.

examples:
  k31dsl ops
  k31dsl ops --json"""


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

    p = sub.add_parser("ops", help="list the op library", description=OPS_HELP, formatter_class=fmt)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--extra", metavar="MODULE", action="append", default=[],
                   help=f"import a module (or .py file) registering more ops; also ${EXTRA_OPS_ENV}")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("check", help="check ops against their oracles", description=CHECK_HELP,
                       formatter_class=fmt)
    p.add_argument("ops", nargs="*", metavar="OP", help="op names (default: all)")
    p.add_argument("--target", "-t", required=True, choices=TARGETS)
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON results instead of a table")
    p.add_argument("--extra", metavar="MODULE", action="append", default=[],
                   help=f"import a module (or .py file) registering more ops; also ${EXTRA_OPS_ENV}")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("selftest", help="compile the op library for every target and check it",
                       description=SELFTEST_HELP, formatter_class=fmt)
    p.add_argument("--target", "-t", action="append", choices=TARGETS,
                   help="a target to test (repeatable; default: every target that is built)")
    p.add_argument("-o", "--output", metavar="DIR", help="also write the generated code to DIR/<target>/")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    p.add_argument("--extra", metavar="MODULE", action="append", default=[],
                   help=f"import a module (or .py file) registering more ops; also ${EXTRA_OPS_ENV}")
    p.set_defaults(func=cmd_selftest)

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

    from k31dsl import resources_cmd, run_cmd      # commands with their own modules
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

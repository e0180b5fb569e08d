"""The op-library commands of the `k31dsl` command line: `ops` lists the registered ops, `check`
runs their equivalence checks against the fp64 oracles on one target, `selftest` compiles every
kernel of the library for each built target and checks every op there. The ops themselves live
in ops/ (ops/registry.py); modules named by --extra or $K31_EXTRA_OPS register more.
cli.build_parser calls `add_parser(sub, fmt)`."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

from k31dsl.cli import TARGETS, _console, _write_files, require_target
from k31dsl.dsl.errors import CapacityError, K31Error
from k31dsl.sources import import_path

EXTRA_OPS_ENV = "K31_EXTRA_OPS"

OPS_HELP = """\
List the op library: each op's name, module, summary, the kernels it launches and whether
its check is bit-exact.

examples:
  k31dsl ops
  k31dsl ops --json"""


CHECK_HELP = """\
Run each op's equivalence check on a target: fresh random inputs (seeded), ragged shapes,
compared with an fp64 NumPy oracle under a per-dtype tolerance (bit-exact for quantizer codes).
Exits 1 if any case fails. Progress goes to stderr: a bar on a terminal, else one line per op.
On a GPU machine `--target triton` runs Triton's real compiler, which the interpreter does not.

examples:
  k31dsl check --target numpy                     all ops
  k31dsl check rmsnorm swiglu --target triton     some ops (Triton interpreter without a GPU)
  k31dsl check --target numpy --seed 7 --json     machine-readable results
  k31dsl check --target numpy --extra my_ops.py   also check ops registered by my_ops.py
  k31dsl check --target numpy --config 4          every kernel in its config number 4
  k31dsl check short_conv --target numpy --config all    each config number in turn (OP@N rows)

A kernel with several configs runs its first one off the GPU, while a GPU's tuner may pick any:
--config N (or K31_CONFIG=N) runs config N mod the number each call leaves open, everywhere and
without tuning, so a tile size that is wrong only in some config shows up on the CPU (a config the
target cannot build, such as a tile beyond AscendC's Unified Buffer, gives way to the next one, as a
GPU tuner skips configs that do not compile). --config all
runs N = 0, 1, ... in one child process each (a kernel reads the switch once per call shape), on
the ops whose kernels have more than N configs."""


SELFTEST_HELP = """\
The main job in one command: compile every kernel of the op library for each target that is
built (numpy, triton — in its interpreter without a GPU — and ascendc once it lands), then check
every op on each against its fp64 oracle. Exits 1 on any compile error or failed case.

examples:
  k31dsl selftest
  k31dsl selftest --target numpy -o out/      keep the generated code in out/numpy/
  k31dsl selftest --seed 5"""


def _add_extra(p) -> None:
    p.add_argument("--extra", metavar="MODULE", action="append", default=[],
                   help=f"import a module (or .py file) registering more ops; also ${EXTRA_OPS_ENV}")


def _config_number(text: str) -> int | str:
    import argparse
    if text == "all":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a config number (an int >= 0) or 'all', got {text!r}")
    return int(text)


def add_parser(sub, fmt) -> None:
    """The `ops`, `check` and `selftest` subcommands, in that order (the order `k31dsl --help` lists)."""
    p = sub.add_parser("ops", help="list the op library", description=OPS_HELP, formatter_class=fmt)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_extra(p)
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("check", help="check ops against their oracles", description=CHECK_HELP,
                       formatter_class=fmt)
    p.add_argument("ops", nargs="*", metavar="OP", help="op names (default: all)")
    p.add_argument("--target", "-t", required=True, choices=TARGETS)
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON results instead of a table")
    p.add_argument("--config", type=_config_number, metavar="N|all",
                   help="run each kernel in its config number N (mod its count) instead of the first or the "
                   "tuned; all: every number in turn")
    _add_extra(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("selftest", help="compile the op library for every target and check it",
                       description=SELFTEST_HELP, formatter_class=fmt)
    p.add_argument("--target", "-t", action="append", choices=TARGETS,
                   help="a target to test (repeatable; default: every target that is built)")
    p.add_argument("-o", "--output", metavar="DIR", help="also write the generated code to DIR/<target>/")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    _add_extra(p)
    p.set_defaults(func=cmd_selftest)


# ---------------------------------------------------------------- ops, check

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


def _with_progress(items: list, label, work, enabled: bool, summary=None) -> list:
    """Run work(item) for each item, with a progress bar on a terminal; concatenates the results.
    Without one (a log file, a CI job) and given `summary(results) -> str`, one line per item goes
    to stderr as it finishes, so a long run shows where it is (a GPU check compiles for minutes)."""
    rows: list = []
    if not enabled:
        for i, item in enumerate(items, 1):
            t0 = time.perf_counter()
            got = work(item)
            rows += got
            if summary is not None:
                print(f"[{i}/{len(items)}] {label(item)}: {summary(got)} ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
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
    def summary(rows: list[dict]) -> str:
        failed = sum(not r["passed"] for r in rows)
        return f"{len(rows)} cases, " + (f"{failed} FAILED" if failed else "all passed")
    return _with_progress(names, lambda n: f"{target}: {n}",
                          lambda n: _run_check(ops[n], target, seed), progress, summary)


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


def _check_every_config(args, ops: dict, names: list[str], progress: bool) -> list[dict]:
    """--config all: `check --config N --json` in a child process per N (a kernel reads the switch
    once per call shape, so a number cannot change within a process), N = 0 .. the largest config
    count - 1, each on the ops whose kernels have more than N configs (all of them at N = 0);
    rows named OP@N."""
    import subprocess
    counts = {n: ops[n].config_count for n in names}

    def one(n: int) -> list[dict]:
        todo = [op for op in names if counts[op] > n]
        cmd = [sys.executable, "-m", "k31dsl", "check", *todo, "--target", args.target, "--seed", str(args.seed),
               "--config", str(n), "--json", *(f"--extra={e}" for e in args.extra)]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "K31_CONFIG": ""})
        try:
            rows = json.loads(r.stdout)["results"]
        except (ValueError, KeyError):
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            rows = [{"op": op, "case": "(check raised)", "max_err": float("nan"), "tol": float("nan"),
                     "passed": False, "detail": f"config {n}: {tail}"} for op in todo]
        return [{**row, "op": f"{row['op']}@{n}"} for row in rows]

    def summary(rows: list[dict]) -> str:
        failed = sum(not r["passed"] for r in rows)
        return f"{len(rows)} cases, " + (f"{failed} FAILED" if failed else "all passed")
    return _with_progress(list(range(max(counts.values()))), lambda n: f"{args.target}: config {n}", one,
                          progress, summary)


def cmd_check(args) -> int:
    if not isinstance(args.config, int):
        return _check(args)
    before = os.environ.get("K31_CONFIG")
    os.environ["K31_CONFIG"] = str(args.config)         # before any kernel runs (targets/common.py)
    try:
        return _check(args)
    finally:                                             # a caller of main() in-process keeps its own
        if before is None:
            del os.environ["K31_CONFIG"]
        else:
            os.environ["K31_CONFIG"] = before


def _check(args) -> int:
    require_target(args.target)
    ops = _all_ops(args.extra)
    names = args.ops or sorted(ops)
    unknown = [n for n in names if n not in ops]
    if unknown:
        raise K31Error(f"unknown op{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                       f"the ops are: {', '.join(sorted(ops))}")
    progress = sys.stderr.isatty() and not args.json
    rows = (_check_every_config(args, ops, names, progress) if args.config == "all"
            else _check_rows(ops, names, args.target, args.seed, progress))
    failed = [r for r in rows if not r["passed"]]
    if args.json:
        print(json.dumps({"target": args.target, "seed": args.seed, "results": rows,
                          "passed": not failed}, indent=2))
        return 1 if failed else 0
    console = _console()
    forced = "" if args.config is None else f" --config {args.config}"
    console.print(_results_table(f"k31dsl check --target {args.target} --seed {args.seed}{forced}", rows))
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

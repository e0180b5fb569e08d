"""Every op's equivalence check on a real GPU: `k31dsl check OP --target triton` with Triton's own
compiler (CI runs the same checks in the interpreter, which does not run Triton's optimisation
passes). One process per op, several at once (compilation is CPU-bound; each process has its
own cache folders), then results/gpu_check.json and .md: per op its cases, failures, worst
error / tolerance and wall time; the failed cases in full.

    python benchmarks/gpu_check.py [--jobs 14] [--timeout 420] [--seed 0] [--config N|A-B] [OP ...]
    python benchmarks/gpu_check.py --collect DIR      # tabulate DIR/<op>.json from an earlier run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402


def run_one(job: str, out: Path, seed: int, timeout: int) -> float:
    """`k31dsl check OP --json` in its own process -> out/<job>.json (stderr beside it); wall s.
    A job is an op name, or OP@N: every kernel in its config N instead of the tuner's pick
    (`k31dsl check --config N`), with seed + N."""
    op, _, config = job.partition("@")
    scratch = Path(tempfile.mkdtemp(prefix=f"k31check_{op}_"))
    env = dict(os.environ, TRITON_INTERPRET="0", K31_CACHE_DIR=str(scratch / "k31"),
               TRITON_CACHE_DIR=str(scratch / "triton"))
    forced = ["--config", config, "--seed", str(seed + int(config))] if config else ["--seed", str(seed)]
    t0 = time.time()
    with open(out / f"{job}.json", "w") as fo, open(out / f"{job}.err", "w") as fe:
        try:
            subprocess.run([sys.executable, "-m", "k31dsl.cli", "check", op, "--target", "triton", "--json",
                            *forced], stdout=fo, stderr=fe, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            fe.write(f"\ntimed out after {timeout} s\n")
    return time.time() - t0


def config_range(text: str) -> range:
    """--config N or A-B (inclusive)."""
    first, _, last = text.partition("-")
    if not first.isdigit() or (last and not last.isdigit()):
        raise argparse.ArgumentTypeError(f"expected N or A-B (config numbers), got {text!r}")
    return range(int(first), int(last or first) + 1)


def jobs_for(ops: list[str], configs: range | None) -> list[str]:
    """The op names, or OP@N for each forced config N that the op's kernels have (an op with at
    most N configs would only repeat config N mod its count, unless N is the range's only one)."""
    if configs is None:
        return ops
    from k31dsl.ops.registry import all_ops
    specs = all_ops()
    return [f"{op}@{n}" for n in configs for op in ops if len(configs) == 1 or specs[op].config_count > n]


def collect(folder: Path, ops: list[str], seconds: dict) -> tuple[list[dict], list[dict]]:
    rows, failed = [], []
    for op in ops:
        try:
            cases = json.loads((folder / f"{op}.json").read_text())["results"]
        except (OSError, ValueError, KeyError):
            err = (folder / f"{op}.err")
            tail = err.read_text().strip().splitlines()[-1:] if err.exists() else ["no output"]
            rows.append({"op": op, "cases": 0, "failed": "no result", "worst err / tol": "",
                         "s": seconds.get(op, ""), "note": tail[0][:120] if tail else ""})
            continue
        bad = [c for c in cases if not c["passed"]]
        ratios = [c["max_err"] / c["tol"] for c in cases if c["tol"] > 0]
        rows.append({"op": op, "cases": len(cases), "failed": len(bad),
                     "worst err / tol": max(ratios) if ratios else 0.0, "s": seconds.get(op, ""), "note": ""})
        failed += [{"op": op, "case": c["case"], "max_err": c["max_err"], "tol": c["tol"]} for c in bad]
    return rows, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ops", nargs="*", help="op names (default: the whole library)")
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--timeout", type=int, default=420, help="seconds per op (linear alone took 225 s on an H200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", type=config_range, metavar="N|A-B",
                    help="force config N of every kernel (no tuning; seed + N): finds bugs that only one "
                    "config has. A range A-B runs each N on the ops whose kernels have more than N configs")
    ap.add_argument("--collect", type=Path, help="only tabulate the <op>.json files of an earlier run")
    ap.add_argument("--tag", default="gpu_check", help="results file name")
    args = ap.parse_args(argv)
    from k31dsl.ops.registry import all_ops
    ops = jobs_for(args.ops or sorted(all_ops()), args.config)
    seconds: dict = {}
    folder = args.collect
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="k31check_"))
        with ThreadPoolExecutor(args.jobs) as pool:
            for op, s in zip(ops, pool.map(lambda o: run_one(o, folder, args.seed, args.timeout), ops)):
                seconds[op] = round(s, 1)
                (row,), _ = collect(folder, [op], seconds)   # a cut-off run still logs its verdicts
                print(f"{op}: {row['cases']} cases, {row['failed']} failed, {seconds[op]} s", flush=True)
    rows, failed = collect(folder, ops, seconds)
    columns = ["op", "cases", "failed", "worst err / tol", "s", "note"]
    harness.print_table(columns, rows)
    env = harness.environment() if args.collect is None else {}
    how = (f"`k31dsl check OP --target triton --seed {args.seed}`" if args.config is None else
           f"`k31dsl check OP --target triton --config N --seed {args.seed}+N` (OP@N), N in "
           f"{args.config.start}..{args.config.stop - 1}")
    notes = (f"{how} per op on the GPU (Triton's compiler); "
             f"{sum(r['cases'] for r in rows)} cases, {len(failed)} failed")
    harness.write(args.tag, {"env": env, "rows": rows, "failed": failed}, columns, rows, notes=notes,
                  extra=[("Failed cases", ["op", "case", "max_err", "tol"], failed)])
    return 1 if failed or any(r["failed"] == "no result" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared benchmark plumbing: medians from triton.testing.do_bench, the copy ceiling measured in
the same run, and results written as JSON + a markdown table under benchmarks/results/."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def shape_pairs(text: str) -> list[tuple[int, int]]:
    """--shapes "64x32768,32x131072" (or "+" between shapes, for gpu_run.sh) -> [(64, 32768), ...]."""
    return [tuple(int(x) for x in shape.split("x")) for shape in text.replace("+", ",").split(",") if shape]


def median_ms(fn, warmup: int = 25, rep: int = 200) -> float:
    import triton
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_median_ms(fn, rep: int = 200) -> float:
    """Median of CUDA-graph replays of fn (host launch overhead removed); NaN if capture fails."""
    import triton
    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    except Exception as e:  # noqa: BLE001 - report, don't fail the run
        print(f"cuda-graph timing failed: {type(e).__name__}: {e}")
        return float("nan")


def try_graph_median_ms(fn, rep: int = 200) -> float:
    """fn run once (its build), then graph_median_ms(fn); NaN, with the reason printed, when the
    first run raises (a probe's config that fails to compile is a result, not a crash)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - see the docstring
        print("failed", type(e).__name__, str(e)[:300], flush=True)
        return float("nan")
    return graph_median_ms(fn, rep)


def copy_ceiling_tbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (TB/s)."""
    import torch
    n = nbytes // 2
    a = torch.randn(n // 2, device="cuda", dtype=torch.float32)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e12


def environment() -> dict:
    import torch
    import triton
    env = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
    return env


def write(name: str, payload: dict, columns: list[str], rows: list[dict], notes: str = "",
          extra: list[tuple[str, list[str], list[dict]]] = ()) -> Path:
    """results/<name>.json (payload) and .md (notes, the table, then each (title, columns, rows)
    of `extra` under its own heading)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=float))
    lines = [f"# {name}", "", f"{payload.get('env', {})}", ""]
    if notes:
        lines += [notes, ""]
    lines += _table(columns, rows)
    for title, cols, more in extra:
        if more:
            lines += ["", f"## {title}", ""] + _table(cols, more)
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def report(name: str, columns: list[str], rows: list[dict], notes: str = "") -> Path:
    """A probe's ending: print the table, then results/<name>.json ({"env", "rows"}) and .md."""
    print_table(columns, rows)
    return write(name, {"env": environment(), "rows": rows}, columns, rows, notes=notes)


def _table(columns: list[str], rows: list[dict]) -> list[str]:
    return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows])


TUNING_COLUMNS = ["kernel", "call", "config", "ms", "vs chosen"]


def tuning_section(rows: list[dict]) -> list[tuple[str, list[str], list[dict]]]:
    """`write(extra=...)` for tuning_rows: every config the tuner timed, under its own heading."""
    return [("Autotuner: every config it timed", TUNING_COLUMNS, rows)]


def tuning_rows(label: str, compiled) -> list[dict]:
    """Every config the Triton autotuner timed for `compiled` (kdef["triton"] or a kernel from
    .compile), per call it tuned: median ms (None: it could not run) and the ratio to the chosen
    config. The tuner's pick alone hides how close the others came."""
    rows = []
    for key, log in getattr(compiled, "tune_log", {}).items():
        shapes, fixed = key if isinstance(key, tuple) and len(key) == 2 else ((), ())
        call = " ".join("x".join(map(str, f[0])) for f in shapes if isinstance(f, tuple) and f and isinstance(f[0], tuple))
        call += "".join(f" {k}={v}" for k, v in fixed)
        best = min((ms for _, ms in log if ms is not None), default=None)
        for cfg, ms in sorted(log, key=lambda e: (e[1] is None, e[1] or 0.0)):
            rows.append({"kernel": label, "call": call, "config": " ".join(f"{k}={v}" for k, v in cfg.items()),
                         "ms": ms if ms is not None else "failed",
                         "vs chosen": ms / best if ms is not None and best else ""})
    return rows


def compiled_resources(match: str = "") -> list[dict]:
    """Registers, spills and shared memory of every Triton kernel compiled in this process whose
    name contains `match`: what the GPU's own compiler gave each variant (occupancy cliffs such
    as 128 registers at 8 warps show up here, not in a SASS build on the CPU)."""
    import gc

    from triton.compiler.compiler import CompiledKernel
    rows = []
    for obj in gc.get_objects():
        if isinstance(obj, CompiledKernel) and match in obj.name:
            try:
                obj._init_handles()
            except Exception:  # noqa: BLE001 - a kernel that cannot load here is skipped
                continue
            rows.append({"kernel": obj.name, "regs": obj.n_regs, "spills": obj.n_spills,
                         "smem": obj.metadata.shared, "warps": obj.metadata.num_warps})
    return sorted(rows, key=lambda r: (r["kernel"], r["regs"]))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(columns: list[str], rows: list[dict]) -> None:
    widths = [max([len(c)] + [len(_fmt(r.get(c, ""))) for r in rows]) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))

"""Shared benchmark plumbing: medians from triton.testing.do_bench, the copy ceiling measured in
the same run, and results written as JSON + a markdown table under benchmarks/results/."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


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


def write(name: str, payload: dict, columns: list[str], rows: list[dict], notes: str = "") -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=float))
    lines = [f"# {name}", "", f"{payload.get('env', {})}", ""]
    if notes:
        lines += [notes, ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(columns: list[str], rows: list[dict]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))

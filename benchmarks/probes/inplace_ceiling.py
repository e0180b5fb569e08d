"""Probe: how fast can an H200 update memory in place (read a buffer and write the same bytes
back), against the copy ceiling (read one buffer, write another)? KDA decode is such an in-place
update of its state rows; this tells how much of its gap to the copy ceiling is the access
pattern itself. Each figure is a do_bench median, bytes read + written per second.

    python benchmarks/probes/inplace_ceiling.py     # GPU; prints a table, writes results/inplace_ceiling.*
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import harness
    rows = []
    for label, nbytes in (("N=64 state rows (805 MB)", 64 * 96 * 128 * 128 * 4),
                          ("N=256 state rows (3.2 GB)", 256 * 96 * 128 * 128 * 4)):
        a = torch.randn(nbytes // 4, device="cuda")
        b = torch.empty_like(a)
        for name, fn in (("copy to another buffer", lambda: b.copy_(a)), ("in place: a *= 1", lambda: a.mul_(1.0)),
                         ("in place: a += a", lambda: a.add_(a))):
            ms = triton.testing.do_bench(fn, warmup=25, rep=200)
            rows.append({"bytes": label, "kernel": name, "us": ms * 1e3, "TB/s (r+w)": 2 * nbytes / ms / 1e9})
            print(rows[-1], flush=True)
        del a, b
    cols = ["bytes", "kernel", "us", "TB/s (r+w)"]
    harness.report("inplace_ceiling", cols, rows,
                   notes="torch elementwise kernels, do_bench medians (not CUDA-graph replays); bytes read + written.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

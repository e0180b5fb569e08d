"""Probe: what programmatic dependent launch (PDL) saves per kernel boundary in a CUDA graph, on
a chain of dependent kernels shaped like the DSA decode step's (plain Triton, not the DSL).

Each kernel of the chain reads the previous kernel's output and writes its own, so the chain is
serial. With PDL every launch carries the programmatic-serialization attribute, and every kernel
first signals that its dependents may launch (`griddepcontrol.launch_dependents`), then waits
for its predecessor (`griddepcontrol.wait`) before touching memory: the semantics of stream
order, with the next kernel's launch and CTA placement overlapped with the previous kernel's
tail. Times are CUDA-graph medians of the whole chain; writes results/pdl_chain.json and .md.

    python benchmarks/probes/pdl_chain.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch
    import triton
    import triton.language as tl

    import harness

    @triton.jit
    def step(src, dst, n, work: tl.constexpr, PDL: tl.constexpr, BLOCK: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < n, other=0.0)
        for _ in range(work):                       # a dependent chain of arithmetic: kernel length
            x = x * 1.0001 + 0.5
        tl.store(dst + offs, x, mask=offs < n)

    rows = []
    for programs, work, kernels in ((132, 8, 20), (528, 8, 20), (132, 2000, 20), (1056, 200, 6)):
        n = programs * 1024
        bufs = [torch.zeros(n, device="cuda") for _ in range(2)]
        for pdl in (False, True):
            def chain(pdl=pdl):
                for i in range(kernels):
                    step[(programs,)](bufs[i % 2], bufs[(i + 1) % 2], n, work=work, PDL=pdl, BLOCK=1024,
                                      num_warps=4, launch_pdl=pdl)
            chain()
            torch.cuda.synchronize()
            ms = harness.graph_median_ms(chain)
            rows.append({"programs": programs, "work": work, "kernels": kernels, "PDL": pdl, "chain us": ms * 1e3,
                         "us per kernel": ms * 1e3 / kernels})
            print(rows[-1], flush=True)
        bufs[0].fill_(1.0)
        chain(pdl=True)
        got = bufs[kernels % 2].clone()
        bufs[0].fill_(1.0)
        chain(pdl=False)
        torch.cuda.synchronize()
        rows[-1]["same result"] = bool(torch.equal(got, bufs[kernels % 2]))
    harness.report("pdl_chain", ["programs", "work", "kernels", "PDL", "chain us", "us per kernel", "same result"],
                   rows, notes="CUDA-graph medians of the whole chain of dependent kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The graph pass pipeline per target, in one readable list. A pass is `(name, fn)` with fn a
plain function `Program -> Program` (it returns a changed copy; the input is left as it was);
the name is what `k31dsl explain --dump-after NAME` accepts. Kernel-level passes (frontend,
verify, portable) are in lowering/pipeline.py and run on every kernel when a call is built.

    numpy    build, verify, superkernel, streams, memory_plan
    triton   build, verify, superkernel, streams, memory_plan
    ascendc  build, verify, nz_layout, superkernel, streams, memory_plan

The NumPy and Triton targets keep ND weights: NZ only pays where the matrix unit consumes
512-byte fractals (Ascend). Tests run `nz_layout` on every target by naming it in `passes=`.
"""
from __future__ import annotations

import os
from typing import Callable

from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.passes.memory_plan import memory_plan
from k31dsl.lowering.passes.nz_layout import nz_layout
from k31dsl.lowering.passes.streams import streams
from k31dsl.lowering.passes.superkernel import superkernel

GraphPass = tuple[str, Callable]


def build(program):
    """The program as the builder made it; listed so that it can be dumped."""
    return program


def verify(program):
    from k31dsl.lowering.graph.verify import verify as check
    check(program)
    return program


PASSES: dict[str, Callable] = {"build": build, "verify": verify, "nz_layout": nz_layout,
                               "superkernel": superkernel, "streams": streams, "memory_plan": memory_plan}

GRAPH_PIPELINES: dict[str, list[str]] = {
    "numpy": ["build", "verify", "superkernel", "streams", "memory_plan"],
    "triton": ["build", "verify", "superkernel", "streams", "memory_plan"],
    "ascendc": ["build", "verify", "nz_layout", "superkernel", "streams", "memory_plan"],
}


def graph_pipeline(target: str, passes=None) -> list[GraphPass]:
    if passes is None:
        if target not in GRAPH_PIPELINES:
            raise K31Error(f"unknown target {target!r}; choose one of {', '.join(GRAPH_PIPELINES)}")
        passes = GRAPH_PIPELINES[target]
    out = []
    for p in passes:
        if isinstance(p, tuple):
            out.append(p)
        elif p in PASSES:
            out.append((p, PASSES[p]))
        else:
            raise K31Error(f"no graph pass named {p!r}; the passes are: {', '.join(PASSES)}")
    return out


def graph_pass_names(target: str) -> list[str]:
    return [n for n, _ in graph_pipeline(target)]


def run_graph_pipeline(program, target: str, passes=None, after_pass=None):
    """Run the passes in order; `after_pass(name, program)` sees each result. With K31_VERIFY=1
    (the test suite) the verifier runs after every pass."""
    strict = os.environ.get("K31_VERIFY") == "1"
    for name, fn in graph_pipeline(target, passes):
        program = fn(program)
        if strict and fn is not verify:
            verify(program)
        if after_pass is not None:
            after_pass(name, program)
    return program

"""The kernel pass pipeline per target, in one readable list. Each pass is `(name, fn)` with fn
taking a kernel IR and returning one; the name is what `k31dsl compile --dump-after NAME` accepts.

A kernel's passes are checks and views: the frontend (which already ran when the IR was built, or
the `.k31` parser), the verifier, and for the compiled targets their tile rules. What rewrites a
step (superkernel, nz_layout, streams, memory plan) works on graph programs and has its own list
in lowering/graph/pipeline.py.
"""
from __future__ import annotations

from typing import Callable

from k31dsl.dsl.errors import K31Error
from k31dsl.dsl.ir import Kernel

Pass = tuple[str, Callable[[Kernel], Kernel]]


def frontend(kernel: Kernel) -> Kernel:
    """The IR as the frontend (or the `.k31` parser) built it; listed so that it can be dumped."""
    return kernel


def verify(kernel: Kernel) -> Kernel:
    """Check the IR against the per-op rules; raises on a malformed kernel."""
    from k31dsl.dsl.verify import verify as check
    check(kernel)
    return kernel


def portable(kernel: Kernel) -> Kernel:
    """The compiled targets' tile rules (power-of-two dims, bounded size, k.dot dims >= 16),
    reported at the user's line; the numpy target has no such limits."""
    from k31dsl.dsl.frontend import check_portable
    check_portable(kernel)
    return kernel


KERNEL_PASSES: list[Pass] = [
    ("frontend", frontend),
    ("verify", verify),
]
COMPILED_PASSES: list[Pass] = KERNEL_PASSES + [("portable", portable)]

PIPELINES: dict[str, list[Pass]] = {
    "numpy": KERNEL_PASSES,
    "triton": COMPILED_PASSES,
    "ascendc": COMPILED_PASSES,
}


def pipeline(target: str) -> list[Pass]:
    if target not in PIPELINES:
        raise K31Error(f"unknown target {target!r}; choose one of {', '.join(PIPELINES)}")
    return PIPELINES[target]


def pass_names(target: str) -> list[str]:
    return [name for name, _ in pipeline(target)]


def verify_every_pass() -> bool:
    """K31_VERIFY=1 (the test suite sets it) re-runs the verifier after every pass."""
    import os
    return os.environ.get("K31_VERIFY") == "1"


def run_pipeline(kernel: Kernel, target: str,
                 after_pass: Callable[[str, Kernel], None] | None = None) -> Kernel:
    """Run every pass of `target` in order; `after_pass(name, kernel)` sees the IR after each."""
    strict = verify_every_pass()
    for name, fn in pipeline(target):
        kernel = fn(kernel)
        if strict and fn not in (verify, portable):
            verify(kernel)
        if after_pass is not None:
            after_pass(name, kernel)
    return kernel

"""Targets: each a vertical slice (emit.py, templates/, runtime.py). This module is the one entry
through which the rest of k31dsl reaches them."""
from __future__ import annotations

import importlib

from k31dsl.dsl.errors import K31Error

TARGETS = ("numpy", "triton", "ascendc")


def runtime(target: str):
    if target not in TARGETS:
        raise K31Error(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"k31dsl.targets.{target}.runtime")


def compile_kernel(kdef, target: str, **options):
    """A callable for `kdef` on `target`; specialises lazily per constexpr set."""
    return runtime(target).compile(kdef, **options)


def emit_source(kernel_ir, target: str, **options) -> dict[str, str]:
    """Generated files (name -> text) for one kernel IR on a target."""
    return runtime(target).emit_files(kernel_ir, **options)


def default_target() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return "triton"
    except ImportError:
        pass
    return "numpy"

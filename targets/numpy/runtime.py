"""NumPy target runtime: emit, load the module, run it over torch tensors or NumPy arrays."""
from __future__ import annotations

import numpy as np

from k31dsl.dsl.ir import Kernel
from k31dsl.targets.common import CompiledKernel
from k31dsl.targets.loader import load_module
from k31dsl.targets.numpy.emit import emit


def emit_files(kernel: Kernel, **options) -> dict[str, str]:
    return {f"{kernel.name}.py": emit(kernel, **options)}


def _to_numpy(a):
    """A writable NumPy view sharing memory with a CPU torch tensor (fp8/bf16 through byte views)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(a, torch.Tensor):
        from k31dsl.dsl import dtypes as D
        if a.device.type != "cpu":
            raise ValueError("the numpy target runs on CPU tensors")
        dt = D.from_torch(a.dtype)
        raw = a.view(torch.uint8) if a.element_size() == 1 else (
            a.view(torch.int16) if a.element_size() == 2 else None)
        if raw is not None and a.dtype not in (torch.uint8, torch.int8, torch.int16, torch.bool):
            return raw.numpy().view(D.numpy_dtype(dt))
        return a.numpy()
    return a


def build(kernel: Kernel, **options):
    src = emit(kernel, **options)
    mod = load_module(src, f"numpy_{kernel.name}")
    fn = getattr(mod, kernel.name)

    def launch(*args):
        conv = [_to_numpy(a) if hasattr(a, "shape") and getattr(a, "ndim", 0) > 0 else a for a in args]
        fn(*conv)
    launch.source = src
    return launch


class NumpyKernel(CompiledKernel):
    allow_numpy = True


def compile(kdef, **options):
    return NumpyKernel(kdef, "numpy", lambda k: build(k, **options), **options)


__all__ = ["compile", "emit_files", "build", "np"]

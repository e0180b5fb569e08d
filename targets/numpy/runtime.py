"""NumPy target runtime: emit, load the module, run it over torch tensors or NumPy arrays."""
from __future__ import annotations

import numpy as np

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import error, naming_the_call
from k31dsl.dsl.ir import Kernel, all_ops
from k31dsl.targets.common import CompiledKernel
from k31dsl.targets.loader import load_module
from k31dsl.targets.numpy.emit import emit


def emit_files(kernel: Kernel, **options) -> dict[str, str]:
    return {f"{kernel.name}.py": emit(kernel, **options)}


def _to_numpy(a, want=None):
    """A NumPy view sharing memory with `a` (a CPU torch tensor or a NumPy array), typed as the
    parameter's dtype `want` (bf16/fp8 go through integer views; e8m0 may arrive as u8 bytes)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(a, torch.Tensor):
        a = a.detach()
        raw = a.view(torch.uint8) if a.element_size() == 1 else (
            a.view(torch.int16) if a.element_size() == 2 else a)
        if a.dtype in (torch.int8, torch.int16, torch.bool, torch.float16):
            raw = a
        arr = raw.numpy()
        if want is None:
            dt = D.from_torch(a.dtype)
            return arr.view(D.numpy_dtype(dt)) if dt is not None else arr
    else:
        arr = a
    if want is not None and arr.dtype != np.dtype(D.numpy_dtype(want)):
        arr = arr.view(D.numpy_dtype(want))
    return arr


@naming_the_call
def _check_memory(kernel: Kernel, args) -> None:
    """Before anything runs: tensors on CPU, and every tensor the kernel stores to writable."""
    stored = {op.operands[0].uid for op in all_ops(kernel) if op.name == "store"}
    for p, a in zip(kernel.params, args):
        if not p.is_tensor:
            continue
        where = p.loc if p.loc.line else kernel.loc
        device = getattr(getattr(a, "device", None), "type", "cpu")
        if device != "cpu":
            raise error(f"argument `{p.name}` of `{kernel.name}` is on {device}; the numpy target runs on CPU",
                        where, "pass x.cpu(), or compile for target='triton'")
        if p.value.uid in stored and isinstance(a, np.ndarray) and not a.flags.writeable:
            raise error(f"argument `{p.name}` of `{kernel.name}` is a read-only array but the kernel "
                        "stores into it", where, "pass a writable array (np.array(x) copies)")


def build(kernel: Kernel, **options):
    src = emit(kernel, **options)
    mod = load_module(src, f"numpy_{kernel.name}")
    fn = getattr(mod, kernel.name)

    def launch(*args):
        _check_memory(kernel, args)
        conv = [_to_numpy(a, p.value.type.dtype) if p.is_tensor else a for p, a in zip(kernel.params, args)]
        fn(*conv)
    launch.source = src
    return launch


class NumpyKernel(CompiledKernel):
    allow_numpy = True


def compile(kdef, **options):
    return NumpyKernel(kdef, "numpy", lambda k: build(k, **options), **options)


__all__ = ["compile", "emit_files", "build", "np"]

"""AscendC target runtime: emit the kernel, build it with g++ against the k31emu emulation header
(targets/ascendc/build.py: one shared library per specialisation, cached by content hash), and
launch it through ctypes on CPU torch tensors or NumPy arrays: data pointers, sizes and strides
(in elements) and scalar parameters go into the tiling struct, blocks run as threads."""
from __future__ import annotations

import ctypes
import os
import re

import numpy as np

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error, error, naming_the_call
from k31dsl.dsl.ir import Kernel, all_ops
from k31dsl.targets.ascendc.emit import emit_all
from k31dsl.targets.common import CompiledKernel

DEFAULT_CORES = int(os.environ.get("K31_ASCENDC_CORES", "8"))
# Emulator builds are -O2 (build.BASE_FLAGS). K31_ASCENDC_OPT (e.g. -O0, which compiles in about
# half the time) or the `opt=` option overrides it: the test suite builds ~60 small kernels at -O0.


def emit_files(kernel: Kernel, **options) -> dict[str, str]:
    return emit_all(kernel, **options)


def translation_unit(files: dict[str, str], name: str) -> str:
    """The emulator launcher with the kernel, tiling header and helpers inlined (one source)."""
    def inline(text: str, seen: set) -> str:
        def repl(m):
            inc = m.group(1)
            if inc in files and inc not in seen:
                seen.add(inc)
                return inline(files[inc], seen)
            return "" if inc in files else m.group(0)
        return re.sub(r'^#include "([^"]+)"\s*$', repl, text, flags=re.M)
    return inline(files[f"{name}_emu.cpp"], set())


def _scalar_value(p, a):
    """A scalar argument as the numpy target types it (f32/bf16/f16 rounded like DT_<dtype>(a))."""
    dt = p.value.type.dtype
    if dt is D.bool_:
        return bool(a)
    if dt.is_int:
        return int(a)
    return float(np.array(float(a), np.float64).astype(D.numpy_dtype(dt)).astype(np.float64))


def _facts(a):
    """(data pointer, shape, strides in elements, device) of a torch tensor or NumPy array."""
    try:
        import torch
        if isinstance(a, torch.Tensor):
            return a.data_ptr(), tuple(a.shape), tuple(a.stride()), a.device.type, a.element_size()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(a, np.ndarray):
        isz = a.itemsize
        if any(s % isz for s in a.strides):
            raise K31Error("ascendc: an array with strides that are not whole elements cannot be passed",
                           hint="pass np.ascontiguousarray(x)")
        return a.__array_interface__["data"][0], a.shape, tuple(s // isz for s in a.strides), "cpu", isz
    raise K31Error(f"ascendc: cannot pass {type(a).__name__} as a tensor")


def build(kernel: Kernel, **options):
    from k31dsl.targets.ascendc import build as emu_build
    opt = options.pop("opt", None) or os.environ.get("K31_ASCENDC_OPT", "")
    files = emit_all(kernel, **options)
    name = kernel.name
    src = translation_unit(files, name)
    lib = emu_build.build(src, name=f"k31_{name}", extra_flags=(*((opt,) if opt else ()), "-fwrapv", "-ffp-contract=off"))
    fn = getattr(lib, f"k31_launch_{name}")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                   ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    cores = int(options.get("cores", DEFAULT_CORES))
    tensors = [i for i, p in enumerate(kernel.params) if p.is_tensor]
    scalars = [i for i, p in enumerate(kernel.params) if not p.is_tensor]
    stored = {op.operands[0].uid for op in all_ops(kernel) if op.name == "store"}

    @naming_the_call          # its argument errors point at a parameter; this names the call too
    def launch(*args):
        ptrs = (ctypes.c_void_p * max(1, len(tensors)))()
        dims: list[int] = []
        keep = []
        for j, i in enumerate(tensors):
            p, a = kernel.params[i], args[i]
            ptr, shape, strides, device, _ = _facts(a)
            where = p.loc if p.loc.line else kernel.loc
            if device != "cpu":
                raise error(f"argument `{p.name}` of `{kernel.name}` is on {device}; the ascendc target runs "
                            "on the CPU emulator", where, "pass x.cpu()")
            if isinstance(a, np.ndarray) and p.value.uid in stored and not a.flags.writeable:
                raise error(f"argument `{p.name}` of `{kernel.name}` is a read-only array but the kernel "
                            "stores into it", where, "pass a writable array (np.array(x) copies)")
            if any(s < 0 for s in strides):
                raise error(f"argument `{p.name}` of `{kernel.name}` has a negative stride", where,
                            "pass x.contiguous() (or np.ascontiguousarray(x))")
            ptrs[j] = ptr
            dims += list(shape) + list(strides)
            keep.append(a)
        fs = (ctypes.c_double * max(1, len(scalars)))()
        iscal = (ctypes.c_int64 * max(1, len(scalars)))()
        for j, i in enumerate(scalars):
            p = kernel.params[i]
            v = _scalar_value(p, args[i])
            if p.value.type.dtype.is_float:
                fs[j] = v
            else:
                iscal[j] = int(v)
        dim_arr = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        rc = fn(ptrs, dim_arr, fs, iscal, cores)
        if rc != 0:
            from k31dsl.targets.ascendc.build import last_error
            raise error(f"kernel `{kernel.name}` failed on the AscendC emulator: {last_error(lib)}", kernel.loc,
                        "this is a bug in the ascendc target if the kernel runs on numpy")
    launch.source = files[f"{name}_kernel.cpp"]
    launch.files = files
    return launch


class AscendKernel(CompiledKernel):
    allow_numpy = True


def compile(kdef, **options):  # noqa: A001 - the targets' common entry point
    return AscendKernel(kdef, "ascendc", lambda k: build(k, **options), **options)


__all__ = ["compile", "emit_files", "build", "translation_unit"]

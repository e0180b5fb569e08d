"""Ahead-of-time compilation of a kernel's gpu-mode module for an NVIDIA architecture on a machine
without a GPU: what the H200's JIT would build, so tests can catch code the interpreter accepts
but Triton's compiler rejects, and benchmarks can read registers, spills and shared memory before
a GPU run. Needs a process where TRITON_INTERPRET is unset."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from k31dsl.dsl.ir import Kernel
from k31dsl.targets.triton.emit import TritonEmitter, emit

POINTER = {"bf16": "*bf16", "f16": "*fp16", "f32": "*fp32", "f64": "*fp64", "i8": "*i8", "i32": "*i32",
           "i64": "*i64", "u8": "*u8", "u32": "*u32", "bool": "*i1", "f8e4m3": "*u8", "f8e5m2": "*u8",
           "e8m0": "*u8"}
SCALAR = {"f32": "fp32", "i32": "i32", "f64": "fp64", "i64": "i64", "bf16": "fp32"}


def compile_for_gpu(kernel: Kernel, folder: Path, *, arch: int = 90, index_type: str = "int32",
                    divisible: Callable[[str], bool] | None = None, **launch):
    """triton.compile of `kernel`'s gpu-mode launcher body for sm_`arch`; returns Triton's compiled
    object (`.asm["cubin"]`, `.asm["ptx"]`, `.metadata`). Launch options (num_warps, num_stages)
    default to those of the kernel's matching config, as the runtime would launch it.
    `divisible(arg_name)` marks pointer/size/stride arguments as multiples of 16, as the JIT
    does for such values (None: no hints, the most general code)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = Path(folder) / f"{kernel.name}_sm{arch}_{index_type}.py"
    path.write_text(emit(kernel, mode="gpu", satfinite=arch >= 89))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, f"{kernel.name}_kernel")
    signature, constants = {}, {}
    for p in kernel.params:
        t = p.value.type
        if p.is_tensor:
            signature[p.name] = POINTER[t.dtype.name]
            signature.update({f"{p.name}_size_{a}": "i32" for a in range(t.rank)})
            signature.update({f"{p.name}_stride_{a}": "i32" for a in range(t.rank - 1)})
            signature[f"{p.name}_stride_{t.rank - 1}"] = "constexpr"       # Triton specialises 1
            constants[f"{p.name}_stride_{t.rank - 1}"] = 1
        else:
            signature[p.name] = SCALAR[t.dtype.name]
    if "K31_IDX" in fn.arg_names:                                          # launcher-chosen offsets
        signature["K31_IDX"], constants["K31_IDX"] = "constexpr", getattr(triton.language, index_type)
    for name in fn.arg_names:
        if name in kernel.constexprs:
            signature[name], constants[name] = "constexpr", kernel.constexprs[name]
        elif name not in signature:
            signature[name] = "i32"                                        # host values
    attrs = {}
    if divisible is not None:
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if n not in constants and divisible(n)
                 and (signature[n].startswith("*") or "_size_" in n or "_stride_" in n)}
    options = {k: v for k, v in TritonEmitter(kernel, launch).launch_options().items() if v is not None}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=options)

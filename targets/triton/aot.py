"""Ahead-of-time compilation of a kernel's gpu-mode module for an NVIDIA architecture on a machine
without a GPU: what the H200's JIT would build, so tests can catch code the interpreter accepts
but Triton's compiler rejects, and benchmarks can read registers, spills and shared memory before
a GPU run. Needs a process where TRITON_INTERPRET is unset."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from k31dsl.dsl.ir import Kernel, TensorType
from k31dsl.targets.triton.emit import TritonEmitter, emit, pdl_mode

POINTER = {"bf16": "*bf16", "f16": "*fp16", "f32": "*fp32", "f64": "*fp64", "i8": "*i8", "i32": "*i32",
           "i64": "*i64", "u8": "*u8", "u32": "*u32", "bool": "*i1", "f8e4m3": "*u8", "f8e5m2": "*u8",
           "e8m0": "*u8"}
SCALAR = {"f32": "fp32", "i32": "i32", "f64": "fp64", "i64": "i64", "bf16": "fp32"}


def compile_for_gpu(kernel: Kernel, folder: Path, *, arch: int = 90, index_type: str = "int32",
                    divisible: Callable[[str], bool] | None = None, ones: frozenset = frozenset(), **launch):
    """triton.compile of `kernel`'s gpu-mode launcher body for sm_`arch`; returns Triton's compiled
    object (`.asm["cubin"]`, `.asm["ptx"]`, `.metadata`). Launch options (num_warps, num_stages)
    default to those of the kernel's matching config, as the runtime would launch it. `index_type`:
    the width of the kernel's offsets ("int32" / "int64"), as the launcher's `_index_type` picks it.
    `divisible(arg_name)` marks pointer and integer arguments as multiples of 16, as the JIT
    does for such values (None: no hints, the most general code); `ones` names the integer arguments
    (sizes, strides, scalars) that are 1, which the JIT compiles as constants (`jit_like` gives
    all three as the GPU would choose them for a call)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = Path(folder) / f"{kernel.name}_sm{arch}_{index_type}.py"
    path.write_text(emit(kernel, mode="gpu", satfinite=arch >= 89, pdl=pdl_mode(arch >= 90)))
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
    for name in ones:
        if name in signature and not signature[name].startswith("*") and name not in constants:
            signature[name], constants[name] = "constexpr", 1
    if "K31_IDX" in fn.arg_names:                                          # launcher-chosen offsets
        signature["K31_IDX"], constants["K31_IDX"] = "constexpr", getattr(triton.language, index_type)
    if "K31_PDL_EARLY" in fn.arg_names:                                    # PDL "auto": the full-GPU form
        signature["K31_PDL_EARLY"], constants["K31_PDL_EARLY"] = "constexpr", False
    for name in fn.arg_names:
        if name in kernel.constexprs:
            signature[name], constants[name] = "constexpr", kernel.constexprs[name]
        elif name not in signature:
            signature[name] = "i32"                                        # host values
    attrs = {}
    if divisible is not None:
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if n not in constants and divisible(n)
                 and (signature[n].startswith("*") or signature[n] in ("i32", "i64"))}
    options = {k: v for k, v in TritonEmitter(kernel, launch).launch_options().items() if v is not None}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=options)


def jit_like(kernel: Kernel, **args) -> dict:
    """compile_for_gpu's `divisible` and `index_type` as Triton's JIT and k31dsl's launcher would
    choose them for these call arguments (torch tensors by parameter name, any device; meta tensors
    will do; integer scalars by name too): a pointer whose address is a multiple of 16 bytes and an
    integer that is a multiple of 16 are marked divisible, an integer equal to 1 becomes a constant,
    and the offsets are int64 when some tensor spans 2^30 elements or more (the launcher's
    `_index_type`; one width for the whole kernel: per-tensor widths measured 1-2 % slower at the
    DSA step, NOTES). With these the CPU build is the H200's binary: the SFA score pass at
    the DSA step's B=64 (all offsets int64 then) gave 199 registers and 2256 instructions, as Nsight
    reported, where `divisible=lambda n: True` and int32 (the cache views' strides 164 and 328 are
    not multiples of 16, and the code view spans 1.4e9 elements) gave 152."""
    facts, ints, wide = {}, {}, False
    for p in kernel.params:
        t = args.get(p.name)
        if t is None:
            continue
        if not p.is_tensor:
            if isinstance(t, int) and not isinstance(t, bool):
                ints[p.name] = t
            continue
        facts[p.name] = t.device.type == "meta" or t.data_ptr() % 16 == 0
        ints.update({f"{p.name}_size_{a}": n for a, n in enumerate(t.shape)})
        ints.update({f"{p.name}_stride_{a}": s_ for a, s_ in enumerate(t.stride())})
        span = sum((n - 1) * abs(s_) for n, s_ in zip(t.shape, t.stride()))
        wide = wide or span >= 1 << 30
    facts.update({name: v % 16 == 0 for name, v in ints.items()})
    return {"divisible": lambda name: facts.get(name, False), "index_type": "int64" if wide else "int32",
            "ones": frozenset(name for name, v in ints.items() if v == 1)}


def blind_spots(kernel: Kernel, **args) -> list[str]:
    """The tensor arguments (torch tensors by parameter name, meta ones will do) whose rows keep a
    `k.aligned(n)` promise their parameter does not make, while the JIT cannot see it: it marks
    only values that are multiples of 16 elements, so rows of 328 bf16 (656 bytes) or of 4 bytes
    look unaligned to Triton and are loaded an element at a time. One line per such argument, with
    the largest n that holds; empty when Triton already knows all it could."""
    out = []
    for p in kernel.params:
        t, x = p.value.type, args.get(p.name)
        if not p.is_tensor or t.align or x is None or x.dim() == 0:
            continue
        shape, strides = tuple(x.shape), tuple(x.stride())
        seen = [s_ for n, s_ in zip(shape[:-1], strides[:-1]) if n > 1] + [shape[-1]]
        if all(v % 16 == 0 for v in seen):
            continue                                            # the JIT marks them all
        for nbytes in (16, 8, 4, 2):
            if nbytes <= t.dtype.itemsize:
                break
            if TensorType(t.dtype, t.dims, nbytes).misalignment(shape, strides) is None:
                out.append(f"`{p.name}` {list(shape)} strides {list(strides)}: rows on {nbytes}-byte multiples, which "
                           f"the JIT cannot see (it marks multiples of 16 elements); annotate it "
                           f"k.Tensor[..., k.aligned({nbytes})]")
                break
    return out

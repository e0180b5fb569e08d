"""Compile gpu-mode Triton modules to sm_90 cubins on a machine without a GPU: catches code that
the interpreter accepts but Triton's real compiler (the one an H200 runs) rejects. Any test module
can call `assert_compiles_for_hopper("tests/test_x.py", ["kernel_a", ...], tmp_path)` with
KernelDefs defined at the top level of that module."""
from __future__ import annotations

import os
import subprocess
import sys

POINTER = {"bf16": "*bf16", "f16": "*fp16", "f32": "*fp32", "f64": "*fp64", "i8": "*i8", "i32": "*i32",
           "i64": "*i64", "u8": "*u8", "u32": "*u32", "bool": "*i1", "f8e4m3": "*u8", "f8e5m2": "*u8",
           "e8m0": "*u8"}


def compile_gpu_module(kern, folder, index_type: str = "int32"):
    """Emit `kern` in gpu mode and compile it with Triton's real compiler to an sm_90 cubin
    (needs a process where TRITON_INTERPRET is unset; no GPU needed)."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from k31dsl.targets.triton.emit import emit
    kernel = kern.ir()
    path = folder / f"{kernel.name}_gpu.py"
    path.write_text(emit(kernel, mode="gpu", satfinite=True))   # as on an H200
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
            signature[p.name] = {"f32": "fp32", "i32": "i32", "f64": "fp64", "i64": "i64", "bf16": "fp32"}[t.dtype.name]
    if "K31_IDX" in fn.arg_names:                                          # launcher-chosen offsets
        signature["K31_IDX"], constants["K31_IDX"] = "constexpr", getattr(triton.language, index_type)
    for name in fn.arg_names:
        if name in kernel.constexprs:
            signature[name], constants[name] = "constexpr", kernel.constexprs[name]
        elif name not in signature:
            signature[name] = "i32"                                        # host values
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32))
    return bool(compiled.asm["cubin"])



def assert_compiles_for_hopper(module_file: str, names: list[str], tmp_path, index_types=("int32", "int64")):
    """Import `module_file` in a fresh process with TRITON_INTERPRET unset (this one has Triton in
    interpreter mode) and compile each named KernelDef's gpu-mode module for sm_90."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        "import importlib.util, pathlib, sys\n"
        f"sys.path.insert(0, {here!r})\n"
        "from hopper import compile_gpu_module\n"
        f"spec = importlib.util.spec_from_file_location('mod_under_test', {os.path.abspath(module_file)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"for name in {list(names)!r}:\n"
        f"    ok = all(compile_gpu_module(getattr(m, name), pathlib.Path({str(tmp_path)!r}), it)\n"
        f"             for it in {tuple(index_types)!r})\n"
        "    print(name, 'ok' if ok else 'empty')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == [w for n in names for w in (n, "ok")], res.stdout + res.stderr[-2000:]

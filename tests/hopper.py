"""Compile gpu-mode Triton modules to sm_90 cubins on a machine without a GPU: catches code that
the interpreter accepts but Triton's real compiler (the one an H200 runs) rejects. Any test module
can call `assert_compiles_for_hopper("tests/test_x.py", ["kernel_a", ...], tmp_path)` with
KernelDefs defined at the top level of that module."""
from __future__ import annotations

import os
import subprocess
import sys

class Specialised:
    """A KernelDef with some constexprs fixed: what the compile check builds (it calls .ir())."""

    def __init__(self, kdef, **constexprs):
        self.kdef, self.constexprs = kdef, constexprs

    def ir(self):
        return self.kdef.ir(**self.constexprs)


def compile_gpu_module(kern, folder, index_type: str = "int32"):
    """Emit `kern` in gpu mode and compile it with Triton's real compiler to an sm_90 cubin, with
    its first config's launch options (needs a process where TRITON_INTERPRET is unset)."""
    from k31dsl.targets.triton.aot import compile_for_gpu
    return bool(compile_for_gpu(kern.ir(), folder, arch=90, index_type=index_type).asm["cubin"])


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
    out = run_compiler_script(script, TRITON_DEFAULT_FP_FUSION="0")
    assert out.split() == [w for n in names for w in (n, "ok")], out


def run_compiler_script(script: str, **env_extra) -> str:
    """Run `script` in a fresh Python with TRITON_INTERPRET unset (Triton's real compiler; this
    process has the interpreter on) plus `env_extra`; assert it succeeds and return its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout

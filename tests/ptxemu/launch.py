"""k31dsl kernels through their gpu-mode launcher, compiled for sm_90 by the Triton in this process, emulated."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .machine import Emulator
from .sass import check_conversions
from .values import Memory, Unsupported


PROFILE: dict = {}        # kernel name -> launches, CTAs, warp-level issues per PTX op (all calls)


def run_gpu_code(kern, *args, folder: str, arch: int = 90):
    """Call a k31dsl kernel as its gpu-mode launcher would on an sm_`arch` GPU (the JIT's argument
    specialisation included), with the PTX of the Triton in this process emulated here. `args`:
    CPU torch tensors and scalars as for `k.compile(kern)`; outputs are written in place. Needs
    TRITON_INTERPRET unset. Returns the compiled kernel (its `.asm` holds TTGIR and PTX)."""
    import importlib.util
    import pathlib

    import torch
    from k31dsl.dsl.ir import Kernel
    from k31dsl.targets.triton.aot import compile_for_gpu, jit_like
    from k31dsl.targets.triton.emit import emit, pdl_mode

    ir = kern if isinstance(kern, Kernel) else kern.ir()
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{ir.name}_launcher.py"
    path.write_text(emit(ir, mode="gpu", satfinite=arch >= 89, pdl=pdl_mode(arch >= 90)))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, f"{ir.name}_kernel")
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((tuple(grid), a))
    setattr(module, f"{ir.name}_kernel", Recorder())
    module._fewer_programs_than_sms = lambda *a: False         # the full-GPU PDL form, as aot builds
    getattr(module, ir.name)(*args)
    if not calls:
        return None                                             # an empty grid: nothing launched
    (grid, positional), = calls
    values = dict(zip(fn.arg_names, positional))
    named = {p.name: values[p.name] for p in ir.params if p.name in values}
    (folder / "aot").mkdir(exist_ok=True)
    compiled = compile_for_gpu(ir, folder / "aot", arch=arch, **jit_like(ir, **named))
    memory, params = Memory(), []
    for name in fn.arg_names:
        if compiled.src.signature.get(name, "constexpr") == "constexpr":
            continue
        v, ty = values[name], compiled.src.signature[name]
        if isinstance(v, torch.Tensor):
            storage = torch.as_strided(v, (v.untyped_storage().nbytes() // v.element_size(),), (1,), 0)
            params.append(memory.add(storage.view(torch.uint8).numpy()) + v.storage_offset() * v.element_size())
        elif ty in ("fp32", "fp64"):
            np_ty = np.float32 if ty == "fp32" else np.float64
            params.append(int(np.array([v], np_ty).view(np.uint32 if ty == "fp32" else np.uint64)[0]))
        else:
            params.append(int(v))
    (folder / f"{ir.name}.ptx").write_text(compiled.asm["ptx"])         # for reading after a failure
    check_conversions(compiled, folder / f"{ir.name}.cubin")    # the one ptxas fault the SASS shows
    emu = Emulator(compiled.asm["ptx"])
    scratch = len(emu.entry.params) - len(params)               # Triton's global / profile scratch
    if getattr(compiled.metadata, "global_scratch_size", 0):
        raise Unsupported("kernels with global scratch memory")
    emu.launch(grid, params + [0] * scratch, memory)
    stats = PROFILE.setdefault(ir.name, {"launches": 0, "ctas": 0, "issued": Counter()})
    stats["launches"] += 1
    stats["ctas"] += emu.ctas
    stats["issued"].update(emu.issued)
    return compiled


def emulate_triton_target(folder: str):
    """Make this process's k31dsl Triton target run gpu-mode code in the emulator: library ops
    called with CPU tensors then launch, through their own runtime path, the PTX the GPU would run
    (one config, no autotuning). For a subprocess with TRITON_INTERPRET unset; not undone."""
    import k31dsl.targets.triton.runtime as runtime

    def build(kernel, kdef=None, **options):
        def launch(*args):
            run_gpu_code(kernel, *args, folder=folder)
        launch.raw, launch.source, launch.module = launch, "", None
        return launch
    runtime.detect_mode = lambda: "gpu"
    runtime._check_devices = lambda *a, **k: None
    runtime.build = build
    runtime.TritonKernel._tunable = lambda self, passed: False

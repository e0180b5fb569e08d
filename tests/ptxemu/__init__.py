"""A PTX emulator for the kernels Triton builds from k31dsl programs: it runs the PTX that Triton
3.6 (the H200's compiler) or 3.9 generates for sm_90 on this CPU, one CTA at a time, its threads
as numpy lanes with one program counter each (machine.py). It exists because the GPU is lent
minutes a day: a wrong answer that the PTX already computes (a Triton lowering bug) shows here,
with every statement's values at hand, and so does whether a workaround form fixes it; shared
memory touched by two warps with no barrier between is reported as a race. What it cannot see:
ptxas (the SASS the GPU runs; its miscompiles need the GPU, except float-to-narrow-integer
conversions it adds on its own, which sass.py counts at each launch) and timing.

Semantics follow the PTX ISA manual for the subset Triton emits for these kernels; an instruction
outside it raises `Unsupported` naming it, never a silent guess. Approximate instructions
(ex2.approx, rcp.approx, ...) are computed exactly, so compare them with a tolerance. fma rounds
f32 once through f64 (exact products); f64 fma goes through float128 where numpy has it.

    ptx = compiled.asm["ptx"]
    Emulator(ptx).launch(grid=(gx, gy, gz), params=[...], memory=mem)
    run_gpu_code(kernel, *args, folder=...)       # a k31dsl kernel as its gpu launcher calls it
    emulate_triton_target(folder)                 # the library's Triton target, emulated
"""
from __future__ import annotations

from .launch import emulate_triton_target, run_gpu_code
from .sass import PtxasConversion
from .machine import Emulator
from .values import Memory, SharedMemoryRace, Unsupported

__all__ = ["Emulator", "Memory", "PtxasConversion", "SharedMemoryRace", "Unsupported", "emulate_triton_target", "run_gpu_code"]

"""What a kernel costs on an NVIDIA GPU, found on a machine without one (`k31dsl resources`).

The kernel is built for sm_XX exactly as the GPU's JIT would build it for a call with the given
argument shapes (`aot.jit_like`: the same divisibility facts, constants and offset width), then
its cubin is read: registers, spills, shared memory, instructions, tensor-core instructions and
global loads by width, and from those the programs one SM holds and what limits them. The DSA
work found most of its performance facts this way before spending GPU time (benchmarks/NOTES.md):
an occupancy cliff at 128 registers for 8 warps, 2-byte gathers from rows Triton took for
unaligned, spill reloads in a prefetching variant.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error

# Per SM: registers, shared memory a CTA may use (bytes), resident warps, resident CTAs.
SM_LIMITS = {80: (65536, 166912, 64, 32), 90: (65536, 232448, 64, 32), 100: (65536, 232448, 64, 32)}
LAUNCH = ("num_warps", "num_stages", "maxnreg")


def parse_arg(text: str):
    """`--arg` text -> (name, value): NAME=4096x328:bf16 is a tensor of that shape and dtype
    (contiguous), NAME=64x128:f8e4m3:8448x128x1 one with those element strides, NAME=5 an integer,
    NAME=0.5 a float. Tensors are meta tensors: nothing is allocated."""
    import torch
    name, sep, spec = text.partition("=")
    if not sep or not name.isidentifier() or not spec:
        raise K31Error(f"--arg {text!r}: expected NAME=SHAPE:DTYPE[:STRIDES] or NAME=NUMBER",
                       hint="e.g. --arg x=4096x328:bf16 --arg idx=64:i32 --arg n_slots=4096")
    parts = spec.split(":")
    if len(parts) == 1:
        try:
            return name, int(spec)
        except ValueError:
            pass
        try:
            return name, float(spec)
        except ValueError:
            raise K31Error(f"--arg {text!r}: {spec!r} is neither a number nor SHAPE:DTYPE") from None
    if len(parts) > 3:
        raise K31Error(f"--arg {text!r}: expected SHAPE:DTYPE[:STRIDES]")

    def ints(field: str, what: str) -> tuple[int, ...]:
        try:
            vals = tuple(int(v) for v in field.split("x"))
        except ValueError:
            raise K31Error(f"--arg {text!r}: the {what} {field!r} must be integers joined by 'x'") from None
        if any(v < 0 for v in vals):
            raise K31Error(f"--arg {text!r}: the {what} must not be negative")
        return vals
    shape = ints(parts[0], "shape")
    if parts[1] not in D.BY_NAME:
        raise K31Error(f"--arg {text!r}: unknown dtype {parts[1]!r}",
                       hint=f"one of {', '.join(sorted(D.BY_NAME))}")
    dtype = D.torch_dtype(D.from_name(parts[1]))
    if len(parts) == 3:
        strides = ints(parts[2], "strides")
        if len(strides) != len(shape):
            raise K31Error(f"--arg {text!r}: {len(strides)} strides for a shape of rank {len(shape)}")
        return name, torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    return name, torch.empty(shape, dtype=dtype, device="meta")


def cuobjdump(cubin: Path, flag: str) -> str:
    """`cuobjdump <flag>` of a cubin file (-sass, -res-usage), by the tool that ships with Triton."""
    import triton
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    return subprocess.run([str(tool), flag, str(cubin)], capture_output=True, text=True, check=True).stdout


def register_usage(cubin: Path) -> str:
    """The REG / STACK words of `cuobjdump -res-usage` of a cubin ("REG:128 STACK:0 ..."), one
    group per function."""
    res = cuobjdump(cubin, "-res-usage")
    return " ".join(w for line in res.splitlines() if "REG" in line for w in line.split()
                    if w.startswith(("REG", "STACK")))


def sass_facts(compiled, folder: Path, arch: int = 90) -> dict:
    """Registers, spills, shared memory, SASS instructions, tensor-core instructions and global
    loads by width of a `triton.compile` result, plus the programs one SM holds and the limit."""
    cubin = folder / "k.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = cuobjdump(cubin, "-sass")
    res = cuobjdump(cubin, "-res-usage")
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    warps = compiled.metadata.num_warps
    smem = compiled.metadata.shared
    max_regs, max_smem, max_warps, max_ctas = SM_LIMITS[arch]
    limits = {"registers": max_regs // (32 * warps * (-(-regs // 8) * 8)),
              "shared memory": max_smem // (smem + 1024) if smem else 1 << 30,
              "warps": max_warps // warps, "CTAs": max_ctas}
    least = min(limits.values())
    widths = {}
    for op, suffix in re.findall(r"\b(LDG|LDGSTS)\.E((?:\.[A-Z0-9]+)*)", sass):
        bits = next((w for w in ("128", "64", "U16", "S16", "U8", "S8") if f".{w}" in suffix), "32")
        bits = {"U16": "16", "S16": "16", "U8": "8", "S8": "8"}.get(bits, bits)
        widths[f"{op} {bits}b"] = widths.get(f"{op} {bits}b", 0) + 1
    return {"regs": regs, "spill loads": len(re.findall(r"\bLDL\b", sass)),
            "spill stores": len(re.findall(r"\bSTL\b", sass)), "smem KB": round(smem / 1024, 1), "warps": warps,
            "SASS": len(re.findall(r"\n\s+/\*[0-9a-f]{4}\*/", sass)),
            "MMA": len(re.findall(r"\b(?:HGMMA|HMMA|IMMA|QGMMA)\b", sass)),
            "global loads": ", ".join(f"{k} x{v}" for k, v in sorted(widths.items())),
            "per SM": least, "limit": " and ".join(k for k, v in limits.items() if v == least)}


def interpreter_set() -> bool:
    """Whether this process has Triton's interpreter on (its real compiler then cannot run here)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def missing_args(kdef, args: dict) -> list[str]:
    """'name: dtype [dims]' for each runtime parameter `args` lacks."""
    out = []
    for p in kdef.signature().runtime:
        if p.name in args:
            continue
        a = p.annot
        if isinstance(a, D.DType):
            out.append(f"{p.name}: {a.name} scalar")
        else:
            dt = a.dtype if isinstance(a.dtype, str) else a.dtype.name
            out.append(f"{p.name}: {dt} [{', '.join(a.dims)}]")
    return out


def report(kdef, args: dict, fixed: dict, arch: int = 90) -> tuple[list[dict], list[str]]:
    """(one row per candidate config, blind-spot lines) for kernel `kdef` called with `args`
    (parameter name -> meta tensor or number) and `fixed` constexprs / launch options."""
    from k31dsl.targets.common import bind_dtypes, check_args
    from k31dsl.targets.triton.aot import blind_spots, compile_for_gpu, jit_like
    if interpreter_set():
        raise K31Error("resources needs Triton's real compiler, but TRITON_INTERPRET is set in this process",
                       hint="run it in a process without TRITON_INTERPRET (`k31dsl resources` restarts itself so)")
    if arch not in SM_LIMITS:
        raise K31Error(f"--arch {arch}: known architectures are {', '.join(map(str, SM_LIMITS))}")
    lacking = missing_args(kdef, args)
    if lacking:
        raise K31Error(f"`{kdef.name}` needs an --arg for each runtime parameter; missing: {'; '.join(lacking)}",
                       hint="tensors as NAME=SHAPE:DTYPE[:STRIDES] (e.g. x=4096x328:bf16), scalars as NAME=NUMBER")
    extra = sorted(set(args) - {p.name for p in kdef.signature().runtime})
    if extra:
        raise K31Error(f"`{kdef.name}` has no runtime parameter {', '.join(extra)}",
                       hint=f"its parameters: {', '.join(p.name for p in kdef.signature().runtime)}")
    passed = bind_dtypes(kdef, (), args, {k: v for k, v in fixed.items() if k not in LAUNCH}, allow_numpy=False)
    compiled_kdef = kdef["triton"]
    rows, spots = [], None
    with tempfile.TemporaryDirectory() as tmp:
        # the configs the GPU autotuner would time for this call (the runtime's own filter)
        for cfg in compiled_kdef._candidates({**passed, **fixed}) or [{}]:
            merged = {**cfg, **passed, **fixed}
            cx = {k: v for k, v in merged.items() if k not in LAUNCH}
            launch = {k: v for k, v in merged.items() if k in LAUNCH}
            kern = compiled_kdef.ir(**cx)
            ordered = check_args(kern, kdef, tuple(args[p.name] for p in kern.params), allow_numpy=False)
            call = dict(zip((p.name for p in kern.params), ordered))
            if spots is None:
                spots = blind_spots(kern, **call)
            like = jit_like(kern, **call)
            try:
                compiled = compile_for_gpu(kern, Path(tmp), arch=arch, **like, **launch)
            except Exception as e:  # noqa: BLE001 - Triton's own error, shown for this config
                rows.append({"config": _describe(cfg, fixed), "error": f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            rows.append({"config": _describe(cfg, fixed), "offsets": like["index_type"],
                         **sass_facts(compiled, Path(tmp), arch)})
    return rows, spots or []


def _describe(cfg: dict, fixed: dict) -> str:
    shown = {**cfg, **fixed}
    return " ".join(f"{k}={getattr(v, 'name', v)}" for k, v in shown.items()) or "defaults"

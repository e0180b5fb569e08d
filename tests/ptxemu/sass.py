"""One look past the PTX: conversions ptxas adds on its own. The emulator runs PTX, so a ptxas
miscompile agrees here and fails on the GPU. One kind leaves a trace in the SASS that can be
counted without a GPU: ptxas types a register by the instruction that wrote it, and turned the
truncating byte store of a register written by `selp.f32` into `F2IP.U8.F32` (a float-to-u8
conversion; fuzz seed 312814 stored 0 / 1 for the low bytes of float bits: ptxas 12.8, the
H200's, and the legacy 12.9 beside Triton 3.9; the 13.4 that Triton 3.9 runs for sm_90 does not).
A float-to-8/16-bit-integer conversion in the SASS that no `cvt.r?i` to 8 / 16 bits in the PTX
asks for is that bug. (Wider F2I is not counted: ptxas also emits it for integer division and
duplicates conversions it rematerialises, so a count there proves nothing.)"""
from __future__ import annotations

import re
from pathlib import Path

NARROW_PTX_CVT = re.compile(r"\bcvt\.r[znmp]i(?:\.ftz)?(?:\.sat)?\.[su](?:8|16)\.(?:bf16|f16|f32|f64)\b")
NARROW_SASS_F2I = re.compile(r"\bF2IP?(?:\.[A-Z0-9]+)*?\.[SU](?:8|16)\b")


class PtxasConversion(Exception):
    """The SASS converts floats to narrow integers where the PTX does not."""


def unasked_narrow_conversions(ptx: str, sass: str) -> int:
    """Narrow float-to-int conversions in `sass` beyond those `ptx` asks for (0 when none)."""
    return max(0, len(NARROW_SASS_F2I.findall(sass)) - len(NARROW_PTX_CVT.findall(ptx)))


def check_conversions(compiled, cubin: Path) -> None:
    """Raise PtxasConversion when ptxas added narrow float-to-int conversions to `compiled`
    (its cubin is written to the file `cubin` for cuobjdump)."""
    from k31dsl.targets.triton.resources import cuobjdump
    cubin.write_bytes(compiled.asm["cubin"])
    extra = unasked_narrow_conversions(compiled.asm["ptx"], cuobjdump(cubin, "-sass"))
    if extra:
        raise PtxasConversion(f"{cubin.stem}: the SASS has {extra} float-to-8/16-bit conversion(s) (F2I / F2IP) that "
                              f"the PTX does not ask for: ptxas typed a register by a float instruction that wrote it")

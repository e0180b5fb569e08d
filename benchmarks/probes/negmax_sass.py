"""The SASS that ptxas makes of `max over axis 0 of -x` (an int32 [32, 16] tile, rows past 29
masked to 3) in four forms, compiled for sm_90 by Triton's compiler on a machine without a GPU.

Form 0 is what the emitter made before. With the ptxas of Triton 3.6 (CUDA 12.8, what the H200
runs) three of the four negations stay (IMAD.MOV -R) and the fourth value enters the three-input
VIMNMX3 un-negated (fuzz seeds 202878, 103512); the ptxas of Triton 3.9 (12.9) happens to keep all
four for this kernel, though pytorch#190973 reports the same fusion up to 13.3.
Form 1 routes each negated value through an identity PRMT, which ptxas does not look through: all
four negations stay (what `opaque_int` in targets/triton/gpu_guards.py emits). Form 2 negates as
not + 1 (ptxas fuses it into VIADDMNMX instead); form 3 hides the negation behind a `mov` in inline
asm, which ptxas sees through (the bug stays).

    env -u TRITON_INTERPRET python benchmarks/probes/negmax_sass.py
"""
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def neg_max(x, o, FORM: tl.constexpr, R: tl.constexpr):
    r = tl.arange(0, 32)[:, None]
    c = tl.arange(0, 16)[None, :]
    v1 = tl.load(x + r * 16 + c, mask=r < R, other=3)
    if FORM == 0:
        v = -v1
    elif FORM == 1:
        v = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x3210;", "=r,r", [-v1], dtype=tl.int32,
                                      is_pure=True, pack=1)
    elif FORM == 2:
        v = tl.inline_asm_elementwise("{ .reg .b32 t; not.b32 t, $1; add.s32 $0, t, 1; }", "=r,r", [v1],
                                      dtype=tl.int32, is_pure=True, pack=1)
    else:
        v = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [-v1], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(o + tl.arange(0, 16), tl.max(v, 0))


def main():
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    folder = tempfile.mkdtemp(prefix="negmax_")
    for form in range(4):
        src = ASTSource(fn=neg_max, signature={"x": "*i32", "o": "*i32", "FORM": "constexpr", "R": "constexpr"},
                        constexprs={"FORM": form, "R": 29})
        cubin = os.path.join(folder, f"form{form}.cubin")
        with open(cubin, "wb") as f:
            f.write(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"])
        sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
        keep = [re.sub(r"\s*/\*[0-9a-f]*\*/\s*", "", line).strip() for line in sass.splitlines()
                if re.search(r"IMNMX|IMAD\.MOV R|PRMT|VIADD", line)]
        print(f"form {form}:\n    " + "\n    ".join(keep[:12]))


if __name__ == "__main__":
    main()

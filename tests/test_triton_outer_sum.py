"""A sum over the middle axis of an outer product, `k.sum(a[:, :, None] * b[None, :, :], axis=1)`,
must stay the elementwise fp32 reduction the kernel states. Triton's combine pass rewrites exactly
that operand order into a tt.dot; Triton 3.6 builds it with tf32 inputs, and on an H200 it gave
results about 4x too large for K = 2 (AttnRes prepare with 9+ queries: `k31dsl check --target
triton` on the GPU, benchmarks/NOTES.md). The Triton target writes such products as b * a, which
the pattern does not match. CI has Triton 3.9, whose rewrite is still there (as an exact FMA dot),
so the compiled TTGIR shows whether the emitted code escapes it."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import k31dsl as k

from hopper import run_compiler_script

TARGETS = ["numpy", "triton", "ascendc"]


@k.kernel
def outer_sum(a: k.Tensor[k.f32, "M", "K"], b: k.Tensor[k.f32, "K", "N"], o: k.Tensor[k.f32, "M", "N"],
              BM: k.constexpr = 16, BK: k.constexpr = 2, BN: k.constexpr = 32):
    for i in k.grid(1):
        x = a[k.span(0, BM, other=0.0), k.span(0, BK, other=0.0)]
        y = b[k.span(0, BK, other=0.0), k.span(0, BN, other=0.0)]
        o[k.span(0, BM), k.span(0, BN)] = k.sum(x[:, :, None] * y[None, :, :], axis=1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,kk,n", [(16, 2, 32), (13, 3, 20), (9, 2, 17)])
def test_outer_sum_matches_fp64(target, m, kk, n, rng):
    a = torch.from_numpy(rng.standard_normal((m, kk)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((kk, n)).astype(np.float32))
    o = torch.full((m, n), float("nan"))
    bk = max(2, 1 << (kk - 1).bit_length())
    outer_sum[target](a, b, o, BM=16, BK=bk, BN=32)
    want = a.double().numpy() @ b.double().numpy()
    assert np.abs(o.double().numpy() - want).max() <= 1e-6 * np.abs(want).max()


def test_emitted_product_puts_the_row_broadcast_first():
    src = outer_sum["triton"].source()
    [(lhs, rhs)] = re.findall(r"= (\w+) \* (\w+)$", src, re.M)
    assert f"{lhs} = y[None, :, :]" in src and f"{rhs} = x[:, :, None]" in src, src


def test_no_dot_in_the_compiled_kernel(tmp_path):
    # the control: the same sum written in the matched order becomes a tt.dot in this Triton
    script = (
        "import pathlib, sys\n"
        "import triton, triton.language as tl\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"pathlib.Path({str(tmp_path)!r}, 'control.py').write_text('''\n"
        "import triton, triton.language as tl\n"
        "@triton.jit\n"
        "def control(a, b, o):\n"
        "    x = tl.load(a + tl.arange(0, 16)[:, None] * 2 + tl.arange(0, 2)[None, :])\n"
        "    y = tl.load(b + tl.arange(0, 2)[:, None] * 32 + tl.arange(0, 32)[None, :])\n"
        "    tl.store(o + tl.arange(0, 16)[:, None] * 32 + tl.arange(0, 32)[None, :],\n"
        "             tl.sum(x[:, :, None] * y[None, :, :], 1))\n"
        "''')\n"
        "import control\n"
        "sig = {'a': '*fp32', 'b': '*fp32', 'o': '*fp32'}\n"
        "c = triton.compile(ASTSource(fn=control.control, signature=sig), target=GPUTarget('cuda', 90, 32))\n"
        "print('control', c.asm['ttgir'].count('tt.dot '))\n"
        "import test_triton_outer_sum as m\n"
        "from k31dsl.targets.triton.aot import compile_for_gpu\n"
        f"c = compile_for_gpu(m.outer_sum.ir(), pathlib.Path({str(tmp_path)!r}), arch=90)\n"
        "print('k31dsl', c.asm['ttgir'].count('tt.dot '))\n")
    out = dict(line.split() for line in run_compiler_script(script).strip().splitlines())
    assert out["control"] == "1", out        # else this Triton no longer rewrites: the test shows nothing
    assert out["k31dsl"] == "0", out

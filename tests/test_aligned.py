"""`k.aligned(n)` on a tensor parameter: the promise that every row starts on an n-byte multiple.
Kept in the IR and its text form, checked at every call (op calls and graph bindings) on every
target, and told to Triton so that gathers of rows whose length is no multiple of 16 elements
vectorise (the MLA cache's 656-byte records viewed as 328 bf16 or 164 fp32)."""
import re
from pathlib import Path

import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.dsl.parse import parse_kernel
from k31dsl.dsl.text import print_kernel
from k31dsl.lowering.graph import Program

from hopper import run_compiler_script

TARGETS = ["numpy", "triton", "ascendc"]


@k.kernel
def gather_rows(x: k.Tensor[k.bf16, "S", "R", k.aligned(16)], idx: k.Tensor[k.i32, "N"],
                y: k.Tensor[k.bf16, "N", "C"], C: k.constexpr = 64, OFF: k.constexpr = 8):
    for n in k.grid(y.shape[0]):
        y[n, k.span(0, C)] = x[idx[n], k.span(OFF, C, other=0.0)]


@k.kernel
def gather_rows_unaligned(x: k.Tensor[k.bf16, "S", "R"], idx: k.Tensor[k.i32, "N"],
                          y: k.Tensor[k.bf16, "N", "C"], C: k.constexpr = 64, OFF: k.constexpr = 8):
    for n in k.grid(y.shape[0]):
        y[n, k.span(0, C)] = x[idx[n], k.span(OFF, C, other=0.0)]


def test_the_promise_is_in_the_ir_and_survives_the_text_form():
    ir = gather_rows.ir()
    x = ir.params[0].value.type
    assert x.align == 16 and ir.params[1].value.type.align == 0
    text = print_kernel(ir)
    assert 'param %x : tensor<bf16>["S", "R"] align 16' in text
    assert print_kernel(parse_kernel(text)) == text


def test_bad_promises_are_errors_with_the_users_line():
    with pytest.raises(K31Error, match=r"k.aligned takes a byte count out of 2, 4, 8, 16, got 3"):
        k.aligned(3)
    with pytest.raises(K31Error, match="goes last"):
        k.Tensor[k.f32, "N", k.aligned(16), "D"]
    text = print_kernel(gather_rows.ir()).replace("align 16", "align 12")
    with pytest.raises(K31Error, match="align 12") as err:
        parse_kernel(text, "bad.k31")
    assert "bad.k31:5:" in str(err.value)


@pytest.mark.parametrize("target", TARGETS)
def test_rows_gathered_from_a_record_view(target, rng):
    # rows of 656 bytes viewed as 328 bf16 (no multiple of 16 elements), gathered at an offset
    s, n = int(rng.integers(5, 40)), int(rng.integers(1, 9))
    store = torch.randn(s, 328).to(torch.bfloat16)
    idx = torch.tensor(rng.integers(0, s, n), dtype=torch.int32)
    y = torch.empty(n, 64, dtype=torch.bfloat16)
    gather_rows[target](store, idx, y, C=64, OFF=264)
    assert torch.equal(y, store[idx.long(), 264:328])


@pytest.mark.parametrize("target", TARGETS)
def test_a_broken_promise_is_refused_before_anything_runs(target):
    idx = torch.zeros(3, dtype=torch.int32)
    y = torch.full((3, 16), 7.0, dtype=torch.bfloat16)
    cases = [(torch.zeros(9, 12, dtype=torch.bfloat16), "stride on axis 0 is 24 bytes"),
             (torch.zeros(9, 32, dtype=torch.bfloat16)[:, :20], "rows hold 40 bytes"),
             (torch.zeros(16, 9, dtype=torch.bfloat16).t(), "innermost stride is 9")]
    for x, why in cases:
        with pytest.raises(K31Error, match=rf"argument `x` of `gather_rows` breaks its k.aligned\(16\): its {why}") as err:
            gather_rows[target](x, idx, y, C=16, OFF=0)
        assert "test_aligned.py:23:" in str(err.value)
    assert bool((y == 7.0).all())
    # a strided view that keeps the promise is fine, and so is a one-row tensor of any stride
    x = torch.arange(16 * 48, dtype=torch.float32).to(torch.bfloat16).view(16, 48)[::2, 8:24]
    gather_rows[target](x, torch.tensor([1, 0, 7], dtype=torch.int32), y, C=16, OFF=0)
    assert torch.equal(y, x[[1, 0, 7]])


def test_graph_bindings_are_checked_too():
    p = Program("gather")
    x = p.input("x", (10, 20), k.bf16)
    idx = p.input("idx", (4,), k.i32)
    y = p.tensor("y", (4, 16), k.bf16)
    with pytest.raises(K31Error, match=r"parameter `x` bound to %x breaks its k.aligned\(16\): its stride on axis 0 is 40 bytes") as err:
        p.call(gather_rows, x, idx, y, C=16, OFF=0)
    assert "test_aligned.py:91:" in str(err.value)
    ok = p.input("ok", (10, 24), k.bf16)
    p.call(gather_rows, ok, idx, y, C=16, OFF=0)


def test_triton_is_told_and_vectorises_the_gather(tmp_path):
    src = gather_rows["triton"].source(C=64, OFF=264)
    assert "x_stride_0 = x_stride_0 // 8 * 8  # k.aligned(16)" in src
    assert "x_size_1 = x_size_1 // 8 * 8" in src
    # sm_90 PTX at the cache's shapes, as the H200's JIT builds it (row stride 328 is no multiple of
    # 16, so the JIT marks nothing), 8 elements per thread: 2-byte loads without the promise, 16-byte ones with it
    script = (
        "import pathlib, re, sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_aligned as m\n"
        "from k31dsl.targets.triton.aot import compile_for_gpu, jit_like\n"
        "x = torch.empty((4096, 328), dtype=torch.bfloat16, device='meta')\n"
        "idx = torch.empty((64,), dtype=torch.int32, device='meta')\n"
        "y = torch.empty((64, 256), dtype=torch.bfloat16, device='meta')\n"
        "for kd in (m.gather_rows, m.gather_rows_unaligned):\n"
        "    kern = kd.ir(C=256, OFF=8)\n"
        f"    c = compile_for_gpu(kern, pathlib.Path({str(tmp_path)!r}), arch=90, num_warps=1, **jit_like(kern, x=x, idx=idx, y=y))\n"
        "    print(kd.name, ' '.join(sorted(set(re.findall(r'ld\\.global(?:\\.[a-z0-9]+)+', c.asm['ptx'])))))\n")
    out = dict(line.split(" ", 1) for line in run_compiler_script(script).strip().splitlines())
    assert re.search(r"ld\.global\S*\.v4\.b32", out["gather_rows"]) and ".b16" not in out["gather_rows"], out
    assert ".b16" in out["gather_rows_unaligned"] and ".v4" not in out["gather_rows_unaligned"], out


def test_blind_spots_name_rows_the_jit_cannot_see_aligned():
    from k31dsl.targets.triton.aot import blind_spots
    meta = dict(device="meta")
    idx, y = torch.empty((5,), dtype=torch.int32, **meta), torch.empty((5, 64), dtype=torch.bfloat16, **meta)
    records = torch.empty((100, 328), dtype=torch.bfloat16, **meta)        # 656-byte rows
    [line] = blind_spots(gather_rows_unaligned.ir(), x=records, idx=idx, y=y)
    assert line.startswith("`x` [100, 328] strides [328, 1]: rows on 16-byte multiples") and "k.aligned(16)" in line
    assert blind_spots(gather_rows.ir(), x=records, idx=idx, y=y) == []                     # promised already
    assert blind_spots(gather_rows_unaligned.ir(), x=torch.empty((100, 320), dtype=torch.bfloat16, **meta),
                       idx=idx, y=y) == []                                                  # the JIT sees 320
    [line] = blind_spots(gather_rows_unaligned.ir(), x=torch.empty((100, 12), dtype=torch.bfloat16, **meta))
    assert "rows on 8-byte multiples" in line and "k.aligned(8)" in line                   # 24-byte rows
    assert blind_spots(gather_rows_unaligned.ir(), x=torch.empty((100, 13), dtype=torch.bfloat16, **meta)) == []

"""Frontend behaviour: constexpr specialisation, inlining, shape/axis sugar, `**` lowering,
compile-time asserts and source locations. Each test reads the IR and runs the kernel on the
numpy target against NumPy written from the math."""
from __future__ import annotations

import inspect
import linecache
import math

import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.dsl.ir import all_ops
from k31dsl.dsl.text import print_kernel


def op_names(kernel) -> list[str]:
    return [op.name for op in all_ops(kernel)]


def line_of(fn, marker: str) -> int:
    """The file line holding `marker` inside fn's source."""
    fn = getattr(fn, "fn", fn)
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def rand(*shape, dtype=np.float32):
    return np.random.default_rng().standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- the DESIGN §2 example verbatim

@k.kernel
def rms_quant(x: k.Tensor[k.bf16, "N", "D"], w: k.Tensor[k.f32, "D"],
              q: k.Tensor[k.f8e4m3, "N", "D"], s: k.Tensor[k.f32, "N", "D // 128"],
              eps: k.f32, BD: k.constexpr = 128):
    for n in k.grid(x.shape[0]):                 # parallel launch grid (1-3 dims)
        acc = k.zeros((BD,), k.f32)
        for j in range(x.shape[1] // BD):        # sequential loop; reassigned names are carried
            t = x[n, k.span(j * BD, BD)].to(k.f32)
            acc += t * t
        r = k.rsqrt(k.sum(acc) / x.shape[1] + eps)
        for j in range(x.shape[1] // BD):
            t = x[n, k.span(j * BD, BD)].to(k.f32) * r * w[k.span(j * BD, BD)]
            sc = k.maximum(k.max(k.abs(t)), 1e-4) / 448.0
            q[n, k.span(j * BD, BD)] = (t / sc).to(k.f8e4m3)   # casts to fp8 saturate
            s[n, j] = sc


def test_design_example_runs_as_written():
    N, D = 5, 256
    x = torch.from_numpy(rand(N, D)).bfloat16()
    w = torch.from_numpy(rand(D))
    q = torch.zeros(N, D, dtype=torch.float8_e4m3fn)
    s = torch.zeros(N, D // 128)
    rms_quant["numpy"](x, w, q, s, 1e-6)
    x64 = x.double().numpy()
    r = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6)
    t = (x64 * r * w.double().numpy()).reshape(N, 2, 128)
    sc = np.maximum(np.abs(t).max(axis=2), 1e-4) / 448.0
    np.testing.assert_allclose(s.numpy(), sc, rtol=1e-5)
    deq = q.float().numpy().reshape(N, 2, 128) * s.numpy()[:, :, None]
    # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 relative
    np.testing.assert_allclose(deq, t, rtol=1 / 16 + 1e-3, atol=sc.max() * 2 ** -9)
    # the int scalar x.shape[1] met a float: one cast, then an f32 division
    assert "cast" in op_names(rms_quant.ir())


# ---------------------------------------------------------------- constexpr specialisation

@k.kernel(configs=[{"BD": 32}, {"BD": 64}])
def act(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], MODE: k.constexpr = "relu",
        REPS: k.constexpr = 3, BD: k.constexpr = 16):
    assert BD % 16 == 0, f"BD={BD} must be a multiple of 16"
    for i in k.grid(k.cdiv(x.shape[0], BD)):
        t = x[k.span(i * BD, BD, other=0.0)]
        if MODE == "relu":
            t = k.relu(t)
        elif MODE == "exp":
            t = k.exp(t)
        else:
            t = -t
        for r in k.static_range(REPS):
            t = t + (r + 1) * 0.5
        y[k.span(i * BD, BD)] = t


def test_if_on_constexpr_picks_one_branch():
    assert "relu" in op_names(act.ir()) and "exp" not in op_names(act.ir())
    names = op_names(act.ir(MODE="exp"))
    assert "exp" in names and "relu" not in names
    names = op_names(act.ir(MODE="neg"))
    assert "neg" in names and "exp" not in names and "relu" not in names


def test_static_range_unrolls():
    ir = act.ir(REPS=4)
    assert "for" not in op_names(ir)
    assert op_names(ir).count("add") == 4 + 1          # four unrolled adds + the cdiv's
    x = rand(77)
    y = torch.zeros(77)
    act["numpy"](torch.from_numpy(x), y, REPS=4, MODE="exp")
    np.testing.assert_allclose(y.numpy(), np.exp(x.astype(np.float64)) + 0.5 + 1.0 + 1.5 + 2.0, rtol=1e-5)


@k.kernel
def pipelined_rowsum(x: k.Tensor[k.f32, "N", "D"], y: k.Tensor[k.f32, "N"], BD: k.constexpr = 16,
                     ST: k.constexpr = 3):
    for i in k.grid(x.shape[0]):
        acc = k.zeros((BD,), k.f32)
        for j in k.range(k.cdiv(x.shape[1], BD), stages=ST):
            acc += x[i, k.span(j * BD, BD, other=0.0)]
        y[i] = k.sum(acc, axis=0)


@pytest.mark.parametrize("target", ["numpy", "triton", "ascendc"])
def test_range_stages_is_a_hint(target):
    """k.range(stages=N) marks the loop op (`stages` attr; None: no attr) and leaves the results
    as range() gives them on every target."""
    loops = [op for op in all_ops(pipelined_rowsum.ir()) if op.name == "for"]
    assert [op.attrs for op in loops] == [{"stages": 3}]
    assert [op.attrs for op in all_ops(pipelined_rowsum.ir(ST=None)) if op.name == "for"] == [{}]
    x = torch.from_numpy(rand(5 * 70).reshape(5, 70))
    y = torch.zeros(5)
    pipelined_rowsum[target](x, y)
    np.testing.assert_allclose(y.numpy(), x.double().sum(1).numpy(), rtol=1e-5, atol=1e-5)


def test_range_stages_reach_triton_and_the_text_form():
    from k31dsl.dsl.parse import parse_kernel
    from k31dsl.dsl.text import print_kernel
    from k31dsl.targets.triton.emit import emit
    ir = pipelined_rowsum.ir()
    text = print_kernel(ir)
    assert "{stages = 3}" in text and print_kernel(parse_kernel(text)) == text
    src = emit(ir, mode="gpu")
    assert "tl.range(0, " in src and "num_stages=3)" in src
    assert "tl.range" not in emit(pipelined_rowsum.ir(ST=None), mode="gpu")


def test_configs_first_entry_and_explicit_override():
    assert act.ir().constexprs["BD"] == 32
    assert act.ir(BD=64).constexprs["BD"] == 64
    loads = [op for op in all_ops(act.ir(BD=64)) if op.name == "load"]
    assert loads[0].attrs["index"] == ["span:64"]
    x = rand(100)
    for bd in (None, 16, 64):
        y = torch.zeros(100)
        kw = {} if bd is None else {"BD": bd}
        act["numpy"](torch.from_numpy(x), y, **kw)
        np.testing.assert_allclose(y.numpy(), np.maximum(x, 0) + 3.0, rtol=1e-6)


def test_compile_time_assert_passes_and_fails():
    assert "assert" not in print_kernel(act.ir(BD=48))
    with pytest.raises(K31Error, match="BD=40 must be a multiple of 16") as info:
        act.ir(BD=40)
    assert info.value.loc.line == line_of(act, "assert BD % 16 == 0")


# ---------------------------------------------------------------- k.func inlining

@k.func
def scale_shift(t, scale=2.0, shift=0.0):
    return t * scale + shift


@k.func
def stats(t):
    """Sum and max of a tile, as a tuple."""
    return k.sum(t), k.max(t)


@k.func
def normalised(t, EPS: float = 1e-6):
    total, biggest = stats(t)
    return scale_shift(t, 1.0 / (biggest + EPS)), total


@k.kernel
def use_funcs(x: k.Tensor[k.f32, "N", "D"], y: k.Tensor[k.f32, "N", "D"], tot: k.Tensor[k.f32, "N"],
              BD: k.constexpr = 32):
    for n in k.grid(x.shape[0]):
        t = x[n, k.span(0, BD, other=-1.0)]
        u, total = normalised(t)
        y[n, k.span(0, BD)] = scale_shift(u, shift=1.0)
        tot[n] = total


def test_func_inlining_with_defaults_and_tuples():
    assert not {"call", "func"} & set(op_names(use_funcs.ir()))
    N, D = 4, 20
    x = np.abs(rand(N, D)) + 0.1
    y, tot = torch.zeros(N, D), torch.zeros(N)
    use_funcs["numpy"](torch.from_numpy(x), y, tot)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y.numpy(), x64 / (x64.max(axis=1, keepdims=True) + 1e-6) * 2.0 + 1.0, rtol=1e-5)
    # the masked lanes read -1.0 and count in the sum: 12 of them per row
    np.testing.assert_allclose(tot.numpy(), x64.sum(axis=1) - 12, rtol=1e-5, atol=1e-5)


def test_inlined_ops_point_into_the_helper():
    ir = use_funcs.ir()
    where = {op.loc.line for op in all_ops(ir) if op.name == "max"}
    assert where == {line_of(stats, "return k.sum(t), k.max(t)")}
    assert all(op.loc.file == __file__ for op in all_ops(ir))


# ---------------------------------------------------------------- shapes, axes, transpose, **

@k.kernel
def shapes_and_axes(a: k.Tensor[k.f32, "M", "K"], b: k.Tensor[k.f32, "M", "K"], out: k.Tensor[k.f32, "M", "K"],
                    rowsum: k.Tensor[k.f32, "K", "M"], BM: k.constexpr = 16, BK: k.constexpr = 16):
    for i in k.grid(1):
        M, K = a.shape
        rows = k.arange(BM)
        cols = k.arange(BK)
        inside = (rows[:, None] < M) & (cols[None, :] < K)          # marker: axes
        ta = a[k.span(0, BM, other=0.0), k.span(0, BK, other=0.0)]
        tb = b[k.span(0, BM, other=0.0), k.span(0, BK, other=0.0)]
        colmax = k.max(ta, axis=0)
        r = ta * colmax[None, :] + k.sum(tb, axis=1)[:, None]
        out[k.span(0, BM), k.span(0, BK)] = k.where(inside, r ** 2 + k.abs(tb) ** 0.5, 0.0)
        rowsum[k.span(0, BK), k.span(0, BM)] = (ta + tb).T                # marker: transpose


def test_shape_unpacking_axes_and_transpose():
    ir = shapes_and_axes.ir()
    dims = [op for op in all_ops(ir) if op.name == "dim"]
    assert [d.attrs["axis"] for d in dims] == [0, 1]
    expands = [op for op in all_ops(ir) if op.name == "expand"]
    assert [e.attrs["axis"] for e in expands] == [1, 0, 0, 1]
    assert {e.loc.line for e in expands[:2]} == {line_of(shapes_and_axes, "marker: axes")}
    trans = [op for op in all_ops(ir) if op.name == "trans"]
    assert len(trans) == 1 and trans[0].loc.line == line_of(shapes_and_axes, "marker: transpose")
    M, K = 13, 11
    a, b = rand(M, K), rand(M, K)
    out, rowsum = torch.zeros(M, K), torch.zeros(K, M)
    shapes_and_axes["numpy"](torch.from_numpy(a), torch.from_numpy(b), out, rowsum)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    r = a64 * a64.max(axis=0)[None, :] + b64.sum(axis=1)[:, None]
    np.testing.assert_allclose(out.numpy(), r ** 2 + np.abs(b64) ** 0.5, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rowsum.numpy(), (a64 + b64).T, rtol=1e-6)


@k.kernel
def powers(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "P", "N"], BN: k.constexpr = 32):
    for i in k.grid(1):
        t = x[k.span(0, BN, other=1.0)]
        y[0, k.span(0, BN)] = t ** 2
        y[1, k.span(0, BN)] = t ** 3
        y[2, k.span(0, BN)] = t ** 0.5
        y[3, k.span(0, BN)] = t ** -0.5
        y[4, k.span(0, BN)] = t ** 1.5
        y[5, k.span(0, BN)] = t ** -2
        y[6, k.span(0, BN)] = 2 ** t
        y[7, k.span(0, BN)] = t ** 0


def test_power_lowering():
    ir = powers.ir()
    by_line = {}
    for op in all_ops(ir):
        by_line.setdefault(op.loc.line, []).append(op.name)
    src = inspect.getsource(powers.fn).splitlines()
    first = inspect.getsourcelines(powers.fn)[1]
    ops_for = {src[ln - first].strip().split("= ", 1)[1]: names for ln, names in by_line.items()
               if "**" in src[ln - first]}
    assert ops_for["t ** 2"].count("mul") == 1 and "exp2" not in ops_for["t ** 2"]
    assert ops_for["t ** 3"].count("mul") == 2
    assert "sqrt" in ops_for["t ** 0.5"] and "exp2" not in ops_for["t ** 0.5"]
    assert "rsqrt" in ops_for["t ** -0.5"]
    assert {"log2", "exp2"} <= set(ops_for["t ** 1.5"])
    assert "div" in ops_for["t ** -2"]
    assert "exp2" in ops_for["2 ** t"] and "log2" not in ops_for["2 ** t"]
    assert "full" in ops_for["t ** 0"]
    x = np.abs(rand(20)) + 0.5
    y = torch.zeros(8, 20)
    powers["numpy"](torch.from_numpy(x), y)
    x64 = x.astype(np.float64)
    want = np.stack([x64 ** 2, x64 ** 3, x64 ** 0.5, x64 ** -0.5, x64 ** 1.5, x64 ** -2.0, 2.0 ** x64,
                     np.ones_like(x64)])
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)


# ---------------------------------------------------------------- loops, closures, compile-time helpers

def make_scaler(factor, dtype):
    @k.kernel
    def scaler(x: k.Tensor[dtype, "N"], y: k.Tensor[dtype, "N"], BN: k.constexpr = 16):
        for i in k.grid(k.cdiv(x.shape[0], BN)):
            t = x[k.span(i * BN, BN, other=0.0)].to(k.f32)
            for c in (1.0, factor):                          # a compile-time tuple unrolls
                t = t * c
            y[k.span(i * BN, BN)] = (t + math.log2(BN)).to(dtype)
    return scaler


def test_closure_variables_tuples_and_math():
    kern = make_scaler(3.0, k.f32)
    x = rand(40)
    y = torch.zeros(40)
    kern["numpy"](torch.from_numpy(x), y)
    np.testing.assert_allclose(y.numpy(), x.astype(np.float64) * 3.0 + 4.0, rtol=1e-6, atol=4e-6)


@k.kernel
def carried(x: k.Tensor[k.f32, "N"], out: k.Tensor[k.f32, "S"], BN: k.constexpr = 16):
    for i in k.grid(1):
        total = 0.0                                   # a Python number carried as an f32 scalar
        count = 0
        biggest = k.full((BN,), float("-inf"), k.f32)
        for j in range(k.cdiv(x.shape[0], BN)):
            t = x[k.span(j * BN, BN, other=float("-inf"))]
            ok = t > float("-inf")
            total += k.sum(k.where(ok, t, 0.0))
            count += k.sum(ok.to(k.i32))
            biggest = k.maximum(biggest, t)
        out[0] = total
        out[1] = count
        out[2] = k.max(biggest)


def test_loop_carried_numbers_become_scalars():
    ir = carried.ir()
    loop = next(op for op in all_ops(ir) if op.name == "for")
    assert [str(r.type) for r in loop.results] == ["f32[16]", "i32", "f32"]
    x = rand(45)
    out = torch.zeros(3)
    carried["numpy"](torch.from_numpy(x), out)
    np.testing.assert_allclose(out.numpy(), [x.astype(np.float64).sum(), 45, x.max()], rtol=1e-5, atol=1e-5)


def test_ir_text_carries_source_lines():
    text = print_kernel(shapes_and_axes.ir())
    line = line_of(shapes_and_axes, "marker: transpose")
    col = linecache.getline(__file__, line).index("(ta + tb).T")
    assert any("= trans(" in t and t.rstrip().endswith(f"@{line}:{col}") for t in text.splitlines()), text


@k.kernel
def sugar(x: k.Tensor[k.f32, "M", "N"], y: k.Tensor[k.f32, "M", "N"], BM: k.constexpr = 16, BN: k.constexpr = 16):
    for i in k.grid(1):
        t = x[k.span(0, BM, other=0.0), k.span(0, BN, other=0.0)]
        assert t.ndim == 2 and x.ndim == 2 and t.shape == (BM, BN) and len(t) == BM
        rows, cols = t.shape
        last = k.sum(t, axis=-1)                       # stored as axis 1
        run = k.cumsum(t, axis=-1)
        real = k.arange(BM)[:, None] < x.shape[0]
        colmax = k.max(k.where(real, t, float("-inf")), axis=0)
        y[k.span(0, rows), k.span(0, cols)] = run - last[..., None] + colmax[None, ...]


def test_negative_axes_ellipsis_ndim():
    ir = sugar.ir()
    axes = {op.name: op.attrs["axis"] for op in all_ops(ir) if op.name in ("sum", "cumsum", "max")}
    assert axes == {"sum": 1, "cumsum": 1, "max": 0}
    assert [op.attrs["axis"] for op in all_ops(ir) if op.name == "expand"] == [1, 1, 0]
    x = rand(9, 14)
    y = torch.zeros(9, 14)
    sugar["numpy"](torch.from_numpy(x), y)
    x64 = x.astype(np.float64)
    want = np.cumsum(x64, axis=1) - x64.sum(axis=1, keepdims=True) + x64.max(axis=0, keepdims=True)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)


@k.kernel
def explicit_masks(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], lim: k.f32, BN: k.constexpr = 16):
    for i in k.grid(k.cdiv(x.shape[0], BN)):
        offs = i * BN + k.arange(BN)
        t = k.load(x, (offs,), mask=offs % 2 == 0, other=-1.0)           # odd lanes read -1
        k.store(y, k.span(i * BN, BN), k.minimum(t, lim), mask=t > -1.0)  # odd lanes keep y
        y[i * BN] += 100.0                                                # load-modify-store


def test_explicit_load_store_masks_and_augmented_store():
    x = np.random.default_rng().uniform(-0.9, 0.9, 37).astype(np.float32)     # real lanes > -1
    y = np.full(37, 5.0, np.float32)
    explicit_masks["numpy"](torch.from_numpy(x), torch.from_numpy(y), 0.25)
    want = np.full(37, 5.0)
    even = np.arange(37) % 2 == 0
    want[even] = np.minimum(x[even].astype(np.float64), 0.25)
    want[::16] += 100.0
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_range_stages_pipeline_dot_free_loads_on_hopper(tmp_path):
    """What the hint is for: with stages=3 Triton turns the loop's plain loads (no dot in the
    loop) into cp.async copies through shared memory on sm_90; without it they stay ld.global."""
    import os
    from hopper import run_compiler_script
    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        "import pathlib, sys\n"
        f"sys.path.insert(0, {here!r})\n"
        "from test_frontend import pipelined_rowsum\n"
        "from k31dsl.targets.triton.aot import compile_for_gpu\n"
        "for st in (3, None):\n"
        f"    c = compile_for_gpu(pipelined_rowsum.ir(ST=st), pathlib.Path({str(tmp_path)!r}), arch=90)\n"
        "    print(st, c.asm['ptx'].count('cp.async.ca') + c.asm['ptx'].count('cp.async.cg'),\n"
        "          c.asm['ptx'].count('ld.global'))\n")
    counts = {line.split()[0]: tuple(map(int, line.split()[1:])) for line in run_compiler_script(script).splitlines()
              if line}
    assert counts["3"][0] > 0 and counts["None"][0] == 0, counts

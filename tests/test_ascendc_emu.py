"""Self-tests of the k31emu AscendC CPU emulator (targets/ascendc/emu): hand-written kernels in
tests/ascendc_cases/ built with g++; good kernels against NumPy / ml_dtypes, bad kernels must
come back as K31Error with the emulator's message (never a crash)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from k31dsl.dsl.errors import K31Error

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

CASES = Path(__file__).parent / "ascendc_cases"


CASE_NAMES = ("vector_ok", "ops_ok", "cube_ok", "bad_kernels")
_built: dict = {}


def _lib(name: str):
    """The case's library; the first call compiles every case file in parallel (g++ dominates
    this module's cold run time)."""
    from concurrent.futures import ThreadPoolExecutor

    from k31dsl.targets.ascendc import build
    if not _built:
        def one(n):
            return n, build.build((CASES / f"{n}.cpp").read_text(), name=n)
        with ThreadPoolExecutor(max_workers=len(CASE_NAMES)) as pool:
            _built.update(pool.map(one, CASE_NAMES))
    return _built[name]


def _call(lib, symbol, *args):
    from k31dsl.targets.ascendc import build
    build.call(lib, symbol, *args)


@pytest.fixture(scope="module")
def vec():
    return _lib("vector_ok")


@pytest.mark.parametrize("n,tile,blocks", [(1000, 64, 4), (37, 64, 1), (4099, 512, 3), (256, 32, 70)])
def test_vec_add_ragged_tail(vec, n, tile, blocks):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    z = np.full(n, np.nan, np.float32)
    _call(vec, "run_vec_add", blocks, x, y, z, n, tile)
    np.testing.assert_array_equal(z, x + y)


@pytest.fixture(scope="module")
def cube():
    return _lib("cube_ok")


@pytest.mark.parametrize("dtype,bT", [("half", 0), ("bf16", 0), ("half", 1), ("f32", 1), ("f32", 2)])
@pytest.mark.parametrize("m,n,k,tiles", [(37, 45, 70, (32, 32, 32)), (1, 17, 9, (16, 16, 16)), (50, 3, 129, (64, 16, 64))])
def test_cube_matmul_odd_shapes(cube, dtype, bT, m, n, k, tiles):
    import ml_dtypes
    np_dt = {"half": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((m, k)).astype(np_dt)
    b = rng.standard_normal((k, n)).astype(np_dt)
    c = np.full((m, n), np.nan, np.float32)
    b_in = np.ascontiguousarray(b.T) if bT == 1 else b
    _call(cube, f"run_mm_{dtype}", 3, a, b_in, c, m, n, k, *tiles, bT)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k))


BAD_CASES = {  # case name -> a fragment the emulator message must contain
    "MISALIGNED_LEN": "80 B is not a multiple of 32 B; DataCopy moves whole 32-byte blocks, use DataCopyPad",
    "MISALIGNED_ADDR": "not 32-byte aligned; use DataCopyPad",
    "DOUBLE_FREE": "FreeTensor on TQue<VECIN, depth 1> #0: TQue<VECIN, depth 1> #0 buffer 0 was already freed",
    "DEQUE_WITHOUT_ENQUE": "DeQue on TQue<VECIN, depth 1> #0: nothing is enqueued (DeQue without EnQue)",
    "DEPTH_OVERFLOW": "EnQue on TQue<VECIN, depth 1> #0: the queue already holds 1 tensor(s), its depth",
    "UB_OVERFLOW": "UB overflow: TQue<VECCALC, depth 1> #2 requests 2 x 102400 B = 204800 B, but 3072 of the 196608 B",
    "UNWRITTEN_VECTOR": "Add: src0 reads element 64 of TQue<VECIN, depth 1> #0 buffer 0 (VECIN) that was never written",
    "UNWRITTEN_COPYOUT": "DataCopy(local->GM): src reads element 8 of TQue<VECOUT, depth 1> #1 buffer 0",
    "COUNT_BEYOND": "Exp: count 264 exceeds src's size of 256 elements",
    "FOREIGN_FREE": "FreeTensor on TQue<VECOUT, depth 1> #1: the tensor belongs to TQue<VECIN, depth 1> #0 buffer 0",
    "USE_AFTER_FREE": "Muls: src uses TQue<VECIN, depth 1> #0 buffer 0 after FreeTensor",
    "ALLOC_EXHAUSTED": "AllocTensor on TQue<VECIN, depth 1> #0: all 2 buffers are in use (2 allocated",
    "SYNCALL_MISMATCH": "every block must call SyncAll the same number of times",
    "L0A_OVERFLOW": "L0A overflow: TQue<A2, depth 1> #2 requests 2 x 40960 B = 81920 B",
    "VECTOR_ON_L1": "Duplicate: dst is in A1 (L1) but this operand must be in UB",
    "COMPARE_COUNT": "Compare: count 40 x 4 B is not a multiple of 256 B",
    "MMAD_UNWRITTEN": "Mmad: A element (0, 0) at L0A element 0 of TQue<A2, depth 1> #2 buffer 0 was never written",
    "PAD_TOO_LONG": "DataCopyPad(GM->UB): the copy fills 1152 B of dst",
    "GM_OUT_OF_RANGE": "touches 32 elements of src but its global buffer holds 16",
    "USE_WHILE_ENQUEUED": "Abs: src (TQue<VECIN, depth 1> #0 buffer 0) is still enqueued; DeQue it before using it",
    "GETVALUE_UNWRITTEN": "GetValue: the tensor reads element 1 of TQue<VECIN, depth 1> #0 buffer 0",
    "PADDING_TOO_WIDE": "leftPadding/rightPadding may cover at most 32 bytes each",
    "FIXPIPE_BAD_STRIDE": "Fixpipe(L0C->GM): srcStride 20 must be a multiple of 16 rows and >= mSize 20",
}


@pytest.fixture(scope="module")
def bad():
    return _lib("bad_kernels")


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_kernel(bad, case):
    which = list(BAD_CASES).index(case)
    gm = np.zeros(4096, np.float32)
    with pytest.raises(K31Error) as err:
        _call(bad, "run_bad", which, gm)
    assert BAD_CASES[case] in str(err.value), str(err.value)
    assert "[block " in str(err.value)


def test_bad_kernel_leaves_library_usable(bad, vec):
    """A failed launch does not poison the next one (per-launch state, per-block memory)."""
    gm = np.zeros(4096, np.float32)
    with pytest.raises(K31Error):
        _call(bad, "run_bad", 0, gm)
    x = np.arange(64, dtype=np.float32)
    z = np.zeros(64, np.float32)
    _call(vec, "run_vec_add", 2, x, x, z, 64, 32)
    np.testing.assert_array_equal(z, 2 * x)


def test_bf16_vector_arithmetic_is_a_compile_error():
    from k31dsl.targets.ascendc import build
    src = ('#include "kernel_operator.h"\nusing namespace AscendC;\n'
           'void f(LocalTensor<bfloat16_t> a) { Add(a, a, a, 16); }\n')
    with pytest.raises(K31Error, match="bfloat16_t has no vector arithmetic on A2/A3; Cast to float first"):
        build.build(src, name="bf16_add")


# ---------------------------------------------------------------- Cast, reductions, Compare/Select
@pytest.fixture(scope="module")
def ops():
    return _lib("ops_ok")


NONE, RINT, FLOOR, CEIL, ROUND, TRUNC, ODD = range(7)


def _neighbours16(bits: np.ndarray, up: bool) -> np.ndarray:
    """Next 16-bit float pattern toward +inf (up) or -inf, for finite non-NaN inputs."""
    b = bits.astype(np.int32)
    neg = (b & 0x8000) != 0
    zero = (b & 0x7FFF) == 0
    if up:
        out = np.where(neg, b - 1, b + 1)
        out = np.where(zero, 0x0001, out)
    else:
        out = np.where(neg, b + 1, b - 1)
        out = np.where(zero, 0x8001, out)
    return out.astype(np.uint16)


def _round16(x: np.ndarray, dt, mode: int) -> np.ndarray:
    """Reference narrowing float32 -> 16-bit float with an AscendC round mode, written from the
    definitions: take the nearest-even result, find the two representable neighbours of x, pick."""
    rne = x.astype(dt)
    if mode in (NONE, RINT):
        return rne.view(np.uint16)
    bits = rne.view(np.uint16)
    v = rne.astype(np.float64)
    xd = x.astype(np.float64)
    exact = v == xd
    lo_b = np.where(v < xd, bits, _neighbours16(bits, up=False))
    hi_b = np.where(v > xd, bits, _neighbours16(bits, up=True))
    lo = lo_b.view(dt).astype(np.float64)
    hi = hi_b.view(dt).astype(np.float64)
    if mode == FLOOR:
        pick = lo_b
    elif mode == CEIL:
        pick = hi_b
    elif mode == TRUNC:
        pick = np.where(np.abs(lo) < np.abs(hi), lo_b, hi_b)
    elif mode == ROUND:
        dlo, dhi = xd - lo, hi - xd
        away = np.where(np.abs(lo) > np.abs(hi), lo_b, hi_b)
        pick = np.where(dlo < dhi, lo_b, np.where(dhi < dlo, hi_b, away))
    else:  # ODD
        pick = np.where(lo_b & 1, lo_b, hi_b)
    return np.where(exact, bits, pick).astype(np.uint16)


def _float_inputs(rng, dt, n):
    """Random float32 values in dt's range: plain values, exact ties between neighbours of dt,
    tiny (subnormal) values, exact values, signed zeros."""
    import ml_dtypes
    info = ml_dtypes.finfo(dt)
    plain = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 14, n))).astype(np.float32)
    base = rng.standard_normal(n).astype(np.float32).astype(dt)
    nxt = _neighbours16(base.view(np.uint16), up=True).view(dt)
    ties = ((base.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)
    tiny = (rng.standard_normal(n // 4) * float(info.smallest_subnormal) * 50).astype(np.float32)
    x = np.concatenate([plain, ties, tiny, base.astype(np.float32), np.float32([0.0, -0.0, 1.0, -2.5])])
    return x[np.abs(x) < float(info.max) / 2]


@pytest.mark.parametrize("dst", ["bf16", "half"])
@pytest.mark.parametrize("mode", [NONE, RINT, FLOOR, CEIL, ROUND, TRUNC, ODD])
def test_cast_f32_to_16bit_round_modes(ops, dst, mode):
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dst == "bf16" else np.float16
    rng = np.random.default_rng(100 + mode)
    x = _float_inputs(rng, dt, 3000)
    out = np.zeros(x.size, np.uint16)
    _call(ops, "run_cast", 0 if dst == "bf16" else 1, mode, x.size, x, out)
    want = _round16(x, dt, mode)
    bad = np.nonzero(out != want)[0]
    assert bad.size == 0, f"{bad.size} mismatches, e.g. x={x[bad[:3]]!r} got={out[bad[:3]]} want={want[bad[:3]]}"


@pytest.mark.parametrize("dst", ["bf16", "half"])
def test_cast_f32_to_16bit_overflow_and_nan(ops, dst):
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dst == "bf16" else np.float16
    big = float(ml_dtypes.finfo(dt).max)
    with np.errstate(over="ignore"):
        x = np.float32([big * 1.001, -big * 1.001, big * 4, np.inf, -np.inf, np.nan, 3e38, -3e38])
        want = x.astype(dt)
    out = np.zeros(x.size, np.uint16)
    _call(ops, "run_cast", 0 if dst == "bf16" else 1, RINT, x.size, x, out)
    got = out.view(dt)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].astype(np.float64), want[ok].astype(np.float64))
    out_f = np.zeros(x.size, np.uint16)
    _call(ops, "run_cast", 0 if dst == "bf16" else 1, FLOOR, x.size, x, out_f)  # floor: +big -> max
    assert out_f.view(dt).astype(np.float64)[0] == big and np.isinf(out_f.view(dt).astype(np.float64)[1])


@pytest.mark.parametrize("mode", [RINT, FLOOR, CEIL, ROUND, TRUNC])
def test_cast_f32_to_int32(ops, mode):
    rng = np.random.default_rng(7 + mode)
    x = np.concatenate([(rng.standard_normal(2000) * 1000).astype(np.float32),
                        np.float32([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3e9, -3e9, np.nan, 2.0**31, -2.0**31])])
    out = np.zeros(x.size, np.int32)
    _call(ops, "run_cast", 2, mode, x.size, x, out)
    xd = x.astype(np.float64)
    r = {RINT: np.rint, FLOOR: np.floor, CEIL: np.ceil, TRUNC: np.trunc,
         ROUND: lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5)}[mode](xd)
    want = np.clip(np.nan_to_num(r, nan=0.0), -2.0**31, 2.0**31 - 1).astype(np.int64)
    np.testing.assert_array_equal(out.astype(np.int64), want)


def test_cast_widening_and_int_paths(ops):
    import ml_dtypes
    rng = np.random.default_rng(3)
    n = 2500
    b = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    out = np.zeros(n, np.float32)
    _call(ops, "run_cast", 3, NONE, n, b, out)
    np.testing.assert_array_equal(out, b.astype(np.float32))
    h = rng.standard_normal(n).astype(np.float16)
    _call(ops, "run_cast", 4, NONE, n, h, out)
    np.testing.assert_array_equal(out, h.astype(np.float32))
    i = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)
    _call(ops, "run_cast", 5, NONE, n, i, out)  # int32 -> float: nearest even
    np.testing.assert_array_equal(out, i.astype(np.float32))
    hs = (rng.standard_normal(n) * 100).astype(np.float16)
    o8 = np.zeros(n, np.int8)
    _call(ops, "run_cast", 6, TRUNC, n, hs, o8)  # half -> int8 saturates
    np.testing.assert_array_equal(o8, np.clip(np.trunc(hs.astype(np.float64)), -128, 127).astype(np.int8))
    u8 = rng.integers(0, 256, n, dtype=np.int64).astype(np.uint8)
    oh = np.zeros(n, np.float16)
    _call(ops, "run_cast", 7, NONE, n, u8, oh)
    np.testing.assert_array_equal(oh, u8.astype(np.float16))


def test_cast_odd_rejected_for_widening(ops):
    h = np.ones(16, np.float16)
    out = np.zeros(16, np.float32)
    with pytest.raises(K31Error, match="CAST_ODD applies to narrowing float casts only"):
        _call(ops, "run_cast", 4, ODD, 16, h, out)


@pytest.mark.parametrize("is_half", [0, 1])
@pytest.mark.parametrize("n", [1, 77, 4096])
def test_reduce_sum_max_min(ops, is_half, n):
    rng = np.random.default_rng(n + is_half)
    dt = np.float16 if is_half else np.float32
    x = rng.standard_normal(n).astype(dt)
    out = np.zeros(5, np.float32)
    _call(ops, "run_reduce", is_half, n, x, out)
    xd = x.astype(np.float64)
    tol = 2e-2 if is_half else 1e-5
    np.testing.assert_allclose(out[0], xd.sum(), rtol=tol, atol=tol * np.sqrt(n))
    assert out[1] == xd.max() and out[2] == np.argmax(xd)
    assert out[3] == xd.min() and out[4] == np.argmin(xd)


def test_reduce_max_propagates_nan(ops):
    x = np.float32([1, 2, np.nan, 5, 3, 4, 0, 1])
    out = np.zeros(5, np.float32)
    _call(ops, "run_reduce", 0, x.size, x, out)
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.isnan(out[3])


CMP = {"LT": np.less, "GT": np.greater, "EQ": np.equal, "LE": np.less_equal, "GE": np.greater_equal,
       "NE": np.not_equal}


@pytest.mark.parametrize("mode", list(CMP))
def test_compare_select(ops, mode):
    rng = np.random.default_rng(len(mode) * 31 + ord(mode[0]))
    n = 333
    a = rng.integers(-3, 4, n).astype(np.float32)
    b = rng.integers(-3, 4, n).astype(np.float32)
    sel = np.full(n, np.nan, np.float32)
    zer = np.full(n, np.nan, np.float32)
    mask = np.zeros(128, np.uint8)
    _call(ops, "run_cmpsel", list(CMP).index(mode), n, a, b, sel, zer, mask)
    c = CMP[mode](a, b)
    np.testing.assert_array_equal(np.unpackbits(mask, bitorder="little")[:n].astype(bool), c)
    np.testing.assert_array_equal(sel, np.where(c, a, b))
    np.testing.assert_array_equal(zer, np.where(c, a, 0.0).astype(np.float32))


@pytest.mark.parametrize("blocks,rounds", [(8, 3), (48, 2)])
def test_syncall_is_a_real_barrier(ops, blocks, rounds):
    ws = np.zeros(blocks, np.int32)
    out = np.zeros(blocks * rounds, np.int32)
    _call(ops, "run_syncall", blocks, rounds, ws, out)
    want = np.repeat([(r + 1) * blocks * (blocks + 1) // 2 for r in range(rounds)], blocks)
    np.testing.assert_array_equal(out, want)


def test_syncall_needs_resident_blocks(ops):
    ws = np.zeros(100, np.int32)
    out = np.zeros(100, np.int32)
    with pytest.raises(K31Error, match="SyncAll needs every block running at once"):
        _call(ops, "run_syncall", 100, 1, ws, out)


# ---------------------------------------------------------------- DataCopyPad / DataCopyParams units
def _pad_in_model(src, count, len_b, src_stride, dst_stride, left, right, is_pad, pad):
    """UB image (uint32 words) after DataCopyPad GM->UB, from the documented rules; 0xFFFFFFFF
    marks values the hardware leaves unspecified (the emulator's poison)."""
    ub = np.full(1024, np.float32(12345.0)).view(np.uint32).copy()
    sw = src.view(np.uint32)
    lb, rb = left * 4, right * 4
    row = -(-(lb + len_b + rb) // 32) * 32
    aligned = (lb + len_b + rb) % 32 == 0
    pad_w = np.float32(pad).view(np.uint32)
    for i in range(count):
        d0 = i * (row + dst_stride * 32) // 4
        s0 = i * (len_b + src_stride) // 4
        words = row // 4
        img = np.full(words, 0xFFFFFFFF, np.uint32)
        img[left:left + len_b // 4] = sw[s0:s0 + len_b // 4]
        if is_pad:
            img[:left] = pad_w
            tail_end = words if (left or right or aligned) else left + len_b // 4 + right
            img[left + len_b // 4:tail_end] = pad_w
        if not left and not right and not aligned:
            img[len_b // 4:] = sw[s0]
        ub[d0:d0 + words] = img
    return ub


@pytest.mark.parametrize("count,len_b,src_stride,dst_stride,left,right,is_pad", [
    (1, 20, 0, 0, 0, 0, 0),       # ragged: dummy = first element
    (3, 20, 8, 1, 0, 0, 1),       # GM stride in bytes, UB stride in 32-byte blocks
    (4, 36, 4, 0, 2, 1, 1),       # left/right padding with paddingValue
    (2, 32, 0, 2, 2, 6, 1),       # padded row exactly 64 B
    (2, 12, 20, 0, 1, 1, 0),      # paddings without isPad: unspecified (poison)
])
def test_datacopypad_gm_to_ub_layout(ops, count, len_b, src_stride, dst_stride, left, right, is_pad):
    import ctypes
    src = np.arange(1, 1025, dtype=np.float32)
    ub = np.zeros(1024, np.float32)
    _call(ops, "run_pad_in", count, len_b, src_stride, dst_stride, left, right, is_pad,
          ctypes.c_float(-7.0), src, ub)
    want = _pad_in_model(src, count, len_b, src_stride, dst_stride, left, right, is_pad, -7.0)
    np.testing.assert_array_equal(ub.view(np.uint32), want)


@pytest.mark.parametrize("ext,count,length,src_stride,dst_stride", [
    (1, 3, 20, 1, 12),   # DataCopyPad UB->GM: blockLen bytes, UB stride blocks, GM stride bytes
    (1, 5, 44, 0, 0),
    (0, 3, 2, 1, 3),     # DataCopyParams: everything in 32-byte blocks
])
def test_strided_copy_out(ops, ext, count, length, src_stride, dst_stride):
    src = np.arange(1, 1025, dtype=np.float32)
    gm = np.full(2048, -1.0, np.float32)
    _call(ops, "run_pad_out", ext, count, length, src_stride, dst_stride, src, gm)
    want = np.full(2048, -1.0, np.float32)
    len_b = length if ext else length * 32
    s_step = (-(-len_b // 32) * 32 + src_stride * 32) if ext else (len_b + src_stride * 32)
    d_step = (len_b + dst_stride) if ext else (len_b + dst_stride * 32)
    for i in range(count):
        want[i * d_step // 4:(i * d_step + len_b) // 4] = src[i * s_step // 4:(i * s_step + len_b) // 4]
    np.testing.assert_array_equal(gm, want)


# ---------------------------------------------------------------- build.py
TINY = ('#include "kernel_operator.h"\n'
        'extern "C" int run_tiny(GM_ADDR out) { return k31emu::Launch(2, [&] {\n'
        '  AscendC::GlobalTensor<int32_t> g; g.SetGlobalBuffer((__gm__ int32_t*)out, 2);\n'
        '  g.SetValue(AscendC::GetBlockIdx(), 10 + AscendC::GetBlockIdx()); }); }\n')


def test_build_cache_rebuilds_corrupt_library(tmp_path, monkeypatch):
    from k31dsl.targets.ascendc import build
    monkeypatch.setenv("K31_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_loaded", {})
    lib = build.build(TINY, name="tiny", extra_flags=("-O0",))
    out = np.zeros(2, np.int32)
    build.call(lib, "run_tiny", out)
    assert out.tolist() == [10, 11]
    (so,) = (tmp_path / "ascendc").glob("tiny-*.so")
    bad = so.with_suffix(".tmp")  # a new inode: the loaded mapping must not change under us
    bad.write_bytes(so.read_bytes()[:100])
    bad.replace(so)  # as if a crash had left a truncated file
    monkeypatch.setattr(build, "_loaded", {})
    lib2 = build.build(TINY, name="tiny", extra_flags=("-O0",))
    assert so.stat().st_size > 100
    out[:] = 0
    build.call(lib2, "run_tiny", out)
    assert out.tolist() == [10, 11]


def test_build_compile_error_shows_diagnostics(tmp_path, monkeypatch):
    from k31dsl.targets.ascendc import build
    monkeypatch.setenv("K31_CACHE_DIR", str(tmp_path))
    src = '#include "kernel_operator.h"\nvoid f() { AscendC::NoSuchApi(1); }\n'
    with pytest.raises(K31Error) as err:
        build.build(src, name="broken")
    msg = str(err.value)
    assert "g++ could not compile" in msg and "NoSuchApi" in msg and "broken-" in msg


def test_sync_noops_and_constants(vec):
    out = np.zeros(128, np.float32)
    _call(vec, "run_sync_noops", out)
    np.testing.assert_array_equal(out, np.repeat([1.0, 2.0], 64).astype(np.float32))


@pytest.mark.parametrize("out", ["bf16", "half"])
def test_cube_fixpipe_converts_and_relus(cube, out):
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if out == "bf16" else np.float16
    m, n, k = 29, 40, 50
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    c = np.zeros((m, n), dt)
    _call(cube, f"run_mm_{out}_out", 2, a, b, c, m, n, k, 32, 32, 32, 0)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if out == "bf16":
        ref = np.maximum(ref, 0.0)  # reluEn
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
    if out == "bf16":
        assert (c.astype(np.float32) >= 0).all() and (ref > 0.5).any()


def test_cube_int8_matmul_exact(cube):
    m, n, k = 21, 35, 77
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    c = np.zeros((m, n), np.int32)
    _call(cube, "run_mm_i8", 2, a, np.ascontiguousarray(b.T), c, m, n, k, 32, 32, 64, 1)
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


def test_build_concurrent_processes_share_one_library(tmp_path):
    """Several processes building the same source at once all get a loadable library (one
    build under the cache's lock, atomic rename, the others reuse it)."""
    import os
    import subprocess
    import sys
    prog = ("import sys, numpy as np\n"
            "from k31dsl.targets.ascendc import build\n"
            f"lib = build.build({TINY!r}, name='tiny', extra_flags=('-O0',))\n"
            "out = np.zeros(2, np.int32); build.call(lib, 'run_tiny', out)\n"
            "assert out.tolist() == [10, 11], out\n")
    env = {**os.environ, "K31_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", prog], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert len(list((tmp_path / "ascendc").glob("tiny-*.so"))) == 1

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


def _lib(name: str):
    from k31dsl.targets.ascendc import build
    return build.build((CASES / f"{name}.cpp").read_text(), name=name)


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


@pytest.mark.parametrize("dtype,bT", [("half", 0), ("bf16", 0), ("half", 1), ("f32", 1)])
@pytest.mark.parametrize("m,n,k,tiles", [(37, 45, 70, (32, 32, 32)), (1, 17, 9, (16, 16, 16)), (50, 3, 129, (64, 16, 64))])
def test_cube_matmul_odd_shapes(cube, dtype, bT, m, n, k, tiles):
    import ml_dtypes
    np_dt = {"half": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((m, k)).astype(np_dt)
    b = rng.standard_normal((k, n)).astype(np_dt)
    c = np.full((m, n), np.nan, np.float32)
    b_in = np.ascontiguousarray(b.T) if bT else b
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

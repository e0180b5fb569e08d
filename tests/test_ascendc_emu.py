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

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

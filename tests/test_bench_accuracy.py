"""benchmarks/model.py's accuracy measure (`logits_error`), the figure the model's GPU check
reports, against the same quantities computed with NumPy in fp64."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def model_bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("k31_model_bench", BENCH / "model.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_error_matches_numpy(model_bench, rng, dtype):
    positions, vocab = int(rng.integers(5, 40)), int(rng.integers(3, 300))
    want = rng.standard_normal((positions, vocab))
    got = want + 1e-3 * rng.standard_normal((positions, vocab))
    flipped = np.sort(rng.choice(positions, size=int(rng.integers(1, positions)), replace=False))
    for p in flipped:                    # push the argmax elsewhere at these positions
        got[p, (want[p].argmax() + 1) % vocab] = want[p].max() + 1.0
    g, w = torch.tensor(got).to(dtype), torch.tensor(want).to(dtype)
    err = model_bench.logits_error(g, w)
    g64, w64 = g.double().numpy(), w.double().numpy()
    agree = g64.argmax(-1) == w64.argmax(-1)
    assert err["max rel"] == pytest.approx(np.abs(g64 - w64).max() / np.abs(w64).max(), rel=1e-12)
    assert err["rms rel"] == pytest.approx(np.linalg.norm(g64 - w64) / np.linalg.norm(w64), rel=1e-12)
    assert err["argmax agree"] == pytest.approx(agree.mean(), rel=1e-12)
    assert err["first argmax miss"] == int(np.flatnonzero(~agree)[0])


def test_logits_error_of_identical_logits(model_bench, rng):
    x = torch.tensor(rng.standard_normal((7, 11)))
    assert model_bench.logits_error(x, x.clone()) == {"max rel": 0.0, "rms rel": 0.0, "argmax agree": 1.0,
                                                       "first argmax miss": -1}

"""`evict=` cache hints on k.load / k.store: Triton gets the eviction policy, every target computes
the same values as without the hint, the text form keeps it, and a bad hint is a K31Error at the
user's line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.dsl.parse import parse_kernel
from k31dsl.dsl.text import print_kernel
from k31dsl.targets.triton.emit import emit


@k.kernel
def scaled_copy(x: k.Tensor[k.f32, "M", "N"], y: k.Tensor[k.f32, "M", "N"], s: k.f32,
                HINTS: k.constexpr = True, B: k.constexpr = 32):
    for m, j in k.grid(x.shape[0], k.cdiv(x.shape[1], B)):
        if HINTS:
            t = k.load(x, (m, k.span(j * B, B)), evict="first")
            k.store(y, (m, k.span(j * B, B)), t * s + 1.0, evict="last")
        else:
            y[m, k.span(j * B, B)] = x[m, k.span(j * B, B)] * s + 1.0


@pytest.mark.parametrize("target", ["numpy", "triton", "ascendc"])
def test_hinted_kernel_computes_the_same_values(target, rng):
    x = torch.from_numpy(rng.standard_normal((3, 75)).astype(np.float32))     # ragged against B
    y = torch.full_like(x, float("nan"))
    scaled_copy[target](x, y, 1.5)
    want = x.double().numpy() * 1.5 + 1.0
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6)


def test_triton_source_carries_the_eviction_policy():
    src = emit(scaled_copy.ir(), mode="gpu")
    assert 'eviction_policy="evict_first"' in src and 'eviction_policy="evict_last"' in src
    assert "eviction_policy" not in emit(scaled_copy.ir(HINTS=False), mode="gpu")


def test_text_form_keeps_the_hint():
    text = print_kernel(scaled_copy.ir())
    assert 'evict = "first"' in text and 'evict = "last"' in text
    assert print_kernel(parse_kernel(text)) == text


def test_bad_hint_names_the_line():
    @k.kernel
    def bad(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"]):
        for i in k.grid(1):
            y[k.span(0, 16)] = k.load(x, (k.span(0, 16),), evict="never")

    with pytest.raises(K31Error) as err:
        bad.ir()
    assert "test_cache_hints.py" in str(err.value) and 'evict= must be "first" or "last"' in str(err.value)

"""`while cond:` in kernels: a loop whose trip count depends on the data. The frontend builds a
`for` that carries the condition as a bool flag (attr `while`, dsl/ir.py); every target runs it
(numpy and the Triton interpreter as a Python `while`, AscendC as a C++ `for` with the flag in its
condition). Each kernel is checked against a plain-Python or fp64 NumPy reference on fresh
random, ragged inputs; the IR's text form, the verifier's rules for the flag and the code the
Triton target emits for both loop forms are checked too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.dsl.ir import all_ops
from k31dsl.dsl.parse import parse_kernel
from k31dsl.dsl.text import print_kernel
from k31dsl.dsl.verify import verify
from k31dsl.ops.dsa.topk import kth_in_tile, order_key
from k31dsl.targets.triton.emit import emit

TARGETS = ["numpy", "triton", "ascendc"]


@k.kernel
def collatz_steps(x: k.Tensor[k.i32, "N"], steps: k.Tensor[k.i32, "N"]):
    for i in k.grid(x.shape[0]):
        v = x[i]
        n = 0
        while v != 1:
            v = k.where(v % 2 == 0, v // 2, 3 * v + 1)
            n += 1
        steps[i] = n


def _collatz(v: int) -> int:
    n = 0
    while v != 1:
        v = v // 2 if v % 2 == 0 else 3 * v + 1
        n += 1
    return n


@pytest.mark.parametrize("target", TARGETS)
def test_a_scalar_loop_runs_as_many_trips_as_its_data_needs(target):
    x = torch.randint(1, 3000, (29,), dtype=torch.int32)
    x[0] = 1                                     # no trip at all
    steps = torch.full_like(x, -7)
    k.compile(collatz_steps, target=target)(x, steps)
    assert steps.tolist() == [_collatz(int(v)) for v in x]


@k.kernel
def halve_rows(x: k.Tensor[k.f32, "R", "C"], y: k.Tensor[k.f32, "R", "C"], trips: k.Tensor[k.i32, "R"],
               limit: k.f32, BC: k.constexpr = 32):
    # halve a row (a tile carried by the loop) until its sum is at most `limit`
    for r in k.grid(x.shape[0]):
        v = k.load(x, (r, k.span(0, BC)), other=0.0)
        n = 0
        while k.sum(v) > limit:
            v = v * 0.5
            n += 1
        k.store(y, (r, k.span(0, BC)), v)
        trips[r] = n


@pytest.mark.parametrize("target", TARGETS)
def test_a_tile_carried_through_a_data_dependent_loop(target):
    rows, cols, limit = 7, 23, 10.0
    # whole numbers up to 2^8: the sums are exact in fp32, so no row sits on the limit by rounding
    x = torch.randint(0, 256, (rows, cols)).float()
    x[3] = 0.0                                   # a row that never enters the loop
    y = torch.zeros_like(x)
    trips = torch.full((rows,), -1, dtype=torch.int32)
    k.compile(halve_rows, target=target)(x, y, trips, limit)
    want_y, want_n = x.double().numpy().copy(), []
    for r in range(rows):
        n = 0
        while want_y[r].sum() > limit:
            want_y[r] *= 0.5
            n += 1
        want_n.append(n)
    assert trips.tolist() == want_n
    np.testing.assert_array_equal(y.double().numpy(), want_y)


@k.kernel
def first_above(x: k.Tensor[k.f32, "R", "N"], out: k.Tensor[k.i32, "R"], limit: k.f32):
    # a linear search that stops at the first hit: two conditions joined with & (and ~ for not)
    for r in k.grid(x.shape[0]):
        i = 0
        found = False
        while (i < x.shape[1]) & ~found:
            found = x[r, i] > limit
            i += 1
        out[r] = k.where(found, i - 1, -1)


@pytest.mark.parametrize("target", TARGETS)
def test_a_search_that_stops_at_the_first_hit(target):
    x = torch.rand(6, 41)
    x[2] = 0.0                                   # no hit: the loop runs to the end of the row
    x[4, 0] = 2.0                                # a hit at the first element
    out = torch.full((6,), 99, dtype=torch.int32)
    k.compile(first_above, target=target)(x, out, 0.9)
    want = [int(np.argmax(row > 0.9)) if np.any(row > 0.9) else -1 for row in x.double().numpy()]
    assert out.tolist() == want


@k.kernel
def kth_largest(x: k.Tensor[k.f32, "R", "L"], out: k.Tensor[k.i32, "R", "3"], K: k.i32,
                BL: k.constexpr = 64):
    # the order key of each row's K-th largest score: the early-exit search after a count of the
    # valid keys, without that count, and all 32 steps
    for r in k.grid(x.shape[0]):
        o = order_key(k.load(x, (r, k.span(0, BL)), other=float("-inf")))
        out[r, 0] = kth_in_tile(o, K, True)
        out[r, 1] = kth_in_tile(o, K, True, False)
        out[r, 2] = kth_in_tile(o, K, False)


def _order_key(v: np.ndarray) -> np.ndarray:
    b = v.astype(np.float32).view(np.int32).astype(np.int64)
    o = np.where(v == 0, 0, b ^ ((b >> 31) & 0x7FFFFFFF))
    return np.where(v > -np.inf, o, -2 ** 31)


@pytest.mark.parametrize("target", TARGETS)
def test_the_top_k_search_stops_early_with_the_same_threshold(target):
    rng = np.random.default_rng()
    rows, length, kk = 9, 53, 13
    x = rng.standard_normal((rows, length)).astype(np.float32)
    x[1, :30] = 0.5                              # ties at the K-th key: no exact count, all 32 steps
    x[2, :] = -np.inf                            # fewer valid keys than K
    x[2, :5] = rng.standard_normal(5)
    x[3, [4, 9]] = [np.inf, -0.0]
    x[5, kk:] = -np.inf                          # exactly K valid keys: the smallest of them
    x[6, 7:] = np.nan                            # NaN never counts
    x[7] = -np.abs(x[7]) - 0.5                   # exactly K keys >= +0: the first step's exact count
    x[7, 20:20 + kk] = np.abs(x[7, 20:20 + kk])
    out = torch.zeros((rows, 3), dtype=torch.int32)
    k.compile(kth_largest, target=target)(torch.from_numpy(x), out, kk)
    keys = _order_key(x)
    want = [int(np.sort(row)[::-1][kk - 1]) if np.sum(row > -2 ** 31) >= kk else -2 ** 31 for row in keys]
    assert want[5] == int(keys[5, :kk].min()) and want[2] == want[6] == -2 ** 31
    assert want[7] == int(keys[7, 20:20 + kk].min())
    for col in range(3):
        assert out[:, col].tolist() == want, col


def test_the_text_form_keeps_the_flag_and_the_verifier_checks_it():
    kern = collatz_steps.ir()
    loops = [op for op in all_ops(kern) if op.name == "for"]
    assert len(loops) == 1 and loops[0].attrs == {"while": 0}
    text = print_kernel(kern)
    assert "{while = 0}" in text
    assert print_kernel(parse_kernel(text, "<t>")) == text
    verify(parse_kernel(text, "<t>"))
    for old, new, message in [("{while = 0}", "{while = 3}", "names no carried value"),
                              ("{while = 0}", "{while = 1}", "not bool"),
                              ("{while = 0}", "{stages = 2, while = 0}", "takes no `stages`")]:
        with pytest.raises(K31Error, match=message):
            verify(parse_kernel(text.replace(old, new), "<t>"))


def test_triton_emits_a_while_loop_and_a_trip_counter_only_when_needed():
    src = emit(collatz_steps.ir(), mode="gpu")
    assert "    while loop_on:" in src and "trip" not in src
    # the same loop with a real bound and its induction variable in use, as the text form allows
    text = print_kernel(collatz_steps.ir())
    text = text.replace("value = 2147483647", "value = 5").replace("%n.2 = add(%n.1, %17)", "%n.2 = add(%n.1, %trip)")
    counted = parse_kernel(text, "<t>")
    verify(counted)
    src = emit(counted, mode="gpu")
    assert "trip = tl.full([], 0, tl.int32)" in src or "trip = 0" in src
    assert "while (loop_on) & (trip < 5):" in src and "trip = trip + 1" in src
    # and it runs: at most 5 trips, n the sum of the trip numbers
    from k31dsl.targets import runtime
    want = [sum(range(min(_collatz(v), 5))) for v in (1, 6, 27, 8, 3)]
    for target in ("numpy", "triton"):
        x = torch.tensor([1, 6, 27, 8, 3], dtype=torch.int32)
        steps = torch.zeros_like(x)
        runtime(target).build(counted)(x, steps)
        assert steps.tolist() == want, target

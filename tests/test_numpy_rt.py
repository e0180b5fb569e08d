"""The numpy target's runtime helpers define the reference semantics of the IR ops that are not
one NumPy call. Each is checked here against an oracle written from the definition: C integer
division, round-to-nearest-even fp8 with saturation (decoded from the bit layout by hand), the
e8m0 scale byte (exact ceil(log2 x)), masked loads with poison, masked stores."""
from __future__ import annotations

import bisect
import math

import ml_dtypes
import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl.targets.numpy import rt

FP8 = {"f8e4m3": (4, 3, 7, ml_dtypes.float8_e4m3fn), "f8e5m2": (5, 2, 15, ml_dtypes.float8_e5m2)}


# ---------------------------------------------------------------- integer division

def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def test_idiv_imod_truncate_toward_zero():
    rng = np.random.default_rng()
    a = rng.integers(-1000, 1000, 400).astype(np.int32)
    b = rng.integers(1, 37, 400).astype(np.int32) * rng.choice([-1, 1], 400).astype(np.int32)
    a[:4], b[:4] = [-7, 7, -7, 7], [2, -2, -2, 2]
    q, r = rt.idiv(a, b), rt.imod(a, b)
    want_q = np.array([c_div(int(x), int(y)) for x, y in zip(a, b)])
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(r, a.astype(np.int64) - b.astype(np.int64) * want_q)
    assert q.dtype == np.int32 and r.dtype == np.int32
    assert rt.idiv(np.int32(-7), np.int32(2)) == -3 and rt.imod(np.int32(-7), np.int32(2)) == -1


# ---------------------------------------------------------------- fp8: RNE with saturation

def fp8_value(code: int, name: str) -> float | None:
    """Decode an fp8 byte from its bit layout (None for NaN/Inf codes)."""
    e_bits, m_bits, bias, _ = FP8[name]
    sign = -1.0 if code >> 7 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    if name == "f8e4m3" and e == 15 and m == 7:
        return None
    if name == "f8e5m2" and e == 31:
        return None
    if e == 0:
        return sign * m / (1 << m_bits) * 2.0 ** (1 - bias)
    return sign * (1 + m / (1 << m_bits)) * 2.0 ** (e - bias)


def fp8_oracle(x: float, name: str) -> int:
    """Round |x| to the nearest finite code (ties to the even code), saturate, keep the sign."""
    if math.isnan(x):
        return 0x7F
    codes = [c for c in range(0x80) if fp8_value(c, name) is not None]
    values = [fp8_value(c, name) for c in codes]
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= values[-1]:
        return sign | codes[-1]
    i = bisect.bisect_right(values, a) - 1
    lo, hi = values[i], values[i + 1]
    if a - lo < hi - a or (a - lo == hi - a and codes[i] % 2 == 0):
        return sign | codes[i]
    return sign | codes[i + 1]


def fp8_boundary_inputs(name: str) -> np.ndarray:
    values = sorted(v for c in range(0x80) if (v := fp8_value(c, name)) is not None)
    pts = []
    for lo, hi in zip(values, values[1:]):
        mid = np.float32((lo + hi) / 2)
        pts += [lo, mid, np.nextafter(mid, np.float32(-np.inf)), np.nextafter(mid, np.float32(np.inf))]
    top = values[-1]
    pts += [top, top * 1.03, top * 1.07, top * 2, 3.4e38, np.inf, values[1] / 2, values[1] / 3, 0.0]
    pts = np.array(pts, np.float32)
    return np.concatenate([pts, -pts, np.array([np.nan, -np.nan], np.float32)])


@pytest.mark.parametrize("name", sorted(FP8))
def test_to_fp8_matches_rne_oracle_at_every_boundary(name):
    x = fp8_boundary_inputs(name)
    got = rt.to_fp8(x, name).view(np.uint8)
    want = np.array([fp8_oracle(float(v), name) for v in x], np.uint8)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:8]]


@pytest.mark.parametrize("name", sorted(FP8))
def test_to_fp8_random_and_from_bf16(name):
    rng = np.random.default_rng()
    x = (rng.standard_normal(3000) * np.exp2(rng.integers(-20, 20, 3000))).astype(np.float32)
    want = np.array([fp8_oracle(float(v), name) for v in x], np.uint8)
    np.testing.assert_array_equal(rt.to_fp8(x, name).view(np.uint8), want)
    xb = x.astype(ml_dtypes.bfloat16)
    want_b = np.array([fp8_oracle(float(v), name) for v in xb.astype(np.float64)], np.uint8)
    np.testing.assert_array_equal(np.asarray(rt.cast(xb, name)).view(np.uint8), want_b)


# ---------------------------------------------------------------- e8m0: ceil(log2 x)

def e8m0_oracle(x: float) -> int:
    if math.isnan(x) or math.isinf(x):
        return 0xFF
    if x <= 0:
        return 0
    m, e = math.frexp(x)            # x = m * 2^e, 0.5 <= m < 1
    ceil_log2 = e - 1 if m == 0.5 else e
    return min(max(ceil_log2, -127), 127) + 127


def test_to_e8m0_edge_cases():
    tiny = np.float32(2.0 ** -149)
    x = np.array([0.0, -0.0, -1.0, 1.0, 2.0, 3.0, 0.75, 0.5, 1.0000001, 2.0 ** -126, 2.0 ** -127,
                  1.5 * 2.0 ** -127, 2.0 ** -127 + 2.0 ** -149, tiny, 3 * tiny, 2.0 ** 127, 1.5 * 2.0 ** 127,
                  3.4e38, np.inf, -np.inf, np.nan, 448.0, 449.0], np.float32)
    got = np.asarray(rt.to_e8m0(x)).view(np.uint8)
    want = np.array([e8m0_oracle(float(v)) for v in x], np.uint8)
    np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng()
    r = (rng.random(2000) * np.exp2(rng.integers(-140, 128, 2000))).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(rt.to_e8m0(r)).view(np.uint8),
                                  np.array([e8m0_oracle(float(v)) for v in r], np.uint8))


def test_from_e8m0_is_a_power_of_two_and_ff_is_nan():
    b = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    v = rt.from_e8m0(b)
    assert v.dtype == np.float32 and np.isnan(v[255])
    np.testing.assert_array_equal(v[:255].astype(np.float64), np.ldexp(1.0, np.arange(255) - 127))


# ---------------------------------------------------------------- other casts

def test_float_to_int_truncates_saturates_and_nonfinite_is_zero():
    x = np.array([1.9, -1.9, 3e9, -3e9, np.nan, np.inf, -np.inf, 255.5, -0.5], np.float32)
    np.testing.assert_array_equal(rt.cast(x, "i32"), [1, -1, 2 ** 31 - 1, -2 ** 31, 0, 0, 0, 255, 0])
    np.testing.assert_array_equal(rt.cast(x, "u8"), [1, 0, 255, 0, 0, 0, 0, 255, 0])


def test_int_to_int_wraps_and_bool_is_nonzero():
    x = np.array([-1, 256, 257, 127, -129], np.int32)
    np.testing.assert_array_equal(rt.cast(x, "u8"), [255, 0, 1, 127, 127])
    np.testing.assert_array_equal(rt.cast(np.array([0.0, -0.0, np.nan, 2.0], np.float32), "bool"),
                                  [False, False, True, True])


def test_low_precision_math_rounds_once_from_f32():
    rng = np.random.default_rng()
    x = rng.standard_normal(500).astype(ml_dtypes.bfloat16)
    got = rt.exp(x)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16).view(np.uint16))


def test_relu_and_maximum_propagate_nan():
    x = np.array([np.nan, -1.0, 2.0], np.float32)
    r = rt.relu(x)
    assert np.isnan(r[0]) and r[1] == 0.0 and r[2] == 2.0
    assert np.isnan(rt.relu(x.astype(ml_dtypes.bfloat16))[0])
    assert np.isnan(rt.reduce_max(x, None))


# ---------------------------------------------------------------- topk, take, cumsum

def test_topk_descending_ties_to_lower_position():
    x = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0, 3.0]], np.float32)
    v, i = rt.topk(x, 4)
    np.testing.assert_array_equal(i, [[1, 2, 5, 4]])
    np.testing.assert_array_equal(v, [[3.0, 3.0, 3.0, 2.0]])
    assert i.dtype == np.int32


def test_take_clamps_out_of_range_positions():
    x = np.array([[10, 11, 12], [20, 21, 22]], np.int32)
    np.testing.assert_array_equal(rt.take(x, np.array([[2, -1], [5, 0]])), [[12, 10], [22, 20]])


def test_cumsum_forward_and_reverse():
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(rt.cumsum(x, 1, False), [[1, 3, 6], [4, 9, 15]])
    np.testing.assert_array_equal(rt.cumsum(x, 1, True), [[6, 5, 3], [15, 11, 6]])
    np.testing.assert_array_equal(rt.cumsum(x, 0, True), [[5, 7, 9], [4, 5, 6]])


# ---------------------------------------------------------------- masked memory access

def test_load_masks_out_of_bounds_and_poisons_without_other():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = rt.load(a, ("scalar", "span:8"), (np.int32(1), np.int32(-2)), None, None)
    assert np.isnan(got[:2]).all() and np.isnan(got[6:]).all()
    np.testing.assert_array_equal(got[2:6], [4, 5, 6, 7])
    got = rt.load(a, ("scalar", "span:8"), (np.int32(1), np.int32(-2)), None, 0.5)
    np.testing.assert_array_equal(got, [0.5, 0.5, 4, 5, 6, 7, 0.5, 0.5])
    whole = rt.load(a, ("scalar", "span:4"), (np.int32(3), np.int32(0)), None, None)
    assert np.isnan(whole).all()
    ai = np.arange(6, dtype=np.int32)
    g = rt.load(ai, ("gather",), (np.array([5, -1, 6, 0], np.int32),), None, None)
    np.testing.assert_array_equal(g, [5, np.iinfo(np.int32).min, np.iinfo(np.int32).min, 0])
    au = np.arange(6, dtype=np.uint8)
    assert rt.load(au, ("gather",), (np.array([9], np.int32),), None, None)[0] == 255
    m = rt.load(ai, ("span:4",), (np.int32(0),), np.array([True, False, True, False]), -7)
    np.testing.assert_array_equal(m, [0, -7, 2, -7])
    assert got.dtype == np.float32 and g.dtype == np.int32


def test_load_fill_of_fp8_and_e8m0_converts_like_a_cast():
    s = np.full(4, 127, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    got = rt.load(s, ("span:8",), (np.int32(0),), None, 1.0)
    assert (np.asarray(got).view(np.uint8)[4:] == 127).all()
    q = np.zeros(4, np.uint8).view(ml_dtypes.float8_e4m3fn)
    got = rt.load(q, ("span:8",), (np.int32(0),), None, 1000.0)
    assert (np.asarray(got).view(np.uint8)[4:] == 0x7E).all()     # saturated to 448


def test_store_skips_masked_and_out_of_bounds_lanes():
    a = np.zeros((3, 4), np.float32)
    rt.store(a, ("scalar", "span:8"), (np.int32(2), np.int32(-3)), np.arange(8, dtype=np.float32), None)
    np.testing.assert_array_equal(a[2], [3, 4, 5, 6])
    assert not a[:2].any()
    rt.store(a, ("span:4", "scalar"), (np.int32(0), np.int32(0)), np.float32(9.0),
             np.array([True, False, True, True]))
    np.testing.assert_array_equal(a[:, 0], [9, 0, 9])
    before = a.copy()
    rt.store(a, ("scalar", "scalar"), (np.int32(5), np.int32(0)), np.float32(1.0), None)   # off the end
    rt.store(a, ("gather", "scalar"), (np.array([-1, 3], np.int32), np.int32(1)), np.float32(1.0), None)
    np.testing.assert_array_equal(a, before)


@k.kernel
def copy_no_other(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "M"], BN: k.constexpr = 16):
    for i in k.grid(1):
        y[k.span(0, BN)] = x[k.span(0, BN)] + 1.0


def test_undefined_lanes_show_as_nan_through_the_dsl():
    """A load without other= leaves its out-of-bounds lanes undefined; the reference makes them
    NaN so that a kernel relying on them shows it in its output."""
    x = torch.arange(5, dtype=torch.float32)
    y = torch.zeros(9)
    copy_no_other["numpy"](x, y)
    assert torch.equal(y[:5], x + 1) and torch.isnan(y[5:]).all()


@k.kernel
def scale_bytes(s: k.Tensor[k.e8m0, "N"], y: k.Tensor[k.f32, "N"], BN: k.constexpr = 8):
    for i in k.grid(1):
        y[k.span(0, BN)] = s[k.span(0, BN)].to(k.f32)


def test_e8m0_arguments_as_bytes_or_e8m0():
    raw = torch.tensor([127, 128, 120, 255, 0], dtype=torch.uint8)
    want = [1.0, 2.0, 2.0 ** -7, float("nan"), 2.0 ** -127]
    for s in (raw, raw.view(torch.float8_e8m0fnu), raw.numpy()):
        y = torch.zeros(5)
        scale_bytes["numpy"](s, y)
        np.testing.assert_array_equal(y.numpy(), np.array(want, np.float32))


def test_read_only_output_is_refused_before_running():
    x = torch.randn(5, requires_grad=True)            # inputs needing grad are read through detach
    out = np.broadcast_to(np.zeros(1, np.float32), (9,))
    with pytest.raises(k.K31Error, match="read-only") as info:
        copy_no_other["numpy"](x, out)
    assert info.value.hint and info.value.loc.line > 0
    y = np.zeros(9, np.float32)
    copy_no_other["numpy"](x, y)
    np.testing.assert_array_equal(y[:5], x.detach().numpy() + 1)

"""Every registered op x every target against its fp64 oracle (spec.check), the oracles against
independent references, and the public APIs' shapes, dtypes, options and input errors."""

import ml_dtypes
import numpy as np
import pytest
import torch

from k31dsl import K31Error
from k31dsl.ops import quant
from k31dsl.ops.common import rmsnorm
from k31dsl.ops.registry import all_ops
from k31dsl.ops.testing import bytes_of, load_oracle, to_f64

OPS = all_ops()
TARGETS = ["numpy", "triton", "ascendc"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_oracle(name, target):
    seed = int(np.random.SeedSequence().entropy % 2**31)      # fresh inputs each run, reported on failure
    results = OPS[name].check(target, seed)
    assert results, f"{name}: check ran no cases"
    bad = [f"{r.case}: {r.max_err} > {r.tol} {r.detail}" for r in results if not r.passed]
    assert not bad, f"{name} on {target} (seed {seed}):\n" + "\n".join(bad)


def test_registry_entries_are_complete():
    for name in ("mxfp8_quantize", "mxfp8_dequantize", "fp8_tile_quantize", "fp8_tile_dequantize", "rmsnorm"):
        spec = OPS[name]
        assert spec.kernels and callable(spec.fn) and spec.summary
        for kd in spec.kernels:
            kd.ir()                                # every kernel variant builds


# ---------------------------------------------------------------- oracles vs independent references

def _rng(seed=None):
    return np.random.default_rng(seed)


def test_oracle_e4m3_rounding_matches_ml_dtypes():
    """round_to(E4M3) + encode against ml_dtypes' RNE cast (clipped: ml_dtypes does not saturate)."""
    fp = load_oracle("fp")
    rng = _rng()
    x = np.concatenate([rng.standard_normal(20000) * np.exp2(rng.integers(-14, 10, 20000)),
                        np.arange(-480, 481, 0.25), [0.0, -0.0, 2.0 ** -10, 3 * 2.0 ** -11, 464.0, 1e30]])
    x = x.astype(np.float32).astype(np.float64)
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    got = fp.e4m3_encode(fp.round_to(x, fp.E4M3))
    assert (got == want).all(), x[got != want][:10]
    assert fp.e4m3_encode(fp.round_to(np.array([np.nan]), fp.E4M3))[0] == 0x7F
    every = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(fp.e4m3_decode(every), every.view(ml_dtypes.float8_e4m3fn).astype(np.float64))


def test_oracle_round_to_bf16_f16_f32_match_numpy():
    """round_to against NumPy / ml_dtypes casts (single roundings from float64, or from float32
    for bf16), subnormals and overflow included."""
    fp = load_oracle("fp")
    rng = _rng()
    x = rng.standard_normal(20000) * np.exp2(rng.integers(-150, 128, 20000).astype(np.float64))
    x32 = x[np.abs(x) < 3e38].astype(np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(fp.round_to(x, fp.F32), x.astype(np.float32).astype(np.float64))
        np.testing.assert_array_equal(fp.round_to(x, fp.F16), x.astype(np.float16).astype(np.float64))
        np.testing.assert_array_equal(fp.round_to(x32.astype(np.float64), fp.BF16),
                                      x32.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_oracle_mx_exponent_matches_float32_bit_trick():
    """Exact-math RCEIL / floor exponents vs the float32-bit formulas (research/dsa.md 4.7) over
    every positive normal bf16 value that keeps the exponent above the clamp."""
    ref = load_oracle("quant")
    bits = np.arange(0x0080, 0x7F80, dtype=np.uint32)             # positive normal bf16
    amax32 = (bits << 16).view(np.float32)
    b = (amax32 / np.float32(448)).view(np.uint32)
    rceil = ((b >> 23) & 0xFF).astype(np.int64) - 127 + ((b & 0x7FFFFF) != 0)
    floor = (((bits << 16) >> 23) & 0xFF).astype(np.int64) - 127 - 8
    keep = rceil > -126
    np.testing.assert_array_equal(ref.mx_exponent(amax32.astype(np.float64), "ceil")[keep], rceil[keep])
    np.testing.assert_array_equal(ref.mx_exponent(amax32.astype(np.float64), "floor"),
                                  np.clip(floor, -127, 127))


def test_oracle_mxfp8_matches_research_golden():
    """The oracle against the minimal golden of research/dsa.md 4.7 (float32 + ml_dtypes) on
    finite data with D % 32 == 0."""
    ref = load_oracle("quant")
    rng = _rng()
    x = (rng.standard_normal((16, 128)) * np.exp2(rng.integers(-10, 10, (16, 1)))).astype(np.float32)
    xs = x.reshape(-1, 32)
    amax = np.abs(xs).max(-1).astype(np.float32)
    b = (amax / np.float32(448)).astype(np.float32).view(np.uint32)
    e = np.clip(((b >> 23) & 0xFF).astype(np.int32) - 127 + ((b & 0x7FFFFF) != 0), -127, 127)
    q = np.clip(xs / np.ldexp(np.float32(1), e)[:, None], -448, 448).astype(ml_dtypes.float8_e4m3fn)
    codes, byte = ref.mxfp8_quantize(x.astype(np.float64), "ceil")
    np.testing.assert_array_equal(codes, q.view(np.uint8).reshape(x.shape))
    np.testing.assert_array_equal(byte.reshape(-1), (e + 127).astype(np.uint8))


# ---------------------------------------------------------------- public API

def test_mxfp8_api_shapes_dtypes_and_modes():
    x = torch.randn(3, 4, 70, dtype=torch.bfloat16) * 100
    c, s = quant.mxfp8_quantize(x, target="numpy")
    assert c.shape == x.shape and c.dtype == torch.float8_e4m3fn
    assert s.shape == (3, 4, 3) and s.dtype == torch.float8_e8m0fnu
    cf, sf = quant.mxfp8_quantize(x, scale_mode="floor", target="numpy")
    # ceil(log2(a/448)) = floor(log2 a) - 8 + (mantissa of a > 1.75): ceil is floor's or one more
    d = bytes_of(s).astype(int) - bytes_of(sf).astype(int)
    assert set(np.unique(d)) <= {0, 1} and (d == 1).any() and (d == 0).any()
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        y = quant.mxfp8_dequantize(c, s, dtype=dt, target="numpy")
        assert y.dtype == dt and y.shape == x.shape
    assert quant.mxfp8_dequantize(c, s, target="numpy").dtype == torch.bfloat16


def test_mxfp8_special_groups():
    x = torch.randn(4, 64)
    x[0, 5] = float("nan")
    x[1, 40] = float("-inf")
    x[2, :32] = 0
    c, s = quant.mxfp8_quantize(x, target="numpy")
    sb, cb = bytes_of(s), bytes_of(c)
    assert sb[0, 0] == 0xFF and sb[1, 1] == 0xFF and sb[2, 0] == 0
    assert (cb[0, :32] == 0x7F).all() and (cb[1, 32:] == 0x7F).all() and (cb[2, :32] == 0).all()
    y = quant.mxfp8_dequantize(c, s, torch.float32, target="numpy")
    assert torch.isnan(y[0, :32]).all() and not torch.isnan(y[0, 32:]).any()


def test_fp8_tile_api_and_pow2():
    x = torch.randn(5, 2, 300, dtype=torch.float16)
    c, s = quant.fp8_tile_quantize(x, target="numpy")
    assert c.shape == x.shape and c.dtype == torch.float8_e4m3fn
    assert s.shape == (5, 2, 3) and s.dtype == torch.float32
    c2, s2 = quant.fp8_tile_quantize(x, tile=64, pow2_scale=True, target="numpy")
    assert s2.shape == (5, 2, 5)
    m, _ = np.frexp(s2.numpy())
    assert (m == 0.5).all()                                    # powers of two
    c3, s3 = quant.fp8_tile_quantize(torch.zeros(2, 128), eps=1e-2, target="numpy")
    assert (bytes_of(c3) == 0).all() and torch.equal(s3, torch.full((2, 1), np.float32(1e-2) / np.float32(448)))
    y = quant.fp8_tile_dequantize(c2, s2, dtype=torch.float32, tile=64, target="numpy")
    assert y.dtype == torch.float32 and y.shape == x.shape


def test_rmsnorm_api():
    x = torch.randn(2, 3, 50, dtype=torch.bfloat16)
    w = torch.randn(50, dtype=torch.float32)
    y = rmsnorm(x, w, target="numpy")
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    y32 = rmsnorm(x, w, out_dtype=torch.float32, target="numpy")
    want = load_oracle("norm").rmsnorm(to_f64(x), to_f64(w), 1e-6)
    np.testing.assert_allclose(to_f64(y32), want, rtol=1e-5, atol=1e-5)
    assert rmsnorm(torch.empty(0, 50), w, target="numpy").shape == (0, 50)


def test_empty_inputs():
    c, s = quant.mxfp8_quantize(torch.empty(0, 64), target="numpy")
    assert c.shape == (0, 64) and s.shape == (0, 2)
    c, s = quant.fp8_tile_quantize(torch.empty(3, 0), target="numpy")
    assert c.shape == (3, 0) and s.shape == (3, 0)


@pytest.mark.parametrize("call, needle", [
    (lambda: quant.mxfp8_quantize(torch.randn(4, 32).to(torch.int32)), "dtype int32"),
    (lambda: quant.mxfp8_quantize(torch.randn(4, 32), scale_mode="nearest"), "scale_mode"),
    (lambda: quant.mxfp8_quantize(torch.tensor(1.0)), "at least 1 dim"),
    (lambda: quant.mxfp8_quantize([1.0, 2.0]), "torch.Tensor"),
    (lambda: quant.mxfp8_quantize(torch.randn(4, 32), target="cuda"), "unknown target"),
    (lambda: quant.mxfp8_dequantize(torch.zeros(4, 64, dtype=torch.float8_e4m3fn),
                                    torch.zeros(4, 3, dtype=torch.float8_e8m0fnu)), "[4, 2]"),
    (lambda: quant.mxfp8_dequantize(torch.zeros(4, 64), torch.zeros(4, 2, dtype=torch.float8_e8m0fnu)),
     "`codes`"),
    (lambda: quant.mxfp8_dequantize(torch.zeros(4, 64, dtype=torch.float8_e4m3fn),
                                    torch.zeros(4, 2, dtype=torch.float8_e8m0fnu), dtype=torch.int8), "dtype"),
    (lambda: quant.fp8_tile_quantize(torch.randn(4, 32), tile=100), "power of two"),
    (lambda: quant.fp8_tile_quantize(torch.randn(4, 32), eps=0.0), "eps"),
    (lambda: quant.fp8_tile_dequantize(torch.zeros(4, 256, dtype=torch.float8_e4m3fn),
                                       torch.zeros(4, 2, dtype=torch.bfloat16)), "`scales`"),
    (lambda: rmsnorm(torch.randn(4, 32), torch.randn(31)), "weight"),
    (lambda: rmsnorm(torch.randn(4, 32), torch.randn(32), eps=-1.0), "eps"),
    (lambda: rmsnorm(torch.randn(4, 32), torch.randn(32), out_dtype=torch.float64), "out_dtype"),
])
def test_bad_inputs_raise_k31error(call, needle):
    with pytest.raises(K31Error) as e:
        call()
    assert needle in str(e.value)

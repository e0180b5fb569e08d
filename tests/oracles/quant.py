"""fp64 oracles of the quantizers (k31dsl.ops.quant), from the formats' definitions.

mxfp8 (groups of 32 along the last dim, E4M3 codes, E8M0 scale byte = exponent + 127):
  ceil  (default; NVIDIA RCEIL / DeepSeek ue8m0): e = ceil(log2(amax / 448)) exactly, i.e. the
        smallest integer with amax <= 448 * 2^e; every |x| * 2^-e <= 448.
  floor (OCP MX v1.0): e = floor(log2(amax)) - 8; values in (448, 512) * 2^e saturate to 448.
  e is clamped to [-127, 127]; amax == 0 gives byte 0 (codes 0). A group holding NaN or +-Inf
  gets byte 0xFF and every code 0x7F (NaN), so the whole group dequantizes to NaN.
  codes = RNE_e4m3(x * 2^-e), saturating at +-448; the sign of zero is kept.
fp8_tile (DeepSeek per-128 tile): s = fp32(max(amax, fp32(eps)) / 448); pow2: s = 2^ceil(log2 s)
  (clamped to [2^-127, 2^127]); r = fp32(1 / s) once per tile (DeepGEMM's recipe: a multiply per
  element, not a divide); codes = RNE_e4m3(fp32(x * r)) saturating. A tile holding NaN or
  +-Inf gets s = NaN and every code 0x7F.
Dequantization: value(code) * scale, rounded once to fp32 and then to the output dtype.
"""
from __future__ import annotations

import numpy as np

from .fp import BY_NAME, E4M3, F32, e4m3_decode, e4m3_encode, e8m0_decode, round_to


def _groups(x, size: int):
    """[..., D] -> [..., G, size] zero-padded, with G = ceil(D / size)."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    g = -(-d // size)
    pad = np.zeros(x.shape[:-1] + (g * size - d,))
    return np.concatenate([x, pad], axis=-1).reshape(x.shape[:-1] + (g, size)), d


def mx_exponent(amax, mode: str) -> np.ndarray:
    """Shared exponent of finite group maxima (fp64), clamped to [-127, 127]."""
    amax = np.asarray(amax, np.float64)
    pos = amax > 0
    a = np.where(pos, amax, 1.0)
    if mode == "floor":
        _, e2 = np.frexp(a)
        e = e2 - 1 - 8                           # floor(log2 a) - emax(E4M3)
    elif mode == "ceil":
        e = np.ceil(np.log2(a / 448.0)).astype(np.int64)
        for _ in range(3):                       # make it exact: smallest e with a <= 448 * 2^e
            e = np.where(a > 448.0 * np.ldexp(1.0, e), e + 1, e)
            e = np.where(a <= 448.0 * np.ldexp(1.0, e - 1), e - 1, e)
    else:
        raise ValueError(mode)
    e = np.where(pos, e, -127)
    return np.clip(e, -127, 127).astype(np.int64)


def mxfp8_quantize(x, mode: str = "ceil"):
    """(codes uint8 [..., D], scale bytes uint8 [..., ceil(D/32)])."""
    xg, d = _groups(x, 32)
    bad = ~np.isfinite(xg).all(axis=-1)
    amax = np.where(bad, 0.0, np.abs(np.where(np.isfinite(xg), xg, 0.0)).max(axis=-1))
    e = mx_exponent(amax, mode)
    scaled = xg * np.ldexp(1.0, -e)[..., None]
    codes = e4m3_encode(round_to(np.where(bad[..., None], 0.0, scaled), E4M3))
    codes = np.where(bad[..., None], 0x7F, codes).astype(np.uint8)
    byte = np.where(bad, 255, e + 127).astype(np.uint8)
    return codes.reshape(codes.shape[:-2] + (-1,))[..., :d], byte


def mxfp8_dequantize(codes, scale_bytes, out: str = "bf16") -> np.ndarray:
    """fp64 values of the dequantized tensor after rounding to `out`."""
    codes = np.asarray(codes)
    cg, d = _groups(e4m3_decode(codes), 32)
    v = cg * e8m0_decode(scale_bytes)[..., None]
    v = v.reshape(v.shape[:-2] + (-1,))[..., :d]
    return round_to(round_to(v, F32), BY_NAME[out])


def fp8_tile_scale(amax, eps: float, pow2: bool) -> np.ndarray:
    s = round_to(np.maximum(amax, round_to(eps, F32)) / 448.0, F32)
    if pow2:
        m, e2 = np.frexp(s)
        e = np.where(m == 0.5, e2 - 1, e2)       # ceil(log2 s), exact
        s = np.ldexp(1.0, np.clip(e, -127, 127))
    return s


def fp8_tile_quantize(x, tile: int = 128, pow2: bool = False, eps: float = 1e-4):
    """(codes uint8 [..., D], fp32-valued scales fp64 [..., ceil(D/tile)], NaN for bad tiles)."""
    xg, d = _groups(x, tile)
    bad = ~np.isfinite(xg).all(axis=-1)
    amax = np.where(bad, 0.0, np.abs(np.where(np.isfinite(xg), xg, 0.0)).max(axis=-1))
    s = fp8_tile_scale(amax, eps, pow2)
    r = round_to(1.0 / s, F32)
    q = round_to(round_to(np.where(bad[..., None], 0.0, xg) * r[..., None], F32), E4M3)
    codes = np.where(bad[..., None], 0x7F, e4m3_encode(q)).astype(np.uint8)
    return codes.reshape(codes.shape[:-2] + (-1,))[..., :d], np.where(bad, np.nan, s)


def fp8_tile_dequantize(codes, scales, tile: int = 128, out: str = "bf16") -> np.ndarray:
    cg, d = _groups(e4m3_decode(codes), tile)
    v = round_to(cg * np.asarray(scales, np.float64)[..., None], F32)
    v = v.reshape(v.shape[:-2] + (-1,))[..., :d]
    return round_to(v, BY_NAME[out])

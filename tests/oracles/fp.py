"""Exact float formats in fp64: round-to-nearest-even into a format (with saturation or overflow
to infinity), and the E4M3 / E8M0 byte encodings, computed from the bit-field definitions."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Format:
    mbits: int            # stored mantissa bits
    emin: int             # exponent of the smallest normal number
    max_finite: float
    saturate: bool        # out-of-range values clamp to +-max_finite (fp8 casts) instead of +-inf


E4M3 = Format(3, -6, 448.0, True)                       # OCP float8_e4m3fn: no inf, S.1111.111 = NaN
BF16 = Format(7, -126, (2 - 2 ** -7) * 2.0 ** 127, False)
F16 = Format(10, -14, 65504.0, False)
F32 = Format(23, -126, (2 - 2 ** -23) * 2.0 ** 127, False)
BY_NAME = {"e4m3": E4M3, "bf16": BF16, "f16": F16, "f32": F32}


def round_to(x, fmt: Format) -> np.ndarray:
    """Round fp64 values to the nearest value of `fmt`, ties to even; keeps the sign of zero, NaN."""
    x = np.asarray(x, np.float64)
    ax = np.abs(x)
    finite = np.isfinite(ax) & (ax > 0)
    safe = np.where(finite, ax, 1.0)
    _, e2 = np.frexp(safe)                       # safe = m * 2**e2, m in [0.5, 1)
    exp = np.maximum(e2 - 1, fmt.emin)           # binade of the value (subnormals share emin's)
    quantum = np.ldexp(1.0, exp - fmt.mbits)     # spacing of representable values there
    r = np.rint(safe / quantum) * quantum        # np.rint rounds half to even; the division is exact
    big = fmt.max_finite if fmt.saturate else np.inf
    r = np.where(r > fmt.max_finite, big, r)
    r = np.where(np.isinf(ax), big, r)
    r = np.where(ax == 0, 0.0, r)
    r = np.where(np.isnan(x), np.nan, r)
    return np.copysign(r, x)


def e4m3_encode(v) -> np.ndarray:
    """Bytes of values already representable in E4M3 (as produced by round_to(., E4M3)); NaN -> 0x7F."""
    v = np.asarray(v, np.float64)
    nan = np.isnan(v)
    av = np.where(nan, 0.0, np.abs(v))
    _, e2 = np.frexp(np.where(av > 0, av, 1.0))
    e = e2 - 1
    sub = av < 2.0 ** -6
    exp_field = np.where(sub, 0, e + 7)
    man = np.where(sub, av / 2.0 ** -9, (av / np.ldexp(1.0, e) - 1) * 8)
    if not np.all(man == np.round(man)) or np.any(av > 448):
        raise ValueError("e4m3_encode: value not representable in E4M3")
    byte = (np.signbit(v).astype(np.int64) << 7) | (exp_field.astype(np.int64) << 3) | man.astype(np.int64)
    return np.where(nan, 0x7F, byte).astype(np.uint8)


def e4m3_decode(b) -> np.ndarray:
    """fp64 values of E4M3 bytes (0x7F / 0xFF -> NaN)."""
    b = np.asarray(b).astype(np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    ef, mf = (b >> 3) & 0xF, b & 0x7
    mag = np.where(ef == 0, mf * 2.0 ** -9, (1 + mf / 8) * np.ldexp(1.0, ef - 7))
    return np.where((ef == 15) & (mf == 7), np.nan, s * mag)


def e8m0_decode(b) -> np.ndarray:
    """2**(byte - 127); 0xFF -> NaN."""
    b = np.asarray(b).astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


def f32_bits(v) -> np.ndarray:
    """uint32 bit patterns of fp64 values that are representable in fp32 (NaN canonical)."""
    return np.asarray(v, np.float64).astype(np.float32).view(np.uint32)

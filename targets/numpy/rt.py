"""Runtime helpers the generated NumPy modules call. These define the reference semantics of the
IR ops that are not one NumPy call: masked tile access, integer division, fp8/e8m0 casts,
top-k, and float math on 16-bit types (computed in float32, rounded back)."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

from k31dsl.dsl import dtypes as D

DT = {d.name: np.dtype(D.numpy_dtype(d)).type for d in D.ALL}
DT["bool"] = np.bool_
F32 = np.float32
_LOW_FLOATS = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def grid(*extents):
    """Program ids in launch order (scalars for a 1-D grid, tuples otherwise)."""
    ids = itertools.product(*(range(int(e)) for e in extents))
    if len(extents) == 1:
        return (np.int32(i[0]) for i in ids)
    return (tuple(np.int32(x) for x in i) for i in ids)


# ------------------------------------------------------------------ memory

def _poison(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return True
    if dtype.kind in "iu":
        return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max
    return np.array(np.nan, np.float32).astype(dtype)   # floats, fp8, e8m0: NaN


def _lane_indices(arr, kinds, idx):
    """Per-axis index arrays laid out on the result axes, and the in-bounds mask."""
    n_tile = sum(k != "scalar" for k in kinds)
    ixs, valid, r = [], np.bool_(True), 0
    shape = []
    for axis, (kind, v) in enumerate(zip(kinds, idx)):
        if kind == "scalar":
            ix = np.int64(v)
        else:
            if kind == "gather":
                ix = np.asarray(v).astype(np.int64)
            else:
                ix = np.int64(v) + np.arange(int(kind[5:]), dtype=np.int64)
            shape.append(ix.shape[0])
            ix = ix.reshape((1,) * r + (ix.shape[0],) + (1,) * (n_tile - r - 1))
            r += 1
        ok = (ix >= 0) & (ix < arr.shape[axis])
        valid = valid & ok
        ixs.append(np.where(ok, ix, 0))
    return ixs, np.broadcast_to(valid, tuple(shape)), tuple(shape)


def _fill(other, dtype):
    """`other=` converted like a cast to the tensor's dtype (e8m0: ceil log2, fp8: saturating)."""
    name = D.from_numpy(dtype).name
    src = np.array(other, np.float32 if isinstance(other, float) else np.int64)
    return np.asarray(cast(src, name)).astype(dtype)


def load(arr, kinds, idx, mask, other):
    ixs, valid, shape = _lane_indices(arr, kinds, idx)
    if mask is not None:
        valid = valid & np.broadcast_to(mask, shape)
    fill = np.array(_poison(arr.dtype)).astype(arr.dtype) if other is None else _fill(other, arr.dtype)
    if arr.size == 0 or not valid.any():
        return np.full(shape, fill, dtype=arr.dtype)[()]
    vals = np.broadcast_to(arr[tuple(ixs)], shape)
    return np.where(valid, vals, fill).astype(arr.dtype)[()]


def store(arr, kinds, idx, value, mask):
    ixs, valid, shape = _lane_indices(arr, kinds, idx)
    if mask is not None:
        valid = valid & np.broadcast_to(mask, shape)
    if not valid.any():
        return
    value = np.broadcast_to(np.asarray(value), shape)
    full = [np.broadcast_to(ix, shape)[valid] for ix in ixs]
    arr[tuple(full)] = value[valid]


# ------------------------------------------------------------------ arithmetic

def idiv(a, b):
    """Integer division truncating toward zero (C, Triton); x // 0 gives 0 here (undefined on
    compiled targets)."""
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
    return (q + fix.astype(q.dtype))[()]


def imod(a, b):
    """Remainder with the sign of the dividend (C, Triton)."""
    return np.fmod(a, b)[()]


def _float_op(f):
    def g(x):
        x = np.asarray(x)
        if x.dtype in _LOW_FLOATS:
            return f(x.astype(F32)).astype(x.dtype)[()]
        return f(x)[()]
    return g


exp = _float_op(np.exp)
exp2 = _float_op(np.exp2)
log = _float_op(np.log)
log2 = _float_op(np.log2)
sqrt = _float_op(np.sqrt)
floor = _float_op(np.floor)
ceil = _float_op(np.ceil)
rsqrt = _float_op(lambda x: (np.array(1, x.dtype) / np.sqrt(x)))
sigmoid = _float_op(lambda x: (np.array(1, x.dtype) / (np.array(1, x.dtype) + np.exp(-x))))
softplus = _float_op(lambda x: np.logaddexp(np.array(0, x.dtype), x))


def relu(x):
    """maximum(x, 0): NaN stays NaN (like maximum and torch.relu)."""
    x = np.asarray(x)
    return np.maximum(x, np.zeros((), x.dtype))[()]


def where(c, a, b):
    return np.where(c, a, b)[()]


def full(shape, value, dt):
    return np.full(shape, value, dtype=dt)


def broadcast(x, shape):
    return np.broadcast_to(x, shape).copy()


def cat(a, b):
    return np.concatenate([a, b])


def take(x, i):
    x = np.asarray(x)
    i = np.clip(np.asarray(i).astype(np.int64), 0, x.shape[-1] - 1)
    return np.take_along_axis(x, i, axis=-1)


def dot(a, b):
    return (np.asarray(a).astype(F32) @ np.asarray(b).astype(F32)).astype(F32)


def _reduce(f):
    def g(x, axis):
        x = np.asarray(x)
        if x.dtype in _LOW_FLOATS:
            return f(x.astype(F32), axis=axis).astype(x.dtype)[()]
        return np.asarray(f(x, axis=axis)).astype(x.dtype)[()]
    return g


reduce_sum = _reduce(np.sum)
reduce_max = _reduce(np.max)
reduce_min = _reduce(np.min)


def histogram(x, bins):
    x = np.asarray(x).astype(np.int64)
    return np.bincount(x[(x >= 0) & (x < bins)], minlength=bins).astype(np.int32)


def cumsum(x, axis, reverse):
    x = np.asarray(x)
    acc = x.astype(F32) if x.dtype in _LOW_FLOATS else x
    if reverse:
        out = np.flip(np.cumsum(np.flip(acc, axis), axis=axis, dtype=acc.dtype), axis)
    else:
        out = np.cumsum(acc, axis=axis, dtype=acc.dtype)
    return out.astype(x.dtype)


def topk(x, n):
    """Largest n along the last axis, descending; ties go to the lower position."""
    x = np.asarray(x)
    key = ~x if x.dtype.kind == "i" else -x.astype(np.float64)     # ~x: exact order reversal of ints
    order = np.argsort(key, axis=-1, kind="stable")[..., :n]
    return np.take_along_axis(x, order, axis=-1), order.astype(np.int32)


# ------------------------------------------------------------------ casts

def _canonical_nan(codes: np.ndarray, src: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(src), np.uint8(0x7F), codes)


def to_fp8(x, name: str):
    """Saturating, round-to-nearest-even conversion; NaN -> 0x7F."""
    x32 = np.asarray(x).astype(F32)
    bound = F32(D.from_name(name).max_finite)
    clipped = np.clip(x32, -bound, bound)
    codes = clipped.astype(D.numpy_dtype(D.from_name(name))).view(np.uint8)
    return _canonical_nan(codes, x32).view(D.numpy_dtype(D.from_name(name)))


def to_e8m0(x):
    """Exact ceil(log2(x)) clamped to [-127, 127], as the biased byte; NaN/Inf -> 0xFF; x <= 0 -> 0."""
    x32 = np.asarray(x).astype(F32)
    bits = x32.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    man = (bits & 0x7FFFFF).astype(np.int32)
    normal = exp - 127 + (man != 0)
    sub = np.where(man > 0x400000, -126, -127)
    e = np.where(exp == 0, sub, normal)
    byte = np.clip(e, -127, 127) + 127
    byte = np.where(x32 <= 0, 0, byte)
    byte = np.where(~np.isfinite(x32), 255, byte).astype(np.uint8)
    return byte.view(ml_dtypes.float8_e8m0fnu)[()]


def from_e8m0(b):
    byte = np.asarray(b).view(np.uint8).astype(np.int32)
    out = np.ldexp(F32(1), np.minimum(byte, 254) - 127).astype(F32)
    return np.where(byte == 255, F32(np.nan), out).astype(F32)[()]


def cast(x, to: str):
    x = np.asarray(x)
    src = D.from_numpy(x.dtype)
    dst = D.from_name(to)
    if src is D.e8m0:
        out = from_e8m0(x)
        return out.astype(D.numpy_dtype(dst))[()] if dst is not D.f32 else out
    if dst.kind == "fp8":
        return to_fp8(x, to)[()]
    if dst is D.e8m0:
        return to_e8m0(x)
    if dst is D.bool_:
        return (x != 0)[()]
    if dst.is_int and (src.is_float or src.kind == "fp8"):
        t = np.trunc(x.astype(np.float64))
        npdt = D.numpy_dtype(dst)
        info = np.iinfo(npdt)
        # the bounds compared as floats, the saturated values set as integers: float(2^63 - 1)
        # rounds up to 2^63, which clipping in float64 and converting would turn into -2^63
        finite = np.isfinite(t)
        high, low = finite & (t >= float(info.max)), finite & (t <= float(info.min))
        inside = np.where(finite & ~high & ~low, t, 0).astype(npdt)
        return np.where(high, npdt(info.max), np.where(low, npdt(info.min), inside)).astype(npdt)[()]
    if src.kind == "fp8" or (src in (D.bf16, D.f16) and dst.is_float):
        return x.astype(F32).astype(D.numpy_dtype(dst))[()]
    return x.astype(D.numpy_dtype(dst))[()]


def bitcast(x, dt):
    return np.asarray(x).view(dt)[()]

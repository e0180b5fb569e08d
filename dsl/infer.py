"""Result-type rules per op, as a table. The frontend uses them to type what it builds; the
verifier re-runs them on every op after a pass. A rule raises `TypeRuleError` with a message
and a hint; callers attach the source location."""
from __future__ import annotations

from typing import Any, Callable

from . import dtypes as D
from .ir import (BINARY, COMPARE, FLOAT_ONLY_UNARY, INT_ONLY_BINARY, REDUCE, UNARY, TensorType,
                 TileType, parse_index_kind)


class TypeRuleError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], what: str = "operands"):
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise TypeRuleError(f"shape mismatch between {what}: {list(a)} and {list(b)}",
                                "use x[:, None] / x[None, :] or k.broadcast_to to line the axes up")
    return tuple(reversed(out))


def _tile(t, what: str) -> TileType:
    if not isinstance(t, TileType):
        raise TypeRuleError(f"{what} must be a tile or scalar, got a tensor parameter",
                            "load a tile from it first, e.g. x[i, k.span(0, BLOCK)]")
    return t


def _no_storage_math(t: TileType, opname: str):
    if t.dtype.is_storage_only:
        raise TypeRuleError(f"`{opname}` on a {t.dtype.name} value: fp8 and e8m0 values are "
                            "storage formats", "convert first, e.g. v.to(k.f32)")


def _binary(name):
    def rule(ts, attrs):
        a, b = _tile(ts[0], "left operand"), _tile(ts[1], "right operand")
        _no_storage_math(a, name)
        _no_storage_math(b, name)
        if a.dtype is not b.dtype:
            raise TypeRuleError(f"dtype mismatch in `{name}`: {a.dtype.name} and {b.dtype.name}",
                                "cast one side explicitly with .to(k.<dtype>)")
        if name in INT_ONLY_BINARY and not (a.dtype.is_int or a.dtype is D.bool_):
            raise TypeRuleError(f"`{name}` needs integer or bool operands, got {a.dtype.name}",
                                "use .bitcast(k.i32) to work on the bits of a float")
        if name in ("floordiv", "mod") and a.dtype.kind == "bool":
            raise TypeRuleError(f"`{name}` on bool values", "cast the masks with .to(k.i32) first")
        if name == "floordiv" and a.dtype.is_float:
            raise TypeRuleError(f"`//` on {a.dtype.name} values",
                                "`//` is integer division (truncating); for floats write k.floor(a / b)")
        shape = broadcast_shapes(a.shape, b.shape, f"the operands of `{name}`")
        return [TileType(D.bool_ if name in COMPARE else a.dtype, shape)]
    return rule


def _unary(name):
    def rule(ts, attrs):
        x = _tile(ts[0], "operand")
        _no_storage_math(x, name)
        if name in FLOAT_ONLY_UNARY and not x.dtype.is_float:
            raise TypeRuleError(f"`k.{name}` needs a float operand, got {x.dtype.name}",
                                "cast first, e.g. x.to(k.f32)")
        if name == "not" and not (x.dtype is D.bool_ or x.dtype.is_int):
            raise TypeRuleError(f"`~` needs a bool or integer operand, got {x.dtype.name}",
                                "negate floats with `-x`; invert masks built from comparisons")
        if name in ("neg", "abs", "relu") and x.dtype is D.bool_:
            raise TypeRuleError(f"`{name}` on a bool value", "use ~mask, or cast with .to(k.i32)")
        return [x]
    return rule


def _const(ts, attrs):
    return [TileType(attrs["dtype"], ())]


def _dim(ts, attrs):
    t = ts[0]
    if not isinstance(t, TensorType):
        raise TypeRuleError("`.shape` is only defined on tensor parameters", "tiles know their shape statically")
    if not 0 <= attrs["axis"] < t.rank:
        raise TypeRuleError(f"shape index {attrs['axis']} out of range for a rank-{t.rank} tensor",
                            f"use 0 .. {t.rank - 1}")
    return [TileType(D.i32, ())]


def _arange(ts, attrs):
    return [TileType(D.i32, (attrs["size"],))]


def _full(ts, attrs):
    return [TileType(attrs["dtype"], tuple(attrs["shape"]))]


def index_result_shape(tensor: TensorType, idx_types: list, kinds: list[str]) -> tuple[int, ...]:
    if len(kinds) != tensor.rank:
        raise TypeRuleError(f"a rank-{tensor.rank} tensor needs {tensor.rank} indices, got {len(kinds)}",
                            "give one index per axis: an integer, a k.span(start, size) or an index tile")
    shape = []
    for kind, t in zip(kinds, idx_types):
        k, size = parse_index_kind(kind)
        t = _tile(t, "an index")
        if not t.dtype.is_int:
            raise TypeRuleError(f"indices must be integers, got {t.dtype.name}", "cast with .to(k.i32)")
        if k in ("scalar", "span"):
            if not t.is_scalar:
                raise TypeRuleError("a scalar index or span start must be a scalar, got a "
                                    f"{list(t.shape)} tile", "use an index tile without k.span for gathers")
            if k == "span":
                shape.append(size)
        elif k == "gather":
            if len(t.shape) != 1:
                raise TypeRuleError(f"a gather index tile must be 1-D, got shape {list(t.shape)}",
                                "gather one axis at a time, or k.reshape the index tile to 1-D")
            shape.append(t.shape[0])
        else:
            raise TypeRuleError(f"unknown index kind {kind!r}", "index kinds are scalar, span:N and gather")
    return tuple(shape)


def _split_access(ts, attrs, has_value: bool):
    n_idx = len(attrs["index"])
    tensor = ts[0]
    if not isinstance(tensor, TensorType):
        raise TypeRuleError("loads and stores go through a tensor parameter",
                            "index a kernel parameter annotated k.Tensor[...]")
    idx = ts[1:1 + n_idx]
    rest = ts[1 + n_idx:]
    value = rest[0] if has_value else None
    mask = rest[1 if has_value else 0] if attrs.get("mask") else None
    return tensor, idx, value, mask


def _check_mask(mask, shape):
    if mask is None:
        return
    mask = _tile(mask, "mask")
    if mask.dtype is not D.bool_:
        raise TypeRuleError(f"mask must be bool, got {mask.dtype.name}", "build it from a comparison")
    if broadcast_shapes(mask.shape, shape, "mask and tile") != tuple(shape):
        raise TypeRuleError(f"mask of shape {list(mask.shape)} does not fit a {list(shape)} tile",
                            "build the mask with the tile's shape, using [:, None] / [None, :] to line axes up")


def _load(ts, attrs):
    tensor, idx, _, mask = _split_access(ts, attrs, False)
    shape = index_result_shape(tensor, idx, attrs["index"])
    _check_mask(mask, shape)
    return [TileType(tensor.dtype, shape)]


def _store(ts, attrs):
    tensor, idx, value, mask = _split_access(ts, attrs, True)
    shape = index_result_shape(tensor, idx, attrs["index"])
    value = _tile(value, "stored value")
    if value.dtype is not tensor.dtype:
        raise TypeRuleError(f"storing a {value.dtype.name} value into a {tensor.dtype.name} tensor",
                            f"cast it: (...).to(k.{tensor.dtype.name})")
    if broadcast_shapes(value.shape, shape, "stored value and destination") != shape:
        raise TypeRuleError(f"stored value of shape {list(value.shape)} does not fit the destination {list(shape)}",
                            "the subscript's spans/index tiles decide the destination shape; make them match")
    _check_mask(mask, shape)
    return []


def _where(ts, attrs):
    c, a, b = (_tile(t, "operand") for t in ts)
    if c.dtype is not D.bool_:
        raise TypeRuleError(f"k.where condition must be bool, got {c.dtype.name}",
                            "build it from a comparison, e.g. k.where(x > 0.0, x, 0.0)")
    if a.dtype is not b.dtype:
        raise TypeRuleError(f"k.where branches differ in dtype: {a.dtype.name} and {b.dtype.name}",
                            "cast one branch with .to(...)")
    shape = broadcast_shapes(broadcast_shapes(c.shape, a.shape, "k.where operands"), b.shape, "k.where operands")
    return [TileType(a.dtype, shape)]


def _cast(ts, attrs):
    x = _tile(ts[0], "operand")
    to = attrs["dtype"]
    if to is D.e8m0 and not (x.dtype.is_float or x.dtype is D.e8m0):
        raise TypeRuleError(f"only floats convert to e8m0, got {x.dtype.name}",
                            "to build a scale byte from an exponent use (e + 127).to(k.u8).bitcast(k.e8m0)")
    if x.dtype.is_storage_only and not (to.is_float or to is x.dtype):
        raise TypeRuleError(f"{x.dtype.name} converts only to float types, not {to.name}",
                            "use .bitcast(k.u8) to get the byte")
    return [TileType(to, x.shape)]


def _bitcast(ts, attrs):
    x = _tile(ts[0], "operand")
    to = attrs["dtype"]
    if x.dtype.bits != to.bits or to is D.bool_ or x.dtype is D.bool_:
        raise TypeRuleError(f"bitcast needs equal widths: {x.dtype.name} is {x.dtype.bits} bits, "
                            f"{to.name} is {to.bits}", "bitcast between types of the same width "
                            "(f32<->i32, bf16<->i16 is not a dtype: use .to() for value conversions)")
    return [TileType(to, x.shape)]


def _axis(x: TileType, axis, what: str):
    if axis is None:
        return None
    if not -len(x.shape) <= axis < len(x.shape):
        raise TypeRuleError(f"{what}: axis {axis} out of range for shape {list(x.shape)}",
                            f"axes of this tile are 0 .. {len(x.shape) - 1} (or negative from the end)")
    return axis % len(x.shape)


def _reduce(name):
    def rule(ts, attrs):
        x = _tile(ts[0], "operand")
        _no_storage_math(x, f"k.{name}")
        if x.dtype is D.bool_:
            raise TypeRuleError(f"k.{name} of a bool tile", "cast the mask first: k.{name}(m.to(k.i32))")
        ax = _axis(x, attrs.get("axis"), f"k.{name}")
        if ax is None:
            return [TileType(x.dtype, ())]
        return [TileType(x.dtype, x.shape[:ax] + x.shape[ax + 1:])]
    return rule


def _cumsum(ts, attrs):
    x = _tile(ts[0], "operand")
    _no_storage_math(x, "k.cumsum")
    if x.is_scalar:
        raise TypeRuleError("k.cumsum needs a tile, got a scalar", "cumsum runs along an axis of a tile")
    if x.dtype is D.bool_:
        raise TypeRuleError("k.cumsum of a bool tile", "cast the mask first: k.cumsum(m.to(k.i32))")
    _axis(x, attrs["axis"], "k.cumsum")
    return [x]


def _histogram(ts, attrs):
    x = _tile(ts[0], "k.histogram operand")
    if len(x.shape) != 1 or not x.dtype.is_int or x.dtype is D.bool_:
        raise TypeRuleError(f"k.histogram needs a 1-D integer tile, got {x.dtype.name}{list(x.shape)}",
                            "k.reshape to one axis and cast with .to(k.i32)")
    if not (isinstance(attrs["bins"], int) and attrs["bins"] >= 1):
        raise TypeRuleError(f"k.histogram bins={attrs['bins']!r} must be an int >= 1", "bins is a static int")
    return [TileType(D.i32, (attrs["bins"],))]


def _dot(ts, attrs):
    a, b = _tile(ts[0], "k.dot left operand"), _tile(ts[1], "k.dot right operand")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise TypeRuleError(f"k.dot needs 2-D tiles, got {list(a.shape)} @ {list(b.shape)}",
                            "expand a vector with v[None, :] or v[:, None]")
    if a.shape[1] != b.shape[0]:
        raise TypeRuleError(f"k.dot inner dimensions differ: {list(a.shape)} @ {list(b.shape)}",
                            "transpose one operand with .T if it is stored the other way round")
    if a.dtype is not b.dtype:
        raise TypeRuleError(f"k.dot operand dtypes differ: {a.dtype.name} and {b.dtype.name}",
                            "cast both operands to the same dtype (bf16 or f32)")
    if not (a.dtype.is_float or a.dtype.kind == "fp8"):
        raise TypeRuleError(f"k.dot needs float operands, got {a.dtype.name}", "cast both with .to(k.f32)")
    return [TileType(D.f32, (a.shape[0], b.shape[1]))]


def _topk(ts, attrs):
    x = _tile(ts[0], "k.topk operand")
    if x.is_scalar or len(x.shape) > 2:
        raise TypeRuleError(f"k.topk works on 1-D or 2-D tiles, got shape {list(x.shape)}",
                            "k.reshape to [rows, length] first")
    if not (x.dtype is D.f32 or x.dtype is D.i32 or x.dtype is D.i64):
        raise TypeRuleError(f"k.topk needs f32, i32 or i64 values, got {x.dtype.name}", "cast to k.f32")
    n = attrs["n"]
    if not 1 <= n <= x.shape[-1]:
        raise TypeRuleError(f"k.topk n={n} must be between 1 and the tile length {x.shape[-1]}",
                            "pad the tile (masked span with other=float('-inf')) to at least n lanes")
    shape = x.shape[:-1] + (n,)
    return [TileType(x.dtype, shape), TileType(D.i32, shape)]


def _take(ts, attrs):
    x, i = _tile(ts[0], "k.take source"), _tile(ts[1], "k.take index")
    if not i.dtype.is_int:
        raise TypeRuleError(f"k.take index must be an integer tile, got {i.dtype.name}", "cast with .to(k.i32)")
    if len(x.shape) != len(i.shape) or x.shape[:-1] != i.shape[:-1]:
        raise TypeRuleError(f"k.take: index shape {list(i.shape)} must match the source {list(x.shape)} "
                            "in all but the last axis", "k.take picks along the last axis, row by row")
    return [TileType(x.dtype, i.shape)]


def _expand(ts, attrs):
    x = _tile(ts[0], "operand")
    ax = attrs["axis"]
    if not 0 <= ax <= len(x.shape):
        raise TypeRuleError(f"cannot insert an axis at {ax} into shape {list(x.shape)}",
                            f"axes go between 0 and {len(x.shape)}")
    return [TileType(x.dtype, x.shape[:ax] + (1,) + x.shape[ax:])]


def _trans(ts, attrs):
    x = _tile(ts[0], "operand")
    if len(x.shape) != 2:
        raise TypeRuleError(f".T needs a 2-D tile, got shape {list(x.shape)}",
                            "use k.reshape for other ranks, or [:, None] to make a column")
    return [TileType(x.dtype, (x.shape[1], x.shape[0]))]


def _broadcast(ts, attrs):
    x = _tile(ts[0], "operand")
    shape = tuple(attrs["shape"])
    if broadcast_shapes(x.shape, shape, "k.broadcast_to") != shape:
        raise TypeRuleError(f"cannot broadcast {list(x.shape)} to {list(shape)}",
                            "axes of size 1 stretch; add them with [:, None] / [None, :]")
    return [TileType(x.dtype, shape)]


def _reshape(ts, attrs):
    x = _tile(ts[0], "operand")
    shape = tuple(attrs["shape"])
    n = 1
    for s in shape:
        n *= s
    if n != x.numel:
        raise TypeRuleError(f"cannot reshape {list(x.shape)} ({x.numel} elements) to {list(shape)}",
                            "the new shape must hold the same number of elements")
    return [TileType(x.dtype, shape)]


def _cat(ts, attrs):
    a, b = _tile(ts[0], "k.cat operand"), _tile(ts[1], "k.cat operand")
    if len(a.shape) != 1 or a != b:
        raise TypeRuleError(f"k.cat joins two 1-D tiles of equal length and dtype, got {a} and {b}",
                            "pad the shorter tile (e.g. a masked span) and cast to one dtype")
    return [TileType(a.dtype, (2 * a.shape[0],))]


def _for(ts, attrs):
    for what, t in zip(("lower bound", "upper bound", "step"), ts[:3]):
        t = _tile(t, f"loop {what}")
        if not (t.is_scalar and t.dtype.is_int):
            raise TypeRuleError(f"loop {what} must be an integer scalar, got {t}", "cast with .to(k.i32)")
    return list(ts[3:])


def _yield(ts, attrs):
    return []


RULES: dict[str, Callable[[list, dict], list]] = {
    "const": _const, "dim": _dim, "arange": _arange, "full": _full, "load": _load,
    "store": _store, "where": _where, "cast": _cast, "bitcast": _bitcast, "cumsum": _cumsum,
    "histogram": _histogram, "dot": _dot, "topk": _topk, "take": _take, "expand": _expand, "trans": _trans,
    "broadcast": _broadcast, "reshape": _reshape, "cat": _cat, "for": _for, "yield": _yield,
    **{n: _binary(n) for n in BINARY | COMPARE},
    **{n: _unary(n) for n in UNARY},
    **{n: _reduce(n) for n in REDUCE},
}

# Attributes each op must carry (checked by the verifier; the text form prints them all).
REQUIRED_ATTRS: dict[str, tuple[str, ...]] = {
    "const": ("value", "dtype"), "dim": ("axis",), "arange": ("size",),
    "full": ("shape", "value", "dtype"), "load": ("index", "other", "mask"),
    "store": ("index", "mask"), "cast": ("dtype",), "bitcast": ("dtype",), "cumsum": ("axis", "reverse"),
    "histogram": ("bins",), "dot": ("precision",), "topk": ("n",), "expand": ("axis",), "broadcast": ("shape",),
    "reshape": ("shape",), **{n: ("axis",) for n in REDUCE},
}


def infer(name: str, operand_types: list, attrs: dict[str, Any]) -> list:
    rule = RULES.get(name)
    if rule is None:
        raise TypeRuleError(f"unknown op `{name}`", "ops are those listed in dsl/ir.py")
    return rule(operand_types, attrs)

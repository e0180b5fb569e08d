"""How the frontend reads each `k.<name>(...)` call: a table from name to a small handler that
checks compile-time arguments and emits IR."""
from __future__ import annotations

import inspect
from typing import Any

from . import dtypes as D
from .frontend import GridCall, Span, _is_const, _is_value
from .ir import Value


def _sig(fe, node, name, args, kwargs, params: str):
    """Bind call arguments against a tiny signature spec like "x, axis=None"."""
    ps = []
    for p in params.split(","):
        p = p.strip()
        if not p:
            continue
        if "=" in p:
            n, d = p.split("=")
            ps.append(inspect.Parameter(n.strip(), inspect.Parameter.POSITIONAL_OR_KEYWORD, default=eval(d)))
        else:
            ps.append(inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    try:
        b = inspect.Signature(ps).bind(*args, **kwargs)
    except TypeError as e:
        raise fe.err(node, f"k.{name}({params}): {e}") from None
    b.apply_defaults()
    return b.arguments


def _static_int(fe, node, x, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or _is_value(x):
        raise fe.err(node, f"{what} must be a compile-time integer (a literal or a constexpr), "
                     f"got {fe._describe(x)}", "make it a k.constexpr parameter")
    return x


def _shape(fe, node, s, what="shape"):
    if isinstance(s, int):
        s = (s,)
    if not isinstance(s, (tuple, list)):
        raise fe.err(node, f"{what} must be a tuple of compile-time integers")
    out = tuple(_static_int(fe, node, d, f"each {what} entry") for d in s)
    if any(d <= 0 for d in out):
        raise fe.err(node, f"{what} entries must be positive, got {list(out)}")
    return out


def _dtype(fe, node, d):
    if not isinstance(d, D.DType):
        raise fe.err(node, f"expected a dtype such as k.f32, got {fe._describe(d)}")
    return d


def _tile(fe, node, x, what="operand"):
    if _is_const(x):
        return fe.as_value(x, node)
    if not _is_value(x):
        raise fe.err(node, f"{what} must be a tile or number, got {fe._describe(x)}")
    return x


def b_span(fe, node, args, kwargs):
    a = _sig(fe, node, "span", args, kwargs, "start, size, other=None")
    size = _static_int(fe, node, a["size"], "k.span size")
    if size <= 0:
        raise fe.err(node, f"k.span size must be positive, got {size}")
    start = a["start"]
    if not (_is_value(start) or isinstance(start, int)):
        raise fe.err(node, f"k.span start must be an integer, got {fe._describe(start)}")
    if _is_value(start) and not (start.type.is_scalar and start.type.dtype.is_int):
        raise fe.err(node, f"k.span start must be an integer scalar, got {start.type}")
    return Span(start, size, a["other"])


def b_grid(fe, node, args, kwargs):
    raise fe.err(node, "`k.grid` must be the outermost loop of the kernel",
                 "write `for i in k.grid(N):` as the kernel's top-level loop")


def b_arange(fe, node, args, kwargs):
    if len(args) == 1:
        args = [0, args[0]]
    a = _sig(fe, node, "arange", args, kwargs, "start, end")
    lo = _static_int(fe, node, a["start"], "k.arange start")
    hi = _static_int(fe, node, a["end"], "k.arange end")
    if hi <= lo:
        raise fe.err(node, f"k.arange({lo}, {hi}) is empty")
    r = fe.emit1("arange", [], {"size": hi - lo}, node)
    return fe.binary("add", r, lo, node) if lo else r


def b_zeros(fe, node, args, kwargs):
    a = _sig(fe, node, "zeros", args, kwargs, "shape, dtype=None")
    dt = _dtype(fe, node, a["dtype"]) if a["dtype"] is not None else D.f32
    return fe.emit1("full", [], {"shape": list(_shape(fe, node, a["shape"])), "value": 0 if dt.is_int else 0.0,
                                 "dtype": dt}, node)


def b_full(fe, node, args, kwargs):
    a = _sig(fe, node, "full", args, kwargs, "shape, value, dtype=None")
    v = a["value"]
    if not _is_const(v):
        if _is_value(v) and v.type.is_scalar:
            shape = _shape(fe, node, a["shape"])
            dt = a["dtype"]
            if dt is not None and dt is not v.type.dtype:
                v = fe.emit1("cast", [v], {"dtype": dt}, node)
            return fe.emit1("broadcast", [v], {"shape": list(shape)}, node)
        raise fe.err(node, "k.full value must be a number or a scalar")
    dt = _dtype(fe, node, a["dtype"]) if a["dtype"] is not None else (D.f32 if isinstance(v, float) else D.i32)
    v = float(v) if dt.is_float else (bool(v) if dt is D.bool_ else int(v))
    return fe.emit1("full", [], {"shape": list(_shape(fe, node, a["shape"])), "value": v, "dtype": dt}, node)


def b_unary(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "x")
        x = a["x"]
        if _is_const(x):
            x = fe.as_value(float(x), node)
        return fe.emit1(name, [_tile(fe, node, x)], {}, node)
    return h


def b_minmax(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "a, b")
        if not _is_value(a["a"]) and not _is_value(a["b"]):
            return (min if name == "minimum" else max)(a["a"], a["b"])
        return fe.binary(name, a["a"], a["b"], node)
    return h


def b_where(fe, node, args, kwargs):
    a = _sig(fe, node, "where", args, kwargs, "cond, a, b")
    c = _tile(fe, node, a["cond"], "condition")
    x, y = a["a"], a["b"]
    like = x.type.dtype if _is_value(x) else (y.type.dtype if _is_value(y) else None)
    if like is None:
        like = D.f32 if isinstance(x, float) or isinstance(y, float) else D.i32
    return fe.emit1("where", [c, fe.as_value(x, node, like), fe.as_value(y, node, like)], {}, node)


def b_reduce(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "x, axis=None")
        ax = a["axis"]
        if ax is not None:
            ax = _static_int(fe, node, ax, f"k.{name} axis")
        return fe.emit1(name, [_tile(fe, node, a["x"])], {"axis": ax}, node)
    return h


def b_cumsum(fe, node, args, kwargs):
    a = _sig(fe, node, "cumsum", args, kwargs, "x, axis=0, reverse=False")
    return fe.emit1("cumsum", [_tile(fe, node, a["x"])],
                    {"axis": _static_int(fe, node, a["axis"], "k.cumsum axis"), "reverse": bool(a["reverse"])}, node)


def b_dot(fe, node, args, kwargs):
    a = _sig(fe, node, "dot", args, kwargs, "a, b, precision='ieee'")
    if a["precision"] not in ("ieee", "tf32"):
        raise fe.err(node, f"k.dot precision must be 'ieee' or 'tf32', got {a['precision']!r}")
    return fe.emit1("dot", [_tile(fe, node, a["a"]), _tile(fe, node, a["b"])], {"precision": a["precision"]}, node)


def b_topk(fe, node, args, kwargs):
    a = _sig(fe, node, "topk", args, kwargs, "x, n")
    vals, idx = fe.emit("topk", [_tile(fe, node, a["x"])], {"n": _static_int(fe, node, a["n"], "k.topk n")}, node)
    return vals, idx


def b_take(fe, node, args, kwargs):
    a = _sig(fe, node, "take", args, kwargs, "x, index")
    return fe.emit1("take", [_tile(fe, node, a["x"]), _tile(fe, node, a["index"])], {}, node)


def b_cat(fe, node, args, kwargs):
    a = _sig(fe, node, "cat", args, kwargs, "a, b")
    return fe.emit1("cat", [_tile(fe, node, a["a"]), _tile(fe, node, a["b"])], {}, node)


def b_reshape(fe, node, args, kwargs):
    a = _sig(fe, node, "reshape", args, kwargs, "x, shape")
    return fe.emit1("reshape", [_tile(fe, node, a["x"])], {"shape": list(_shape(fe, node, a["shape"]))}, node)


def b_broadcast_to(fe, node, args, kwargs):
    a = _sig(fe, node, "broadcast_to", args, kwargs, "x, shape")
    return fe.emit1("broadcast", [_tile(fe, node, a["x"])], {"shape": list(_shape(fe, node, a["shape"]))}, node)


def b_cdiv(fe, node, args, kwargs):
    a = _sig(fe, node, "cdiv", args, kwargs, "a, b")
    x, y = a["a"], a["b"]
    if not _is_value(x) and not _is_value(y):
        return -(-x // y)
    s = fe.binary("add", x, fe.binary("sub", y, 1, node) if _is_value(y) else y - 1, node)
    return fe.binary("floordiv", s, y, node)


def b_cast(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "x, dtype")
        x = _tile(fe, node, a["x"])
        dt = _dtype(fe, node, a["dtype"])
        if name == "cast" and dt is x.type.dtype:
            return x
        return fe.emit1(name, [x], {"dtype": dt}, node)
    return h


def b_load(fe, node, args, kwargs):
    a = _sig(fe, node, "load", args, kwargs, "tensor, index, mask=None, other=None")
    t = a["tensor"]
    if not (_is_value(t) and hasattr(t.type, "dims")):
        raise fe.err(node, "k.load reads from a tensor parameter")
    idx = a["index"] if isinstance(a["index"], tuple) else (a["index"],)
    return fe.load(t, list(idx), a["mask"], a["other"], node)


def b_store(fe, node, args, kwargs):
    a = _sig(fe, node, "store", args, kwargs, "tensor, index, value, mask=None")
    t = a["tensor"]
    if not (_is_value(t) and hasattr(t.type, "dims")):
        raise fe.err(node, "k.store writes into a tensor parameter")
    idx = a["index"] if isinstance(a["index"], tuple) else (a["index"],)
    fe.store(t, list(idx), a["value"], a["mask"], node)


def b_static_range(fe, node, args, kwargs):
    raise fe.err(node, "k.static_range is only valid as the iterable of a for loop")


HANDLERS: dict[str, Any] = {
    "span": b_span, "grid": b_grid, "arange": b_arange, "zeros": b_zeros, "full": b_full,
    "where": b_where, "cumsum": b_cumsum, "dot": b_dot, "topk": b_topk, "take": b_take, "cat": b_cat,
    "reshape": b_reshape, "broadcast_to": b_broadcast_to, "cdiv": b_cdiv, "load": b_load,
    "store": b_store, "static_range": b_static_range, "cast": b_cast("cast"), "bitcast": b_cast("bitcast"),
    "maximum": b_minmax("maximum"), "minimum": b_minmax("minimum"),
    **{n: b_unary(n) for n in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sigmoid",
                               "softplus", "relu", "floor", "ceil")},
    **{n: b_reduce(n) for n in ("sum", "max", "min")},
}


def call(fe, name: str, args, kwargs, node):
    if name == "grid":
        return GridCall(args)
    return HANDLERS[name](fe, node, args, kwargs)

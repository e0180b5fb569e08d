"""How the frontend reads each call: a table from `k.<name>` to a small handler that checks
compile-time arguments and emits IR, plus the Python builtins and `math.*` functions a kernel
may call on compile-time values."""
from __future__ import annotations

import inspect
import math
from typing import Any

from . import dtypes as D
from .frontend_exprs import GridCall, Span, int_range, is_const, is_tensor, is_tile, is_value
from .ir import DOT_PRECISIONS, TileType


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
        raise fe.err(node, f"k.{name}({params}): {e}", f"call it as k.{name}({params})") from None
    b.apply_defaults()
    return b.arguments


def _static_int(fe, node, x, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise fe.err(node, f"{what} must be a compile-time integer (a literal or a constexpr), "
                     f"got {fe.describe(x)}", "make it a k.constexpr parameter or a literal")
    return x


def _static_bool(fe, node, x, what: str) -> bool:
    if not isinstance(x, (bool, int)) or is_value(x):
        raise fe.err(node, f"{what} must be a compile-time bool, got {fe.describe(x)}", "use True/False or a constexpr")
    return bool(x)


def _shape(fe, node, s, what="shape"):
    if isinstance(s, int) and not isinstance(s, bool):
        s = (s,)
    if not isinstance(s, (tuple, list)):
        raise fe.err(node, f"{what} must be a tuple of compile-time integers, got {fe.describe(s)}",
                     "e.g. (BM, BN) with constexpr sizes")
    out = tuple(_static_int(fe, node, d, f"each {what} entry") for d in s)
    if not out or any(d <= 0 for d in out):
        raise fe.err(node, f"{what} entries must be positive, got {list(out)}", "use positive tile sizes")
    return out


def _axis(fe, node, x, ax: int) -> int:
    """A negative axis counted from the end, as the non-negative axis the IR carries (an axis out
    of range is left for the type rule to report)."""
    rank = len(x.type.shape)
    return ax + rank if -rank <= ax < 0 else ax


def _dtype(fe, node, d):
    if not isinstance(d, D.DType):
        raise fe.err(node, f"expected a dtype such as k.f32, got {fe.describe(d)}", "pass k.f32, k.bf16, k.i32, ...")
    return d


def _int_operand(fe, node, x, what):
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if is_tile(x) and x.type.is_scalar and x.type.dtype.is_int:
        return x
    raise fe.err(node, f"{what} must be an integer scalar, got {fe.describe(x)}",
                 "use sizes, program ids, loop indices or integer literals")


# ---------------------------------------------------------------- tensor loads and stores

def access_index(fe, tensor, idx: list, node):
    if len(idx) != tensor.type.rank:
        raise fe.err(node, f"`{tensor.hint}` has rank {tensor.type.rank} but is indexed with "
                       f"{len(idx)} indices", "give one index per axis: an integer, a "
                       "k.span(start, SIZE) or a 1-D index tile")
    kinds, operands, other = [], [], None
    for i in idx:
        if isinstance(i, Span):
            kinds.append(f"span:{i.size}")
            operands.append(fe.as_value(i.start, node, D.i32))
            if i.other is not None:
                other = i.other
        elif is_tile(i) and not i.type.is_scalar:
            kinds.append("gather")
            operands.append(i)
        elif is_tile(i) or (isinstance(i, int) and not isinstance(i, bool)):
            kinds.append("scalar")
            operands.append(fe.as_value(i, node, D.i32))
        else:
            raise fe.err(node, f"a tensor index must be an integer, k.span(...) or an index tile, "
                           f"got {fe.describe(i)}",
                           "slices need a compile-time size: k.span(start, BLOCK)")
    return kinds, operands, other

def fill_value(fe, tensor, other, node):
    """`other=` as the attribute value for a load from `tensor` (checked against its dtype)."""
    if other is None:
        return None
    if not is_const(other):
        raise fe.err(node, f"`other=` must be a compile-time number, got {fe.describe(other)}",
                       "write a literal such as 0.0 or float('-inf'); select runtime values "
                       "afterwards with k.where")
    dt = tensor.type.dtype
    if dt is D.bool_:
        return bool(other)
    if dt.is_int:
        if isinstance(other, float) and not other.is_integer():
            raise fe.err(node, f"`other={other}` cannot fill the {dt.name} tensor `{tensor.hint}`",
                           "use an integer fill value such as 0 or -1")
        lo, hi = int_range(dt)
        if not lo <= int(other) <= hi:
            raise fe.err(node, f"`other={other}` does not fit {dt.name}", f"use a value in {lo} .. {hi}")
        return int(other)
    return float(other)

EVICT = ("first", "last")


def evict_attr(fe, evict, node) -> dict:
    """{"evict": ...} for a load/store cache hint, {} without one. The hint asks the GPU's L2 to
    drop the lines first ("first": streamed data) or keep them ("last": data read again soon);
    it never changes results, and targets without such a cache ignore it."""
    if evict is None:
        return {}
    if not (isinstance(evict, str) and evict in EVICT):
        raise fe.err(node, f"evict= must be \"first\" or \"last\", got {fe.describe(evict)}",
                     'evict="first" for data read once, evict="last" for data read again soon')
    return {"evict": evict}


def tensor_load(fe, tensor, idx, mask, other, node, evict=None):
    kinds, operands, span_other = access_index(fe, tensor, idx, node)
    other = fill_value(fe, tensor, other if other is not None else span_other, node)
    hint = evict_attr(fe, evict, node)
    if mask is not None:
        operands.append(fe.operand(mask, node, "the mask"))
    return fe.emit1("load", [tensor] + operands,
                      {"index": kinds, "other": other, "mask": mask is not None, **hint}, node)

def tensor_store(fe, tensor, idx, value, mask, node, evict=None):
    kinds, operands, span_other = access_index(fe, tensor, idx, node)
    hint = evict_attr(fe, evict, node)
    if span_other is not None:
        raise fe.err(node, "`other=` has no meaning in a store", "drop other= from the k.span")
    if is_tensor(value):
        raise fe.err(node, f"cannot store the tensor parameter `{value.hint}` directly",
                       fe.tensor_hint(value))
    if not (is_tile(value) or is_const(value)):
        raise fe.err(node, f"cannot store {fe.describe(value)}", "store a tile or a number")
    if is_tile(value) and value.type.is_scalar and value.type.dtype.is_int and tensor.type.dtype.is_float:
        value = fe.emit1("cast", [value], {"dtype": tensor.type.dtype}, node)
    operands.append(fe.as_value(value, node, tensor.type.dtype))
    if mask is not None:
        operands.append(fe.operand(mask, node, "the mask"))
    fe.emit("store", [tensor] + operands, {"index": kinds, "mask": mask is not None, **hint}, node)


# ---------------------------------------------------------------- k.* builtins

def b_span(fe, node, args, kwargs):
    a = _sig(fe, node, "span", args, kwargs, "start, size, other=None")
    size = _static_int(fe, node, a["size"], "k.span size")
    if size <= 0:
        raise fe.err(node, f"k.span size must be positive, got {size}", "use a positive power of two")
    start = _int_operand(fe, node, a["start"], "k.span start")
    other = a["other"]
    if other is not None and not is_const(other):
        raise fe.err(node, f"k.span other= must be a compile-time number, got {fe.describe(other)}",
                     "write a literal such as 0.0 or float('-inf')")
    return Span(start, size, other)


def b_grid(fe, node, args, kwargs):
    raise fe.err(node, "`k.grid` must be the outermost loop of the kernel",
                 "write `for i in k.grid(N):` as the kernel's top-level loop")


def b_arange(fe, node, args, kwargs):
    if len(args) == 1 and not kwargs:
        args = [0, args[0]]
    a = _sig(fe, node, "arange", args, kwargs, "start, end")
    lo = _static_int(fe, node, a["start"], "k.arange start")
    hi = _static_int(fe, node, a["end"], "k.arange end")
    if hi <= lo:
        raise fe.err(node, f"k.arange({lo}, {hi}) is empty", "the end must exceed the start")
    r = fe.emit1("arange", [], {"size": hi - lo}, node)
    return fe.binary("add", r, lo, node, "+") if lo else r


def b_zeros(fe, node, args, kwargs):
    a = _sig(fe, node, "zeros", args, kwargs, "shape, dtype=None")
    dt = _dtype(fe, node, a["dtype"]) if a["dtype"] is not None else D.f32
    return fe.emit1("full", [], {"shape": list(_shape(fe, node, a["shape"])),
                                 "value": 0.0 if dt.is_float else (False if dt is D.bool_ else 0),
                                 "dtype": dt}, node)


def b_full(fe, node, args, kwargs):
    a = _sig(fe, node, "full", args, kwargs, "shape, value, dtype=None")
    v, shape = a["value"], _shape(fe, node, a["shape"])
    dt = _dtype(fe, node, a["dtype"]) if a["dtype"] is not None else None
    if is_tile(v) and v.type.is_scalar:
        if dt is not None and dt is not v.type.dtype:
            v = fe.emit1("cast", [v], {"dtype": dt}, node)
        return fe.emit1("broadcast", [v], {"shape": list(shape)}, node)
    if not is_const(v):
        raise fe.err(node, f"k.full value must be a number or a scalar, got {fe.describe(v)}",
                     "for a tile use k.broadcast_to(tile, shape)")
    dt = dt or (D.f32 if isinstance(v, float) else (D.bool_ if isinstance(v, bool) else D.i32))
    if dt.is_storage_only:
        raise fe.err(node, f"k.full cannot build {dt.name} tiles directly",
                     f"build a float tile and convert it: k.full(shape, v, k.f32).to(k.{dt.name})")
    return fe.emit1("full", [], {"shape": list(shape), "value": fe.literal(v, dt, node), "dtype": dt}, node)


def b_unary(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "x")
        x = a["x"]
        if is_const(x) and name not in ("abs", "relu"):
            x = float(x)
        return fe.emit1(name, [fe.operand(x, node, f"the argument of k.{name}")], {}, node)
    return h


def b_minmax(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "a, b")
        if is_const(a["a"]) and is_const(a["b"]):
            return (min if name == "minimum" else max)(a["a"], a["b"])
        return fe.binary(name, a["a"], a["b"], node, f"k.{name}")
    return h


def b_where(fe, node, args, kwargs):
    a = _sig(fe, node, "where", args, kwargs, "cond, a, b")
    c = fe.operand(a["cond"], node, "the k.where condition")
    x, y = a["a"], a["b"]
    for v in (x, y):
        if not (is_tile(v) or is_const(v)):
            fe.operand(v, node, "a k.where branch")
    x, y = fe.promote_int_scalar(x, y, node)
    like = x.type.dtype if is_tile(x) else (y.type.dtype if is_tile(y) else None)
    if like is None:
        like = D.f32 if isinstance(x, float) or isinstance(y, float) else (
            D.bool_ if isinstance(x, bool) and isinstance(y, bool) else D.i32)
    return fe.emit1("where", [c, fe.as_value(x, node, like), fe.as_value(y, node, like)], {}, node)


def b_reduce(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "x, axis=None")
        x = fe.operand(a["x"], node, f"the argument of k.{name}")
        ax = a["axis"]
        if ax is not None:
            ax = _axis(fe, node, x, _static_int(fe, node, ax, f"k.{name} axis"))
        return fe.emit1(name, [x], {"axis": ax}, node)
    return h


def b_cumsum(fe, node, args, kwargs):
    a = _sig(fe, node, "cumsum", args, kwargs, "x, axis=0, reverse=False")
    x = fe.operand(a["x"], node, "the argument of k.cumsum")
    return fe.emit1("cumsum", [x],
                    {"axis": _axis(fe, node, x, _static_int(fe, node, a["axis"], "k.cumsum axis")),
                     "reverse": _static_bool(fe, node, a["reverse"], "k.cumsum reverse")}, node)


def b_histogram(fe, node, args, kwargs):
    a = _sig(fe, node, "histogram", args, kwargs, "x, bins, mask=None")
    x = fe.operand(a["x"], node, "the argument of k.histogram")
    if a["mask"] is not None:                      # masked-off lanes become -1: outside every bin
        m = fe.operand(a["mask"], node, "the k.histogram mask")
        x = fe.emit1("where", [m, x, fe.as_value(-1, node, x.type.dtype)], {}, node)
    return fe.emit1("histogram", [x], {"bins": _static_int(fe, node, a["bins"], "k.histogram bins")}, node)


def b_dot(fe, node, args, kwargs):
    a = _sig(fe, node, "dot", args, kwargs, "a, b, precision='ieee'")
    if a["precision"] not in DOT_PRECISIONS:
        raise fe.err(node, f"k.dot precision must be 'ieee', 'tf32' or 'tf32x3', got {fe.describe(a['precision'])}",
                     "'ieee' is exact fp32 accumulation; 'tf32' allows tensor-core rounding (~1e-3); 'tf32x3' "
                     "splits each fp32 operand into two tf32 parts (three MMAs, ~fp32 accuracy)")
    return fe.emit1("dot", [fe.operand(a["a"], node, "the left k.dot operand"),
                            fe.operand(a["b"], node, "the right k.dot operand")], {"precision": a["precision"]}, node)


def b_topk(fe, node, args, kwargs):
    a = _sig(fe, node, "topk", args, kwargs, "x, n")
    vals, idx = fe.emit("topk", [fe.operand(a["x"], node, "the argument of k.topk")],
                        {"n": _static_int(fe, node, a["n"], "k.topk n")}, node)
    return vals, idx


def b_take(fe, node, args, kwargs):
    a = _sig(fe, node, "take", args, kwargs, "x, index")
    return fe.emit1("take", [fe.operand(a["x"], node, "the k.take source"),
                             fe.operand(a["index"], node, "the k.take index")], {}, node)


def b_cat(fe, node, args, kwargs):
    a = _sig(fe, node, "cat", args, kwargs, "a, b")
    return fe.emit1("cat", [fe.operand(a["a"], node, "a k.cat operand"),
                            fe.operand(a["b"], node, "a k.cat operand")], {}, node)


def b_reshape(fe, node, args, kwargs):
    a = _sig(fe, node, "reshape", args, kwargs, "x, shape")
    return fe.emit1("reshape", [fe.operand(a["x"], node, "the argument of k.reshape")],
                    {"shape": list(_shape(fe, node, a["shape"]))}, node)


def b_broadcast_to(fe, node, args, kwargs):
    a = _sig(fe, node, "broadcast_to", args, kwargs, "x, shape")
    return fe.emit1("broadcast", [fe.operand(a["x"], node, "the argument of k.broadcast_to")],
                    {"shape": list(_shape(fe, node, a["shape"]))}, node)


def b_cdiv(fe, node, args, kwargs):
    a = _sig(fe, node, "cdiv", args, kwargs, "a, b")
    x = _int_operand(fe, node, a["a"], "k.cdiv numerator")
    y = _int_operand(fe, node, a["b"], "k.cdiv denominator")
    if not is_value(x) and not is_value(y):
        if y == 0:
            raise fe.err(node, "k.cdiv by zero", "the denominator must be positive")
        return -(-x // y)
    s = fe.binary("add", x, fe.binary("sub", y, 1, node, "-") if is_value(y) else y - 1, node, "+")
    return fe.binary("floordiv", s, y, node, "//")


def b_cast(name):
    def h(fe, node, args, kwargs):
        a = _sig(fe, node, name, args, kwargs, "x, dtype")
        x = fe.operand(a["x"], node, f"the argument of k.{name}")
        dt = _dtype(fe, node, a["dtype"])
        if name == "cast" and dt is x.type.dtype:
            return x
        return fe.emit1(name, [x], {"dtype": dt}, node)
    return h


def _tensor_arg(fe, node, t, verb):
    if not is_tensor(t):
        raise fe.err(node, f"k.{verb} needs a tensor parameter, got {fe.describe(t)}",
                     "pass a kernel parameter annotated k.Tensor[...]")
    return t


def b_load(fe, node, args, kwargs):
    a = _sig(fe, node, "load", args, kwargs, "tensor, index, mask=None, other=None, evict=None")
    t = _tensor_arg(fe, node, a["tensor"], "load")
    idx = a["index"] if isinstance(a["index"], tuple) else (a["index"],)
    return fe.load(t, list(idx), a["mask"], a["other"], node, a["evict"])


def b_store(fe, node, args, kwargs):
    a = _sig(fe, node, "store", args, kwargs, "tensor, index, value, mask=None, evict=None")
    t = _tensor_arg(fe, node, a["tensor"], "store")
    idx = a["index"] if isinstance(a["index"], tuple) else (a["index"],)
    fe.store(t, list(idx), a["value"], a["mask"], node, a["evict"])


def b_static_range(fe, node, args, kwargs):
    raise fe.err(node, "k.static_range is only valid as the iterable of a for loop",
                 "write `for i in k.static_range(N):`")


HANDLERS: dict[str, Any] = {
    "span": b_span, "grid": b_grid, "arange": b_arange, "zeros": b_zeros, "full": b_full,
    "where": b_where, "cumsum": b_cumsum, "histogram": b_histogram, "dot": b_dot, "topk": b_topk, "take": b_take, "cat": b_cat,
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


# ---------------------------------------------------------------- Python builtins and math.*

def python_builtin(fe, fn, args, kwargs, node):
    name = fn.__name__
    if fn is range:
        raise fe.err(node, "range() is only valid as the iterable of a for loop", "write `for i in range(n):`")
    if kwargs:
        raise fe.err(node, f"{name}() takes no keyword arguments in kernels", "pass them positionally")
    if fn in (min, max) and any(is_value(a) for a in args):
        if len(args) != 2:
            raise fe.err(node, f"{name}() on tiles takes exactly two arguments",
                         f"nest the calls or use k.{'minimum' if fn is min else 'maximum'}")
        return fe.binary("minimum" if fn is min else "maximum", args[0], args[1], node, name)
    if fn is abs and len(args) == 1 and is_value(args[0]):
        return fe.emit1("abs", [fe.operand(args[0], node)], {}, node)
    if fn is len and len(args) == 1 and is_value(args[0]):
        t = args[0].type
        if not isinstance(t, TileType) or not t.shape:
            raise fe.err(node, "len() needs a tile with at least one axis or a tuple", "for tensors use x.shape[0]")
        return t.shape[0]
    if any(is_value(a) for a in args):
        raise fe.err(node, f"{name}() needs compile-time arguments", "convert tiles with .to(k.i32) / .to(k.f32)")
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the user's compile-time call failed
        raise fe.err(node, f"{name}() failed: {e}", "check the arguments") from None


def is_math_function(fn) -> bool:
    return callable(fn) and getattr(math, getattr(fn, "__name__", ""), None) is fn


def math_call(fe, fn, args, kwargs, node):
    if any(is_value(a) for a in list(args) + list(kwargs.values())):
        raise fe.err(node, f"math.{fn.__name__} runs at compile time and needs compile-time arguments",
                     "use k.exp/k.log/k.sqrt/... on tiles")
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the user's compile-time call failed
        raise fe.err(node, f"math.{fn.__name__} failed: {e}", "check the arguments") from None

"""Expression reading for the AST frontend (a mixin of `frontend.Frontend`).

Every expression evaluates either to a compile-time Python object (number, str, dtype, tuple,
@k.func, module, k.* builtin, `Span`, `ShapeOf`) or to an IR `Value` (a tile, a scalar, or a
tensor parameter). Anything an op author can get wrong is reported through `self.err(node, ...)`.
Operators (arithmetic, comparisons, unary, `and`/`or`) are in frontend_operators.py; `expr`
reaches their `expr_*` handlers through `Frontend`, which mixes in both.
"""
from __future__ import annotations

import ast
import difflib
import math
import types
from dataclasses import dataclass
from typing import Any

from . import dtypes as D
from . import lang
from .errors import Loc
from .ir import TensorType, TileType, Value

# ---------------------------------------------------------------- compile-time objects


@dataclass
class Span:
    start: Any
    size: int
    other: Any = None


@dataclass
class ShapeOf:
    tensor: Value


@dataclass
class GridCall:
    extents: list


@dataclass
class Method:
    value: Value
    name: str


@dataclass
class LoopLocal:
    """A name assigned only inside a finished loop: reading it is an error."""
    name: str
    loc: Loc


def is_value(x) -> bool:
    return isinstance(x, Value)


def is_tile(x) -> bool:
    return isinstance(x, Value) and isinstance(x.type, TileType)


def is_tensor(x) -> bool:
    return isinstance(x, Value) and isinstance(x.type, TensorType)


def is_const(x) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, Value)


UNSUPPORTED_EXPR = {
    ast.Lambda: ("lambdas", "define a module-level @k.func helper instead"),
    ast.ListComp: ("list comprehensions", "write the tuple out, or loop with k.static_range"),
    ast.DictComp: ("dict comprehensions", "kernels compute with tiles, numbers and tuples"),
    ast.SetComp: ("set comprehensions", "kernels compute with tiles, numbers and tuples"),
    ast.GeneratorExp: ("generator expressions", "write the tuple out, or loop with k.static_range"),
    ast.Dict: ("dicts", "kernels compute with tiles, numbers and tuples"),
    ast.Set: ("sets", "kernels compute with tiles, numbers and tuples"),
    ast.Await: ("await", "kernels are not coroutines"),
    ast.Yield: ("yield", "kernels are not generators; store results into an output tensor"),
    ast.YieldFrom: ("yield", "kernels are not generators; store results into an output tensor"),
    ast.NamedExpr: ("the walrus operator", "assign on a line of its own"),
    ast.Starred: ("star-unpacking", "pass the arguments one by one"),
    ast.Slice: ("slices like `a:b`", "tensors take k.span(start, SIZE) with a compile-time SIZE; "
                "tiles take only `:` and `None` (to add axes)"),
}
PY_BUILTINS = {"range": range, "min": min, "max": max, "abs": abs, "int": int, "float": float,
               "len": len, "bool": bool, "True": True, "False": False, "None": None}
TILE_ATTRS = "available on tiles: .shape, .ndim, .dtype, .T, .to(dtype), .bitcast(dtype)"


def int_range(dt: D.DType) -> tuple[int, int]:
    if dt.signed:
        return -(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1
    return 0, (1 << dt.bits) - 1


class ExprMixin:
    """Expression handlers; `Frontend` supplies err/emit/env/cur_src/inline and, through
    OperatorMixin, the operator handlers."""

    # ------------------------------------------------------------ dispatch
    def expr(self, node):
        self.last_loc = self.cur_src.loc(node)
        for cls, (what, hint) in UNSUPPORTED_EXPR.items():
            if isinstance(node, cls):
                raise self.err(node, f"{what} are not supported in kernels" if what.endswith("s")
                               else f"{what} is not supported in kernels", hint)
        m = getattr(self, "expr_" + type(node).__name__, None)
        if m is None:
            raise self.err(node, f"`{type(node).__name__}` expressions are not supported in kernels",
                           "kernels use names, numbers, arithmetic, comparisons, calls, subscripts and tuples")
        return m(node)

    def describe(self, x) -> str:
        if is_tensor(x):
            return f"the tensor parameter `{x.hint}`"
        if is_value(x):
            return f"a {x.type} value"
        if isinstance(x, ShapeOf):
            return f"the shape of `{x.tensor.hint}` (index it: {x.tensor.hint}.shape[0])"
        if isinstance(x, Span):
            return "a k.span (only valid inside a tensor subscript)"
        if isinstance(x, GridCall):
            return "k.grid(...) (only valid as the kernel's outer loop)"
        if isinstance(x, D.DType):
            return f"the dtype {x.name}"
        if isinstance(x, lang.FuncDef):
            return f"the @k.func `{x.name}`"
        if isinstance(x, Method):
            return f"the method .{x.name} (call it: .{x.name}(k.f32))"
        if isinstance(x, types.ModuleType):
            return f"the module `{x.__name__}`"
        if lang.builtin_name(x):
            return f"k.{lang.builtin_name(x)} (call it)"
        return f"{type(x).__name__} {x!r}"[:80]

    def tensor_hint(self, x) -> str:
        return (f"`{x.hint}` is a tensor in memory; load a tile from it first, "
                f"e.g. {x.hint}[i, k.span(0, BLOCK)]")

    # ------------------------------------------------------------ numbers -> values
    def literal(self, value, dtype: D.DType, node):
        """A Python number as a value of `dtype` (checked: kind and range)."""
        if dtype.is_storage_only:
            raise self.err(node, f"a number cannot be used directly with {dtype.name} values",
                           "convert the fp8/e8m0 value to k.f32 first")
        if dtype.is_float:
            return float(value)
        if isinstance(value, float):
            if not value.is_integer():
                raise self.err(node, f"the float literal {value} cannot become a {dtype.name} value",
                               "cast the other operand to a float type with .to(k.f32)")
            value = int(value)
        if dtype is D.bool_:
            return bool(value)
        lo, hi = int_range(dtype)
        if not lo <= int(value) <= hi:
            raise self.err(node, f"the integer {value} does not fit {dtype.name} (range {lo} .. {hi})",
                           "use a value in range, e.g. write a mask 0x80000000 as -0x80000000 for i32, "
                           "or bitcast to an unsigned type")
        return int(value)

    def const(self, value, dtype: D.DType, node) -> Value:
        return self.emit1("const", [], {"value": self.literal(value, dtype, node), "dtype": dtype}, node)

    def as_value(self, x, node, like: D.DType | None = None) -> Value:
        """A tile/scalar for `x`: numbers become consts typed like `like` (default i32/f32/bool)."""
        if is_tile(x):
            return x
        if is_tensor(x):
            raise self.err(node, f"the tensor parameter `{x.hint}` cannot be used as a value",
                           self.tensor_hint(x))
        if isinstance(x, bool):
            return self.const(x, like or D.bool_, node)
        if isinstance(x, int):
            return self.const(x, like or D.i32, node)
        if isinstance(x, float):
            if like is not None and not (like.is_float or like.is_storage_only):
                raise self.err(node, f"float literal {x} used with a {like.name} value",
                               "cast the value with .to(k.f32), or use an integer literal")
            return self.const(x, like or D.f32, node)
        raise self.err(node, f"expected a number or a tile here, got {self.describe(x)}",
                       "tiles come from tensor subscripts, k.zeros/k.full/k.arange and arithmetic")

    def operand(self, x, node, what: str = "operand") -> Value:
        """A tile operand of a builtin: numbers become scalars, tensors and other objects fail."""
        if is_const(x):
            return self.as_value(x, node)
        if is_tile(x):
            return x
        if is_tensor(x):
            raise self.err(node, f"{what} is the tensor parameter `{x.hint}`, not a tile", self.tensor_hint(x))
        raise self.err(node, f"{what} must be a tile or a number, got {self.describe(x)}",
                       "tiles come from tensor subscripts, k.zeros/k.full/k.arange and arithmetic")

    # ------------------------------------------------------------ leaves
    def expr_Constant(self, node):
        if isinstance(node.value, (bool, int, float, str)) or node.value is None:
            return node.value
        raise self.err(node, f"unsupported constant {node.value!r}", "use numbers and strings only")

    def expr_Name(self, node):
        name = node.id
        if name in self.env:
            v = self.env[name]
            if isinstance(v, LoopLocal):
                raise self.err(node, f"`{name}` is assigned only inside the loop at line {v.loc.line} "
                               "and cannot be used after it",
                               f"initialise `{name}` before the loop (e.g. `{name} = k.zeros(...)`) so it is "
                               "carried out of the loop")
            return v
        scope = self.cur_src.scope
        if name in scope:
            return self.global_object(scope[name], node, name)
        if name in PY_BUILTINS:
            return PY_BUILTINS[name]
        known = list(self.env) + [n for n in scope if not n.startswith("_")] + list(PY_BUILTINS)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean `{close[0]}`?" if close else (
            "kernels see their parameters, local variables, module-level constants, @k.func helpers "
            "and the k31dsl module")
        raise self.err(node, f"unknown name `{name}`", hint)

    def global_object(self, obj, node, name: str):
        if isinstance(obj, (bool, int, float, str, D.DType, lang.FuncDef)) or obj is None:
            return obj
        if isinstance(obj, (tuple, list)):
            return tuple(self.global_object(o, node, f"{name}[...]") for o in obj)
        if isinstance(obj, types.ModuleType) or lang.builtin_name(obj) or any(
                obj is b for b in PY_BUILTINS.values()):
            return obj
        if callable(obj) and getattr(math, getattr(obj, "__name__", ""), None) is obj:
            return obj
        if isinstance(obj, lang.KernelDef):
            raise self.err(node, f"kernel `{obj.name}` cannot be called from another kernel",
                           "move the shared code into a @k.func helper and call that")
        if type(obj).__module__ == "numpy" and hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
            return obj.item()
        if isinstance(obj, lang.TensorAnnot) or obj is lang.TensorAnnot:
            raise self.err(node, "k.Tensor is a parameter annotation, not a value",
                           "annotate a kernel parameter with it")
        if callable(obj) and isinstance(obj, types.FunctionType):
            raise self.err(node, f"`{name}` is a plain Python function; kernels cannot call it",
                           "decorate it with @k.func to inline it into kernels")
        raise self.err(node, f"`{name}` is a {type(obj).__name__}, which kernels cannot use",
                       "kernels use numbers, dtypes, tuples, @k.func helpers and the k31dsl module; "
                       "pass arrays as tensor parameters")

    def expr_Attribute(self, node):
        base = self.expr(node.value)
        attr = node.attr
        if isinstance(base, types.ModuleType):
            if not hasattr(base, attr) or attr.startswith("_"):
                names = [n for n in dir(base) if not n.startswith("_")]
                close = difflib.get_close_matches(attr, names, n=1)
                hint = f"did you mean `{close[0]}`?" if close else "see the DSL surface in DESIGN.md §2"
                raise self.err(node, f"module `{base.__name__}` has no `{attr}`", hint)
            obj = getattr(base, attr)
            if isinstance(obj, types.ModuleType):
                return obj
            return self.global_object(obj, node, f"{base.__name__}.{attr}")
        if is_value(base):
            t = base.type
            if attr == "shape":
                return ShapeOf(base) if isinstance(t, TensorType) else tuple(t.shape)
            if attr == "dtype":
                return t.dtype
            if attr == "ndim":
                return t.rank if isinstance(t, TensorType) else len(t.shape)
            if isinstance(t, TensorType):
                raise self.err(node, f"tensor parameter `{base.hint}` has no attribute `{attr}`",
                               "tensors offer .shape, .ndim and .dtype; " + self.tensor_hint(base))
            if attr == "T":
                return self.emit1("trans", [base], {}, node)
            if attr in ("to", "bitcast"):
                return Method(base, attr)
            raise self.err(node, f"tiles have no attribute `{attr}`", TILE_ATTRS)
        if isinstance(base, D.DType):
            if attr in ("bits", "itemsize", "name"):
                return getattr(base, attr)
            raise self.err(node, f"dtypes have no attribute `{attr}`", "available: .bits, .itemsize, .name")
        raise self.err(node, f"{self.describe(base)} has no attribute `{attr}`",
                       "attributes exist on tiles, tensors, dtypes and modules")

    def expr_Tuple(self, node):
        return tuple(self.expr(e) for e in node.elts)

    expr_List = expr_Tuple

    def expr_JoinedStr(self, node):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
                continue
            x = self.expr(v.value)
            if is_value(x):
                raise self.err(v, "f-strings can only show compile-time values",
                               "use f-strings in compile-time assert messages about constexprs")
            spec = "".join(str(p.value) for p in v.format_spec.values) if v.format_spec else ""
            try:
                parts.append(format(x, spec))
            except (TypeError, ValueError) as e:
                raise self.err(v, f"cannot format {self.describe(x)}: {e}", "check the format spec") from None
        return "".join(parts)

    def expr_IfExp(self, node):
        c = self.expr(node.test)
        if is_value(c):
            raise self.err(node, "`a if c else b` needs a condition known at compile time",
                           "for a runtime condition use k.where(c, a, b)")
        return self.expr(node.body if c else node.orelse)

    # ------------------------------------------------------------ subscripts
    def static_index(self, node):
        """A compile-time subscript entry: an int or a Python slice with int bounds."""
        if isinstance(node, ast.Slice):
            parts = [self.expr(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
            if not all(p is None or (isinstance(p, int) and not isinstance(p, bool)) for p in parts):
                raise self.err(node, "slice bounds must be compile-time integers", "use literals or constexprs")
            return slice(*parts)
        i = self.expr(node)
        if isinstance(i, bool) or not isinstance(i, int):
            raise self.err(node, f"this index must be a compile-time integer, got {self.describe(i)}",
                           "tuples and shapes are indexed with literals or constexprs")
        return i

    def expr_Subscript(self, node):
        base = self.expr(node.value)
        idx_nodes = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if isinstance(base, ShapeOf):
            t = base.tensor
            i = self.static_index(node.slice)
            if isinstance(i, slice):
                return tuple(self.dim(t, j, node) for j in range(t.type.rank)[i])
            return self.dim(t, i, node)
        if isinstance(base, (tuple, list, str)):
            i = self.static_index(node.slice)
            try:
                return base[i]
            except IndexError:
                raise self.err(node, f"index {i} is out of range for a sequence of length {len(base)}",
                               "check the tuple's length") from None
        if is_tensor(base):
            return self.load(base, [self.index_entry(i) for i in idx_nodes], None, None, node)
        if is_tile(base):
            return self.tile_view(base, idx_nodes, node)
        raise self.err(node, f"cannot index {self.describe(base)}",
                       "subscripts apply to tensors (loads), tiles (`:`/`None`), tuples and shapes")

    def index_entry(self, node):
        if isinstance(node, ast.Slice):
            raise self.err(node, "tensor subscripts take integers, k.span(start, SIZE) or index tiles, "
                           "not slices", "write k.span(start, SIZE) with a compile-time SIZE; "
                           "masking handles the ragged edge")
        return self.expr(node)

    def tile_view(self, x: Value, idx_nodes, node):
        """t[:, None] style axis insertion; the only subscript defined on tiles."""
        rank = len(x.type.shape)
        kinds = []
        for i in idx_nodes:
            if isinstance(i, ast.Constant) and i.value is None:
                kinds.append("new")
            elif isinstance(i, ast.Slice) and i.lower is None and i.upper is None and i.step is None:
                kinds.append("keep")
            elif isinstance(i, ast.Constant) and i.value is Ellipsis:
                kinds.append("rest")
            else:
                raise self.err(node, "tiles take only `:` and `None` in subscripts (to add axes)",
                               "to pick elements use k.take(tile, index_tile), k.where or a reduction")
        if kinds.count("rest") > 1:
            raise self.err(node, "only one `...` per subscript", "write `t[..., None]`")
        keeps = kinds.count("keep")
        if keeps > rank:
            raise self.err(node, f"subscript has {keeps} `:` entries for a tile of rank {rank}",
                           "use one `:` per tile axis and `None` where an axis is added")
        fill = rank - keeps
        if "rest" in kinds:
            at = kinds.index("rest")
            kinds = kinds[:at] + ["keep"] * fill + kinds[at + 1:]
        else:
            kinds = kinds + ["keep"] * fill
        out = x
        for axis, kind in enumerate(kinds):
            if kind == "new":
                out = self.emit1("expand", [out], {"axis": axis}, node)
        return out

    def dim(self, tensor: Value, i: int, node) -> Value:
        rank = tensor.type.rank
        if not -rank <= i < rank:
            raise self.err(node, f"shape index {i} is out of range for `{tensor.hint}` of rank {rank}",
                           f"use 0 .. {rank - 1}")
        return self.emit1("dim", [tensor], {"axis": i % rank}, node)

    # ------------------------------------------------------------ memory access (builtins_impl)
    def load(self, tensor, idx, mask, other, node, evict=None):
        from .builtins_impl import tensor_load
        return tensor_load(self, tensor, idx, mask, other, node, evict)

    def store(self, tensor, idx, value, mask, node, evict=None):
        from .builtins_impl import tensor_store
        tensor_store(self, tensor, idx, value, mask, node, evict)

    # ------------------------------------------------------------ calls
    def expr_Call(self, node):
        from . import builtins_impl as B
        fn = self.expr(node.func)
        args = [self.expr(a) for a in node.args]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise self.err(node, "`**kwargs` calls are not supported", "pass keyword arguments by name")
            kwargs[kw.arg] = self.expr(kw.value)
        if isinstance(fn, Method):
            return self.method(fn, args, kwargs, node)
        if isinstance(fn, lang.FuncDef):
            return self.inline(fn, args, kwargs, node)
        name = lang.builtin_name(fn)
        if name is not None:
            return B.call(self, name, args, kwargs, node)
        if fn in (min, max, abs, int, float, bool, len, range):
            return B.python_builtin(self, fn, args, kwargs, node)
        if B.is_math_function(fn):
            return B.math_call(self, fn, args, kwargs, node)
        raise self.err(node, f"cannot call {self.describe(fn)} inside a kernel",
                       "kernels call k.* builtins, @k.func helpers, min/max/abs/int/float/len and math.*")

    def method(self, m, args, kwargs, node):
        if len(args) != 1 or kwargs or not isinstance(args[0], D.DType):
            raise self.err(node, f".{m.name}() takes one dtype", f"e.g. .{m.name}(k.f32)")
        if m.name == "to" and args[0] is m.value.type.dtype:
            return m.value
        return self.emit1("cast" if m.name == "to" else "bitcast", [m.value], {"dtype": args[0]}, node)

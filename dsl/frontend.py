"""AST frontend: reads an `@k.kernel` function's source and builds kernel IR.

The frontend is a partial evaluator. Names bound to Python numbers, dtypes, tuples and constexprs
are folded while reading (so `if` on a constexpr picks a branch and `BD * 2` is a number);
everything that depends on runtime data becomes IR ops. `@k.func` helpers are inlined.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from . import dtypes as D
from . import lang
from .errors import K31Error, Loc, error
from .infer import TypeRuleError, infer
from .ir import Block, Kernel, Op, Param, TensorType, TileType, Value

HOST_OPS = {"const", "dim", "add", "sub", "mul", "floordiv", "mod", "maximum", "minimum"}

UNSUPPORTED_STMT = {
    ast.While: ("`while` loops", "use `for i in range(n)` with a bound known at launch"),
    ast.Try: ("`try` blocks", "kernels cannot catch errors; check inputs before the launch"),
    ast.With: ("`with` blocks", None), ast.Raise: ("`raise`", "use `assert` on constexprs"),
    ast.FunctionDef: ("nested function definitions", "define a module-level @k.func instead"),
    ast.ClassDef: ("class definitions", None), ast.Import: ("imports", "import at module level"),
    ast.ImportFrom: ("imports", "import at module level"), ast.Global: ("`global`", None),
    ast.Nonlocal: ("`nonlocal`", None), ast.Delete: ("`del`", None),
    ast.Break: ("`break`", "loops run their full range; mask the work instead"),
    ast.Continue: ("`continue`", "wrap the rest of the body in k.where masks instead"),
    ast.AsyncFunctionDef: ("async functions", None), ast.Match: ("`match`", None),
}
UNSUPPORTED_EXPR = {
    ast.Lambda: ("lambdas", "define a @k.func"), ast.ListComp: ("list comprehensions", None),
    ast.DictComp: ("dict comprehensions", None), ast.SetComp: ("set comprehensions", None),
    ast.GeneratorExp: ("generator expressions", None), ast.Dict: ("dicts", None),
    ast.Set: ("sets", None), ast.JoinedStr: ("f-strings", None), ast.Await: ("await", None),
    ast.Yield: ("yield", None), ast.NamedExpr: ("the walrus operator", None),
    ast.Starred: ("star-unpacking", None),
}
BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
          ast.Mod: "mod", ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor",
          ast.LShift: "shl", ast.RShift: "shr"}
CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
UNARY_FUNCS = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sigmoid", "softplus", "relu",
               "floor", "ceil"}
PY_BUILTINS = {"range": range, "min": min, "max": max, "abs": abs, "int": int, "float": float,
               "len": len, "bool": bool, "True": True, "False": False, "None": None}


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


class _Return(Exception):
    def __init__(self, value):
        self.value = value


class _Source:
    """A function's parsed AST with the offsets that map it back to the user's file."""

    def __init__(self, fn):
        self.file = inspect.getsourcefile(fn) or "<unknown>"
        lines, self.first_line = inspect.getsourcelines(fn)
        raw = "".join(lines)
        dedented = textwrap.dedent(raw)
        self.col_offset = len(raw.splitlines()[0]) - len(dedented.splitlines()[0])
        tree = ast.parse(dedented)
        self.fdef = tree.body[0]
        self.globals = fn.__globals__

    def loc(self, node) -> Loc:
        return Loc(self.file, self.first_line + getattr(node, "lineno", 1) - 1,
                   getattr(node, "col_offset", 0) + self.col_offset)


_SOURCE_CACHE: dict[int, _Source] = {}


def _source(fn) -> _Source:
    key = id(fn)
    if key not in _SOURCE_CACHE:
        try:
            _SOURCE_CACHE[key] = _Source(fn)
        except (OSError, TypeError) as e:
            raise K31Error(f"cannot read the source of `{fn.__name__}` ({e}); kernels must live in a file")
    return _SOURCE_CACHE[key]


def _assigned_names(stmts) -> set[str]:
    out: set[str] = set()
    for st in stmts:
        for node in ast.walk(st):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.For)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                            out.add(n.id)
    return out


def _is_value(x) -> bool:
    return isinstance(x, Value)


def _is_const(x) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, Value)


class Frontend:
    def __init__(self, kdef: lang.KernelDef, constexprs: dict[str, Any]):
        self.kdef = kdef
        self.src = _source(kdef.fn)
        self.constexprs_in = dict(constexprs)
        self.block: Block | None = None
        self.host = Block()
        self.body: Block | None = None
        self.grid: list[Value] | None = None
        self.func_stack: list[str] = []
        self.in_loop = 0
        self.loop_locals: dict[str, Loc] = {}

    # ------------------------------------------------------------ errors and emission
    def err(self, node, message: str, hint: str | None = None, src: _Source | None = None) -> K31Error:
        return error(message, (src or self.cur_src).loc(node), hint)

    def emit(self, name: str, operands: list[Value], attrs: dict, node, regions=None) -> list[Value]:
        if self.block is self.host and name not in HOST_OPS:
            raise self.err(node, f"only shape arithmetic may come before `k.grid` (found `{name}`)",
                           "move the statement inside the `for ... in k.grid(...)` loop")
        try:
            types = infer(name, [v.type for v in operands], attrs)
        except TypeRuleError as e:
            raise self.err(node, e.message, e.hint) from None
        results = [Value(t) for t in types]
        op = Op(name, list(operands), results, dict(attrs), list(regions or []), self.cur_src.loc(node))
        self.block.ops.append(op)
        return results

    def emit1(self, name, operands, attrs, node) -> Value:
        return self.emit(name, operands, attrs, node)[0]

    def const(self, value, dtype: D.DType, node) -> Value:
        if dtype.is_int or dtype is D.bool_:
            if isinstance(value, float) and not value.is_integer():
                raise self.err(node, f"the float literal {value} cannot become a {dtype.name} value",
                               "cast the other side to a float type with .to(k.f32)")
            value = int(value) if dtype.is_int else bool(value)
        else:
            value = float(value)
        return self.emit1("const", [], {"value": value, "dtype": dtype}, node)

    def as_value(self, x, node, like: D.DType | None = None) -> Value:
        """Turn a compile-time number into a const (typed like `like`, else i32/f32/bool)."""
        if _is_value(x):
            return x
        if isinstance(x, bool):
            return self.const(x, like or D.bool_, node)
        if isinstance(x, int):
            return self.const(x, like or D.i32, node)
        if isinstance(x, float):
            if like is not None and not like.is_float:
                raise self.err(node, f"float literal {x} used with a {like.name} value",
                               "cast the value with .to(k.f32) or use an integer literal")
            return self.const(x, like or D.f32, node)
        raise self.err(node, f"expected a number or a tile here, got {self._describe(x)}")

    def _describe(self, x) -> str:
        if _is_value(x):
            return f"a {x.type} value"
        if isinstance(x, ShapeOf):
            return "a tensor shape (index it: x.shape[0])"
        if isinstance(x, Span):
            return "a k.span (only valid as a tensor index)"
        if isinstance(x, D.DType):
            return f"the dtype {x.name}"
        return f"{type(x).__name__} {x!r}"[:80]

    # ------------------------------------------------------------ driver
    def build(self) -> Kernel:
        self.cur_src = self.src
        fdef = self.src.fdef
        if fdef.decorator_list is None or not isinstance(fdef, ast.FunctionDef):
            raise self.err(fdef, "a @k.kernel must be a plain function")
        self.env: dict[str, Any] = {}
        params = self._bind_params(fdef)
        self.block = self.host
        stmts = list(fdef.body)
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None), ast.Constant):
            stmts = stmts[1:]  # docstring
        grid_seen = False
        for st in stmts:
            if grid_seen:
                raise self.err(st, "`k.grid` must be the outermost loop and the last statement of the kernel",
                               "put this statement inside the grid loop")
            if isinstance(st, ast.For) and self._is_grid(st.iter):
                self._grid_loop(st)
                grid_seen = True
            else:
                self.stmt(st)
        if not grid_seen:
            raise self.err(fdef, f"kernel `{fdef.name}` has no `for ... in k.grid(...)` loop",
                           "wrap the body in `for i in k.grid(N):` to say how many programs run")
        return Kernel(self.kdef.name, params, self.constexprs, self.host, self.grid, self.body,
                      self.src.loc(fdef), self.kdef.configs)

    def _bind_params(self, fdef: ast.FunctionDef) -> list[Param]:
        fn = self.kdef.fn
        sig = inspect.signature(fn)
        try:
            hints = {n: (eval(a, fn.__globals__) if isinstance(a, str) else a)
                     for n, a in fn.__annotations__.items()}
        except Exception as e:  # noqa: BLE001 - any failure is the user's annotation
            raise self.err(fdef, f"cannot evaluate a parameter annotation: {e}")
        node_of = {a.arg: a for a in fdef.args.args}
        if fdef.args.vararg or fdef.args.kwarg or fdef.args.kwonlyargs:
            raise self.err(fdef, "kernels take plain positional parameters only (no *args/**kwargs/keyword-only)")
        config0 = self.kdef.configs[0] if self.kdef.configs else {}
        unknown = set(self.constexprs_in) - set(sig.parameters)
        if unknown:
            raise K31Error(f"{self.kdef.loc}: kernel `{self.kdef.name}` has no constexpr named "
                           f"{', '.join(sorted(unknown))}")
        params, self.constexprs = [], {}
        for name, p in sig.parameters.items():
            ann = hints.get(name)
            anode = node_of[name]
            if ann is lang.constexpr:
                if name in self.constexprs_in:
                    val = self.constexprs_in[name]
                elif name in config0:
                    val = config0[name]
                elif p.default is not inspect.Parameter.empty:
                    val = p.default
                else:
                    raise self.err(anode, f"constexpr `{name}` has no value",
                                   "give it a default, list it in configs=, or pass it when compiling")
                self.constexprs[name] = val
                self.env[name] = val
            elif isinstance(ann, lang.TensorAnnot):
                v = Value(TensorType(ann.dtype, ann.dims), name)
                params.append(Param(name, v))
                self.env[name] = v
            elif isinstance(ann, D.DType):
                if ann.is_storage_only:
                    raise self.err(anode, f"scalar parameter `{name}` cannot be {ann.name}")
                v = Value(TileType(ann, ()), name)
                params.append(Param(name, v))
                self.env[name] = v
            elif ann is None:
                raise self.err(anode, f"parameter `{name}` needs an annotation",
                               "use k.Tensor[dtype, dims...], a dtype such as k.f32, or k.constexpr")
            else:
                raise self.err(anode, f"parameter `{name}` has an unsupported annotation {ann!r}",
                               "use k.Tensor[dtype, dims...], a dtype such as k.f32, or k.constexpr")
        return params

    def _is_grid(self, it) -> bool:
        if not isinstance(it, ast.Call):
            return False
        try:
            f = self.expr(it.func)
        except K31Error:
            return False
        return lang.builtin_name(f) == "grid"

    def _grid_loop(self, st: ast.For):
        it = st.iter
        if it.keywords or not 1 <= len(it.args) <= 3:
            raise self.err(it, f"k.grid takes 1 to 3 extents, got {len(it.args)}",
                           "fold extra dimensions into one: k.grid(B * H)")
        extents = [self.as_value(self.expr(a), a) for a in it.args]
        for e, a in zip(extents, it.args):
            if not (e.type.is_scalar and e.type.dtype.is_int):
                raise self.err(a, f"k.grid extents must be integer scalars, got {e.type}")
        self.grid = extents
        names = self._target_names(st.target, len(extents))
        self.body = Block([Value(TileType(D.i32, ()), n) for n in names])
        self.block = self.body
        for n, v in zip(names, self.body.args):
            self.env[n] = v
        self.stmts(st.body)
        if st.orelse:
            raise self.err(st, "`for ... else` is not supported")

    def _target_names(self, target, n: int) -> list[str]:
        if isinstance(target, ast.Name):
            names = [target.id]
        elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            names = [e.id for e in target.elts]
        else:
            raise self.err(target, "loop targets must be names")
        if len(names) != n:
            raise self.err(target, f"k.grid has {n} dims but the loop unpacks {len(names)} names")
        return names

    # ------------------------------------------------------------ statements
    def stmts(self, body):
        for st in body:
            self.stmt(st)

    def stmt(self, st):
        for cls, (what, hint) in UNSUPPORTED_STMT.items():
            if isinstance(st, cls):
                raise self.err(st, f"{what} are not supported in kernels" if what.endswith("s")
                               else f"{what} is not supported in kernels", hint)
        if isinstance(st, ast.Expr):
            if isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                return
            self.expr(st.value)
        elif isinstance(st, ast.Pass):
            return
        elif isinstance(st, ast.Assign):
            value = self.expr(st.value)
            for t in st.targets:
                self.assign(t, value, st)
        elif isinstance(st, ast.AugAssign):
            if isinstance(st.target, ast.Subscript):
                cur = self.expr(ast.Subscript(st.target.value, st.target.slice, ast.Load(),
                                              lineno=st.lineno, col_offset=st.col_offset))
            else:
                cur = self.expr(ast.Name(st.target.id, ast.Load(), lineno=st.target.lineno,
                                         col_offset=st.target.col_offset))
            new = self.binop(type(st.op), cur, self.expr(st.value), st)
            self.assign(st.target, new, st)
        elif isinstance(st, ast.AnnAssign):
            raise self.err(st, "annotated assignments are not supported in kernels",
                           "write `x = value.to(k.f32)` to fix a dtype")
        elif isinstance(st, ast.For):
            self.for_loop(st)
        elif isinstance(st, ast.If):
            cond = self.expr(st.test)
            if _is_value(cond):
                raise self.err(st.test, "`if` needs a condition known at compile time (a constexpr)",
                               "for runtime conditions select with k.where(cond, a, b)")
            self.stmts(st.body if cond else st.orelse)
        elif isinstance(st, ast.Return):
            if not self.func_stack:
                raise self.err(st, "kernels do not return values", "store results into an output tensor")
            if self.in_loop:
                raise self.err(st, "`return` inside a loop is not supported", "return after the loop")
            raise _Return(self.expr(st.value) if st.value is not None else None)
        elif isinstance(st, ast.Assert):
            cond = self.expr(st.test)
            if _is_value(cond):
                raise self.err(st, "`assert` needs a compile-time condition")
            if not cond:
                msg = self.expr(st.msg) if st.msg is not None else "assertion failed"
                raise self.err(st, f"compile-time assertion failed: {msg}")
        else:
            raise self.err(st, f"`{type(st).__name__}` statements are not supported in kernels")

    def assign(self, target, value, st):
        if isinstance(target, ast.Name):
            if isinstance(value, (Span, GridCall)):
                raise self.err(target, "k.span/k.grid results cannot be stored in variables",
                               "use them directly inside the subscript / for statement")
            if _is_value(value) and value.hint is None:
                value.hint = target.id
            self.env[target.id] = value
            if self.in_loop:
                self.loop_locals.setdefault(target.id, self.cur_src.loc(target))
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, ShapeOf):
                value = tuple(self.dim(value.tensor, i, target) for i in range(value.tensor.type.rank))
            if not isinstance(value, (tuple, list)) or len(value) != len(target.elts):
                raise self.err(target, f"cannot unpack {self._describe(value)} into {len(target.elts)} names")
            for t, v in zip(target.elts, value):
                self.assign(t, v, st)
        elif isinstance(target, ast.Subscript):
            base = self.expr(target.value)
            if not (_is_value(base) and isinstance(base.type, TensorType)):
                name = target.value.id if isinstance(target.value, ast.Name) else "this expression"
                raise self.err(target, f"cannot store into `{name}`: only tensor parameters can be stored to",
                               "tiles are values; build a new one (e.g. with k.where) instead of assigning into it")
            idx_nodes = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
            self.store(base, [self.expr(i) for i in idx_nodes], value, None, target)
        else:
            raise self.err(target, "unsupported assignment target")

    def for_loop(self, st: ast.For):
        if st.orelse:
            raise self.err(st, "`for ... else` is not supported")
        it = st.iter
        if self._is_grid(it):
            raise self.err(it, "`k.grid` must be the outermost loop of the kernel",
                           "only one grid loop, at the top of the kernel body; use range() inside")
        if not isinstance(it, ast.Call):
            raise self.err(it, "kernels loop only over range(...), k.static_range(...) or k.grid(...)")
        fn = self.expr(it.func)
        args = [self.expr(a) for a in it.args]
        if lang.builtin_name(fn) == "static_range":
            if not all(isinstance(a, int) for a in args):
                raise self.err(it, "k.static_range bounds must be compile-time integers")
            for i in range(*args):
                self.assign(st.target, i, st)
                self.stmts(st.body)
            return
        if fn is not range:
            raise self.err(it, "kernels loop only over range(...), k.static_range(...) or k.grid(...)")
        if it.keywords or not 1 <= len(args) <= 3:
            raise self.err(it, "range() takes 1 to 3 positional arguments")
        if len(args) == 1:
            args = [0, args[0], 1]
        elif len(args) == 2:
            args = [args[0], args[1], 1]
        if isinstance(args[2], int) and args[2] <= 0:
            raise self.err(it, "range() step must be positive in kernels")
        lo, hi, step = (self.as_value(a, n, D.i32) for a, n in zip(args, [it] * 3))
        if not isinstance(st.target, ast.Name):
            raise self.err(st.target, "a range loop target must be a single name")
        carried = sorted(n for n in _assigned_names(st.body)
                         if n in self.env and (_is_value(self.env[n]) or _is_const(self.env[n]))
                         and not (_is_value(self.env[n]) and isinstance(self.env[n].type, TensorType)))
        inits = [self.as_value(self.env[n], st) for n in carried]
        body = Block([Value(TileType(D.i32, ()), st.target.id)] + [Value(v.type, n) for v, n in zip(inits, carried)])
        outer_env, outer_block, outer_locals = dict(self.env), self.block, self.loop_locals
        self.env[st.target.id] = body.args[0]
        for n, a in zip(carried, body.args[1:]):
            self.env[n] = a
        self.block, self.loop_locals = body, {}
        self.in_loop += 1
        try:
            self.stmts(st.body)
            yields = []
            for n, init in zip(carried, inits):
                v = self.env[n]
                if not _is_value(v):
                    v = self.as_value(v, st, init.type.dtype)
                if v.type != init.type:
                    raise self.err(st, f"loop-carried `{n}` changes type from {init.type} to {v.type} in the loop body",
                                   f"give `{n}` its final type before the loop (e.g. k.zeros(shape, dtype) "
                                   "or .to(dtype))")
                yields.append(v)
            self.emit("yield", yields, {}, st)
        finally:
            self.in_loop -= 1
            inner_locals = self.loop_locals
            self.block, self.env, self.loop_locals = outer_block, outer_env, outer_locals
        results = self.emit("for", [lo, hi, step] + inits, {}, st, regions=[body])
        for n, r in zip(carried, results):
            r.hint = n
            self.env[n] = r
        for n, loc in inner_locals.items():
            if n not in self.env:
                self.env[n] = _LoopLocal(n, loc)

    # ------------------------------------------------------------ expressions
    def expr(self, node):
        for cls, (what, hint) in UNSUPPORTED_EXPR.items():
            if isinstance(node, cls):
                raise self.err(node, f"{what} are not supported in kernels", hint)
        m = getattr(self, "expr_" + type(node).__name__, None)
        if m is None:
            raise self.err(node, f"`{type(node).__name__}` expressions are not supported in kernels")
        return m(node)

    def expr_Constant(self, node):
        if isinstance(node.value, (bool, int, float, str)) or node.value is None:
            return node.value
        raise self.err(node, f"unsupported constant {node.value!r}")

    def expr_Name(self, node):
        name = node.id
        if name in self.env:
            v = self.env[name]
            if isinstance(v, _LoopLocal):
                raise self.err(node, f"`{name}` is assigned only inside the loop at line {v.loc.line} "
                               "and cannot be used after it", f"initialise `{name}` before the loop so it is carried")
            return v
        g = self.cur_src.globals
        if name in g:
            return self._global(g[name], node)
        if name in PY_BUILTINS:
            return PY_BUILTINS[name]
        raise self.err(node, f"unknown name `{name}`",
                       "kernels see their parameters, local variables, module-level constants, "
                       "@k.func helpers and the k31dsl module")

    def _global(self, obj, node):
        import types
        if isinstance(obj, (bool, int, float, str, D.DType, lang.FuncDef, tuple)) or obj is None:
            return obj
        if isinstance(obj, types.ModuleType) or lang.builtin_name(obj) or obj is range:
            return obj
        if obj in (min, max, abs, int, float, len):
            return obj
        if isinstance(obj, lang.KernelDef):
            raise self.err(node, f"kernel `{obj.name}` cannot be called from another kernel",
                           "make the shared code a @k.func")
        raise self.err(node, f"`{getattr(node, 'id', '?')}` is a {type(obj).__name__}, which kernels cannot use",
                       "kernels can use numbers, dtypes, @k.func helpers and the k31dsl module")

    def expr_Attribute(self, node):
        base = self.expr(node.value)
        attr = node.attr
        import types
        if isinstance(base, types.ModuleType):
            obj = getattr(base, attr, None)
            if obj is None:
                raise self.err(node, f"module `{base.__name__}` has no `{attr}`")
            return self._global(obj, node) if not isinstance(obj, types.ModuleType) else obj
        if _is_value(base):
            if attr == "shape":
                if isinstance(base.type, TensorType):
                    return ShapeOf(base)
                return tuple(base.type.shape)
            if attr == "T":
                return self.emit1("trans", [base], {}, node)
            if attr == "dtype":
                return base.type.dtype
            if attr in ("to", "bitcast"):
                return _Method(base, attr)
            raise self.err(node, f"tiles have no attribute `{attr}`",
                           "available: .shape, .dtype, .T, .to(dtype), .bitcast(dtype)")
        raise self.err(node, f"{self._describe(base)} has no attribute `{attr}`")

    def expr_Tuple(self, node):
        return tuple(self.expr(e) for e in node.elts)

    expr_List = expr_Tuple

    def expr_IfExp(self, node):
        c = self.expr(node.test)
        if _is_value(c):
            raise self.err(node, "`a if c else b` needs a compile-time condition", "use k.where(c, a, b)")
        return self.expr(node.body if c else node.orelse)

    def expr_BoolOp(self, node):
        vals = [self.expr(v) for v in node.values]
        if any(_is_value(v) for v in vals):
            raise self.err(node, "`and`/`or` need compile-time operands",
                           "combine masks with & and |, with parentheses: (a < b) & (c < d)")
        out = vals[0]
        for v in vals[1:]:
            out = (out and v) if isinstance(node.op, ast.And) else (out or v)
        return out

    def expr_UnaryOp(self, node):
        x = self.expr(node.operand)
        if not _is_value(x):
            try:
                return {ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Not: lambda a: not a,
                        ast.Invert: lambda a: ~a}[type(node.op)](x)
            except TypeError as e:
                raise self.err(node, str(e))
        if isinstance(node.op, ast.USub):
            return self.emit1("neg", [x], {}, node)
        if isinstance(node.op, ast.UAdd):
            return x
        if isinstance(node.op, ast.Invert):
            return self.emit1("not", [x], {}, node)
        raise self.err(node, "`not` needs a compile-time operand", "use ~mask for bool tiles")

    def binop(self, optype, a, b, node):
        if optype is ast.Pow:
            return self.power(a, b, node)
        name = BINOPS.get(optype)
        if name is None:
            raise self.err(node, f"operator `{type(optype).__name__}` is not supported")
        if not _is_value(a) and not _is_value(b):
            return self._fold(optype, a, b, node)
        return self.binary(name, a, b, node)

    def _fold(self, optype, a, b, node):
        import operator
        f = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
             ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
             ast.LShift: operator.lshift, ast.RShift: operator.rshift}[optype]
        try:
            return f(a, b)
        except Exception as e:  # noqa: BLE001 - the user's constant expression failed
            raise self.err(node, f"cannot evaluate this constant expression: {e}")

    def binary(self, name, a, b, node):
        if isinstance(a, (Span, ShapeOf)) or isinstance(b, (Span, ShapeOf)):
            raise self.err(node, f"cannot compute with {self._describe(a if not _is_value(a) else b)}")
        a, b = self._promote_int_scalar(a, b, node)
        like = a.type.dtype if _is_value(a) else b.type.dtype
        if name == "div" and like.is_int:
            raise self.err(node, "`/` on integers", "use // for integer division, or cast with .to(k.f32)")
        a, b = self.as_value(a, node, like), self.as_value(b, node, like)
        return self.emit1(name, [a, b], {}, node)

    def _promote_int_scalar(self, a, b, node):
        """An integer scalar (a shape, loop index, program id, int parameter) meeting a float
        operand converts to that float type, as a Python int would; tiles never convert."""
        def float_of(x):
            if _is_value(x):
                return x.type.dtype if x.type.dtype.is_float else None
            return D.f32 if isinstance(x, float) else None

        def int_scalar(x):
            return _is_value(x) and x.type.is_scalar and x.type.dtype.is_int

        if int_scalar(a) and float_of(b) is not None:
            a = self.emit1("cast", [a], {"dtype": float_of(b)}, node)
        elif int_scalar(b) and float_of(a) is not None:
            b = self.emit1("cast", [b], {"dtype": float_of(a)}, node)
        return a, b

    def power(self, a, b, node):
        if not _is_value(a) and not _is_value(b):
            return a ** b
        if _is_value(b):
            raise self.err(node, "`**` needs a compile-time exponent", "use k.exp2(b * k.log2(a))")
        if isinstance(b, int) and 1 <= b <= 8:
            out = a
            for _ in range(b - 1):
                out = self.emit1("mul", [out, a], {}, node)
            return out
        if b == 0.5:
            return self.emit1("sqrt", [a], {}, node)
        if b == -0.5:
            return self.emit1("rsqrt", [a], {}, node)
        lg = self.emit1("log2", [a], {}, node)
        return self.emit1("exp2", [self.binary("mul", lg, float(b), node)], {}, node)

    def expr_BinOp(self, node):
        return self.binop(type(node.op), self.expr(node.left), self.expr(node.right), node)

    def expr_Compare(self, node):
        if len(node.ops) != 1:
            raise self.err(node, "chained comparisons are not supported", "write (a < b) & (b < c)")
        a, b = self.expr(node.left), self.expr(node.comparators[0])
        op = type(node.ops[0])
        if op in (ast.Is, ast.IsNot, ast.In, ast.NotIn):
            if _is_value(a) or _is_value(b):
                raise self.err(node, "`is`/`in` need compile-time operands")
            return {ast.Is: lambda: a is b, ast.IsNot: lambda: a is not b,
                    ast.In: lambda: a in b, ast.NotIn: lambda: a not in b}[op]()
        if not _is_value(a) and not _is_value(b):
            import operator
            return {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
                    ast.Eq: operator.eq, ast.NotEq: operator.ne}[op](a, b)
        return self.binary(CMPOPS[op], a, b, node)

    def expr_Subscript(self, node):
        base = self.expr(node.value)
        idx_nodes = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if isinstance(base, ShapeOf):
            i = self.expr(node.slice)
            if not isinstance(i, int):
                raise self.err(node.slice, "shape index must be a compile-time integer")
            return self.dim(base.tensor, i, node)
        if isinstance(base, (tuple, list)):
            i = self.expr(node.slice)
            if _is_value(i):
                raise self.err(node.slice, "tuples are indexed with compile-time integers")
            try:
                return base[i]
            except (IndexError, TypeError) as e:
                raise self.err(node, str(e))
        if _is_value(base) and isinstance(base.type, TensorType):
            return self.load(base, [self.expr(i) for i in idx_nodes], None, None, node)
        if _is_value(base):
            return self.tile_view(base, idx_nodes, node)
        raise self.err(node, f"cannot index {self._describe(base)}")

    def tile_view(self, x: Value, idx_nodes, node):
        """t[:, None] style axis insertion; the only indexing defined on tiles."""
        out, axis = x, 0
        for i in idx_nodes:
            if isinstance(i, ast.Constant) and i.value is None:
                out = self.emit1("expand", [out], {"axis": axis}, node)
                axis += 1
            elif isinstance(i, ast.Slice) and i.lower is None and i.upper is None and i.step is None:
                axis += 1
            else:
                raise self.err(node, "tiles support only `:` and `None` in subscripts (to add axes)",
                               "to pick elements use k.take(tile, index_tile) or k.where")
        if axis != len(x.type.shape) + sum(1 for i in idx_nodes if isinstance(i, ast.Constant)):
            raise self.err(node, f"subscript has {axis} entries for a tile of rank {len(x.type.shape)} "
                           "plus the added axes")
        return out

    def dim(self, tensor: Value, i: int, node) -> Value:
        rank = tensor.type.rank
        if not -rank <= i < rank:
            raise self.err(node, f"shape index {i} is out of range for `{tensor.hint}` of rank {rank}")
        return self.emit1("dim", [tensor], {"axis": i % rank}, node)

    # ------------------------------------------------------------ memory access
    def _index(self, tensor: Value, idx: list, node):
        if len(idx) != tensor.type.rank:
            raise self.err(node, f"`{tensor.hint}` has rank {tensor.type.rank} but is indexed with {len(idx)} "
                           f"indices", "give one index per axis: an integer, a k.span(start, size) or an index tile")
        kinds, operands, other = [], [], None
        for i in idx:
            if isinstance(i, Span):
                kinds.append(f"span:{i.size}")
                operands.append(self.as_value(i.start, node, D.i32))
                if i.other is not None:
                    other = i.other
            elif _is_value(i) and not i.type.is_scalar:
                kinds.append("gather")
                operands.append(i)
            elif _is_value(i) or isinstance(i, int):
                kinds.append("scalar")
                operands.append(self.as_value(i, node, D.i32))
            else:
                raise self.err(node, f"a tensor index must be an integer, k.span(...) or an index tile, "
                               f"got {self._describe(i)}", "slices like `:` need a static size: k.span(0, BLOCK)")
        return kinds, operands, other

    def load(self, tensor, idx, mask, other, node):
        kinds, operands, span_other = self._index(tensor, idx, node)
        other = other if other is not None else span_other
        if other is not None and not _is_const(other):
            raise self.err(node, "`other=` must be a compile-time number such as 0.0 or float('-inf')")
        if mask is not None:
            operands.append(self.as_value(mask, node))
        return self.emit1("load", [tensor] + operands,
                          {"index": kinds, "other": other, "mask": mask is not None}, node)

    def store(self, tensor, idx, value, mask, node):
        kinds, operands, _ = self._index(tensor, idx, node)
        value = self.as_value(value, node, tensor.type.dtype)
        operands.append(value)
        if mask is not None:
            operands.append(self.as_value(mask, node))
        self.emit("store", [tensor] + operands, {"index": kinds, "mask": mask is not None}, node)

    # ------------------------------------------------------------ calls
    def expr_Call(self, node):
        fn = self.expr(node.func)
        args = [self.expr(a) for a in node.args]
        kwargs = {kw.arg: self.expr(kw.value) for kw in node.keywords}
        if None in kwargs:
            raise self.err(node, "`**kwargs` calls are not supported")
        if isinstance(fn, _Method):
            return self.method(fn, args, kwargs, node)
        if isinstance(fn, lang.FuncDef):
            return self.inline(fn, args, kwargs, node)
        name = lang.builtin_name(fn)
        if name is not None:
            from . import builtins_impl
            return builtins_impl.call(self, name, args, kwargs, node)
        if fn in (min, max):
            if any(_is_value(a) for a in args):
                if len(args) != 2 or kwargs:
                    raise self.err(node, f"{fn.__name__}() on tiles takes exactly two arguments")
                return self.binary("minimum" if fn is min else "maximum", args[0], args[1], node)
            return fn(*args, **kwargs)
        if fn is abs:
            return self.emit1("abs", [args[0]], {}, node) if _is_value(args[0]) else abs(args[0])
        if fn in (int, float, bool, len):
            if any(_is_value(a) for a in args):
                raise self.err(node, f"{fn.__name__}() needs compile-time arguments", "use .to(k.i32)/.to(k.f32)")
            return fn(*args)
        if fn is range:
            raise self.err(node, "range() is only valid as the iterable of a for loop")
        raise self.err(node, f"cannot call {self._describe(fn)} inside a kernel")

    def method(self, m, args, kwargs, node):
        if len(args) != 1 or kwargs or not isinstance(args[0], D.DType):
            raise self.err(node, f".{m.name}() takes one dtype, e.g. .{m.name}(k.f32)")
        if m.name == "to" and args[0] is m.value.type.dtype:
            return m.value
        return self.emit1("cast" if m.name == "to" else "bitcast", [m.value], {"dtype": args[0]}, node)

    def inline(self, f: lang.FuncDef, args, kwargs, node):
        if f.name in self.func_stack:
            chain = " -> ".join(self.func_stack + [f.name])
            raise self.err(node, f"recursive @k.func call: {chain}", "k.func helpers are inlined and cannot recurse")
        src = _source(f.fn)
        sig = inspect.signature(f.fn)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise self.err(node, f"bad call of @k.func `{f.name}`: {e}")
        bound.apply_defaults()
        saved = (self.env, self.cur_src, self.in_loop, self.loop_locals)
        self.env, self.cur_src, self.in_loop, self.loop_locals = dict(bound.arguments), src, 0, {}
        self.func_stack.append(f.name)
        try:
            self.stmts(src.fdef.body)
            return None
        except _Return as r:
            return r.value
        finally:
            self.func_stack.pop()
            self.env, self.cur_src, self.in_loop, self.loop_locals = saved


@dataclass
class _Method:
    value: Value
    name: str


@dataclass
class _LoopLocal:
    name: str
    loc: Loc


def build_kernel(kdef: lang.KernelDef, constexprs: dict[str, Any] | None = None) -> Kernel:
    fe = Frontend(kdef, constexprs or {})
    try:
        return fe.build()
    except RecursionError:
        raise K31Error(f"{kdef.loc}: kernel `{kdef.name}` is nested too deeply to compile") from None

"""AST frontend: reads an `@k.kernel` function's source and builds kernel IR.

The frontend is a partial evaluator. Names bound to Python numbers, dtypes, tuples and constexprs
are folded while reading (so `if` on a constexpr picks a branch and `BD * 2` is a number);
everything that depends on runtime data becomes IR ops. `@k.func` helpers are inlined.
Statements and the driver live here; expressions, subscripts, loads/stores and calls in
frontend_exprs.py; operators (arithmetic, comparisons, unary, `and`/`or`, constant folding) in
frontend_operators.py; loops (range, k.range, k.static_range, while) in frontend_loops.py;
parameters are classified by signature.py; the function's parsed source and the map from its AST
back to the user's file come from pysource.py. A tensor annotated `k.Tensor["XT", ...]` takes the
dtype that the constexpr XT holds in this specialisation, so the IR is always concrete.

`check_portable(kernel)` checks the rules the compiled targets (Triton, AscendC) add to the IR's
own: tile dims are powers of two, a tile holds at most 2**20 elements, `k.dot` dims are >= 16.
The numpy reference runs any tile shape.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any

from . import dtypes as D
from . import lang
from .errors import K31Error, Loc, error
from .frontend_exprs import (ExprMixin, GridCall, Method, ShapeOf, Span,  # noqa: F401
                             is_tensor, is_value)
from .frontend_loops import LoopMixin
from .frontend_operators import OperatorMixin
from .infer import TypeRuleError, infer
from .ir import Block, Kernel, Op, Param, TensorType, TileType, Value
from .pysource import source_of
from .signature import Signature, read_signature

HOST_OPS = {"const", "dim", "add", "sub", "mul", "floordiv", "mod", "maximum", "minimum"}
MAX_TILE_NUMEL = 1 << 20
MAX_OPS = 200_000
LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}   # configs= entries for targets
CONSTEXPR_TYPES = (bool, int, float, str, D.DType, tuple, type(None))

UNSUPPORTED_STMT = {
    ast.Try: ("`try` blocks", "kernels cannot catch errors; check inputs before the launch"),
    ast.With: ("`with` blocks", "kernels have no context managers; write the body directly"),
    ast.Raise: ("`raise`", "use `assert` on constexprs for compile-time checks"),
    ast.FunctionDef: ("nested function definitions", "define a module-level @k.func instead"),
    ast.AsyncFunctionDef: ("async functions", "define a module-level @k.func instead"),
    ast.ClassDef: ("class definitions", "define classes outside kernels"),
    ast.Import: ("imports", "import at module level"),
    ast.ImportFrom: ("imports", "import at module level"),
    ast.Global: ("`global`", "kernels cannot change module state; store into an output tensor"),
    ast.Nonlocal: ("`nonlocal`", "kernels cannot change outer state; return values from @k.func"),
    ast.Delete: ("`del`", "just stop using the name"),
    ast.Break: ("`break`", "a range() loop runs its full range; to stop on data, loop with "
                "`while cond:` and let the body change what cond reads"),
    ast.Continue: ("`continue`", "wrap the rest of the body in k.where masks instead"),
    ast.Match: ("`match`", "use `if` on constexprs"),
    ast.AnnAssign: ("annotated assignments", "write `x = value.to(k.f32)` to fix a dtype"),
}


class _Return(Exception):
    def __init__(self, value):
        self.value = value


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class Frontend(ExprMixin, OperatorMixin, LoopMixin):
    def __init__(self, kdef: lang.KernelDef, constexprs: dict[str, Any]):
        self.kdef = kdef
        self.src = self.cur_src = source_of(kdef.fn, kdef)
        self.last_loc = self.src.loc(self.src.fdef)
        self.constexprs_in = dict(constexprs)
        self.block: Block | None = None
        self.host = Block()
        self.body: Block | None = None
        self.grid: list[Value] | None = None
        self.func_stack: list[str] = []
        self.in_loop = 0
        self.loop_locals: dict[str, Loc] = {}
        self.n_ops = 0
        self.env: dict[str, Any] = {}

    # ------------------------------------------------------------ errors and emission
    def err(self, node, message: str, hint: str | None = None) -> K31Error:
        return error(message, self.cur_src.loc(node), hint)

    def emit(self, name: str, operands: list[Value], attrs: dict, node, regions=None) -> list[Value]:
        if self.block is self.host and name not in HOST_OPS:
            raise self.err(node, f"only shape arithmetic may come before `k.grid` (found `{name}`)",
                           "move the statement inside the `for ... in k.grid(...)` loop")
        try:
            types = infer(name, [v.type for v in operands], attrs)
        except TypeRuleError as e:
            raise self.err(node, e.message, e.hint or "check the operand types and shapes") from None
        self.n_ops += 1
        if self.n_ops > MAX_OPS:
            raise self.err(node, f"the kernel unrolls to more than {MAX_OPS} ops",
                           "use range() instead of k.static_range for long loops")
        results = [Value(t) for t in types]
        op = Op(name, list(operands), results, dict(attrs), list(regions or []), self.cur_src.loc(node))
        self.block.ops.append(op)
        return results

    def emit1(self, name, operands, attrs, node) -> Value:
        return self.emit(name, operands, attrs, node)[0]

    # ------------------------------------------------------------ driver
    def build(self) -> Kernel:
        fdef = self.src.fdef
        params = self.bind_params(fdef)
        self.block = self.host
        stmts = list(fdef.body)
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
            stmts = stmts[1:]  # docstring
        if not any(isinstance(st, ast.For) and self.is_grid(st.iter) for st in stmts):
            nested = [n for st in stmts for n in ast.walk(st) if isinstance(n, ast.For) and self.is_grid(n.iter)]
            if nested:
                raise self.err(nested[0].iter, "`k.grid` must be the outermost loop of the kernel",
                               "make `for ... in k.grid(...)` a top-level statement; use range() inside it")
            raise self.err(fdef, f"kernel `{fdef.name}` has no `for ... in k.grid(...)` loop",
                           "wrap the body in `for i in k.grid(N):` to say how many programs run "
                           "(the grid loop must be a top-level statement of the kernel)")
        grid_seen = False
        for st in stmts:
            if grid_seen:
                raise self.err(st, "`k.grid` must be the outermost loop and the last statement of the kernel",
                               "move this statement inside the grid loop")
            if isinstance(st, ast.For) and self.is_grid(st.iter):
                self.grid_loop(st)
                grid_seen = True
            else:
                self.stmt(st)
        return Kernel(self.kdef.name, params, self.constexprs, self.host, self.grid, self.body,
                      self.src.loc(fdef), self.kdef.configs)

    def bind_params(self, fdef: ast.FunctionDef) -> list[Param]:
        sig = read_signature(self.kdef, self.src)
        cx_names = list(sig.constexprs)
        where = self.src.loc(fdef)
        unknown = sorted(set(self.constexprs_in) - set(cx_names) - LAUNCH_OPTIONS)
        if unknown:
            raise error(f"kernel `{self.kdef.name}` has no constexpr named {', '.join(unknown)}", where,
                        f"its constexprs are: {', '.join(cx_names) or 'none'}")
        for i, cfg in enumerate(self.kdef.configs):
            bad = sorted(set(cfg) - set(cx_names) - LAUNCH_OPTIONS)
            if bad:
                raise error(f"configs[{i}] of `{self.kdef.name}` sets {', '.join(bad)}, which is not a constexpr",
                            where, f"configs may set constexprs ({', '.join(cx_names) or 'none'}) and launch "
                            f"options ({', '.join(sorted(LAUNCH_OPTIONS))})")
        config0 = self.kdef.configs[0] if self.kdef.configs else {}
        self.constexprs = {}
        self.constexprs_in = {k: v for k, v in self.constexprs_in.items() if k not in LAUNCH_OPTIONS}
        for name, p in sig.constexprs.items():
            a = p.node
            if name in self.constexprs_in:
                val = self.constexprs_in[name]
            elif name in config0:
                val = config0[name]
            elif p.default is not inspect.Parameter.empty:
                val = p.default
            else:
                users = sig.dtype_slots.get(name)
                hint = (f"it is bound from the dtype of `{users[0].name}` when the kernel is called; to build "
                        f"the IR or compile without a call pass it (e.g. {name}=k.bf16) or give it a default"
                        if users else "give it a default, list it in configs=, or pass it when compiling")
                raise self.err(a, f"constexpr `{name}` has no value", hint)
            if not isinstance(val, CONSTEXPR_TYPES):
                raise self.err(a, f"constexpr `{name}` is {type(val).__name__} {val!r}"[:120],
                               "constexprs are numbers, bools, strings, dtypes or tuples")
            if name in sig.dtype_slots and not isinstance(val, D.DType):
                raise self.err(a, f"constexpr `{name}` gives the dtype of `{sig.dtype_slots[name][0].name}`, so it "
                               f"must be a dtype, got {val!r}"[:160], f"pass a dtype, e.g. {name}=k.bf16")
            sig.check_allowed(name, val)
            self.constexprs[name] = val
            self.env[name] = val
        params = []
        for p in sig.runtime:
            ann = p.annot
            if isinstance(ann, lang.TensorAnnot):
                dt = ann.dtype if ann.dtype_param is None else self.constexprs[ann.dtype_param]
                v = Value(TensorType(dt, ann.dims, ann.align), p.name)
            else:
                v = Value(TileType(ann, ()), p.name)
            params.append(Param(p.name, v, p.loc))
            self.env[p.name] = v
        return params

    def is_grid(self, it) -> bool:
        if not isinstance(it, ast.Call):
            return False
        try:
            f = self.expr(it.func)
        except K31Error:
            return False
        return lang.builtin_name(f) == "grid"

    def grid_loop(self, st: ast.For):
        it = st.iter
        if it.keywords or not 1 <= len(it.args) <= 3:
            raise self.err(it, f"k.grid takes 1 to 3 extents, got {len(it.args) + len(it.keywords)}",
                           "fold extra dimensions into one, e.g. k.grid(B * H) and split the id with // and %")
        if st.orelse:
            raise self.err(st, "`for ... else` is not supported", "remove the else block")
        extents = []
        for a in it.args:
            e = self.as_value(self.expr(a), a)
            if not (e.type.is_scalar and e.type.dtype.is_int):
                raise self.err(a, f"k.grid extents must be integer scalars, got {e.type}",
                               "use sizes such as x.shape[0] or k.cdiv(n, BLOCK)")
            extents.append(e)
        self.grid = extents
        names = self.target_names(st.target, len(extents))
        self.body = Block([Value(TileType(D.i32, ()), n) for n in names])
        self.block = self.body
        for n, v in zip(names, self.body.args):
            self.env[n] = v
        self.stmts(st.body)

    def target_names(self, target, n: int) -> list[str]:
        if isinstance(target, ast.Name):
            names = [target.id]
        elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            names = [e.id for e in target.elts]
        else:
            raise self.err(target, "grid loop targets must be names", "write `for i, j in k.grid(M, N):`")
        if len(names) != n:
            raise self.err(target, f"k.grid has {n} dims but the loop unpacks {len(names)} names",
                           "use one name per grid extent")
        return names

    # ------------------------------------------------------------ statements
    def stmts(self, body):
        for st in body:
            self.stmt(st)

    def stmt(self, st):
        self.last_loc = self.cur_src.loc(st)
        for cls, (what, hint) in UNSUPPORTED_STMT.items():
            if isinstance(st, cls):
                plural = what.endswith("s") and not what.startswith("`")
                raise self.err(st, f"{what} {'are' if plural else 'is'} not supported in kernels", hint)
        if isinstance(st, ast.Expr):
            if not (isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)):
                self.expr(st.value)
        elif isinstance(st, ast.Pass):
            return
        elif isinstance(st, ast.Assign):
            value = self.expr(st.value)
            for t in st.targets:
                self.assign(t, value, st)
        elif isinstance(st, ast.AugAssign):
            self.aug_assign(st)
        elif isinstance(st, ast.For):
            self.for_loop(st)
        elif isinstance(st, ast.While):
            self.while_loop(st)
        elif isinstance(st, ast.If):
            cond = self.expr(st.test)
            if is_value(cond):
                raise self.err(st.test, "`if` needs a condition known at compile time (a constexpr)",
                               "for runtime conditions select with k.where(cond, a, b) or mask loads/stores")
            self.stmts(st.body if cond else st.orelse)
        elif isinstance(st, ast.Return):
            if not self.func_stack:
                raise self.err(st, "kernels do not return values", "store results into an output tensor")
            if self.in_loop:
                raise self.err(st, "`return` inside a loop is not supported", "return after the loop")
            raise _Return(self.expr(st.value) if st.value is not None else None)
        elif isinstance(st, ast.Assert):
            cond = self.expr(st.test)
            if is_value(cond):
                raise self.err(st, "`assert` needs a compile-time condition",
                               "assert on constexprs and shapes of tiles; check runtime data on the host")
            if not cond:
                msg = self.expr(st.msg) if st.msg is not None else "assertion failed"
                raise self.err(st, f"compile-time assertion failed: {msg}",
                               "the assertion is checked when the kernel is specialised; change the constexprs "
                               "(defaults, configs= or compile options)")
        else:
            raise self.err(st, f"`{type(st).__name__}` statements are not supported in kernels",
                           "kernels use assignments, for loops, if on constexprs, assert and expressions")

    def aug_assign(self, st: ast.AugAssign):
        t = st.target
        if isinstance(t, ast.Subscript):
            if not is_tensor(self.expr(t.value)):
                name = t.value.id if isinstance(t.value, ast.Name) else "this expression"
                raise self.err(t, f"cannot store into `{name}`: only tensor parameters can be stored to",
                               "tiles and scalars are values; write `t = t + v` or build a new tile with k.where")
            cur = self.expr(ast.Subscript(t.value, t.slice, ast.Load(), lineno=st.lineno, col_offset=st.col_offset))
        elif isinstance(t, ast.Name):
            cur = self.expr(ast.Name(t.id, ast.Load(), lineno=t.lineno, col_offset=t.col_offset))
        else:
            raise self.err(t, "this augmented assignment target is not supported",
                           "use `name op= value` or `tensor[index] op= value`")
        self.assign(t, self.binop(type(st.op), cur, self.expr(st.value), st), st)

    def assign(self, target, value, st):
        if isinstance(target, ast.Name):
            if isinstance(value, (Span, GridCall, Method)):
                raise self.err(target, f"{self.describe(value)} cannot be stored in a variable",
                               "use it directly where it is needed")
            if is_value(value) and value.hint is None:
                value.hint = target.id
            self.env[target.id] = value
            if self.in_loop:
                self.loop_locals.setdefault(target.id, self.cur_src.loc(target))
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, ShapeOf):
                value = tuple(self.dim(value.tensor, i, target) for i in range(value.tensor.type.rank))
            if not isinstance(value, (tuple, list)) or len(value) != len(target.elts):
                got = f"{len(value)} values" if isinstance(value, (tuple, list)) else self.describe(value)
                raise self.err(target, f"cannot unpack {got} into {len(target.elts)} names",
                               "the right side must be a tuple (or shape) of the same length; "
                               "does the @k.func return a tuple?")
            for t, v in zip(target.elts, value):
                self.assign(t, v, st)
        elif isinstance(target, ast.Subscript):
            base = self.expr(target.value)
            if not is_tensor(base):
                name = target.value.id if isinstance(target.value, ast.Name) else "this expression"
                raise self.err(target, f"cannot store into `{name}`: only tensor parameters can be stored to",
                               "tiles and scalars are values; build a new one (e.g. with k.where) instead "
                               "of assigning into it")
            idx_nodes = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
            self.store(base, [self.index_entry(i) for i in idx_nodes], value, None, target)
        elif isinstance(target, ast.Attribute):
            raise self.err(target, "cannot assign to an attribute", "assign to a plain name")
        else:
            raise self.err(target, "unsupported assignment target", "assign to names, tuples of names or "
                           "tensor subscripts")

    # ------------------------------------------------------------ @k.func inlining
    def inline(self, f: lang.FuncDef, args, kwargs, node):
        if f.name in self.func_stack:
            chain = " -> ".join(self.func_stack[self.func_stack.index(f.name):] + [f.name])
            raise self.err(node, f"recursive @k.func call: {chain}", "k.func helpers are inlined and cannot recurse")
        src = source_of(f.fn, f)
        sig = inspect.signature(f.fn)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise self.err(node, f"bad call of @k.func `{f.name}`: {e}", f"its signature is {f.name}{sig}") from None
        bound.apply_defaults()
        saved = (self.env, self.cur_src, self.in_loop, self.loop_locals)
        self.env, self.cur_src, self.in_loop, self.loop_locals = dict(bound.arguments), src, 0, {}
        self.func_stack.append(f.name)
        try:
            body = src.fdef.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            self.stmts(body)
            return None
        except _Return as r:
            return r.value
        finally:
            self.func_stack.pop()
            self.env, self.cur_src, self.in_loop, self.loop_locals = saved


def check_portable(kernel: Kernel) -> None:
    """Raise a K31Error at the first op whose tiles a compiled target cannot hold: a dim that is
    not a power of two, more than MAX_TILE_NUMEL elements, or a k.dot with a dim below 16."""
    from .ir import all_ops
    for op in all_ops(kernel):
        for r in op.results:
            t = r.type
            if not isinstance(t, TileType) or t.is_scalar:
                continue
            bad = [d for d in t.shape if not _is_pow2(d)]
            if bad:
                raise error(f"`{op.name}` makes a tile of shape {list(t.shape)}; {bad[0]} is not a power of two",
                            op.loc, "compiled targets need power-of-two tiles: use the next power of two "
                            "(e.g. k.span(start, 32) for 20 columns) and let masking handle the edge")
            if t.numel > MAX_TILE_NUMEL:
                raise error(f"`{op.name}` makes a tile of shape {list(t.shape)} ({t.numel} elements, "
                            f"limit {MAX_TILE_NUMEL})", op.loc, "use smaller tiles and loop over the rest")
        if op.name == "dot":
            (m, kk), n = op.operands[0].type.shape, op.operands[1].type.shape[1]
            if min(m, kk, n) < 16:
                raise error(f"k.dot of [{m}, {kk}] x [{kk}, {n}]: compiled targets need every dim >= 16", op.loc,
                            "pad the small dim to 16 (a masked span with other=0.0) and ignore the extra rows, "
                            "or use a broadcast multiply and k.sum for tiny products")


def kernel_signature(kdef: lang.KernelDef) -> Signature:
    """kdef's parameters read from its annotations (see dsl/signature.py)."""
    return read_signature(kdef, source_of(kdef.fn, kdef))


def build_kernel(kdef: lang.KernelDef, constexprs: dict[str, Any] | None = None) -> Kernel:
    fe = Frontend(kdef, constexprs or {})
    try:
        return fe.build()
    except K31Error:
        raise
    except RecursionError:
        raise error(f"kernel `{kdef.name}` is nested too deeply to compile", fe.last_loc,
                    "flatten deeply nested expressions or helper calls") from None
    except Exception as e:  # noqa: BLE001 - a compiler bug must still point at the user's line
        raise error(f"internal compiler error while reading this line ({type(e).__name__}: {e})",
                    fe.last_loc, "this is a k31dsl bug; please report it with the kernel source") from e

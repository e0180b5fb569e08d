"""Loops of the kernel frontend (a mixin of `frontend.Frontend`): `range()` / `k.range()` loops
and `while` loops become the IR's `for` op with loop-carried values, `k.static_range` and
compile-time tuples are unrolled. Names a loop body assigns that exist before it are carried;
names first bound inside stay local (LoopLocal: using them after the loop is an error)."""
from __future__ import annotations

import ast

from . import dtypes as D
from . import lang
from .frontend_exprs import LoopLocal, is_const, is_tile, is_value
from .ir import WHILE_BOUND, Block, TileType, Value

MAX_UNROLL = 4096


def _hint(name: str) -> str:
    """The value name of a variable; the compiler's own loop variables start with NUL."""
    return name.lstrip("\0")


def _assigned_names(stmts) -> set[str]:
    out: set[str] = set()
    for st in stmts:
        for node in ast.walk(st):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
    return out


def _tile_tuple(v) -> bool:
    """A non-empty flat tuple of tiles: carried through a range() loop element by element (a tuple
    holding compile-time values, e.g. a shape, stays a compile-time value)."""
    return isinstance(v, tuple) and len(v) > 0 and all(is_tile(x) for x in v)


def _same(a, b) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # noqa: BLE001 - objects without a usable == are simply different
        return False


class LoopMixin:
    def for_loop(self, st: ast.For):
        if st.orelse:
            raise self.err(st, "`for ... else` is not supported", "remove the else block")
        it = st.iter
        if self.is_grid(it):
            raise self.err(it, "`k.grid` must be the outermost loop of the kernel",
                           "only one grid loop, at the top of the kernel body; use range() inside it")
        if not isinstance(it, ast.Call):
            seq = self.expr(it)
            if isinstance(seq, tuple):
                return self.unrolled(st, list(seq))
            raise self.err(it, "kernels loop only over range(...), k.static_range(...), k.grid(...) "
                           "or a compile-time tuple", "write `for i in range(n):`")
        fn = self.expr(it.func)
        args = [self.expr(a) for a in it.args]
        if lang.builtin_name(fn) == "static_range":
            if it.keywords or not 1 <= len(args) <= 3 or not all(
                    isinstance(a, int) and not isinstance(a, bool) for a in args):
                raise self.err(it, "k.static_range takes 1 to 3 compile-time integers",
                               "use range() for bounds known only at launch")
            if len(args) == 3 and args[2] == 0:
                raise self.err(it, "k.static_range step must not be zero", "use a positive step")
            return self.unrolled(st, range(*args))
        attrs = {}
        if lang.builtin_name(fn) == "range":
            attrs = self.range_hints(it)
        elif fn is not range:
            raise self.err(it, "kernels loop only over range(...), k.range(...), k.static_range(...), k.grid(...) "
                           "or a compile-time tuple", "write `for i in range(n):`")
        elif it.keywords:
            raise self.err(it, "range() takes no keyword arguments",
                           "write k.range(lo, hi, step, stages=N) for a pipelining hint")
        if not 1 <= len(args) <= 3:
            raise self.err(it, "range() takes 1 to 3 positional arguments", "write range(n) or range(lo, hi, step)")
        args = [0, args[0], 1] if len(args) == 1 else (args + [1] if len(args) == 2 else args)
        for a in args:
            if not (isinstance(a, int) and not isinstance(a, bool)) and not (
                    is_tile(a) and a.type.is_scalar and a.type.dtype.is_int):
                raise self.err(it, f"range() bounds must be integer scalars, got {self.describe(a)}",
                               "use sizes, program ids or loop indices (cast floats with .to(k.i32))")
        if not isinstance(args[2], int) or args[2] <= 0:
            raise self.err(it, "range() step must be a positive compile-time integer",
                           "loop upward with a literal or constexpr step and index backwards if needed")
        if not isinstance(st.target, ast.Name):
            raise self.err(st.target, "a range loop target must be a single name", "write `for j in range(n):`")
        lo, hi, step = (self.as_value(a, it, D.i32) for a in args)
        self.runtime_loop(st, lo, hi, step, attrs)

    def range_hints(self, it: ast.Call) -> dict:
        """k.range's keyword hints as `for` attrs: stages=N (a compile-time int >= 1, or None for
        none) asks the Triton target to software-pipeline the loop's loads N deep (tl.range
        num_stages: Triton then pipelines loads that feed no dot too); other targets ignore it."""
        attrs = {}
        for kw in it.keywords:
            if kw.arg != "stages":
                raise self.err(kw.value if kw.arg else it, f"k.range takes no keyword `{kw.arg}`",
                               "the one hint is stages=N")
            v = self.expr(kw.value)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise self.err(kw.value, f"k.range stages must be a compile-time int >= 1 (or None), got "
                               f"{self.describe(v)}", "pass a literal or a constexpr, e.g. stages=STAGES")
            attrs["stages"] = v
        return attrs

    def unrolled(self, st: ast.For, values):
        if len(values) > MAX_UNROLL:
            raise self.err(st.iter, f"unrolling {len(values)} iterations at compile time is too many "
                           f"(limit {MAX_UNROLL})", "use range() for long loops")
        for v in values:
            self.assign(st.target, v, st)
            self.stmts(st.body)

    def while_loop(self, st: ast.While):
        """`while cond:` with a runtime scalar condition: a `for` over (0, 2^31 - 1, 1) that also
        carries the condition as a bool flag (attr `while` = its index among the carried values),
        computed before the loop and again at the end of each iteration from the body's values."""
        if st.orelse:
            raise self.err(st, "`while ... else` is not supported", "remove the else block")
        cond = self.expr(st.test)
        if is_const(cond) and not is_value(cond) and not cond:
            return                                 # false at compile time: the body never runs
        reads = list(ast.walk(st.test))
        if not any(isinstance(n, (ast.Subscript, ast.Call)) for n in reads) and \
                not {n.id for n in reads if isinstance(n, ast.Name)} & _assigned_names(st.body):
            raise self.err(st.test, "the loop body assigns none of the names this `while` condition reads: "
                           "once true it would stay true", "update a variable of the condition in the body")
        flag = "\0loop_on"                          # NUL: no user variable has this name
        self.env[flag] = self.as_flag(cond, st.test)

        def next_flag():
            again = self.expr(st.test)
            if is_const(again) and not is_value(again) and again:
                raise self.err(st.test, "this `while` condition is still true at compile time after the body: "
                               "the loop would never end", "let the body change a runtime value the condition reads")
            self.env[flag] = self.as_flag(again, st.test)
        try:
            self.runtime_loop(st, *(self.const(v, D.i32, st) for v in (0, WHILE_BOUND, 1)), {},
                              ivname="\0trip", extra=(flag,), at_end=next_flag)
        finally:
            self.env.pop(flag, None)

    def as_flag(self, cond, node) -> Value:
        """A scalar `while` condition as a bool value (numbers compare against zero, like `if`)."""
        cond = self.as_value(cond, node, D.bool_)
        if not cond.type.is_scalar:
            raise self.err(node, f"a `while` condition must be a scalar, got a {cond.type} tile",
                           "reduce it first, e.g. `while k.sum(mask.to(k.i32)) > 0:`")
        return cond if cond.type.dtype is D.bool_ else self.emit1("cast", [cond], {"dtype": D.bool_}, node)

    def runtime_loop(self, st: ast.For | ast.While, lo, hi, step, attrs: dict, ivname: str | None = None,
                     extra: tuple = (), at_end=None):
        """A `for` op over the statements of st.body. `extra` names more carried values (a while
        loop's flag; the first one becomes attr `while`); `at_end` runs after the body."""
        ivname = ivname or st.target.id
        assigned = _assigned_names(st.body) | set(extra)
        carried = sorted(n for n in assigned if n != ivname and n in self.env
                         and (is_tile(self.env[n]) or is_const(self.env[n]) or _tile_tuple(self.env[n])))
        # a tuple of tiles is carried as one loop value per element (`slots`: name, element or None)
        slots = [(n, i) for n in carried for i in (range(len(self.env[n])) if _tile_tuple(self.env[n]) else [None])]
        inits = [self.as_value(self.env[n] if i is None else self.env[n][i], st, None) for n, i in slots]
        body = Block([Value(TileType(D.i32, ()), _hint(ivname))]
                     + [Value(v.type, _hint(n) if i is None else f"{n}_{i}") for v, (n, i) in zip(inits, slots)])
        outer_env, outer_block, outer_locals = dict(self.env), self.block, self.loop_locals
        self.env[ivname] = body.args[0]
        for n in carried:
            args = [a for a, (m, _) in zip(body.args[1:], slots) if m == n]
            self.env[n] = tuple(args) if _tile_tuple(outer_env[n]) else args[0]
        self.block, self.loop_locals = body, {}
        self.in_loop += 1
        try:
            self.stmts(st.body)
            if at_end is not None:
                at_end()
            yields = []
            for (n, i), init in zip(slots, inits):
                v = self.env[n]
                if i is not None:
                    if not isinstance(v, tuple) or len(v) != len(outer_env[n]):
                        raise self.err(st, f"loop-carried tuple `{n}` must keep its {len(outer_env[n])} elements "
                                       f"in the loop body, got {self.describe(v)}",
                                       "rebuild it with the same number of tiles of the same types")
                    v = v[i]
                if is_const(v):
                    v = self.as_value(v, st, init.type.dtype)
                if not is_tile(v) or v.type != init.type:
                    got = v.type if is_value(v) else self.describe(v)
                    raise self.err(st, f"loop-carried `{n}` changes type from {init.type} to {got} in the loop body",
                                   f"give `{n}` its final type before the loop (e.g. k.zeros(shape, dtype), "
                                   "a float literal 0.0, or .to(dtype))")
                yields.append(v)
            for n in sorted(assigned - set(carried) - {ivname}):
                before = outer_env.get(n)
                if n in outer_env and not isinstance(before, LoopLocal) and not is_tile(before) \
                        and not is_const(before) and not _same(self.env.get(n), before):
                    raise self.err(st, f"`{n}` holds {self.describe(outer_env[n])} and is reassigned inside a "
                                   "runtime loop", "compile-time values cannot change in a range() loop; use a "
                                   "new name, or k.static_range to unroll")
            self.emit("yield", yields, {}, st)
        finally:
            self.in_loop -= 1
            inner_locals = self.loop_locals
            self.block, self.env, self.loop_locals = outer_block, outer_env, outer_locals
        if extra:
            attrs = {**attrs, "while": next(i for i, (n, _) in enumerate(slots) if n == extra[0])}
        results = self.emit("for", [lo, hi, step] + inits, dict(attrs), st, regions=[body])
        for r, (n, i) in zip(results, slots):
            r.hint = _hint(n) if i is None else f"{n}_{i}"
        for n in carried:
            rs = [r for r, (m, _) in zip(results, slots) if m == n]
            self.env[n] = tuple(rs) if _tile_tuple(outer_env[n]) else rs[0]
        if isinstance(st, ast.For):
            inner_locals.setdefault(ivname, self.cur_src.loc(st.target))
        for n, loc in inner_locals.items():
            if n not in self.env:
                self.env[n] = LoopLocal(n, loc)
        if self.in_loop:
            for n, loc in inner_locals.items():
                self.loop_locals.setdefault(n, loc)

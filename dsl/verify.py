"""The IR verifier: a table of rules, each a named predicate with the message it reports.

`verify(kernel)` runs every rule and raises one K31Error listing every problem (with the op's
source location and the rule's name); `problems(kernel)` returns them as a list. Rules come in
two kinds:

  kernel rules  check(ctx)        -> iterable of (loc, detail)     whole-kernel facts
  op rules      check(site, ctx)  -> None | detail | [details]     one op where it stands

An op rule may name rules it `needs`: when one of those failed on the op, it is skipped (the type
rules of dsl/infer.py, re-run on every op, need known ops and well-formed attributes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import dtypes as D
from .errors import K31Error, Loc
from .frontend import HOST_OPS
from .infer import REQUIRED_ATTRS, RULES as TYPE_RULES, TypeRuleError, infer
from .ir import (BINARY, COMPARE, DOT_PRECISIONS, REDUCE, UNARY, Block, Kernel, Op, TensorType, TileType, Value,
                 parse_index_kind)


@dataclass
class Site:
    """An op and where it stands: its block, the block's role, its position, the enclosing op."""
    op: Op
    block: Block
    role: str                  # "host", "body" or "region"
    index: int
    parent: Op | None


@dataclass
class Problem:
    rule: str
    loc: Loc
    message: str

    def __str__(self) -> str:
        where = f"{self.loc}: " if self.loc.line else ""
        return f"{where}[{self.rule}] {self.message}"


@dataclass
class Context:
    kernel: Kernel
    sites: list[Site]
    names: dict[int, str]                 # uid -> printed name, for messages
    params: set[int]                      # uids of parameter values
    host_results: set[int]
    defs: dict[int, list[tuple[str, Loc]]] = field(default_factory=dict)   # uid -> where defined

    def name(self, v: Value) -> str:
        return self.names.get(v.uid, f"%<unnamed #{v.uid}>")


@dataclass(frozen=True)
class Rule:
    name: str
    message: str                          # what the rule demands
    check: Callable
    scope: str = "op"                     # "op" or "kernel"
    needs: tuple[str, ...] = ()


# ---------------------------------------------------------------- kernel rules

def _params_well_formed(ctx: Context):
    seen = set()
    for p in ctx.kernel.params:
        if p.name in seen:
            yield ctx.kernel.loc, f"parameter `{p.name}` is declared twice"
        seen.add(p.name)
        t = p.value.type
        if isinstance(t, TileType) and (not t.is_scalar or t.dtype.is_storage_only):
            yield ctx.kernel.loc, f"parameter `{p.name}` has type {t}; scalar params are non-fp8 scalars"
        if isinstance(t, TensorType) and not t.dims:
            yield ctx.kernel.loc, f"tensor parameter `{p.name}` has no dims"


def _grid_extents(ctx: Context):
    k = ctx.kernel
    if not 1 <= len(k.grid) <= 3:
        yield k.loc, f"the grid has {len(k.grid)} extents"
    for g in k.grid:
        if g.uid not in ctx.host_results and g.uid not in ctx.params:
            yield k.loc, f"grid extent {ctx.name(g)} is not computed in the host block"
        if g.type != TileType(D.i32, ()):
            yield k.loc, f"grid extent {ctx.name(g)} has type {g.type}, not i32"


def _body_args(ctx: Context):
    k = ctx.kernel
    if len(k.body.args) != len(k.grid):
        yield k.loc, f"the body has {len(k.body.args)} program ids for {len(k.grid)} grid extents"
    for a in k.body.args:
        if a.type != TileType(D.i32, ()):
            yield k.loc, f"program id {ctx.name(a)} has type {a.type}, not i32"


def _defined_once(ctx: Context):
    for uid, where in ctx.defs.items():
        if len(where) > 1:
            name = ctx.names.get(uid, f"#{uid}")
            yield where[1][1], f"{name} is defined {len(where)} times: {'; '.join(w for w, _ in where)}"


def _tensors_only_params(ctx: Context):
    for s in ctx.sites:
        for r in s.op.results:
            if isinstance(r.type, TensorType):
                yield s.op.loc, f"`{s.op.name}` result {ctx.name(r)} is a tensor"
        for region in s.op.regions:
            for a in region.args:
                if isinstance(a.type, TensorType):
                    yield s.op.loc, f"block argument {ctx.name(a)} of `{s.op.name}` is a tensor"
    for a in ctx.kernel.body.args:
        if isinstance(a.type, TensorType):
            yield ctx.kernel.loc, f"program id {ctx.name(a)} is a tensor"


def _dominance(ctx: Context):
    """Walk blocks in order with the set of values visible at each point: params, then the host
    block's results, then (in the body) program ids; a region also sees its block args and what
    encloses it, and what it defines stays inside."""
    k = ctx.kernel
    home: dict[int, tuple[Block, str]] = {a.uid: (k.body, "the body") for a in k.body.args}
    for s in ctx.sites:
        where = {"host": "the host block", "body": "the body"}.get(s.role)
        for r in s.op.results:
            home.setdefault(r.uid, (s.block, where or f"the `{s.parent.name}` body at {s.parent.loc.line}:{s.parent.loc.col}"))
        for region in s.op.regions:
            for a in region.args:
                home.setdefault(a.uid, (region, f"the `{s.op.name}` body at {s.op.loc.line}:{s.op.loc.col}"))
    out: list[tuple[Loc, str]] = []

    def why(v: Value, chain: list[Block]) -> str:
        if v.uid not in home:
            return "is never defined"
        block, where = home[v.uid]
        if any(block is b for b in chain):
            return "is used before its definition"
        return f"is defined in {where} and not visible here"

    def walk(block: Block, visible: set[int], chain: list[Block]):
        for op in block.ops:
            for i, v in enumerate(op.operands):
                if v.uid not in visible:
                    out.append((op.loc, f"operand {i} of `{op.name}` ({ctx.name(v)}) {why(v, chain)}"))
            for region in op.regions:
                walk(region, visible | {a.uid for a in region.args}, chain + [region])
            visible |= {r.uid for r in op.results}

    visible = set(ctx.params)
    walk(k.host, visible, [k.host])
    visible |= {a.uid for a in k.body.args}
    walk(k.body, visible, [k.host, k.body])
    return out


# ---------------------------------------------------------------- op rules

def _known_op(s: Site, ctx):
    if s.op.name not in TYPE_RULES:
        return f"unknown op `{s.op.name}`"


# operand counts of fixed-arity ops (load/store are checked by access-index, for/yield by theirs)
ARITY: dict[str, int] = {
    "const": 0, "arange": 0, "full": 0, "dim": 1, "where": 3, "cast": 1, "bitcast": 1, "cumsum": 1, "histogram": 1,
    "dot": 2, "topk": 1, "take": 2, "expand": 1, "trans": 1, "broadcast": 1, "reshape": 1, "cat": 2,
    **{n: 2 for n in BINARY | COMPARE}, **{n: 1 for n in UNARY | REDUCE},
}


def _arity(s: Site, ctx):
    want = ARITY.get(s.op.name)
    if want is not None and len(s.op.operands) != want:
        return f"`{s.op.name}` takes {want} operand(s), got {len(s.op.operands)}"


def _regions(s: Site, ctx):
    want = 1 if s.op.name == "for" else 0
    if len(s.op.regions) != want:
        return f"`{s.op.name}` has {len(s.op.regions)} regions, expected {want}"


def _for_signature(s: Site, ctx):
    op = s.op
    if op.name != "for" or len(op.regions) != 1:
        return None
    if len(op.operands) < 3:
        return f"`for` has {len(op.operands)} operands; it needs lower bound, upper bound and step"
    inits = op.operands[3:]
    args = op.regions[0].args
    if len(args) != 1 + len(inits):
        return f"the loop body takes {len(args)} block args; it needs the induction variable plus {len(inits)} carried"
    problems = []
    if args[0].type != TileType(D.i32, ()):
        problems.append(f"the induction variable {ctx.name(args[0])} has type {args[0].type}, not i32")
    for a, init in zip(args[1:], inits):
        if a.type != init.type:
            problems.append(f"carried {ctx.name(a)} has type {a.type} but its initial value {ctx.name(init)} is {init.type}")
    flag = op.attrs.get("while")
    if _is_int(flag):
        if not 0 <= flag < len(inits):
            problems.append(f"attribute while = {flag} names no carried value (the loop carries {len(inits)})")
        elif inits[flag].type != TileType(D.bool_, ()):
            problems.append(f"the `while` flag {ctx.name(args[1 + flag])} has type {inits[flag].type}, not bool")
        if op.attrs.get("stages") is not None:
            problems.append("a `for ... while` loop takes no `stages` (it is not software-pipelined)")
    return problems


def _for_yield(s: Site, ctx):
    op = s.op
    if op.name != "for" or len(op.regions) != 1:
        return None
    body = op.regions[0]
    if not body.ops or body.ops[-1].name != "yield":
        return "the loop body does not end with `yield`"
    carried = body.args[1:]
    got = body.ops[-1].operands
    if [v.type for v in got] != [a.type for a in carried]:
        return (f"`yield` gives ({', '.join(str(v.type) for v in got)}) but the loop carries "
                f"({', '.join(str(a.type) for a in carried)})")


def _yield_placement(s: Site, ctx):
    if s.op.name != "yield":
        return None
    if s.role != "region" or s.parent is None or s.parent.name != "for":
        return f"`yield` in the {s.role} block; it only ends a `for` body"
    if s.index != len(s.block.ops) - 1:
        return "`yield` is not the last op of the loop body"


def _host_ops(s: Site, ctx):
    if s.role != "host":
        return None
    if s.op.name not in HOST_OPS:
        return f"`{s.op.name}` in the host block; it may only compute grid sizes ({', '.join(sorted(HOST_OPS))})"
    bad = [r for r in s.op.results if not (isinstance(r.type, TileType) and r.type.is_scalar and r.type.dtype.is_int)]
    if bad:
        return f"host `{s.op.name}` gives {bad[0].type}; host values are integer scalars"


def _required_attrs(s: Site, ctx):
    missing = [a for a in REQUIRED_ATTRS.get(s.op.name, ()) if a not in s.op.attrs]
    if missing:
        return f"`{s.op.name}` lacks attribute(s) {', '.join(missing)}"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _positive_ints(x) -> bool:
    return isinstance(x, (list, tuple)) and all(_is_int(d) and d > 0 for d in x)


def _number(x) -> bool:
    return isinstance(x, (int, float))


# attribute -> (predicate, what it must be); `axis` differs between reductions and the rest
ATTR_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dtype": (lambda x: isinstance(x, D.DType), "a dtype"),
    "axis": (_is_int, "an integer"),
    "size": (lambda x: _is_int(x) and x > 0, "a positive integer"),
    "n": (lambda x: _is_int(x) and x > 0, "a positive integer"),
    "shape": (_positive_ints, "a list of positive integers"),
    "value": (_number, "a number or bool"),
    "other": (lambda x: x is None or _number(x), "a number or none"),
    "mask": (lambda x: isinstance(x, bool), "true or false"),
    "reverse": (lambda x: isinstance(x, bool), "true or false"),
    "precision": (lambda x: x in DOT_PRECISIONS, '"ieee", "tf32" or "tf32x3"'),
    "evict": (lambda x: x in ("first", "last"), '"first" or "last"'),
    "stages": (lambda x: _is_int(x) and x >= 1, "an integer >= 1"),
    "while": (lambda x: _is_int(x) and x >= 0, "an integer >= 0"),
    "index": (lambda x: isinstance(x, (list, tuple)) and all(isinstance(e, str) for e in x), "a list of strings"),
}


def _attr_types(s: Site, ctx):
    out = []
    for key, val in s.op.attrs.items():
        if key == "axis" and s.op.name in REDUCE:
            ok, what = val is None or _is_int(val), "an integer or none"
        elif key in ATTR_KINDS:
            pred, what = ATTR_KINDS[key]
            ok = pred(val)
        else:
            continue
        if not ok:
            out.append(f"attribute {key} = {val!r} of `{s.op.name}` must be {what}")
    return out


def _access_index(s: Site, ctx):
    op = s.op
    if op.name not in ("load", "store") or not isinstance(op.attrs.get("index"), (list, tuple)):
        return None
    kinds = op.attrs["index"]
    out = []
    for kind in kinds:
        try:
            k, size = parse_index_kind(kind)
        except ValueError:
            k, size = "?", None
        if not (k in ("scalar", "gather") or (k == "span" and size is not None and size > 0)):
            out.append(f"index entry {kind!r} is not \"scalar\", \"gather\" or \"span:N\" with N > 0")
    want = 1 + len(kinds) + (op.name == "store") + bool(op.attrs.get("mask"))
    if len(op.operands) != want:
        out.append(f"`{op.name}` with {len(kinds)} index entries and mask={bool(op.attrs.get('mask'))} "
                   f"takes {want} operands, got {len(op.operands)}")
    elif op.operands and isinstance(op.operands[0].type, TensorType) and op.operands[0].type.rank != len(kinds):
        out.append(f"{len(kinds)} index entries for the rank-{op.operands[0].type.rank} tensor {ctx.name(op.operands[0])}")
    return out


def _tensor_operands(s: Site, ctx):
    """Tensors are parameters used only as the first operand of load/store/dim; stores go only
    into tensor parameters."""
    op = s.op
    out = []
    for i, v in enumerate(op.operands):
        is_tensor = isinstance(v.type, TensorType)
        if i == 0 and op.name in ("load", "store", "dim"):
            if not is_tensor or v.uid not in ctx.params:
                verb = {"store": "stores into", "load": "loads from", "dim": "takes the size of"}[op.name]
                out.append(f"`{op.name}` {verb} {ctx.name(v)} ({v.type}); it must be a tensor parameter")
        elif is_tensor:
            out.append(f"operand {i} of `{op.name}` is the tensor {ctx.name(v)}; tensors are only "
                       "read by load/dim and written by store")
    return out


def _type_rules(s: Site, ctx):
    op = s.op
    try:
        want = infer(op.name, [v.type for v in op.operands], op.attrs)
    except TypeRuleError as e:
        return e.message
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        return f"the type rule of `{op.name}` cannot run on these operands/attributes ({type(e).__name__}: {e})"
    got = [r.type for r in op.results]
    if len(got) != len(want):
        return f"`{op.name}` has {len(got)} results, its type rule gives {len(want)}"
    diffs = [f"result {i} ({ctx.name(r)}) is {r.type}, the type rule gives {w}"
             for i, (r, w) in enumerate(zip(op.results, want)) if r.type != w]
    return diffs


RULES: list[Rule] = [
    Rule("params", "parameters are uniquely named tensors or non-fp8 scalars", _params_well_formed, "kernel"),
    Rule("grid", "the grid is 1-3 i32 scalars computed in the host block", _grid_extents, "kernel"),
    Rule("body-args", "the body takes one i32 program id per grid extent", _body_args, "kernel"),
    Rule("defined-once", "each value is defined exactly once", _defined_once, "kernel"),
    Rule("tensor-values", "tensor-typed values exist only as parameters", _tensors_only_params, "kernel"),
    Rule("dominance", "every operand is defined before its use and visible in its scope", _dominance, "kernel"),
    Rule("known-op", "ops are those of dsl/ir.py", _known_op),
    Rule("arity", "ops take the number of operands dsl/ir.py lists", _arity),
    Rule("regions", "`for` has exactly one region, other ops none", _regions),
    Rule("for-signature", "a `for` takes (lo, hi, step, init...) and its body (i32 iv, carried...) "
         "typed like the inits; its `while` flag is a carried bool", _for_signature, needs=("regions",)),
    Rule("for-yield", "a `for` body ends with `yield` of the carried types", _for_yield, needs=("regions",)),
    Rule("yield-placement", "`yield` appears only as the last op of a `for` body", _yield_placement),
    Rule("host-ops", "the host block holds only const/dim and integer scalar arithmetic", _host_ops),
    Rule("required-attrs", "ops carry the attributes dsl/infer.py REQUIRED_ATTRS lists", _required_attrs),
    Rule("attr-types", "attributes have their documented kinds", _attr_types),
    Rule("access-index", "load/store index entries are scalar/gather/span:N, one per tensor axis, "
         "with matching operands", _access_index, needs=("required-attrs", "attr-types")),
    Rule("tensor-operands", "tensors are read by load/dim and written by store, only as parameters",
         _tensor_operands),
    Rule("type-rules", "result types equal those the type rules of dsl/infer.py give", _type_rules,
         needs=("known-op", "arity", "required-attrs", "attr-types", "access-index", "tensor-operands",
                "for-signature")),
]
RULES_BY_NAME = {r.name: r for r in RULES}


# ---------------------------------------------------------------- driver

def _sites(kernel: Kernel) -> list[Site]:
    out: list[Site] = []

    def walk(block: Block, role: str, parent: Op | None):
        for i, op in enumerate(block.ops):
            out.append(Site(op, block, role, i, parent))
            for region in op.regions:
                walk(region, "region", op)

    walk(kernel.host, "host", None)
    walk(kernel.body, "body", None)
    return out


def _value_names(kernel: Kernel) -> dict[int, str]:
    from .text import Printer
    p = Printer(kernel)
    try:
        p.kernel()
    except Exception:  # noqa: BLE001 - names are a courtesy; an unprintable attr must not hide problems
        pass
    return {uid: "%" + n for uid, n in p.names.items()}


def _context(kernel: Kernel) -> Context:
    sites = _sites(kernel)
    params = {p.value.uid for p in kernel.params}
    host = {r.uid for s in sites if s.role == "host" for r in s.op.results}
    ctx = Context(kernel, sites, _value_names(kernel), params, host)

    def define(v: Value, where: str, loc: Loc):
        ctx.defs.setdefault(v.uid, []).append((where, loc))

    for p in kernel.params:
        define(p.value, f"param {p.name}", kernel.loc)
    for a in kernel.body.args:
        define(a, "program id", kernel.loc)
    for s in sites:
        at = f"{s.op.loc.line}:{s.op.loc.col}"
        for r in s.op.results:
            define(r, f"result of `{s.op.name}` at {at}", s.op.loc)
        for region in s.op.regions:
            for a in region.args:
                define(a, f"block arg of `{s.op.name}` at {at}", s.op.loc)
    return ctx


def _as_list(found) -> list[str]:
    if found is None:
        return []
    if isinstance(found, str):
        return [found]
    return list(found)


def problems(kernel: Kernel, rules: Iterable[Rule] | None = None) -> list[Problem]:
    """Every rule violation in `kernel` (empty when it verifies)."""
    rules = list(RULES if rules is None else rules)
    ctx = _context(kernel)
    out: list[Problem] = []
    for rule in rules:
        if rule.scope == "kernel":
            out += [Problem(rule.name, loc, msg) for loc, msg in rule.check(ctx)]
    failed: dict[int, set[str]] = {}
    for s in ctx.sites:
        bad = failed.setdefault(id(s.op), set())
        for rule in rules:
            if rule.scope != "op" or bad & set(rule.needs):
                continue
            found = _as_list(rule.check(s, ctx))
            if found:
                bad.add(rule.name)
                out += [Problem(rule.name, s.op.loc, msg) for msg in found]
    return out


def verify(kernel: Kernel) -> None:
    """Raise K31Error listing every problem of `kernel`; return None when it is well formed."""
    found = problems(kernel)
    if not found:
        return
    lines = [f"kernel `{kernel.name}` fails IR verification ({len(found)} problem"
             f"{'s' if len(found) != 1 else ''}):"]
    lines += [f"  {p}" for p in found]
    err = K31Error("\n".join(lines), None,
                   "this is a compiler bug if the IR came from the frontend or a pass; "
                   "if you wrote the .k31 text, fix the op named above")
    err.problems = found
    raise err

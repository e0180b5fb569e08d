"""Vertical fusion of two kernels at the kernel-IR level (the superkernel pass's inline case).

`fuse(producer, consumer)` puts both bodies under one grid when every load the consumer makes of
a tensor the producer writes reads exactly the tile that the *same program* of the producer
stored: same index kinds, index values that are the same expression of the program ids, params
and constants, and the same mask. Each such load is replaced by the stored value (broadcast to
the load's shape and, where the load names `other=`, with out-of-bounds or masked-off lanes set to
`other`), so the tile never goes through global memory. The store itself is dropped when the graph
says nothing else reads the tensor. Anything else is a `Refusal` whose message says which load
breaks the rule and why.
"""
from __future__ import annotations

from dataclasses import dataclass

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.infer import infer
from k31dsl.dsl.ir import (BINARY, COMPARE, UNARY, Block, Kernel, Op, Param, TensorType, Value,
                           parse_index_kind, walk)

PURE = BINARY | COMPARE | UNARY | {"const", "dim", "cast", "where", "arange", "full", "expand",
                                   "broadcast", "reshape", "trans", "bitcast"}
INT_HOST = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "floordiv": lambda a, b: int(a / b) if b else 0, "mod": lambda a, b: a - b * int(a / b) if b else 0,
            "maximum": max, "minimum": min}


class Refusal(Exception):
    """Why two kernels cannot be inlined into one (said in the superkernel report)."""


@dataclass
class Side:
    """One kernel of the pair, with what its parameters are bound to in the graph."""
    kernel: Kernel
    binding: dict          # param name -> ("tensor", storage) or ("scalar", value)
    shapes: dict           # storage -> static shape

    def __post_init__(self):
        self.defs = {}
        for op in walk(self.kernel.body):
            for r in op.results:
                self.defs[r.uid] = op
        self.params = {p.value.uid: p for p in self.kernel.params}
        self.pids = {v.uid: i for i, v in enumerate(self.kernel.body.args)}

    def bound(self, v: Value):
        p = self.params.get(v.uid)
        return self.binding[p.name] if p is not None else None

    def key(self, v: Value):
        """A canonical form of a value in terms of program ids, bindings and constants (None when
        it depends on loads, loop variables or other non-comparable values)."""
        if v.uid in self.pids:
            return ("pid", self.pids[v.uid])
        if v.uid in self.params:
            return ("param", self.bound(v))
        op = self.defs.get(v.uid)
        if op is None or op.name not in PURE or op.regions:
            return None
        subs = tuple(self.key(o) for o in op.operands)
        if any(s is None for s in subs):
            return None
        attrs = tuple(sorted((k, repr(a)) for k, a in op.attrs.items()))
        return (op.name, attrs, subs)

    def operand_text(self, v: Value) -> str:
        op = self.defs.get(v.uid)
        compound = op is not None and op.name in ("add", "sub", "mul", "floordiv", "mod")
        return f"({self.text(v)})" if compound else self.text(v)

    def text(self, v: Value) -> str:
        """The value as an expression, for refusal messages."""
        if v.uid in self.pids:
            return v.hint or f"pid{self.pids[v.uid]}"
        if v.uid in self.params:
            return self.params[v.uid].name
        op = self.defs.get(v.uid)
        if op is None:
            return v.hint or "?"
        if op.name == "const":
            return repr(op.attrs["value"])
        if op.name == "dim":
            return f"{self.text(op.operands[0])}.shape[{op.attrs['axis']}]"
        sym = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}.get(op.name)
        if sym and len(op.operands) == 2:
            return f"{self.operand_text(op.operands[0])} {sym} {self.operand_text(op.operands[1])}"
        if op.name == "cast":
            return self.text(op.operands[0])
        return v.hint or f"{op.name}(...)"


def access_parts(op: Op):
    """(tensor, index operands, value or None, mask or None) of a load/store."""
    kinds = op.attrs["index"]
    n = len(kinds)
    tensor, idx = op.operands[0], op.operands[1:1 + n]
    rest = op.operands[1 + n:]
    value = rest[0] if op.name == "store" else None
    if op.name == "store":
        rest = rest[1:]
    mask = rest[0] if op.attrs.get("mask") and rest else None
    return tensor, idx, value, mask


def index_text(side: Side, op: Op) -> str:
    _, idx, _, _ = access_parts(op)
    parts = []
    for kind, v in zip(op.attrs["index"], idx):
        k, size = parse_index_kind(kind)
        parts.append(f"{side.text(v)}:{side.text(v)} + {size}" if k == "span" else
                     f"<{side.text(v)}>" if k == "gather" else side.text(v))
    return "[" + ", ".join(parts) + "]"


def access_key(side: Side, op: Op):
    _, idx, _, mask = access_parts(op)
    keys = tuple(side.key(v) for v in idx)
    mkey = side.key(mask) if mask is not None else ("nomask",)
    if any(k is None for k in keys) or mkey is None:
        return None
    return (tuple(op.attrs["index"]), keys, mkey)


def grid_extents(side: Side):
    """The launch grid as integers (static shapes), or None when it depends on something else."""
    env = {}
    for op in side.kernel.host.ops:
        vals = [env.get(o.uid) for o in op.operands]
        if op.name == "const":
            out = op.attrs["value"]
        elif op.name == "dim":
            b = side.bound(op.operands[0])
            out = side.shapes[b[1]][op.attrs["axis"]] if b and b[0] == "tensor" else None
        elif op.name == "cast" and vals[0] is not None:
            out = vals[0]
        elif op.name in INT_HOST and None not in vals:
            out = INT_HOST[op.name](*vals)
        else:
            out = None
        for r in op.results:
            env[r.uid] = out
    ext = []
    for g in side.kernel.grid:
        if g.uid in side.params:
            b = side.bound(g)
            ext.append(b[1] if b[0] == "scalar" else None)
        else:
            ext.append(env.get(g.uid))
    return None if any(e is None for e in ext) else tuple(ext)


def loc_text(op: Op) -> str:
    import os
    return f"{os.path.relpath(op.loc.file) if op.loc.file and op.loc.file.startswith('/') else op.loc.file}:{op.loc.line}"


# ---------------------------------------------------------------- building the fused kernel

class Builder:
    """Clones ops into a new block with fresh values."""

    def __init__(self):
        self.vmap: dict[int, Value] = {}

    def v(self, old: Value) -> Value:
        return self.vmap[old.uid]

    def clone_block(self, block: Block, out: Block, hook=None) -> None:
        for op in block.ops:
            if hook is not None and hook(op, out, self):
                continue
            regions = []
            for reg in op.regions:
                nb = Block([self._fresh(a) for a in reg.args], [])
                self.clone_block(reg, nb, hook)
                regions.append(nb)
            new = Op(op.name, [self.v(o) for o in op.operands], [self._fresh(r) for r in op.results],
                     dict(op.attrs), regions, op.loc)
            out.ops.append(new)

    def _fresh(self, old: Value) -> Value:
        nv = Value(old.type, old.hint)
        self.vmap[old.uid] = nv
        return nv

    @staticmethod
    def emit(out: Block, name: str, operands: list, attrs: dict, loc) -> Value:
        types = infer(name, [o.type for o in operands], attrs)
        res = [Value(t) for t in types]
        out.ops.append(Op(name, list(operands), res, attrs, [], loc))
        return res[0]


def forwarded_value(b: Builder, out: Block, load: Op, stored: Value, dims: dict, loc) -> Value:
    """The value the load would have read: `stored` broadcast to the load's tile, with lanes
    outside the tensor (or masked off) set to the load's `other` when it names one."""
    shape = load.results[0].type.shape
    val = stored
    if val.type.shape != shape:
        val = Builder.emit(out, "broadcast", [val], {"shape": list(shape)}, loc)
    other = load.attrs.get("other")
    if other is None:
        return val
    tensor, idx, _, mask = access_parts(load)
    conds = []
    axis = 0
    for a, (kind, iv) in enumerate(zip(load.attrs["index"], idx)):
        k, size = parse_index_kind(kind)
        i = b.v(iv)
        if k == "span":
            ar = Builder.emit(out, "arange", [], {"size": size}, loc)
            i = Builder.emit(out, "add", [ar, i], {}, loc)
        zero = Builder.emit(out, "const", [], {"value": 0, "dtype": D.i32}, loc)
        hi = Builder.emit(out, "const", [], {"value": dims[a], "dtype": D.i32}, loc)
        c = Builder.emit(out, "and", [Builder.emit(out, "ge", [i, zero], {}, loc),
                                      Builder.emit(out, "lt", [i, hi], {}, loc)], {}, loc)
        if k != "scalar":
            for before in range(axis):
                c = Builder.emit(out, "expand", [c], {"axis": 0}, loc)
            for _ in range(len(shape) - axis - 1):
                c = Builder.emit(out, "expand", [c], {"axis": len(c.type.shape)}, loc)
            axis += 1
        conds.append(c)
    if mask is not None:
        conds.append(b.v(mask))
    cond = conds[0]
    for c in conds[1:]:
        cond = Builder.emit(out, "and", [cond, c], {}, loc)
    if cond.type.shape != shape:
        cond = Builder.emit(out, "broadcast", [cond], {"shape": list(shape)}, loc)
    fill = Builder.emit(out, "const", [], {"value": other, "dtype": val.type.dtype}, loc)
    return Builder.emit(out, "where", [cond, val, fill], {}, loc)


def fuse(prod: Side, cons: Side, drop: set, pname: str, cname: str, name: str | None = None):
    """(fused kernel, {fused param name: (side, param name)}, message). Raises Refusal."""
    written = {prod.binding[p.name][1] for p in prod.kernel.params
               if p.is_tensor and any(op.name == "store" and op.operands[0] is p.value for op in walk(prod.kernel.body))}
    read_by_prod = {prod.binding[p.name][1] for p in prod.kernel.params
                    if p.is_tensor and any(op.name == "load" and op.operands[0] is p.value for op in walk(prod.kernel.body))}
    gp, gc = grid_extents(prod), grid_extents(cons)
    if gp is None or gc is None:
        raise Refusal(f"the grid of `{pname if gp is None else cname}` is not known from static shapes")
    if gp != gc:
        raise Refusal(f"grids differ: `{pname}` launches {list(gp)} programs, `{cname}` {list(gc)}")
    # the producer's top-level stores to tensors the consumer reads, by index key
    stores: dict = {}
    for op in prod.kernel.body.ops:
        if op.name == "store":
            st = prod.bound(op.operands[0])[1]
            stores.setdefault(st, []).append(op)
    nested = {prod.bound(op.operands[0])[1] for top in prod.kernel.body.ops for reg in top.regions
              for op in walk(reg) if op.name == "store"}
    forward: dict[int, Op] = {}
    for op in walk(cons.kernel.body):
        if op.name not in ("load", "store"):
            continue
        st = cons.bound(op.operands[0])[1]
        if op.name == "store":
            if st in written or st in read_by_prod:
                raise Refusal(f"store at {loc_text(op)} writes `{st}`, which `{pname}` also "
                              f"{'writes' if st in written else 'reads'} in other programs")
            continue
        if st not in written:
            continue
        where = f"load at {loc_text(op)} reads `{st}` at {index_text(cons, op)}"
        if st in nested:
            raise Refusal(f"{where}, which `{pname}` stores inside a loop (not one tile per program)")
        key = access_key(cons, op)
        if key is None:
            raise Refusal(f"{where}: the index depends on loop variables or loaded values")
        match = [s for s in stores.get(st, []) if access_key(prod, s) == key]
        if not match:
            wrote = " or ".join(index_text(prod, s) for s in stores.get(st, [])) or "nothing"
            raise Refusal(f"{where}, but the same program of `{pname}` stores {wrote}; other "
                          "programs write the rest")
        last = stores[st][-1]
        if last is not match[-1]:
            raise Refusal(f"{where}: `{pname}` stores `{st}` again afterwards at {index_text(prod, last)}")
        forward[op.results[0].uid] = match[-1]
    if not forward:
        raise Refusal(f"`{cname}` reads nothing `{pname}` writes")
    return build_fused(prod, cons, forward, drop, pname, cname, name)


def build_fused(prod: Side, cons: Side, forward: dict, drop: set, pname: str, cname: str,
                kernel_name: str | None = None):
    b = Builder()
    params, origin, by_storage, names = [], {}, {}, set()

    def add_param(side: Side, p: Param, tag: str):
        bind = side.binding[p.name]
        if p.is_tensor and bind[1] in by_storage:
            b.vmap[p.value.uid] = by_storage[bind[1]].value
            return
        if p.is_tensor and bind[1] in drop:
            return
        name = p.name
        n = 0
        while name in names:
            n += 1
            name = f"{p.name}_{n}"
        names.add(name)
        np_ = Param(name, Value(p.value.type, name), p.loc)
        b.vmap[p.value.uid] = np_.value
        params.append(np_)
        origin[name] = (tag, p.name)
        if p.is_tensor:
            by_storage[bind[1]] = np_

    for p in prod.kernel.params:
        add_param(prod, p, "producer")
    for p in cons.kernel.params:
        add_param(cons, p, "consumer")
    dropped = {p.value.uid: prod.shapes[side.binding[p.name][1]] for side in (prod, cons)
               for p in side.kernel.params if p.is_tensor and side.binding[p.name][1] in drop}

    def hook(op: Op, out: Block, bb: Builder) -> bool:
        if op.name == "dim" and op.operands[0].uid in dropped:      # the static size instead
            bb.vmap[op.results[0].uid] = Builder.emit(
                out, "const", [], {"value": dropped[op.operands[0].uid][op.attrs["axis"]], "dtype": D.i32}, op.loc)
            return True
        if op.name == "store" and op.operands[0].uid in dropped:
            return True
        if op.name == "load" and op.results[0].uid in forward:
            st = forward[op.results[0].uid]
            _, _, value, _ = access_parts(st)
            tensor = op.operands[0]
            bind = cons.bound(tensor)
            dims = prod.shapes[bind[1]]
            bb.vmap[op.results[0].uid] = forwarded_value(bb, out, op, bb.v(value), dims, op.loc)
            return True
        return False

    host = Block([], [])
    b.clone_block(prod.kernel.host, host, hook)
    grid = [b.v(g) for g in prod.kernel.grid]
    pids = [Value(a.type, a.hint) for a in prod.kernel.body.args]
    for old, new in zip(prod.kernel.body.args, pids):
        b.vmap[old.uid] = new
    for old, new in zip(cons.kernel.body.args, pids):
        b.vmap[old.uid] = new
    body = Block(pids, [])
    b.clone_block(prod.kernel.body, body, hook)
    b.clone_block(cons.kernel.body, body, hook)
    cx = dict(prod.kernel.constexprs)
    for k, v in cons.kernel.constexprs.items():
        name, n = k, 0
        while name in cx and cx[name] != v:          # same name, other value: keep both
            n += 1
            name = f"{k}_{n}"
        cx.setdefault(name, v)
    lp, lc = launch_options(prod.kernel), launch_options(cons.kernel)
    merged = {n: max(lp.get(n, 0), lc.get(n, 0)) for n in sorted(set(lp) | set(lc))}
    fused = Kernel(kernel_name or f"{prod.kernel.name}__{cons.kernel.name}", params, cx, host, grid, body, prod.kernel.loc,
                   [merged] if merged else [])
    return fused, origin


def launch_options(kernel: Kernel) -> dict:
    """num_warps etc. of the config a specialisation came from (the larger of the two parts' is
    what the fused kernel launches with)."""
    from k31dsl.dsl.frontend import LAUNCH_OPTIONS
    for cfg in kernel.configs:
        if all(kernel.constexprs.get(n) == v for n, v in cfg.items() if n not in LAUNCH_OPTIONS):
            return {n: cfg[n] for n in LAUNCH_OPTIONS if n in cfg}
    return {}


def tensor_params(kernel: Kernel) -> list[Param]:
    return [p for p in kernel.params if isinstance(p.value.type, TensorType)]

"""Where every tile of an AscendC kernel lives, decided before any code is written.

Ops are numbered in program order (a `for` also gets an end number after its body). Tiles that
are views of another (expand, reshape, same-width bitcast) share their root's buffer; a `for`
gives each carried tile one buffer (its result's) for the whole loop. A root is live from its
definition to its last use, lifted to the end of the outermost loop that holds the use but not
the definition. Roots are placed:

  "in"   a load's result: its own TQue<VECIN, depth> (AllocTensor at the load, FreeTensor after
         the last use) — the DMA of the next program overlaps compute on a real core when depth 2;
  "out"  a computed tile whose only use is an unmasked store: built directly in a
         TQue<VECOUT, depth> buffer, enqueued and copied out by the store;
  "pool" everything else: a fixed offset in one TBuf<VECCALC>, first-fit by liveness.

`mode` shrinks the footprint when UB is short: "double" (queues of depth 2), "single" (depth 1),
"pool" (no per-site queues: every tile in the liveness pool)."""
from __future__ import annotations

from dataclasses import dataclass, field

from k31dsl.dsl.infer import index_result_shape
from k31dsl.dsl.ir import BINARY, COMPARE, UNARY, Block, Kernel, Op, TileType, Value
from k31dsl.targets.ascendc import cexpr

ALIAS_OPS = ("expand", "reshape")


def ceil32(n: int) -> int:
    return (n + 31) // 32 * 32


def tile_bytes(v: Value) -> int:
    return ceil32(v.type.numel * cexpr.itemsize(v.type.dtype))


def is_tile(v: Value) -> bool:
    return isinstance(v.type, TileType) and not v.type.is_scalar


def row_aligned(t: TileType) -> bool:
    """Whether each row (last axis) of a dense tile starts 32-byte aligned in UB."""
    return (t.shape[-1] * cexpr.itemsize(t.dtype)) % 32 == 0


@dataclass
class Root:
    uid: int
    value: Value
    kind: str                      # "in", "out", "pool"
    start: int
    end: int = -1
    offset: int = 0                # pool byte offset
    loc: object = None
    coalesce: int | None = None    # built in this carried buffer (root uid of a loop result)
    share: int | None = None       # computed in place over this (dying) operand's buffer

    @property
    def bytes(self) -> int:
        return tile_bytes(self.value)


@dataclass
class Plan:
    mode: str
    pos: dict = field(default_factory=dict)        # id(op) -> number
    end: dict = field(default_factory=dict)        # id(for op) -> number after its body
    chain: dict = field(default_factory=dict)      # id(op) -> enclosing for ops, outermost first
    defs: dict = field(default_factory=dict)       # uid -> defining op (None: param / block arg)
    root: dict = field(default_factory=dict)       # uid -> root uid
    roots: dict = field(default_factory=dict)      # root uid -> Root
    uses: dict = field(default_factory=dict)       # uid -> [op]
    frees: dict = field(default_factory=dict)      # position -> [Root] (queue tiles to free)
    pool_bytes: int = 0

    def root_of(self, v: Value) -> Root | None:
        return self.roots.get(self.root.get(v.uid, v.uid))


def _number(plan: Plan, block: Block, chain: tuple, counter: list):
    for op in block.ops:
        plan.pos[id(op)] = counter[0]
        plan.chain[id(op)] = chain
        counter[0] += 1
        for r in op.results:
            plan.defs[r.uid] = op
        for x in op.operands:
            plan.uses.setdefault(x.uid, []).append(op)
        for region in op.regions:
            for a in region.args:
                plan.defs[a.uid] = op
            _number(plan, region, chain + (op,), counter)
        if op.name == "for":
            plan.end[id(op)] = counter[0]
            counter[0] += 1


def _lifted(plan: Plan, def_op: Op, use: Op) -> int:
    """The use's position, or the end of the outermost loop holding the use but not the
    definition (a carried buffer is defined by its own loop, so it lives through it)."""
    outer = set(map(id, plan.chain.get(id(def_op), ())))
    for f in plan.chain[id(use)]:
        if id(f) not in outer:
            return plan.end[id(f)]
    return plan.pos[id(use)]


def build_plan(kernel: Kernel, mode: str = "double", extra_uses=(), skip=()) -> Plan:
    """`extra_uses`: (value, op) pairs of values an op reads besides its operands (the operands
    of an op folded into its user); `skip`: uids of folded results that get no buffer."""
    plan = Plan(mode)
    _number(plan, kernel.body, (), [0])
    for v, op in extra_uses:
        plan.uses.setdefault(v.uid, []).append(op)
    # roots: views share their operand's root; carried tiles share the for result's root
    for op in _walk(kernel.body):
        if not (is_tile(op.result) if len(op.results) == 1 else False) or not op.operands \
                or not is_tile(op.operands[0]):
            pass
        elif op.name in ALIAS_OPS or (op.name == "bitcast" and
                                    cexpr.itemsize(op.result.type.dtype) ==
                                    cexpr.itemsize(op.operands[0].type.dtype)):
            plan.root[op.result.uid] = plan.root.get(op.operands[0].uid, op.operands[0].uid)
        if op.name == "for":
            for arg, res in zip(op.regions[0].args[1:], op.results):
                plan.root[arg.uid] = res.uid
    for op in _walk(kernel.body):
        for r in op.results:
            if not is_tile(r) or plan.root.get(r.uid, r.uid) != r.uid or r.uid in skip:
                continue
            kind = "pool"
            if mode != "pool" and op.name == "load" and row_aligned(r.type):
                kind = "in"
            plan.roots[r.uid] = Root(r.uid, r, kind, plan.pos[id(op)], loc=op.loc)
    # last uses, lifted out of loops the definition is not in
    members: dict[int, list[int]] = {}
    for uid, ru in plan.root.items():
        members.setdefault(ru, []).append(uid)
    for ru, root in plan.roots.items():
        def_op = plan.defs[ru]
        end = root.start
        for uid in [ru] + members.get(ru, []):
            for use in plan.uses.get(uid, []):
                end = max(end, _lifted(plan, def_op, use))
        if def_op.name == "for":
            end = max(end, plan.end[id(def_op)])
        root.end = end
    # computed tiles stored once, unmasked, as they are: build them in the VECOUT buffer
    if mode != "pool":
        for ru, root in plan.roots.items():
            group = {ru, *members.get(ru, [])}
            users = [u for uid in group for u in plan.uses.get(uid, [])
                     if not (u.name in ALIAS_OPS + ("bitcast",) and u.results[0].uid in group)]
            def_op = plan.defs[ru]
            if len(users) != 1 or users[0].name != "store" or users[0].attrs["mask"] or \
                    def_op.name in ("load", "for") or plan.chain[id(users[0])] != plan.chain[id(def_op)]:
                continue
            st = users[0]
            n_idx = len(st.attrs["index"])
            stored = st.operands[1 + n_idx]
            lanes = index_result_shape(st.operands[0].type, [x.type for x in st.operands[1:1 + n_idx]],
                                       st.attrs["index"])
            # a stored value the store broadcasts is copied into a staging tile first: not "out"
            if stored.uid in group and row_aligned(stored.type) and stored.type.shape == lanes and \
                    sum(1 for x in st.operands if x.uid in group) == 1:
                root.kind = "out"
    for root in plan.roots.values():
        if root.kind == "in":
            plan.frees.setdefault(root.end, []).append(root)
    _coalesce_yields(plan, kernel, members)
    _in_place(plan)
    _place_pool(plan)
    return plan


def _in_place(plan: Plan):
    """A lane-wise op whose operand tile dies at it writes its result over that operand
    (Add(x, x, y)-style): one buffer for the chain instead of two."""
    for ru, root in sorted(plan.roots.items(), key=lambda kv: kv[1].start):
        d = plan.defs[ru]
        if root.kind != "pool" or root.coalesce is not None or d.name not in LANEWISE:
            continue
        for x in d.operands:
            if not is_tile(x):
                continue
            ou = plan.root.get(x.uid, x.uid)
            op_root = plan.roots.get(ou)
            if op_root is None or op_root.kind != "pool" or op_root.coalesce is not None or ou == ru:
                continue
            if plan.defs[ou].name == "for" or not _lanewise(plan, d, ou):
                continue
            head = op_root
            while head.share is not None:
                head = plan.roots[head.share]
            if head.coalesce is not None or head.end != plan.pos[id(d)] or head.bytes < root.bytes:
                continue
            root.share = head.uid
            head.end = max(head.end, root.end)
            break


def _body_pos(plan: Plan, loop: Op, use: Op) -> int:
    """A use's position seen from `loop`'s body: the end of a nested loop holding it."""
    chain = plan.chain[id(use)]
    inner = chain[chain.index(loop) + 1:] if loop in chain else ()
    return plan.end[id(inner[0])] if inner else plan.pos[id(use)]


LANEWISE = BINARY | COMPARE | UNARY | {"where", "cast"}


def _lanewise(plan: Plan, op: Op, root_uid: int) -> bool:
    """Whether `op` may write its result over operands of root `root_uid` (each lane read
    before the same lane is written: same shape, same element width)."""
    if op.name not in LANEWISE:
        return False
    r = op.result
    for x in op.operands:
        if plan.root.get(x.uid, x.uid) == root_uid:
            if x.type.shape != r.type.shape or cexpr.itemsize(x.type.dtype) != cexpr.itemsize(r.type.dtype):
                return False
    return True


def _coalesce_yields(plan: Plan, kernel: Kernel, members: dict):
    """A tile yielded by a loop body is built directly in the carried buffer when it is defined
    in the body after the last use of the carried value (accumulators update in place)."""
    taken = set()
    for loop in _walk(kernel.body):
        if loop.name != "for":
            continue
        body = loop.regions[0]
        y = body.ops[-1]
        for init, res in zip(loop.operands[3:], loop.results):     # the initial value, likewise
            croot = plan.roots.get(res.uid)
            ir = plan.root.get(init.uid, init.uid)
            root = plan.roots.get(ir)
            if croot is None or root is None or root.kind != "pool" or ir in taken:
                continue
            d = plan.defs[ir]
            users = [u for m in [ir] + members.get(ir, []) for u in plan.uses.get(m, [])]
            if d.name == "for" or plan.chain[id(d)] != plan.chain[id(loop)] or any(u is not loop for u in users) \
                    or sum(1 for x in loop.operands[3:] if plan.root.get(x.uid, x.uid) == ir) != 1:
                continue
            croot.start = min(croot.start, root.start)
            root.coalesce = res.uid
            taken.add(ir)
        for c, v, res in zip(body.args[1:], y.operands, loop.results):
            croot = plan.roots.get(res.uid)
            vr = plan.root.get(v.uid, v.uid)
            root = plan.roots.get(vr)
            if croot is None or root is None or root.kind != "pool" or vr in taken:
                continue
            d = plan.defs[vr]
            if d.name == "for" or plan.chain[id(d)] != plan.chain[id(loop)] + (loop,):
                continue
            last_c = plan.pos[id(loop)]
            for uid in [c.uid] + [m for m in members.get(res.uid, []) if m != c.uid]:
                for u in plan.uses.get(uid, []):
                    if u is d and _lanewise(plan, d, res.uid):
                        continue                 # acc = acc + x: read and written lane by lane
                    if loop in plan.chain[id(u)]:
                        last_c = max(last_c, _body_pos(plan, loop, u))
            if plan.pos[id(d)] <= last_c or root.end > plan.pos[id(y)]:
                continue
            if sum(1 for x in y.operands if plan.root.get(x.uid, x.uid) == vr) != 1:
                continue
            root.coalesce = res.uid
            taken.add(vr)


def _walk(block: Block):
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from _walk(region)


def _place_pool(plan: Plan):
    """First-fit offsets by liveness (intervals are inclusive: an op's result never shares bytes
    with its operands)."""
    placed: list[Root] = []
    pool = [r for r in plan.roots.values() if r.kind == "pool"]
    for root in sorted((r for r in pool if r.coalesce is None and r.share is None), key=lambda r: (r.start, -r.bytes)):
        busy = sorted((p.offset, p.offset + p.bytes) for p in placed
                      if not (p.end < root.start or root.end < p.start))
        off = 0
        for lo, hi in busy:
            if off + root.bytes <= lo:
                break
            off = max(off, hi)
        root.offset = off
        placed.append(root)
        plan.pool_bytes = max(plan.pool_bytes, off + root.bytes)
    for root in pool:
        if root.share is not None:
            root.offset = plan.roots[root.share].offset
    for root in pool:
        if root.coalesce is not None:
            root.offset = plan.roots[root.coalesce].offset


def live_at_peak(plan: Plan) -> list[Root]:
    """The pool tiles live at the position where the pool is fullest."""
    best, best_pos = -1, 0
    points = sorted({r.start for r in plan.roots.values()})
    for p in points:
        total = sum(r.bytes for r in plan.roots.values()
                    if r.kind == "pool" and r.coalesce is None and r.share is None and r.start <= p <= r.end)
        if total > best:
            best, best_pos = total, p
    return [r for r in plan.roots.values()
            if r.kind == "pool" and r.coalesce is None and r.share is None and r.start <= best_pos <= r.end]

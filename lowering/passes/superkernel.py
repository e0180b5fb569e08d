"""The `superkernel` graph pass: fuse chains of kernel calls.

For each call and each call that reads what it wrote (in schedule order, in rounds until nothing
changes: each round takes every fusion whose two calls no other fusion of the round touches, and
rebuilds the program once), the pair is inlined into one kernel when the consumer's program reads only what the same
program of the producer wrote (lowering/passes/fuse.py): one launch, and the intermediate tile
never goes through global memory; the intermediate tensor disappears when nothing else reads it.
A pair that cannot be inlined is put in one launch *group* instead when it is a link of a linear
chain (the producer feeds only the consumer, the consumer depends only on the chain), sub-kernels
separated by a grid barrier: AscendC emits one entry with SyncAll() between them, Triton captures the group as a
CUDA graph on a GPU ("graph mode"), NumPy runs it in order. Pairs are never merged when another
node lies on a dependency path between them (that would make a cycle). Every decision, with the
reason for a refusal, is appended to `program.report`; `program.meta["superkernel"]` counts.
"""
from __future__ import annotations

import itertools

from k31dsl.lowering.graph.ir import CallNode, successors, would_cycle
from k31dsl.lowering.passes.fuse import Refusal, Side, fuse


def _binding(p, node: CallNode) -> dict:
    out = {}
    for k, v in node.args.items():
        out[k] = ("tensor", p.tensor_node(v).storage) if isinstance(v, str) else ("scalar", v)
    return out


def _side(p, nid: str) -> Side:
    node = p.node(nid)
    tensors = [p.tensor_node(v) for v in node.args.values() if isinstance(v, str)]
    shapes = {t.storage: t.shape for t in tensors}
    return Side(node.kernel, _binding(p, node), shapes)


def consumers(p, nid: str) -> list[str]:
    """Calls reading a tensor version `nid` writes, in schedule order."""
    # Without launch groups the schedule is the insertion order (a topological order, and ops()
    # sorts by it): reading it is linear, where ops() is a full sort per query (a model step
    # graph of ~100 calls spent 30 s here).
    pos = schedule_pos(p)
    out = {r for t in p.writes_of(nid) for r in p.readers(t) if p.node(r).kind == "call"}
    return sorted(out, key=pos.get)


def schedule_pos(p) -> dict:
    """op -> its schedule position, once per program object (a fusion makes a new one)."""
    pos = p.__dict__.get("_superkernel_pos")
    if pos is None or pos[0] is not p.g:
        grouped = any("group" in p.node(n).attrs for n in p.order)
        pos = p._superkernel_pos = (p.g, {n: i for i, n in enumerate(p.ops() if grouped else p.order)})
    return pos[1]


def droppable(p, prod: str, cons: str) -> set[str]:
    """Storages the producer writes that only the consumer reads, never read or written again and
    not returned: the fused kernel need not store them at all."""
    out = set()
    read_by_prod = {p.tensor_node(t).storage for t in p.reads_of(prod)}
    for tid in p.writes_of(prod):
        t = p.tensor_node(tid)
        if t.kind != "temp" or t.storage in p.outputs or t.storage in read_by_prod:
            continue
        if set(p.readers(tid)) != {cons} or p.final(t.storage) != tid:
            continue
        out.add(t.storage)
    return out


def fused_name(kernels: list[str]) -> str:
    """`a__b` for two kernels; longer chains name their distinct kernels (at most three) and the
    count, e.g. `row_scale__row_add__8`."""
    distinct = list(dict.fromkeys(kernels))
    if len(kernels) == 2:
        return "__".join(kernels)
    head = "__".join(distinct[:3]) + ("__etc" if len(distinct) > 3 else "")
    return f"{head}__{len(kernels)}"


def all_deps(p) -> dict:
    """{node: p.op_deps(node)} of a program, computed once per program object (the pass replaces
    the program on every fusion, so the cache never outlives the graph it describes)."""
    deps = p.__dict__.get("_superkernel_deps")
    if deps is None or deps[0] is not p.g:
        deps = p._superkernel_deps = (p.g, {n: p.op_deps(n) for n in p.order})
    return deps[1]


def succ_map(p) -> dict:
    """{node: the nodes depending on it}, once per program object, like all_deps."""
    cached = p.__dict__.get("_superkernel_succ")
    if cached is None or cached[0] is not p.g:
        cached = p._superkernel_succ = (p.g, successors(all_deps(p)))
    return cached[1]


def cycles_if_merged(p, nodes: set) -> bool:
    """would_cycle with the program's successor map and schedule positions cached."""
    return would_cycle(p, nodes, succ=succ_map(p), pos=schedule_pos(p))


def between(p, prod: str, cons: str) -> list[str]:
    """The ops on a dependency path from `prod` to `cons`, in schedule order."""
    pos, deps, succ = schedule_pos(p), all_deps(p), succ_map(p)
    down, stack = set(), [prod]
    while stack:                             # after prod, up to cons's position
        for x in succ[stack.pop()]:
            if x not in down and pos[x] < pos[cons]:
                down.add(x)
                stack.append(x)
    up, stack = set(), [cons]
    while stack:                             # before cons, down to prod's position
        for x in deps[stack.pop()]:
            if x not in up and pos[x] > pos[prod]:
                up.add(x)
                stack.append(x)
    return sorted(down & up, key=pos.get)


def plan_fusion(p, prod: str, cons: str, taken: set):
    """(fused CallNode, report line) for inlining `cons` into `prod`, or raises Refusal. The
    program is not changed: `apply_fusions` rebuilds it once for every fusion of a round. `taken`:
    node names already given out this round."""
    if cycles_if_merged(p, {prod, cons}):
        raise Refusal(f"another node ({', '.join(between(p, prod, cons)[:3])}) depends on `{prod}` and "
                      f"feeds `{cons}`")
    drop = droppable(p, prod, cons)
    a, b = p.node(prod), p.node(cons)
    kernels = a.attrs.get("kernels", [a.kernel.name]) + b.attrs.get("kernels", [b.kernel.name])
    kernel, origin = fuse(_side(p, prod), _side(p, cons), drop, prod, cons, fused_name(kernels))
    args = {name: (a if side == "producer" else b).args[pname] for name, (side, pname) in origin.items()}
    fused_names = a.attrs.get("fused", [prod]) + b.attrs.get("fused", [cons])
    name = p._unique(kernel.name, taken)
    taken.add(name)
    cx = {**b.constexprs, **a.constexprs}
    node = CallNode(name, kernel, None, cx, args, loc=a.loc, attrs={"fused": fused_names, "kernels": kernels})
    forwarded = sorted({p.tensor_node(t).storage for t in p.writes_of(prod)} &
                       {p.tensor_node(t).storage for t in p.reads_of(cons)})
    msg = (f"superkernel: fused {prod} + {cons} -> {name}: each program of {cons} reads only the "
           f"tile of {', '.join(f'`{s}`' for s in forwarded)} that the same program of {prod} stored "
           f"(forwarded on chip{'; ' + ', '.join(f'`{s}`' for s in sorted(drop)) + ' no longer stored' if drop else ''})")
    return node, msg


def apply_fusions(p, fusions: list):
    """One rebuild of the program for several fusions [(prod, cons, fused node)] that share no
    node. Each was checked alone; together they are still acyclic: a cycle through the merged
    pairs would contain a path from some pair's producer to its consumer through other nodes,
    which that pair's own check refused."""
    units, fused_at = {}, {}
    for i, (prod, cons, node) in enumerate(fusions):
        units[prod] = units[cons] = ("fuse", i)
        fused_at[prod], fused_at[cons] = node, None
    nodes = []
    for nid in p.ops(units, all_deps(p)):
        if nid not in fused_at:
            nodes.append(p.node(nid))
        elif fused_at[nid] is not None:
            nodes.append(fused_at[nid])
    return p.replay(nodes)


def superkernel(program):
    p = program.copy()
    refused: dict[tuple, str] = {}
    fused = 0
    while True:                 # rounds: every fusion whose pair is free, then one rebuild
        planned, touched, taken = [], set(), set()
        for prod in p.calls():
            if prod in touched:
                continue
            for cons in consumers(p, prod):
                if (prod, cons) in refused or cons in touched:
                    continue
                try:
                    node, msg = plan_fusion(p, prod, cons, taken)
                except Refusal as why:
                    refused[(prod, cons)] = str(why)
                    continue
                planned.append((prod, cons, node, msg))
                touched |= {prod, cons}
                break
        if not planned:
            break
        p = apply_fusions(p, [f[:3] for f in planned])
        p.report.extend(f[3] for f in planned)
        fused += len(planned)
    groups: dict[str, set] = {}
    group_of: dict[str, str] = {}
    counter = itertools.count()
    for (prod, cons), why in refused.items():
        if prod not in p.g or cons not in p.g:
            continue
        members = groups.get(group_of.get(prod), {prod}) | groups.get(group_of.get(cons), {cons})
        if consumers(p, prod) != [cons] or not {d for d in p.op_deps(cons)} <= members:
            p.report.append(f"superkernel: did not inline {cons} into {prod}: {why}; not grouped either "
                            "(a branch or join: the streams pass may run its parts side by side)")
            continue
        if cycles_if_merged(p, members):
            p.report.append(f"superkernel: kept {prod} and {cons} apart and in separate launches: {why}; "
                            "grouping them would put another node inside the launch")
            continue
        gid = group_of.get(prod) or group_of.get(cons) or f"g{next(counter)}"
        for old in {group_of.get(prod), group_of.get(cons)} - {None, gid}:
            groups.pop(old, None)
        groups[gid] = members
        for m in members:
            group_of[m] = gid
        p.report.append(f"superkernel: did not inline {cons} into {prod}: {why}; both run in launch "
                        f"group {gid} with a grid barrier between them")
    for gid, members in groups.items():
        for m in members:
            p.node(m).attrs["group"] = gid
    p.meta["superkernel"] = {"fused": fused, "groups": {g: sorted(m) for g, m in groups.items()},
                             "calls_before": len(program.calls()), "calls_after": len(p.calls())}
    return p

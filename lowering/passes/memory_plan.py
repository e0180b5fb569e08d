"""The `memory_plan` graph pass: intermediate tensors share buffers by liveness.

Candidates are the program's temps that are not returned. A tensor may move into a buffer when
every use (read or write, any version) of every tensor already placed there *happens before*
its own first use — through the dependency graph, which streams and events respect, so the plan
is safe on several streams too. Tensors are placed in order of first use, best fit among the
buffers free for them (a too-small free buffer grows), else a new buffer.
`program.meta["memory_plan"]` = {"assign": storage -> buffer, "buffers": buffer -> bytes,
"bytes_before", "bytes_after", "peak_live"}; the executors allocate exactly those buffers.
"""
from __future__ import annotations

import networkx as nx


def op_dag(p) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(p.order)
    for n in p.order:
        for d in p.op_deps(n):
            g.add_edge(d, n)
    return g


def uses(p) -> dict[str, set]:
    """storage -> the call/host nodes that read or write any of its versions."""
    out: dict[str, set] = {}
    for n in p.order:
        for t in p.reads_of(n) + p.writes_of(n):
            out.setdefault(p.tensor_node(t).storage, set()).add(n)
        for u, _, r in p.g.in_edges(n, data="role"):
            if r == "prev":
                out.setdefault(p.tensor_node(u).storage, set()).add(n)
    return out


def before_all(anc: dict, earlier: set, later: set) -> bool:
    """Every node of `earlier` is an ancestor of every node of `later`."""
    return all(earlier <= anc[n] for n in later)


def peak_live(p, candidates: list[str], use: dict, topo: list[str]) -> int:
    """Largest sum of candidate bytes live at one op in schedule order (a lower bound)."""
    pos = {n: i for i, n in enumerate(topo)}
    spans = [(min(pos[n] for n in use[s]), max(pos[n] for n in use[s]), p.storages()[s].nbytes)
             for s in candidates]
    return max((sum(b for lo, hi, b in spans if lo <= i <= hi) for i in range(len(topo))), default=0)


def reshape_aliases(p, candidates: list[str], storages: dict) -> dict[str, str]:
    """{b: a} for each `reshape` host op from temp a to temp b that may be a view instead of a
    copy: neither is written after it (it reads a's final version and is b's only writer), so
    b in a's buffer (same bytes, same offset) holds exactly the reshaped elements. Chains map to
    their first source. The executors skip these ops."""
    cand = set(candidates)
    alias: dict[str, str] = {}
    for n in p.order:
        node = p.node(n)
        if node.kind != "host" or node.op != "reshape":
            continue
        src, dst = p.tensor_node(node.inputs[0]), p.tensor_node(node.outputs[0])
        a, b = src.storage, dst.storage
        if a in cand and b in cand and a != b and p.final(a) == src.id and p.final(b) == dst.id \
                and dst.version == 1 and storages[a].nbytes == storages[b].nbytes:
            alias[b] = alias.get(a, a)
    return alias


def memory_plan(program):
    p = program.copy()
    storages = p.storages()
    use = uses(p)
    candidates = [s for s, t in storages.items()
                  if t.kind == "temp" and s not in p.outputs and s in use]
    alias = reshape_aliases(p, candidates, storages)
    for b, a in alias.items():                 # b lives in a's buffer: a's uses extend over b's
        use[a] = use[a] | use[b]
    candidates = [s for s in candidates if s not in alias]
    dag = op_dag(p)
    anc = {n: nx.ancestors(dag, n) for n in dag}
    topo = p.ops()
    pos = {n: i for i, n in enumerate(topo)}
    candidates.sort(key=lambda s: (min(pos[n] for n in use[s]), s))
    buffers: dict[str, int] = {}
    holders: dict[str, list[str]] = {}
    assign: dict[str, str] = {}
    for s in candidates:
        need = storages[s].nbytes
        # a buffer's holders are ordered (each placed after every use of the one before), so
        # following its last holder means following them all
        free = [b for b in buffers if before_all(anc, use[holders[b][-1]], use[s])]
        fits = [b for b in free if buffers[b] >= need]
        if fits:
            b = min(fits, key=lambda b: (buffers[b], b))
        elif free:
            b = max(free, key=lambda b: (buffers[b], b))
            buffers[b] = need
        else:
            b = f"b{len(buffers)}"
            buffers[b] = need
            holders[b] = []
        holders[b].append(s)
        assign[s] = b
    for b, a in alias.items():
        assign[b] = assign[a]
    before = sum(storages[s].nbytes for s in candidates) + sum(storages[b].nbytes for b in alias)
    after = sum(buffers.values())
    p.meta["memory_plan"] = {"assign": assign, "alias": alias, "buffers": buffers, "bytes_before": before,
                             "bytes_after": after, "peak_live": peak_live(p, candidates, use, topo)}
    if candidates:
        p.report.append(f"memory_plan: {len(candidates)} intermediates in {len(buffers)} buffers; "
                        f"{before} bytes -> {after} bytes (peak live {p.meta['memory_plan']['peak_live']})"
                        + (f"; {len(alias)} reshape results share their source's buffer (no copy)" if alias else ""))
    return p

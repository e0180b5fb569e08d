"""The graph verifier: a table of named rules, each `rule(program) -> [problem text]`. It runs
after the builder and (in tests, K31_VERIFY=1) after every graph pass."""
from __future__ import annotations

import networkx as nx

from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.graph.bind import check_binding, loaded_params, stored_params
from k31dsl.lowering.graph.ir import CallNode, HostNode, TensorNode


def acyclic(p) -> list[str]:
    if nx.is_directed_acyclic_graph(p.g):
        return []
    cycle = nx.find_cycle(p.g)
    return ["cycle: " + " -> ".join(u for u, _ in cycle)]


def single_writer(p) -> list[str]:
    out = []
    for t in p.tensors():
        writers = [u for u, _, r in p.g.in_edges(t.id, data="role") if r == "write"]
        if len(writers) > 1:
            out.append(f"{t.id} has {len(writers)} writers ({', '.join(writers)}); each version has one")
        elif t.version > 0 and not writers:
            out.append(f"{t.id} is version {t.version} of `{t.storage}` but nothing writes it")
        elif t.version == 0 and writers:
            out.append(f"{t.id} is the declared version of `{t.storage}` but {writers[0]} writes it")
    return out


def inputs_bound(p) -> list[str]:
    out = []
    for t in p.tensors():
        if t.version == 0 and t.kind == "temp":
            for r in p.readers(t.id):
                out.append(f"{r} reads {t.id}, which no node has written (its contents are undefined)")
    return out


def signatures(p) -> list[str]:
    """Each call's bound tensors match its kernel's parameters, and the edges match the kernel's
    loads and stores."""
    out = []
    for nid in p.ops():
        n = p.node(nid)
        if not isinstance(n, CallNode):
            continue
        try:
            check_binding(p, n.kernel, n.args)
        except K31Error as e:
            out.append(f"{nid}: {e.message}")
            continue
        reads = {q for _, _, d in p.g.in_edges(nid, data=True) if d["role"] == "read" for q in d["params"]}
        writes = {d["param"] for _, _, d in p.g.out_edges(nid, data=True) if d["role"] == "write"}
        if not set(loaded_params(n.kernel)) <= reads:
            out.append(f"{nid}: kernel loads {sorted(set(loaded_params(n.kernel)) - reads)} without a read edge")
        if set(stored_params(n.kernel)) != writes:
            out.append(f"{nid}: kernel stores {sorted(stored_params(n.kernel))}, graph writes {sorted(writes)}")
        for _, _, d in p.g.in_edges(nid, data=True):
            for q in d["params"] if d["role"] == "read" else ():
                if q not in n.args:
                    out.append(f"{nid}: read edge for unknown parameter {q}")
    return out


def weights_static(p) -> list[str]:
    out = []
    for t in p.tensors():
        if t.kind == "weight" and t.version > 0:
            w = p.writer(t.id)
            node = p.node(w) if w else None
            if not isinstance(node, HostNode) or not all(p.tensor_node(i).static for i in node.inputs):
                out.append(f"weight {t.id} is written by {w}; weights change only by host conversions of weights")
    return out


def edges_well_formed(p) -> list[str]:
    out = []
    for u, v, d in p.g.edges(data=True):
        role, tu, tv = d.get("role"), p.node(u), p.node(v)
        ok = {"read": (TensorNode, (CallNode, HostNode)), "prev": (TensorNode, (CallNode, HostNode)),
              "write": ((CallNode, HostNode), TensorNode), "order": ((CallNode, HostNode), (CallNode, HostNode))}
        if role not in ok or not (isinstance(tu, ok[role][0]) and isinstance(tv, ok[role][1])):
            out.append(f"edge {u} -> {v} has role {role!r} between {type(tu).__name__} and {type(tv).__name__}")
    return out


def outputs_exist(p) -> list[str]:
    return [f"output `{s}` is not a tensor of the program" for s in p.outputs if s not in p.latest]


RULES = [acyclic, edges_well_formed, single_writer, inputs_bound, signatures, weights_static, outputs_exist]


def problems(program) -> list[str]:
    out = []
    for rule in RULES:
        out.extend(f"[{rule.__name__}] {msg}" for msg in rule(program))
        if rule is acyclic and out:
            break
    return out


def verify(program) -> None:
    found = problems(program)
    if found:
        raise K31Error(f"program `{program.name}` is malformed:\n  " + "\n  ".join(found),
                       hint="a graph pass or the builder produced this; report it with the dump")

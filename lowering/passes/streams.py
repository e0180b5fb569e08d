"""The `streams` graph pass: independent branches on their own streams.

Each op (a launch group counts as one) gets a `stream` attr. The critical path (the longest
dependency chain, weighting each op by the bytes it reads and writes) stays on stream 0, the
caller's stream. The other ops, in schedule order, continue the side stream of a predecessor
they extend; an op that starts a new branch opens a new stream while fewer than `max_streams`
(default 3, or $K31_MAX_STREAMS) exist, else joins the least loaded one. Every dependency between
ops on different streams becomes an event: the producer's `record` attr names it, the consumer's
`wait` attr waits for it (once per consumer stream). Targets: Triton `torch.cuda.Stream`/`Event`, AscendC `aclrtStream`/`aclrtEvent`
in the host code, NumPy runs in order. `program.meta["streams"]` has the count, critical path and
events.
"""
from __future__ import annotations

import functools
import os

import networkx as nx

MAX_STREAMS = 3      # the default limit; K31_MAX_STREAMS overrides it for the pipelines


def op_cost(p, nid: str) -> int:
    ids = set(p.reads_of(nid)) | set(p.writes_of(nid))
    return sum(p.tensor_node(t).nbytes for t in ids) or 1


def unit_graph(p):
    """(DAG of units, unit -> member ids in schedule order, op -> unit)."""
    order = [n for n in p.ops() if not p.is_static(n)]       # load-time conversions take no stream
    unit_of = {n: ("group", p.node(n).attrs["group"]) if "group" in p.node(n).attrs else n for n in order}
    members: dict = {}
    for n in order:
        members.setdefault(unit_of[n], []).append(n)
    ug = nx.DiGraph()
    ug.add_nodes_from(members)
    for n in order:
        for d in p.op_deps(n):
            if d in unit_of and unit_of[d] != unit_of[n]:
                ug.add_edge(unit_of[d], unit_of[n])
    return ug, members, unit_of


def critical_path(ug, cost: dict) -> list:
    best, prev = {}, {}
    for u in nx.topological_sort(ug):
        preds = list(ug.predecessors(u))
        top = max(preds, key=lambda x: best[x]) if preds else None
        best[u] = cost[u] + (best[top] if top is not None else 0)
        prev[u] = top
    if not best:
        return []
    end = max(best, key=lambda u: best[u])
    path = []
    while end is not None:
        path.append(end)
        end = prev[end]
    return path[::-1]


def streams(program, max_streams: int | None = None):
    if max_streams is None:
        max_streams = int(os.environ.get("K31_MAX_STREAMS", MAX_STREAMS))
    max_streams = max(1, max_streams)
    p = program.copy()
    ug, members, unit_of = unit_graph(p)
    cost = {u: sum(op_cost(p, m) for m in ms) for u, ms in members.items()}
    main = critical_path(ug, cost)
    stream: dict = {u: 0 for u in main}
    last_on: dict[int, object] = {}
    load: dict[int, int] = {0: sum(cost[u] for u in main)}
    order = list(members)                          # units in schedule order
    for u in order:
        if u in stream:
            last_on[0] = u
            continue
        chosen = None
        for pred in ug.predecessors(u):
            s = stream.get(pred)
            if s and last_on.get(s) == pred:       # continue the branch a predecessor started
                chosen = s
                break
        if chosen is None:
            if len(load) < max_streams:
                chosen = len(load)
            else:
                chosen = min(load, key=lambda s: (load[s], s))
        stream[u] = chosen
        last_on[chosen] = u
        load[chosen] = load.get(chosen, 0) + cost[u]
    events = []
    waited: set = set()
    for u in order:
        for pred in sorted(ug.predecessors(u), key=order.index):
            if stream[pred] == stream[u] or (pred, stream[u]) in waited:
                continue
            name = f"e{len(events)}"
            producer, consumer = members[pred][-1], members[u][0]
            p.node(producer).attrs.setdefault("record", []).append(name)
            p.node(consumer).attrs.setdefault("wait", []).append(name)
            waited.add((pred, stream[u]))
            events.append((name, producer, consumer))
    for u, ms in members.items():
        for m in ms:
            p.node(m).attrs["stream"] = stream[u]
    used = sorted(set(stream.values()))
    p.meta["streams"] = {"count": len(used), "critical_path": [m for u in main for m in members[u]],
                         "events": events}
    if len(used) > 1:
        p.report.append(f"streams: {len(used)} streams; critical path {' -> '.join(p.meta['streams']['critical_path'])} "
                        f"on stream 0; {len(events)} cross-stream events")
    return p


def with_max_streams(n: int):
    """The streams pass with another stream limit, for `passes=[("streams", with_max_streams(2))]`."""
    return functools.partial(streams, max_streams=n)

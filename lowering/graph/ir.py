"""Graph IR: a program of kernel calls, host ops (collectives, layout conversions) and tensors,
held as a networkx DAG.

Nodes are tensor *versions* and calls. A tensor (its storage) has version 0 when declared; every
call that writes it makes a new version, so each version has at most one writer and the graph
stays acyclic even when a kernel updates a tensor in place. Edges carry a `role`:
  "read"   tensor version -> call that loads it (bound to the kernel parameters `params`)
  "write"  call -> the version it produces (parameter `param`)
  "prev"   the version a write replaces -> the writer (elements the kernel does not store keep
           their old value, so the writer comes after it)
  "order"  call -> call: a reader of a replaced version runs before the writer (write after read)

Building a program (static shapes; kernels are `@k.kernel` definitions):

    import k31dsl as k
    from k31dsl.lowering.graph import Program, run
    from k31dsl.ops.common import rmsnorm_rows

    p = Program("norm_twice")
    x = p.input("x", (6, 48), k.f32)
    w = p.weight("w", (48,), k.f32)              # static: may be converted once (NZ layout)
    h = p.tensor("h", (6, 48), k.f32)            # an intermediate the program allocates
    y = p.tensor("y", (6, 48), k.f32)
    h = p.call(rmsnorm_rows, x, w, h, 1e-6, BM=2, BD=64, ONE_TILE=True)   # returns h's new version
    y = p.call(rmsnorm_rows, h, w, y, 1e-6, BM=2, BD=64, ONE_TILE=True)
    p.output(y)
    out = run(p, {"x": xt, "w": wt}, target="numpy")    # {"y": tensor}

`p.call(kernel, *args, **kw)` binds the kernel's runtime parameters in order (tensors are the
handles above, scalars are Python numbers; a keyword naming a parameter binds it too); other
keywords are constexprs. Dtype constexprs not passed are bound from the tensors' dtypes. A tensor
parameter the kernel only stores to may be left out: it becomes a new temp `<call>_<param>` sized
from the dims the other arguments bind (`y = p.call(rmsnorm_rows, x, w, eps=1e-6, ...)`). It
returns the new version of each tensor the kernel stores to (one handle, a tuple, or None).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error, error

TENSOR_KINDS = ("input", "weight", "temp")


def add_read(g, tensor_id: str, op: str, param: str | None = None):
    """A "read" edge from a tensor version to an op, naming the kernel parameters bound to it
    (`params`): a version passed to several parameters of one call is one edge naming them all."""
    if g.has_edge(tensor_id, op):
        g.edges[tensor_id, op]["params"] += (() if param is None else (param,))
    else:
        g.add_edge(tensor_id, op, role="read", params=() if param is None else (param,))


@dataclass(frozen=True)
class TensorNode:
    storage: str                  # the tensor's name (one buffer for all its versions)
    version: int
    shape: tuple[int, ...]
    dtype: D.DType
    kind: str                     # "input" | "weight" | "temp"
    layout: str = "ND"            # "ND", or "NZ" (flat FRACTAL_NZ data, see lowering/passes/nz_layout.py)
    meta: tuple = ()              # layout facts, e.g. (("nd_shape", (K, N)), ("nz_shape", (...)))

    @property
    def static(self) -> bool:
        return self.kind == "weight"

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize

    @property
    def id(self) -> str:
        return tensor_id(self.storage, self.version)


def tensor_id(storage: str, version: int) -> str:
    return f"%{storage}" if version == 0 else f"%{storage}.{version}"


@dataclass
class CallNode:
    """One kernel launch: the specialised kernel IR and what each runtime parameter is bound to
    (a tensor version id, or a Python scalar). `attrs` hold what passes decide: stream, events,
    group, fused (the calls a fused kernel replaced)."""
    name: str
    kernel: Any                   # dsl.ir.Kernel (specialised)
    kdef: Any                     # the KernelDef it came from (None for a fused kernel)
    constexprs: dict
    args: dict                    # param name -> tensor id or scalar
    loc: Any = None
    attrs: dict = field(default_factory=dict)

    kind = "call"


@dataclass
class HostNode:
    """A host-side op on whole tensors (collectives, layout conversions), run by torch.
    `inputs` and `outputs` are tensor ids; see HOST_OPS in lowering/graph/hostops.py."""
    name: str
    op: str
    inputs: list
    outputs: list
    params: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)

    kind = "host"


class TensorRef:
    """A handle to one version of a tensor of a program (what the builder returns)."""

    def __init__(self, program: "Program", id: str):
        self.program, self.id = program, id

    @property
    def node(self) -> TensorNode:
        return self.program.g.nodes[self.id]["node"]

    shape = property(lambda self: self.node.shape)
    dtype = property(lambda self: self.node.dtype)
    storage = property(lambda self: self.node.storage)

    def __repr__(self) -> str:
        n = self.node
        return f"<{n.id}: {n.dtype.name}{list(n.shape)}>"


def _fixed_shape(shape, what: str) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise K31Error(f"{what}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in out):
        raise K31Error(f"{what}: negative size in shape {list(out)}")
    return out


class Program:
    """A graph of kernel calls and tensors; see the module docstring."""

    def __init__(self, name: str):
        if not name.isidentifier():
            raise K31Error(f"program name {name!r} must be an identifier")
        self.name = name
        self.g = nx.DiGraph()
        self.outputs: list[str] = []          # storage names whose final version is returned
        self.latest: dict[str, str] = {}      # storage -> id of its newest version
        self.order: list[str] = []            # call/host node ids in the order they were added
        self.report: list[str] = []           # what passes did (and why they refused)
        self.meta: dict = {}                  # pass results (memory plan, stream count, ...)

    # ------------------------------------------------------------ tensors

    def _declare(self, name: str, shape, dtype, kind: str) -> TensorRef:
        if not isinstance(name, str) or not name.isidentifier():
            raise K31Error(f"tensor name {name!r} must be an identifier")
        if name in self.latest:
            raise K31Error(f"program `{self.name}` already has a tensor `{name}`")
        if not isinstance(dtype, D.DType):
            raise K31Error(f"tensor `{name}`: dtype must be a k31dsl dtype such as k.f32, got {dtype!r}")
        node = TensorNode(name, 0, _fixed_shape(shape, f"tensor `{name}`"), dtype, kind)
        self.g.add_node(node.id, node=node)
        self.latest[name] = node.id
        return TensorRef(self, node.id)

    def input(self, name: str, shape, dtype) -> TensorRef:
        """A tensor the caller passes to `run` (may be written by the program)."""
        return self._declare(name, shape, dtype, "input")

    def weight(self, name: str, shape, dtype) -> TensorRef:
        """A static tensor passed to `run` that the program never writes (a model weight)."""
        return self._declare(name, shape, dtype, "weight")

    def tensor(self, name: str, shape, dtype) -> TensorRef:
        """A tensor the program allocates (contents undefined until a kernel writes it)."""
        return self._declare(name, shape, dtype, "temp")

    def output(self, *refs: TensorRef) -> None:
        """Return the final version of these tensors from `run`."""
        for r in refs:
            st = self.tensor_node(r.id).storage
            if st not in self.outputs:
                self.outputs.append(st)

    def tensor_node(self, tid: str) -> TensorNode:
        if tid not in self.g or self.g.nodes[tid]["node"].__class__ is not TensorNode:
            raise K31Error(f"program `{self.name}` has no tensor {tid}")
        return self.g.nodes[tid]["node"]

    def new_version(self, storage: str, writer: str, param: str | None = None) -> str:
        """Add the next version of `storage`, written by node `writer`; returns its id."""
        old = self.tensor_node(self.latest[storage])
        new = replace(old, version=old.version + 1)
        self.g.add_node(new.id, node=new)
        self.g.add_edge(writer, new.id, role="write", param=param)
        if not self.g.has_edge(old.id, writer):       # an in-place update already reads it
            self.g.add_edge(old.id, writer, role="prev")
        for reader in self.readers(old.id):
            if reader != writer:
                self.g.add_edge(reader, writer, role="order")
        self.latest[storage] = new.id
        return new.id

    # ------------------------------------------------------------ calls

    def _unique(self, base: str, taken=()) -> str:
        """`base`, or `base_N`, not yet a node of the graph nor in `taken`."""
        name, n = base, 0
        while name in self.g or name in taken:
            n += 1
            name = f"{base}_{n}"
        return name

    def call(self, kernel, *args, **kwargs):
        """Launch `kernel` (a @k.kernel) on tensors of this program; see the module docstring."""
        from k31dsl.lowering.graph.bind import bind_call
        name = self._unique(getattr(kernel, "name", "call"))
        loc = _caller_loc()
        kir, cx, bound, written = bind_call(self, kernel, args, kwargs, loc, name)
        node = CallNode(name, kir, kernel, cx, bound, loc=loc)
        self.g.add_node(name, node=node)
        for param, val in bound.items():
            if isinstance(val, str) and param not in written:
                add_read(self.g, val, name, param)
        for param, val in bound.items():
            if param in written and not _only_written(kir, param):
                add_read(self.g, val, name, param)
        outs = []
        for param in written:
            storage = self.tensor_node(bound[param]).storage
            if self.tensor_node(bound[param]).kind == "weight":
                raise error(f"`{kernel.name}` stores to parameter `{param}`, bound to the weight "
                            f"`{storage}`; weights are static", node.loc,
                            "declare it with p.tensor(...) or p.input(...)")
            outs.append(TensorRef(self, self.new_version(storage, name, param)))
        self.order.append(name)
        return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)

    def host(self, op: str, inputs, outputs, **params):
        """A host op (see lowering/graph/hostops.py: all_gather, all_reduce, to_nz, ...) reading
        `inputs` and writing `outputs` (tensor handles); returns the new output versions."""
        from k31dsl.lowering.graph.hostops import HOST_OPS
        if op not in HOST_OPS:
            raise K31Error(f"unknown host op {op!r}; known: {', '.join(sorted(HOST_OPS))}")
        name = self._unique(op)
        node = HostNode(name, op, [r.id for r in inputs], [], dict(params))
        self.g.add_node(name, node=node)
        for r in inputs:
            add_read(self.g, r.id, name)
        outs = []
        for r in outputs:
            tid = self.new_version(self.tensor_node(r.id).storage, name)
            node.outputs.append(tid)
            outs.append(TensorRef(self, tid))
        self.order.append(name)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def all_gather(self, shards, out: TensorRef, axis: int = 0):
        """Concatenate the per-rank `shards` along `axis` into `out` (one process for now)."""
        return self.host("all_gather", list(shards), [out], axis=axis)

    def dist_all_gather(self, shard, out, *, name: str = "", also=()):
        """This rank's `shard` gathered from every rank into `out` (rank-major along axis 0) over
        the installed communicator (lowering/graph/comm.py). `also`: (shard view, out view) pairs
        of the same two storages (typed views of one buffer) the gather orders with it. Returns
        the new version of `out` (and of each `also` view)."""
        ins = [shard] + [a for a, _ in also]
        outs = [out] + [b for _, b in also]
        return self.host("dist_all_gather", ins, outs, name=name)

    def all_reduce(self, shards, out: TensorRef):
        """Sum the per-rank `shards` into `out` (one process for now)."""
        return self.host("all_reduce", list(shards), [out])

    # ------------------------------------------------------------ queries

    def node(self, nid: str):
        return self.g.nodes[nid]["node"]

    def ops(self, units: dict | None = None, deps: dict | None = None) -> list[str]:
        """Call and host node ids in execution order: topological, ties in insertion order, the
        members of one `group` (or of one key of `units`: node id -> unit) kept together."""
        if units is None:
            units = {n: ("group", self.node(n).attrs["group"]) for n in self.order
                     if "group" in self.node(n).attrs}
        if not units:
            # insertion order is topological (a version's writer is added before its readers, a
            # reader before the next writer), so the tie-break by insertion order returns it as is
            return list(self.order)
        return op_order(self, units, deps)

    def is_static(self, nid: str) -> bool:
        """A host op over weights only (a layout conversion): done once when the weights are
        loaded, not on every run, so it takes no stream and orders nothing at run time."""
        n = self.node(nid)
        return n.kind == "host" and all(self.tensor_node(i).static for i in n.inputs) and all(
            self.tensor_node(o).static for o in n.outputs)

    def calls(self) -> list[str]:
        return [n for n in self.ops() if self.node(n).kind == "call"]

    def tensors(self) -> list[TensorNode]:
        return [d["node"] for _, d in self.g.nodes(data=True) if isinstance(d["node"], TensorNode)]

    def readers(self, tid: str) -> list[str]:
        return [v for _, v, r in self.g.out_edges(tid, data="role") if r == "read"]

    def writer(self, tid: str) -> str | None:
        ws = [u for u, _, r in self.g.in_edges(tid, data="role") if r == "write"]
        return ws[0] if ws else None

    def reads_of(self, nid: str) -> list[str]:
        return [u for u, _, r in self.g.in_edges(nid, data="role") if r == "read"]

    def writes_of(self, nid: str) -> list[str]:
        return [v for _, v, r in self.g.out_edges(nid, data="role") if r == "write"]

    def op_deps(self, nid: str) -> set[str]:
        """The call/host nodes `nid` must run after (through tensors or order edges)."""
        deps = set()
        for u, _, r in self.g.in_edges(nid, data="role"):
            if r == "order":
                deps.add(u)
            elif r in ("read", "prev"):
                w = self.writer(u)
                if w is not None:
                    deps.add(w)
                if r == "prev":        # write after read: the readers of the replaced version
                    deps.update(x for x in self.readers(u) if x != nid)
        return deps

    def storages(self) -> dict[str, TensorNode]:
        """storage name -> its version-0 node (shape, dtype, kind)."""
        return {t.storage: t for t in self.tensors() if t.version == 0}

    def final(self, storage: str) -> str:
        return self.latest[storage]

    def copy(self) -> "Program":
        """A copy whose graph and node payloads can be changed without touching this one
        (kernel IR objects are shared; passes build new kernels rather than editing them)."""
        new = copy.copy(self)
        new.g = nx.DiGraph()
        for n, d in self.g.nodes(data=True):
            payload = d["node"]
            if isinstance(payload, (CallNode, HostNode)):
                payload = copy.copy(payload)
                payload.attrs = copy.deepcopy(payload.attrs)
                if isinstance(payload, CallNode):
                    payload.args = dict(payload.args)
                else:
                    payload.inputs, payload.outputs = list(payload.inputs), list(payload.outputs)
            new.g.add_node(n, node=payload)
        for u, v, d in self.g.edges(data=True):
            new.g.add_edge(u, v, **d)
        new.outputs, new.latest, new.order = list(self.outputs), dict(self.latest), list(self.order)
        new.report, new.meta = list(self.report), copy.deepcopy(self.meta)
        return new

    def __str__(self) -> str:
        from k31dsl.lowering.graph.text import dump
        return dump(self)

    def replay(self, nodes: list, drop_unused: bool = True) -> "Program":
        """A new program with this one's tensors and outputs and `nodes` (CallNode/HostNode
        payloads, in an order valid for execution) added again. Tensor ids in their bindings may be
        of any version: each binds the newest version of its storage at that point, so a pass can
        replace, merge or drop nodes and rebuild a consistent graph. Temps no node uses any more
        are dropped."""
        from k31dsl.lowering.graph.bind import stored_params
        new = Program(self.name)
        new.report, new.meta = list(self.report), copy.deepcopy(self.meta)
        used = set(self.outputs)
        for n in nodes:
            ids = [v for v in n.args.values() if isinstance(v, str)] if n.kind == "call" else n.inputs + n.outputs
            used.update(self.tensor_node(i).storage for i in ids)
        for st, t in self.storages().items():
            if t.kind != "temp" or st in used or not drop_unused:
                new.g.add_node(t.id, node=t)
                new.latest[st] = t.id
        for n in nodes:
            n = copy.copy(n)
            if n.kind == "call":
                n.args = {k: (new.latest[self.tensor_node(v).storage] if isinstance(v, str) else v)
                          for k, v in n.args.items()}
                new.g.add_node(n.name, node=n)
                written = stored_params(n.kernel)
                only = {w for w in written if _only_written(n.kernel, w)}
                for param, val in n.args.items():
                    if isinstance(val, str) and param not in only:
                        add_read(new.g, val, n.name, param)
                for param in written:
                    new.new_version(new.tensor_node(n.args[param]).storage, n.name, param)
            else:
                outs = [self.tensor_node(o).storage for o in n.outputs]
                n.inputs = [new.latest[self.tensor_node(i).storage] for i in n.inputs]
                n.outputs = []
                new.g.add_node(n.name, node=n)
                for i in n.inputs:
                    add_read(new.g, i, n.name)
                for st in outs:
                    n.outputs.append(new.new_version(st, n.name))
            new.order.append(n.name)
        new.outputs = list(self.outputs)
        return new


def op_order(p: "Program", units: dict, deps: dict | None = None) -> list[str]:
    """Topological order of the call/host nodes in which the members of each unit are adjacent
    (the unit's dependencies are the union of its members'); ties go by insertion order. `deps`
    ({node: p.op_deps(node)}) may be passed by a caller that has it."""
    if deps is None:
        deps = {n: p.op_deps(n) for n in p.order}
    pos = {n: i for i, n in enumerate(p.order)}
    unit_of = {n: units.get(n, ("op", n)) for n in p.order}
    members: dict = {}
    for n in p.order:
        members.setdefault(unit_of[n], []).append(n)
    ug = nx.DiGraph()
    ug.add_nodes_from(members)
    for n in p.order:
        for d in deps[n]:
            if unit_of[d] != unit_of[n]:
                ug.add_edge(unit_of[d], unit_of[n])
    first = {u: min(pos[m] for m in ms) for u, ms in members.items()}
    out = []
    for u in nx.lexicographical_topological_sort(ug, key=lambda u: first[u]):
        ms = members[u]
        if len(ms) == 1:
            out.extend(ms)
            continue
        sub = nx.DiGraph()
        sub.add_nodes_from(ms)
        sub.add_edges_from((d, m) for m in ms for d in deps[m] if d in ms)
        out.extend(nx.lexicographical_topological_sort(sub, key=lambda m: pos[m]))
    return out


def would_cycle(p: "Program", nodes: set, succ: dict | None = None, pos: dict | None = None) -> bool:
    """True when merging `nodes` into one unit makes a cycle: some other node lies on a
    dependency path between two of them. A caller asking many times about one program may pass
    `succ` (`successors` of {node: p.op_deps(node)} for every node) and `pos`
    (a topological position per node: the search stops past the last member, since no path from
    there leads back)."""
    if succ is None:
        succ = successors({n: p.op_deps(n) for n in p.order})
    last = max(pos[n] for n in nodes) if pos is not None else None
    # everything reachable from the set through an outside node
    stack = [s for n in nodes for s in succ[n] if s not in nodes]
    seen = set()
    while stack:
        x = stack.pop()
        if x in seen or (last is not None and pos[x] > last):
            continue
        if x in nodes:
            return True
        seen.add(x)
        stack.extend(succ[x])
    return False


def successors(deps: dict) -> dict:
    """{node: the nodes that depend on it}, from {node: its dependencies}."""
    succ: dict = {n: set() for n in deps}
    for n, ds in deps.items():
        for d in ds:
            succ[d].add(n)
    return succ


def _only_written(kernel, param: str) -> bool:
    """True when the kernel stores to `param` but never loads it (a pure output)."""
    from k31dsl.lowering.graph.bind import loaded_params
    return param not in loaded_params(kernel)


def _caller_loc():
    """file:line of the user's `p.call(...)` (the first frame outside lowering/graph)."""
    import os
    import sys
    from k31dsl.dsl.errors import Loc
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None:
        if os.path.dirname(os.path.abspath(frame.f_code.co_filename)) != here:
            return Loc(frame.f_code.co_filename, frame.f_lineno, 0)
        frame = frame.f_back
    return None


def program(fn):
    """Mark a zero-argument function returning a Program, so `k31dsl explain FILE` finds it."""
    fn.__k31_program__ = True
    return fn


def launch_units(p: "Program", order: list[str]) -> list[list[str]]:
    """`order` cut into launch units: the calls of a launch group (superkernel's grid-barrier
    groups) together, in order, at the place of the first; every other op alone."""
    out, seen = [], {}
    for nid in order:
        g = p.node(nid).attrs.get("group")
        if g is None:
            out.append([nid])
        elif g in seen:
            seen[g].append(nid)
        else:
            seen[g] = [nid]
            out.append(seen[g])
    return out

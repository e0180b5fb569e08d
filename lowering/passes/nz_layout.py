"""The `nz_layout` graph pass: static weights consumed by `k.dot` as B are stored FRACTAL_NZ.

FRACTAL_NZ of a [K, N] matrix (research/ascend_attnres.md §3): pad K to K1*16 and N to N1*N0 with
zeros (N0 = 32 bytes / itemsize: 8 for f32, 16 for bf16/f16, 32 for 1-byte types), view as
[K1, 16, N1, N0] and transpose to [N1, K1, 16, N0]: each 16 x N0 fractal is one contiguous
512-byte block, the unit the matrix engine loads. NZ[n1, k1, k0, n0] = ND[k1*16 + k0, n1*N0 + n0].

The pass applies to a weight (p.weight, rank 2, ND) bound to a kernel parameter whose every load
is a [span:BK, span:BN] tile that feeds operand B of a `dot` (directly or through a cast). It adds
a static `<w>_nz` weight (flat NZ data) computed once by a `to_nz` host op, and rewrites the
kernel: the parameter becomes the flat NZ tensor and each load becomes a gather at the NZ offsets
of the tile's lanes, masked to the original bounds (so `other=` and masks keep their meaning),
reshaped back to [BK, BN]. Results are unchanged.
"""
from __future__ import annotations

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.ir import Block, Kernel, Op, Param, TensorType, Value, parse_index_kind, walk
from k31dsl.lowering.graph.ir import CallNode, HostNode, TensorNode
from k31dsl.lowering.passes.fuse import Builder, access_parts

M0 = 16


def n0_of(dtype) -> int:
    """Fractal width in elements: 32 bytes of the element type."""
    return max(1, 32 // dtype.itemsize)


def nz_shape(k: int, n: int, dtype) -> tuple[int, int, int, int]:
    n0 = n0_of(dtype)
    return (-(-n // n0), -(-k // M0), M0, n0)


def _raw(a):
    """An integer view of the same width (so fp8/bf16 layouts move bits, never values)."""
    import torch
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return a.view(ints[a.element_size()])


def nd_to_nz(a):
    """[K, N] torch tensor -> [N1, K1, 16, N0] (zero padding)."""
    import torch
    kdim, ndim = a.shape
    dt = D.from_torch(a.dtype)
    n1, k1, m0, n0 = nz_shape(kdim, ndim, dt)
    raw = _raw(a.contiguous())
    padded = torch.zeros((k1 * m0, n1 * n0), dtype=raw.dtype, device=a.device)
    padded[:kdim, :ndim] = raw
    out = padded.reshape(k1, m0, n1, n0).permute(2, 0, 1, 3).contiguous()
    return out.view(a.dtype)


def nz_to_nd(z, shape):
    """[N1, K1, 16, N0] torch tensor -> [K, N] = `shape` (padding dropped)."""
    n1, k1, m0, n0 = z.shape
    raw = _raw(z.contiguous())
    nd = raw.permute(1, 2, 0, 3).reshape(k1 * m0, n1 * n0)[: shape[0], : shape[1]].contiguous()
    return nd.view(z.dtype)


# ---------------------------------------------------------------- which loads qualify

def _users(kernel: Kernel) -> dict[int, list[tuple[Op, int]]]:
    out: dict[int, list] = {}
    for op in walk(kernel.body):
        for i, v in enumerate(op.operands):
            out.setdefault(v.uid, []).append((op, i))
    return out


def _feeds_dot_b(v: Value, users) -> bool:
    uses = users.get(v.uid, [])
    if not uses:
        return False
    for op, i in uses:
        if op.name == "dot" and i == 1:
            continue
        if op.name == "cast" and _feeds_dot_b(op.results[0], users):
            continue
        return False
    return True


def nz_loads(kernel: Kernel, param: Param) -> list[Op] | None:
    """The loads of `param` when every one is a 2-D span tile feeding dot's B, else None."""
    users = _users(kernel)
    loads = []
    for op in walk(kernel.body):
        if not op.operands or op.operands[0] is not param.value:
            continue
        if op.name != "load":
            return None
        kinds = [parse_index_kind(k)[0] for k in op.attrs["index"]]
        if kinds != ["span", "span"] or not _feeds_dot_b(op.results[0], users):
            return None
        loads.append(op)
    return loads or None


# ---------------------------------------------------------------- the rewrite

def _nz_gather(b: Builder, out: Block, load: Op, nzv: Value, kn: tuple, dtype) -> Value:
    e = Builder.emit
    loc = load.loc
    _, idx, _, mask = access_parts(load)
    (bk, bn) = load.results[0].type.shape
    kdim, ndim = kn
    n1, k1, m0, n0 = nz_shape(kdim, ndim, dtype)

    def c(x):
        return e(out, "const", [], {"value": x, "dtype": D.i32}, loc)

    kk = e(out, "add", [e(out, "arange", [], {"size": bk}, loc), b.v(idx[0])], {}, loc)
    nn = e(out, "add", [e(out, "arange", [], {"size": bn}, loc), b.v(idx[1])], {}, loc)
    offk = e(out, "add", [e(out, "mul", [e(out, "floordiv", [kk, c(m0)], {}, loc), c(m0 * n0)], {}, loc),
                          e(out, "mul", [e(out, "mod", [kk, c(m0)], {}, loc), c(n0)], {}, loc)], {}, loc)
    offn = e(out, "add", [e(out, "mul", [e(out, "floordiv", [nn, c(n0)], {}, loc), c(k1 * m0 * n0)], {}, loc),
                          e(out, "mod", [nn, c(n0)], {}, loc)], {}, loc)
    off = e(out, "add", [e(out, "expand", [offk], {"axis": 1}, loc), e(out, "expand", [offn], {"axis": 0}, loc)], {}, loc)

    def inside(i, hi):
        return e(out, "and", [e(out, "ge", [i, c(0)], {}, loc), e(out, "lt", [i, c(hi)], {}, loc)], {}, loc)

    valid = e(out, "and", [e(out, "expand", [inside(kk, kdim)], {"axis": 1}, loc),
                           e(out, "expand", [inside(nn, ndim)], {"axis": 0}, loc)], {}, loc)
    if mask is not None:
        m = b.v(mask)
        if m.type.shape != (bk, bn):
            m = e(out, "broadcast", [m], {"shape": [bk, bn]}, loc)
        valid = e(out, "and", [valid, m], {}, loc)
    flat = e(out, "reshape", [off], {"shape": [bk * bn]}, loc)
    fmask = e(out, "reshape", [valid], {"shape": [bk * bn]}, loc)
    got = e(out, "load", [nzv, flat, fmask], {"index": ["gather"], "other": load.attrs.get("other"), "mask": True}, loc)
    return e(out, "reshape", [got], {"shape": [bk, bn]}, loc)


def rewrite_kernel(kernel: Kernel, pname: str, kn: tuple, dtype, loads: list[Op]) -> Kernel:
    b = Builder()
    params = []
    nz_param = None
    for p in kernel.params:
        if p.name == pname:
            nz_param = Param(p.name, Value(TensorType(p.value.type.dtype, (f"{p.name}_nz_size",)), p.name), p.loc)
            b.vmap[p.value.uid] = nz_param.value
            params.append(nz_param)
        else:
            nv = Value(p.value.type, p.value.hint)
            b.vmap[p.value.uid] = nv
            params.append(Param(p.name, nv, p.loc))
    targets = {op.results[0].uid for op in loads}

    def hook(op: Op, out: Block, bb: Builder) -> bool:
        if op.name == "dim" and op.operands[0] is kernel.params[[p.name for p in kernel.params].index(pname)].value:
            bb.vmap[op.results[0].uid] = Builder.emit(out, "const", [], {"value": kn[op.attrs["axis"]], "dtype": D.i32}, op.loc)
            return True
        if op.name == "load" and op.results[0].uid in targets:
            bb.vmap[op.results[0].uid] = _nz_gather(bb, out, op, nz_param.value, kn, dtype)
            return True
        return False

    host = Block([], [])
    b.clone_block(kernel.host, host, hook)
    body = Block([Value(a.type, a.hint) for a in kernel.body.args], [])
    for old, new in zip(kernel.body.args, body.args):
        b.vmap[old.uid] = new
    b.clone_block(kernel.body, body, hook)
    grid = [b.v(g) for g in kernel.grid]
    return Kernel(kernel.name, params, dict(kernel.constexprs), host, grid, body, kernel.loc, list(kernel.configs))


def nz_layout(program):
    p = program.copy()
    nodes, added, changed = [], {}, []
    for nid in p.ops():
        n = p.node(nid)
        if not isinstance(n, CallNode):
            nodes.append(n)
            continue
        kernel, args = n.kernel, dict(n.args)
        for prm in list(kernel.params):
            tid = args.get(prm.name)
            if not isinstance(tid, str):
                continue
            t = p.tensor_node(tid)
            if t.kind != "weight" or t.layout != "ND" or len(t.shape) != 2:
                continue
            loads = nz_loads(kernel, next(q for q in kernel.params if q.name == prm.name))
            if loads is None:
                continue
            if t.storage not in added:
                shape4 = nz_shape(*t.shape, t.dtype)
                flat = shape4[0] * shape4[1] * shape4[2] * shape4[3]
                node = TensorNode(f"{t.storage}_nz", 0, (flat,), t.dtype, "weight", "NZ",
                                  (("nd_shape", t.shape), ("nz_shape", shape4)))
                p.g.add_node(node.id, node=node)
                p.latest[node.storage] = node.id
                nodes.append(HostNode(f"to_nz_{t.storage}", "to_nz", [tid], [node.id], {}))
                added[t.storage] = node.id
            kernel = rewrite_kernel(kernel, prm.name, t.shape, t.dtype, loads)
            args[prm.name] = added[t.storage]
            changed.append(f"{nid}.{prm.name} <- {t.storage}")
        if kernel is not n.kernel:
            n = CallNode(n.name, kernel, n.kdef, n.constexprs, args, n.loc, dict(n.attrs))
        nodes.append(n)
    if not changed:
        return p
    new = p.replay(nodes)
    new.report.append("nz_layout: FRACTAL_NZ weights for " + ", ".join(changed))
    return new

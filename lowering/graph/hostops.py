"""Host ops of the graph IR: whole-tensor operations the runtime performs with torch rather than
a generated kernel. Each op is `fn(inputs, outputs, **params)` over torch tensors and writes its
outputs in place.

Collectives come in two kinds: `all_gather` / `all_reduce` emulate P ranks in one process (each
input is one rank's shard); `dist_all_gather` is the real one, over the communicator the caller
installed (lowering/graph/comm.py), one input per process."""
from __future__ import annotations


def all_gather(inputs, outputs, axis: int = 0):
    import torch
    outputs[0].copy_(torch.cat(list(inputs), dim=axis))


def all_reduce(inputs, outputs):
    import torch
    acc = torch.zeros(outputs[0].shape, dtype=torch.float64)
    for x in inputs:
        acc += x.to(torch.float64)
    outputs[0].copy_(acc.to(outputs[0].dtype))


def dist_all_gather(inputs, outputs, name: str = ""):
    """outputs[0] <- every rank's inputs[0] in rank order, along the first axis (outputs[0] has
    world x inputs[0].shape[0] rows). Further inputs/outputs are other views of the same two
    storages (e.g. the typed views of one cache): they are listed so the graph orders every
    writer of the shard before the gather and every reader of the result after it."""
    from k31dsl.lowering.graph.comm import current
    src, dst = inputs[0], outputs[0]
    comm = current()
    if comm is None:
        if dst.numel() != src.numel():
            from k31dsl.dsl.errors import K31Error
            raise K31Error(f"dist_all_gather {name}: no communicator installed, so this process is the only "
                           f"rank, but the output holds {dst.numel() // max(1, src.numel())} shards",
                           hint="run the program inside `with lowering.graph.comm.communicator(comm):`")
        dst.copy_(src)
        return
    comm.all_gather(dst, src, name)


def row_slice(inputs, outputs, start: int):
    """outputs[0] <- rows [start, start + its rows) of inputs[0] (axis 0). Further inputs are
    not read: they order the slice after their writers."""
    outputs[0].copy_(inputs[0][start:start + outputs[0].shape[0]])


def row_put(inputs, outputs, start: int):
    """Rows [start, start + inputs[0]'s rows) of outputs[0] <- inputs[0]; the other rows keep
    their values (the output is a new version of an existing tensor)."""
    outputs[0][start:start + inputs[0].shape[0]].copy_(inputs[0])


def to_nz(inputs, outputs, **params):
    """ND [K, N] weight -> flat FRACTAL_NZ data (see lowering/passes/nz_layout.py)."""
    from k31dsl.lowering.passes.nz_layout import nd_to_nz
    outputs[0].copy_(nd_to_nz(inputs[0]).reshape(-1))


def reshape(inputs, outputs):
    """The same elements in another shape (a copy: the graph IR has no views, so a kernel whose
    rank differs from its producer's, e.g. [T, H*K] -> [T, H, K], reads its own tensor)."""
    outputs[0].copy_(inputs[0].reshape(outputs[0].shape))


def order(inputs, outputs):
    """Nothing at run time. The outputs are typed views of the storage the inputs were written
    through (e.g. an indexer cache written as bytes, read as codes and scales): their new
    versions make the graph order every reader of the views after those writers."""


HOST_OPS = {"all_gather": all_gather, "dist_all_gather": dist_all_gather, "all_reduce": all_reduce, "to_nz": to_nz,
            "row_slice": row_slice, "row_put": row_put, "reshape": reshape, "order": order}

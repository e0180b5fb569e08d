"""Host ops of the graph IR: whole-tensor operations the runtime performs with torch rather than
a generated kernel. Collectives run on one process for now: each input is one rank's shard.
Each op is `fn(inputs, outputs, **params)` over torch tensors and writes its outputs in place."""
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


def to_nz(inputs, outputs, **params):
    """ND [K, N] weight -> flat FRACTAL_NZ data (see lowering/passes/nz_layout.py)."""
    from k31dsl.lowering.passes.nz_layout import nd_to_nz
    outputs[0].copy_(nd_to_nz(inputs[0]).reshape(-1))


def reshape(inputs, outputs):
    """The same elements in another shape (a copy: the graph IR has no views, so a kernel whose
    rank differs from its producer's, e.g. [T, H*K] -> [T, H, K], reads its own tensor)."""
    outputs[0].copy_(inputs[0].reshape(outputs[0].shape))


HOST_OPS = {"all_gather": all_gather, "all_reduce": all_reduce, "to_nz": to_nz, "reshape": reshape}

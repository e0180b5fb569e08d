"""The MoE FFN of docs/model.md in fp64, written from the math."""
from __future__ import annotations

import numpy as np


def silu(v):
    return v / (1.0 + np.exp(-v))


def swiglu(x, gate_up, down):
    """(silu(x G^T) * (x U^T)) @ down^T with gate_up = [G; U] ([2F, D]), down [D, F]."""
    f = gate_up.shape[0] // 2
    return (silu(x @ gate_up[:f].T) * (x @ gate_up[f:].T)) @ down.T


def route(x, router, top_k: int):
    """(expert ids [M, k], weights [M, k]): softmax(x router^T), the k largest (ties: lower
    expert index first), renormalised over the selected."""
    logits = np.asarray(x, np.float64) @ np.asarray(router, np.float64).T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :top_k]        # stable: equal p keep index order
    sel = np.take_along_axis(p, top, axis=1)
    return top, sel / sel.sum(axis=1, keepdims=True)


def moe(x, router, gate_up, down, shared_gate_up, shared_down, top_k: int):
    """out[t] = sum_j wgt[t, j] expert_{top[t, j]}(x_t) + shared(x_t), all fp64."""
    x = np.asarray(x, np.float64)
    gate_up, down = np.asarray(gate_up, np.float64), np.asarray(down, np.float64)
    top, wgt = route(x, router, top_k)
    out = swiglu(x, np.asarray(shared_gate_up, np.float64), np.asarray(shared_down, np.float64))
    for e in range(gate_up.shape[0]):
        tok, slot = np.nonzero(top == e)
        if tok.size:
            out[tok] += wgt[tok, slot][:, None] * swiglu(x[tok], gate_up[e], down[e])
    return out

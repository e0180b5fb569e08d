"""The K31 model's dense layers and MLA glue in fp64, written from docs/model.md (not from the
kernels): linear + activation, SwiGLU, embedding, the causal short convolution with its state,
the KDA output norm + gate, RoPE tables and rope, the absorbed MLA query, the MLA key row and the
per-head value projection."""
from __future__ import annotations

import numpy as np


def _f64(x):
    return np.asarray(x, np.float64)


def silu(x):
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-_f64(x)))


def rmsnorm(x, w, eps: float):
    x = _f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * _f64(w)


def linear(x, w, act: str = "none"):
    """act(x @ w^T), w in torch Linear layout [out, in]."""
    y = _f64(x) @ _f64(w).T
    if act == "sigmoid":
        return sigmoid(y)
    return silu(y) if act == "silu" else y


def swiglu(x):
    x = _f64(x)
    f = x.shape[-1] // 2
    return silu(x[..., :f]) * x[..., f:]


def embedding(ids, table):
    return _f64(table)[np.asarray(ids)]


def short_conv(x, w, state, slots, update: bool = True):
    """Per sequence n: xx = concat(state[slots[n]] (zeros when slots[n] < 0), x[n]);
    y[n, t, c] = silu(sum_j w[c, j] xx[t + j, c]) (xx row t + j is input t - 3 + j); with update
    the new state of the slot is xx[-3:]. Returns (y, new state)."""
    x, w = _f64(x), _f64(w)
    state = _f64(state).copy()
    n_seq, t_len, c = x.shape
    y = np.zeros_like(x)
    for n in range(n_seq):
        s = state[slots[n]] if slots[n] >= 0 else np.zeros((3, c))
        xx = np.concatenate([s, x[n]], axis=0)
        for t in range(t_len):
            y[n, t] = silu(sum(w[:, j] * xx[t + j] for j in range(4)))
        if update and slots[n] >= 0:
            state[slots[n]] = xx[-3:]
    return y, state


def short_conv_commit(x, state, slots, accepted):
    """state[slots[n]] = the last 3 rows of concat(state[slots[n]], x[n, :accepted[n]])."""
    x = _f64(x)
    state = _f64(state).copy()
    for n in range(x.shape[0]):
        if slots[n] >= 0:
            state[slots[n]] = np.concatenate([state[slots[n]], x[n, :accepted[n]]], axis=0)[-3:]
    return state


def head_norm_gate(o, w, gate, eps: float):
    """rmsnorm of each head's V values (o [M, HV, V]) * w, flattened to [M, HV*V], * sigmoid(gate)."""
    o = _f64(o)
    m, hv, v = o.shape
    return rmsnorm(o, w, eps).reshape(m, hv * v) * sigmoid(gate)


def rope_table(pos, theta: float, dim: int = 64):
    """cos, sin [T, dim/2] of pos * theta^(-2i/dim)."""
    i = np.arange(dim // 2, dtype=np.float64)
    ang = np.asarray(pos, np.float64)[:, None] * theta ** (-2.0 * i / dim)
    return np.cos(ang), np.sin(ang)


def rope(x, cos, sin):
    """NeoX half split on the last axis (64): out[i] = x[i] c - x[i+32] s, out[i+32] = x[i+32] c + x[i] s.
    cos/sin [T, 32] broadcast over any axes between T and the last."""
    x = _f64(x)
    h = x.shape[-1] // 2
    shape = (cos.shape[0],) + (1,) * (x.ndim - 2) + (h,)
    c, s = _f64(cos).reshape(shape), _f64(sin).reshape(shape)
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def mla_absorb_q(q, w_uk, cos, sin):
    """q [T, H, DN + 64], w_uk [H, DN, 512] -> [T, H, 576]: q_nope[h] @ w_uk[h], then rope(q_pe)."""
    q, w_uk = _f64(q), _f64(w_uk)
    dn = w_uk.shape[1]
    lat = np.einsum("thd,hdl->thl", q[..., :dn], w_uk)
    return np.concatenate([lat, rope(q[..., dn:], cos, sin)], axis=-1)


def mla_kv(kv, norm_w, cos, sin, eps: float):
    """kv [T, 576] -> (rmsnorm(kv[:, :512]) * norm_w, rope(kv[:, 512:]))."""
    kv = _f64(kv)
    return rmsnorm(kv[:, :512], norm_w, eps), rope(kv[:, 512:], cos, sin)


def mla_out(o, w_uv):
    """o [T, H, 512], w_uv [H, DV, 512] -> [T, H*DV], head h's block = o[:, h] @ w_uv[h]^T."""
    y = np.einsum("thl,hdl->thd", _f64(o), _f64(w_uv))
    return y.reshape(y.shape[0], -1)

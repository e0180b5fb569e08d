"""Attention Residuals in fp64, written from the math of Kimi's "Attention Residuals" (softmax over
depth with input-independent pseudo-queries, keys = values, RMS-normalised keys, no 1/sqrt(d)),
K3 convention: the key-norm gain is folded into the query (q_eff = w * g), so keys are
v / sqrt(mean(v^2) + eps) and every function below takes effective queries.

Three formulations that must agree: full AttnRes over a list of sources, naive Block AttnRes
(attend over the committed blocks + the running partial sum at every layer) and the two-phase
computation (prepare once per block for all its queries, then one online-softmax update per
layer)."""
from __future__ import annotations

import numpy as np


def rms(x, eps: float) -> np.ndarray:
    """sqrt(mean(x^2 over the last dim) + eps), keeping the dim."""
    x = np.asarray(x, np.float64)
    return np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def logits(q, v, eps: float) -> np.ndarray:
    """z[..., i, t] = q . v[i, t] / rms(v[i, t]) for q [D] (or [S, D] -> [S, n, T])."""
    v = np.asarray(v, np.float64)
    k = v / rms(v, eps)
    return np.einsum("...d,ntd->...nt", np.asarray(q, np.float64), k)


def attnres(sources, q, eps: float) -> np.ndarray:
    """Full AttnRes: h[t] = sum_i softmax_i(z[i, t]) v[i, t] over sources [n, T, D]."""
    v = np.asarray(sources, np.float64)
    z = logits(q, v, eps)                                # [n, T]
    a = np.exp(z - z.max(axis=0))
    a /= a.sum(axis=0)
    return np.einsum("nt,ntd->td", a, v)


def prepare(blocks, queries, eps: float):
    """Phase 1: for each of the S queries, the unnormalised numerator O [S, T, D], the logit
    maximum M [S, T] and the exp-sum L [S, T] over the n blocks."""
    v = np.asarray(blocks, np.float64)
    z = logits(queries, v, eps)                          # [S, n, T]
    m = z.max(axis=1)
    e = np.exp(z - m[:, None, :])
    return np.einsum("snt,ntd->std", e, v), m, e.sum(axis=1)


def update(p, q, o, m, l, eps: float) -> np.ndarray:
    """Phase 2 merge: the partial sum p [T, D] (after adding the last delta) joins (o, m, l) of
    the completed blocks by online softmax; returns h [T, D]."""
    p = np.asarray(p, np.float64)
    score = (p @ np.asarray(q, np.float64)) / rms(p, eps)[:, 0]
    mx = np.maximum(m, score)
    a, b = np.exp(m - mx), np.exp(score - mx)
    return (o * a[:, None] + p * b[:, None]) / (l * a + b)[:, None]


def rmsnorm(x, w, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / rms(x, eps) * np.asarray(w, np.float64)


def update_rmsnorm(partial, delta, q, o, m, l, w, eps: float, norm_eps: float, round_h=None):
    """The fused per-layer step: p = partial + delta; h = update(p, ...); y = rmsnorm(h) where the
    norm reads h after `round_h` (the bf16 rounding of the stored h; identity if None).
    Returns (p, h, y)."""
    p = np.asarray(partial, np.float64) + np.asarray(delta, np.float64)
    h = update(p, q, o, m, l, eps)
    hr = h if round_h is None else round_h(h)
    return p, h, rmsnorm(hr, w, eps=norm_eps)


# ---------------------------------------------------------------- whole-network formulations

def block_attnres_naive(emb, queries, sublayers, block: int, eps: float):
    """Block AttnRes over L = len(sublayers) layers, K3 boundary convention: the block list starts
    empty; layer l first attends over blocks + [prefix] (the embedding itself at l = 0), then
    every `block` layers commits the prefix as a new block and restarts it; prefix += f_l(h).
    queries: [L + 1, D], the last one for the final aggregation. Returns (out, [h_l])."""
    blocks, prefix, hs = [], np.asarray(emb, np.float64), []
    for l, f in enumerate(sublayers):
        h = prefix if not blocks else attnres(np.stack(blocks + [prefix]), queries[l], eps)
        hs.append(h)
        if l % block == 0:
            blocks.append(prefix)
            prefix = None
        d = f(h)
        prefix = d if prefix is None else prefix + d
    return attnres(np.stack(blocks + [prefix]), queries[len(sublayers)], eps), hs


def block_attnres_two_phase(emb, queries, sublayers, block: int, eps: float):
    """The same network computed in two phases: at each block start, prepare() against the
    committed blocks for all of the block's queries; the block's first layer reads O/L directly
    (its only sources are the blocks), later layers merge the running partial with update()."""
    emb = np.asarray(emb, np.float64)
    blocks, prefix, hs = [], emb, []
    n_layers = len(sublayers)
    for b0 in range(0, n_layers, block):
        blocks.append(prefix)
        b1 = min(b0 + block, n_layers)
        o, m, l = prepare(np.stack(blocks), np.stack([queries[i] for i in range(b0, b1)]), eps)
        p = np.zeros_like(emb)
        for i, layer in enumerate(range(b0, b1)):
            if layer == 0:
                h = emb
            elif i == 0:
                h = o[0] / l[0][:, None]
            else:
                h = update(p, queries[layer], o[i], m[i], l[i], eps)
            hs.append(h)
            p = p + sublayers[layer](h)
        prefix = p
    o, m, l = prepare(np.stack(blocks), queries[n_layers][None], eps)
    return update(prefix, queries[n_layers], o[0], m[0], l[0], eps), hs

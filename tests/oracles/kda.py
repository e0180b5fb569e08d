"""KDA (Kimi Delta Attention) in fp64, written from the math of research/kda.md §1.4 (recurrent
form), §2.1 (chunked WY/UT form, used only to cross-check the recurrent one) and §3.1 (a token
range's affine summary S_out = M S_in + E).

Shapes follow fla: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (natural-log decay, or the
raw gate input when A_log/dt_bias are given); beta [B, T, HV]; states [N, HV, K, V] with rows
indexed by key channel. HV is a multiple of H (GVA): value head hv reads q/k head hv // (HV // H).
Varlen: B == 1 and cu_seqlens [N + 1] (token offsets) splits the T axis into N sequences.

Per-head recurrence (operational form, every kernel's order of operations):
    S <- Diag(exp(a_t)) S;  u_t = b_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T (scale q_t)
"""
from __future__ import annotations

import numpy as np

L2_EPS = 1e-6


def f64(x) -> np.ndarray:
    """A torch tensor (any float dtype) or array-like as float64 NumPy."""
    if hasattr(x, "detach"):
        import torch
        return x.detach().to("cpu").to(torch.float64).numpy()
    return np.asarray(x, np.float64)


def l2norm(x, eps: float = L2_EPS) -> np.ndarray:
    """x / sqrt(sum(x^2 over the last dim) + eps) (fla's l2norm: eps inside the sqrt)."""
    x = f64(x)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def kda_gate(x, A_log, dt_bias, lower_bound=None) -> np.ndarray:
    """Natural-log decay from the raw gate input x [..., HV, K]; A_log [HV]; dt_bias [HV*K] or
    [HV, K] (None: no bias).
      lower_bound None (Kimi Linear): -exp(A_log[h]) * softplus(x + dt_bias[h])
      lower_bound lb (K3 safe gate): lb * sigmoid(exp(A_log[h]) * (x + dt_bias[h]))
    A_log None: exp(A_log) is taken as 1."""
    x = f64(x)
    hv, kk = x.shape[-2], x.shape[-1]
    z = x + (0.0 if dt_bias is None else f64(dt_bias).reshape(hv, kk))
    a = np.ones(hv) if A_log is None else np.exp(f64(A_log).reshape(hv))
    a = a[:, None]
    if lower_bound is None:
        return -a * np.logaddexp(0.0, z)
    return float(lower_bound) / (1.0 + np.exp(-a * z))


# ---------------------------------------------------------------- one head

def recurrent_head(q, k, v, a, beta, S0=None, scale=None, return_states: bool = False):
    """One head, one sequence. q, k [T, K] (already normalised), v [T, V], a [T, K] log decay,
    beta [T]. Returns (o [T, V], S [K, V]) or, with return_states, (o, S, states [T, K, V], u [T, V])
    where states[t] is the state after token t and u[t] the correction vector b_t (v_t - S'^T k_t)."""
    q, k, v, a, beta = (f64(t) for t in (q, k, v, a, beta))
    T, dk = q.shape
    dv = v.shape[1]
    scale = dk ** -0.5 if scale is None else scale
    S = np.zeros((dk, dv)) if S0 is None else f64(S0).copy()
    o = np.empty((T, dv))
    states, us = np.empty((T, dk, dv)), np.empty((T, dv))
    for t in range(T):
        S = S * np.exp(a[t])[:, None]
        u = beta[t] * (v[t] - k[t] @ S)
        S = S + np.outer(k[t], u)
        o[t] = (scale * q[t]) @ S
        states[t], us[t] = S, u
    return (o, S, states, us) if return_states else (o, S)


def step_head(S, q, k, v, a, beta, scale=None):
    """One decode step of one head: (o [V], S_new [K, V]) from S [K, V] and one token's vectors."""
    o, S1 = recurrent_head(f64(q)[None], f64(k)[None], f64(v)[None], f64(a)[None], np.atleast_1d(f64(beta)),
                           S, scale)
    return o[0], S1


def chunk_head(q, k, v, a, beta, S0=None, scale=None, chunk: int = 64):
    """The chunked WY/UT form of research §2.1 (fp64, no rebasing: fine in float64 for moderate
    gates). Same contract as recurrent_head; used to check that the two forms agree."""
    q, k, v, a, beta = (f64(t) for t in (q, k, v, a, beta))
    T, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    S = np.zeros((dk, v.shape[1])) if S0 is None else f64(S0).copy()
    o = np.empty((T, v.shape[1]))
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        n, b = e - s, beta[s:e, None]
        G = np.cumsum(a[s:e], 0)
        Kt, Kh = k[s:e] * np.exp(G), k[s:e] * np.exp(-G)
        Qt, Kb = scale * q[s:e] * np.exp(G), k[s:e] * np.exp(G[-1] - G)
        Ainv = np.linalg.inv(np.eye(n) + np.tril(b * (Kt @ Kh.T), -1))
        W, U = Ainv @ (b * Kt), Ainv @ (b * v[s:e])
        Vn = U - W @ S
        o[s:e] = Qt @ S + np.tril(Qt @ Kh.T) @ Vn
        S = np.exp(G[-1])[:, None] * S + Kb.T @ Vn
    return o, S


def summary_head(k, v, a, beta):
    """(M [K, K], E [K, V]) with S_out = M S_in + E over these tokens, from the per-token
    transitions (I - b k k^T) Diag(exp(a)) (latest on the left) and the zero-state run."""
    k, v, a, beta = (f64(t) for t in (k, v, a, beta))
    dk = k.shape[1]
    M = np.eye(dk)
    for t in range(len(k)):
        M = (np.eye(dk) - beta[t] * np.outer(k[t], k[t])) @ (np.exp(a[t])[:, None] * M)
    _, E = recurrent_head(np.zeros_like(k), k, v, a, beta)
    return M, E


def compose(first, second):
    """Summary of `first` then `second`: (M2 M1, M2 E1 + E2)."""
    (M1, E1), (M2, E2) = first, second
    return M2 @ M1, M2 @ E1 + E2


# ---------------------------------------------------------------- fla-shaped entry point

def _sequences(T_total: int, B: int, cu_seqlens):
    """[(batch index, start, end)] for the batch or the varlen split."""
    if cu_seqlens is None:
        return [(b, 0, T_total) for b in range(B)]
    cu = [int(c) for c in np.asarray(f64(cu_seqlens)).astype(np.int64)]
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def prepare(q, k, g, use_qk_l2norm=True, A_log=None, dt_bias=None, lower_bound=None, gate_in_kernel=None):
    """fp64 (q, k, a) after the optional L2 norm and gate: what the recurrence consumes."""
    q, k, g = f64(q), f64(k), f64(g)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if gate_in_kernel is None:
        gate_in_kernel = A_log is not None or dt_bias is not None or lower_bound is not None
    a = kda_gate(g, A_log, dt_bias, lower_bound) if gate_in_kernel else g
    return q, k, a


def kda(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=True,
        A_log=None, dt_bias=None, lower_bound=None, chunked: int | None = None):
    """fla-shaped KDA forward in fp64 -> (o [B, T, HV, V], final_state [N, HV, K, V]).
    g is the log decay, or the raw gate when any of A_log / dt_bias / lower_bound is given.
    chunked=C runs the chunked form with chunk C instead of the recurrence (cross-check only)."""
    q, k, a = prepare(q, k, g, use_qk_l2norm, A_log, dt_bias, lower_bound)
    v, beta = f64(v), f64(beta)
    B, T, H, dk = q.shape
    HV, dv = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    grp = HV // H
    seqs = _sequences(T, B, cu_seqlens)
    S0 = None if initial_state is None else f64(initial_state)
    o = np.zeros((B, T, HV, dv))
    final = np.zeros((len(seqs), HV, dk, dv))
    for n, (b, s, e) in enumerate(seqs):
        for hv in range(HV):
            h = hv // grp
            init = None if S0 is None else S0[n, hv]
            args = (q[b, s:e, h], k[b, s:e, h], v[b, s:e, hv], a[b, s:e, hv], beta[b, s:e, hv], init, scale)
            oh, Sh = chunk_head(*args, chunk=chunked) if chunked else recurrent_head(*args)
            o[b, s:e, hv], final[n, hv] = oh, Sh
    return o, final

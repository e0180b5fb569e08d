"""KDA in plain torch: the chunked (WY / UT) form for prefill, the recurrent step for decode and
verify (docs/model.md, research/kda.md §1.1, §2.1), and the KDA sublayer around them.

Chunked form, per chunk of C = 64 tokens with incoming state S and chunk-local G = cumsum(a):
  Akk = StrictTril(beta_i sum_d k_id k_jd exp(G_id - G_jd)),  Aqk = Tril(s sum_d q_id k_jd exp(G_id - G_jd))
  W = (I + Akk)^-1 beta (k exp(G)),  U = (I + Akk)^-1 beta v,  Vn = U - W S
  O = s (q exp(G)) S + Aqk Vn,  S' = exp(G_C) S + (k exp(G_C - G))^T Vn
The decay ratios exp(G_i - G_j) (i >= j) are formed elementwise, never as exp(G_i) * exp(-G_j):
the factor exp(-G_j) overflows fp32 within one chunk (a ~ -5 per token gives G ~ -320). Every
exponent used is <= 0, so the form holds for both gates at any decay. Only the state scan loops
over chunks; the intra-chunk work is batched over all chunks (in groups bounded by memory).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from k31dsl.model.reference.functions import causal_conv, kda_gate, l2norm, lin, maybe_compiled, rmsnorm

CHUNK = 64
GROUP_ELEMENTS = 1 << 26          # bound of the [chunks, HV, C, C, K] decay tensors per group


def _expand_heads(x: torch.Tensor, hv: int, axis: int) -> torch.Tensor:
    """q/k heads -> value heads (GVA: value head j reads q/k head j // (HV / H))."""
    return x.repeat_interleave(hv // x.shape[axis], dim=axis) if x.shape[axis] != hv else x


def _decay_scores(g, k, q, beta, causal, scale: float):
    """Akk (before the strict-lower mask) and Aqk of a group of chunks, decay ratios elementwise."""
    diff = g[:, :, :, None, :] - g[:, :, None, :, :]                                      # [c, HV, i, j, K]
    kd = torch.exp(diff.masked_fill(~causal[:, :, None], float("-inf"))) * k[:, :, None, :, :]   # k_j exp(G_i - G_j)
    akk = torch.einsum("chijd,chid->chij", kd, k) * beta[:, :, :, None]
    aqk = torch.einsum("chijd,chid->chij", kd, q) * scale
    return akk, aqk


def kda_chunk(q, k, v, a, beta, state=None, chunk: int = CHUNK, compile: bool = False):
    """One sequence, chunked form. q, k [T, H, K] (L2-normalised), v [T, HV, V], a [T, HV, K]
    (natural-log decay), beta [T, HV], state [HV, K, V] (None: zeros). Computes in q's dtype.
    Returns (o [T, HV, V], final state [HV, K, V])."""
    T, HV, V = v.shape
    K = q.shape[-1]
    dt = q.dtype
    scale = K ** -0.5
    S = torch.zeros(HV, K, V, dtype=dt, device=q.device) if state is None else state.to(dt).clone()
    if T == 0:
        return v.new_zeros(0, HV, V), S
    q, k = _expand_heads(q, HV, 1).to(dt), _expand_heads(k, HV, 1).to(dt)
    v, a, beta = v.to(dt), a.to(dt), beta.to(dt)
    n_chunks = -(-T // chunk)
    pad = n_chunks * chunk - T

    def blocks(x):        # [T, HV, ...] -> [NC, HV, C, ...]; padding tokens change nothing (a=0, beta=0, k=0)
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad)) if x.dim() > 1 else F.pad(x, (0, pad))
        x = x.reshape((n_chunks, chunk) + x.shape[1:])
        return x.transpose(1, 2)

    q, k, v, a = blocks(q), blocks(k), blocks(v), blocks(a)
    beta = F.pad(beta, (0, 0, 0, pad)).reshape(n_chunks, chunk, HV).transpose(1, 2)     # [NC, HV, C]
    G = torch.cumsum(a, dim=2)                                                            # [NC, HV, C, K]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = causal.tril(-1)
    Akk = torch.empty(n_chunks, HV, chunk, chunk, dtype=dt, device=q.device)
    Aqk = torch.empty_like(Akk)
    step = max(1, GROUP_ELEMENTS // (HV * chunk * chunk * K))
    scores = maybe_compiled(_decay_scores, compile)
    for c0 in range(0, n_chunks, step):
        grp = slice(c0, c0 + step)
        Akk[grp], Aqk[grp] = scores(G[grp], k[grp], q[grp], beta[grp], causal, scale)
    Akk = Akk.masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=dt, device=q.device)
    L = Akk + eye
    W = torch.linalg.solve_triangular(L, beta[..., None] * k * torch.exp(G), upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(L, beta[..., None] * v, upper=False, unitriangular=True)
    Qg = q * torch.exp(G) * scale
    g_last = G[:, :, -1:, :]                                                              # [NC, HV, 1, K]
    Kb = (k * torch.exp(g_last - G)).transpose(-1, -2)                                    # [NC, HV, K, C]
    decay_c = torch.exp(g_last).transpose(-1, -2)                                         # [NC, HV, K, 1]
    O = torch.empty(n_chunks, HV, chunk, V, dtype=dt, device=q.device)
    for c in range(n_chunks):                                                             # the state scan
        vn = U[c] - W[c] @ S
        O[c] = Qg[c] @ S + Aqk[c] @ vn
        S = decay_c[c] * S + Kb[c] @ vn
    return O.transpose(1, 2).reshape(n_chunks * chunk, HV, V)[:T], S


def _recurrent_step(S, q, k, v, a, beta):
    """One token for N sequences: decay, delta-rule write, read (q already scaled)."""
    S = S * torch.exp(a)[..., None]
    u = beta[..., None] * (v - torch.einsum("nhk,nhkv->nhv", k, S))
    S = S + k[..., None] * u[..., None, :]
    return torch.einsum("nhk,nhkv->nhv", q, S), S


def kda_recurrent(q, k, v, a, beta, state, keep_all: bool = False, compile: bool = False):
    """N sequences of L tokens each, token by token. q, k [N, L, H, K] (L2-normalised), v [N, L, HV, V],
    a [N, L, HV, K], beta [N, L, HV], state [N, HV, K, V]. Returns (o [N, L, HV, V], final state),
    or with keep_all (o, states after each token [N, L, HV, K, V])."""
    HV, K = v.shape[2], q.shape[-1]
    dt = q.dtype
    q, k = _expand_heads(q, HV, 2) * K ** -0.5, _expand_heads(k, HV, 2)
    S = state.to(dt).clone()
    v, a, beta = v.to(dt), a.to(dt), beta.to(dt)
    step = maybe_compiled(_recurrent_step, compile)
    outs, states = [], []
    for t in range(q.shape[1]):
        o, S = step(S, q[:, t], k[:, t], v[:, t], a[:, t], beta[:, t])
        outs.append(o)
        if keep_all:
            states.append(S)
    o = torch.stack(outs, 1)
    return (o, torch.stack(states, 1)) if keep_all else (o, S)


# ---------------------------------------------------------------- the sublayer

def kda_project(x, q_proj, k_proj, v_proj, f_a, f_b, b_proj, a_log, dt_bias, gate: str, lb: float, HV: int, K: int):
    """Pre-conv q|k|v inputs [n, C], log-decay a [n, HV, K], beta [n, HV]."""
    qkv = torch.cat([lin(x, q_proj), lin(x, k_proj), lin(x, v_proj)], dim=-1)
    a = kda_gate(lin(lin(x, f_a), f_b).view(x.shape[0], HV, K), a_log, dt_bias.view(HV, K), gate, lb)
    return qkv, a, torch.sigmoid(lin(x, b_proj))


def kda_heads(full, conv_w, H: int, K: int, HV: int, V: int):
    """Short conv over (3 earlier inputs | this segment) [..., 3 + n, C], SiLU, L2 norm of q and k:
    q, k [..., n, H, K], v [..., n, HV, V] in fp32."""
    qc, kc, vc = F.silu(causal_conv(full, conv_w)).float().split([H * K, H * K, HV * V], dim=-1)
    return l2norm(qc.unflatten(-1, (H, K))), l2norm(kc.unflatten(-1, (H, K))), vc.unflatten(-1, (HV, V))


def kda_output(o, x, o_norm, g_proj, o_proj, eps: float):
    """rmsnorm per head * sigmoid(x g_proj^T), then o_proj; o [n, HV, V]."""
    n, HV, V = o.shape
    o = rmsnorm(o.to(x.dtype), o_norm, eps) * torch.sigmoid(lin(x, g_proj)).view(n, HV, V)
    return lin(o.reshape(n, HV * V), o_proj)


def kda_layer(cfg, w: dict, p: str, x: torch.Tensor, batch, state, layer: int) -> torch.Tensor:
    """The KDA sublayer on the step's tokens x [Ntok, d] (already RMS-normed). Prefill advances the
    slots' KDA/conv states; decode too; verify leaves them pending in `state` until commit."""
    H, HV, K, V = cfg.kda_heads, cfg.kda_value_heads, cfg.kda_head_dim, cfg.kda_value_dim
    cc = batch.compile
    qkv, a, beta = maybe_compiled(kda_project, cc)(
        x, *[w[p + n] for n in ("q_proj", "k_proj", "v_proj", "f_a", "f_b", "b_proj", "A_log", "dt_bias")],
        cfg.kda_gate, cfg.kda_lower_bound, HV, K)
    conv_w = torch.cat([w[p + "q_conv"], w[p + "k_conv"], w[p + "v_conv"]], dim=0)
    heads = maybe_compiled(kda_heads, cc)
    conv_states, kda_states = state.conv[layer], state.kda[layer]
    keep = conv_w.shape[1] - 1
    if batch.kind == "prefill":
        outs = []
        for slot, off, n in zip(batch.slots, batch.offsets, batch.lens):
            seg = slice(off, off + n)
            full = torch.cat([conv_states[slot].to(qkv.dtype), qkv[seg]], dim=0)
            qh, kh, vh = heads(full, conv_w, H, K, HV, V)
            o, S = kda_chunk(qh, kh, vh, a[seg].float(), beta[seg].float(), kda_states[slot], compile=cc)
            kda_states[slot] = S
            conv_states[slot] = full[-keep:].to(conv_states.dtype)
            outs.append(o)
        o = torch.cat(outs, dim=0)
    else:
        n_seq, L = len(batch.slots), batch.lens[0]
        slots = batch.slot_index
        full = torch.cat([conv_states[slots].to(qkv.dtype), qkv.view(n_seq, L, -1)], dim=1)   # [N, 3 + L, C]
        qh, kh, vh = heads(full, conv_w, H, K, HV, V)
        verify = batch.kind == "verify"
        o, S = kda_recurrent(qh, kh, vh, a.view(n_seq, L, HV, K).float(), beta.view(n_seq, L, HV).float(),
                             kda_states[slots], keep_all=verify, compile=cc)
        if verify:
            state.pending[layer] = (S, full)
        else:
            kda_states[slots] = S
            conv_states[slots] = full[:, -keep:].to(conv_states.dtype)
        o = o.reshape(x.shape[0], HV, V)
    return maybe_compiled(kda_output, cc)(o, x, w[p + "o_norm"], w[p + "g_proj"], w[p + "o_proj"], cfg.rms_eps)

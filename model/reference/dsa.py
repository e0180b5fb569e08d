"""The DSA sublayer in plain torch (docs/model.md): MLA in absorbed (MQA) form over a per-slot
dense cache of what the paged caches hold (dequantised FP8 latent tiles, bf16-rounded rope,
dequantised MXFP8 indexer keys), the Lightning Indexer and its top-k.

Queries are processed in blocks so that prefill never materialises [T, T, H]: per block the
indexer scores [N, B, S] (causally masked), the top-k positions, the selected keys gathered to
[N, B, k, 576], and the attention over them.
"""
from __future__ import annotations

import torch

from k31dsl.model.config import INDEX_DIM, KV_LORA, ROPE_DIM
from k31dsl.model.reference.functions import (apply_rope, bf16_round, fp8_tile_qdq, hadamard, layernorm, lin,
                                              mxfp8_qdq, rmsnorm)

BLOCK_ELEMENTS = 1 << 27          # bound of the per-query-block intermediates (elements)


def _as_f32(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def sparse_attention(Q, qi, wts, qpos, keys, kidx, topk: int, sm_scale: float) -> torch.Tensor:
    """N sequences of L queries each over their S cached positions.
    Q [N, L, H, 576] (bf16-rounded), qi [N, L, HI, 128] (indexer queries, dequantised), wts [N, L, HI],
    qpos [N, L] (positions; a query sees s <= pos), keys [N, S, 576], kidx [N, S, 128].
    Returns o_lat [N, L, H, 512]."""
    N, L, H, _ = Q.shape
    HI, S = qi.shape[2], keys.shape[1]
    kk = min(topk, S)
    per_query = N * max(2 * HI * S, kk * (KV_LORA + ROPE_DIM) + 2 * H * kk)
    block = max(1, min(L, BLOCK_ELEMENTS // per_query))
    rows = torch.arange(N, device=Q.device)[:, None, None]
    span = torch.arange(S, device=Q.device)
    out = []
    for b0 in range(0, L, block):
        b1 = min(b0 + block, L)
        dots = torch.relu(torch.einsum("nbhd,nsd->nbhs", qi[:, b0:b1], kidx))           # [N, B, HI, S]
        score = torch.einsum("nbh,nbhs->nbs", wts[:, b0:b1], dots)
        score = score.masked_fill(span > qpos[:, b0:b1, None], float("-inf"))
        top, idx = score.topk(kk, dim=-1)                                                # [N, B, k]
        sel = keys[rows, idx]                                                            # [N, B, k, 576]
        logits = torch.einsum("nbhd,nbkd->nbhk", Q[:, b0:b1], sel) * sm_scale
        logits = logits.masked_fill(~torch.isfinite(top)[:, :, None, :], float("-inf"))  # fewer than k positions
        p = torch.softmax(logits, dim=-1)
        out.append(torch.einsum("nbhk,nbkc->nbhc", p, sel[..., :KV_LORA]))
    return torch.cat(out, dim=1)


def dsa_layer(cfg, w: dict, p: str, x: torch.Tensor, batch, state, layer: int) -> torch.Tensor:
    """The DSA sublayer on the step's tokens x [Ntok, d] (already RMS-normed): writes the tokens'
    cache entries at (slot, position), then attends over each sequence's positions <= its own."""
    H, dn, dv, HI = cfg.mla_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.index_heads
    n_tok = x.shape[0]
    cos, sin = batch.cos, batch.sin
    had = hadamard(INDEX_DIM, x.device, torch.float32)
    if batch.quantize:
        fp8, mx, bf16 = fp8_tile_qdq, mxfp8_qdq, bf16_round
    else:                                       # the exact model (tests): every quantisation point is the identity
        fp8 = mx = bf16 = _as_f32
    # MLA query and latent
    qa = rmsnorm(lin(x, w[p + "q_a"]), w[p + "q_a_norm"], cfg.rms_eps)
    q = lin(qa, w[p + "q_b"]).view(n_tok, H, dn + ROPE_DIM)
    q_nope, q_pe = q[..., :dn], apply_rope(q[..., dn:], cos, sin)
    kv = lin(x, w[p + "kv_a"])
    c = rmsnorm(kv[:, :KV_LORA], w[p + "kv_a_norm"], cfg.rms_eps)
    k_pe = apply_rope(kv[:, KV_LORA:], cos, sin)
    q_lat = torch.einsum("thn,hnc->thc", q_nope, w[p + "w_uk"].to(q_nope.dtype))
    Q = bf16(torch.cat([q_lat, q_pe], dim=-1).float())
    # Lightning Indexer: RoPE on dims [0, 64), orthonormal Hadamard, MXFP8
    qi = lin(qa, w[p + "idx_wq_b"]).view(n_tok, HI, INDEX_DIM).float()
    qi = mx(apply_rope(qi, cos, sin) @ had)
    ki = layernorm(lin(x, w[p + "idx_wk"]).float(), w[p + "idx_k_norm_w"], w[p + "idx_k_norm_b"], 1e-6)
    ki = mx(apply_rope(ki, cos, sin) @ had)
    wts = lin(x, w[p + "idx_weights_proj"]).float() * HI ** -0.5
    # cache writes at (slot, position)
    lat_cache, rope_cache, idx_cache = state.latent[layer], state.rope[layer], state.index[layer]
    lat_cache[batch.slot_of_token, batch.positions] = fp8(c)
    rope_cache[batch.slot_of_token, batch.positions] = bf16(k_pe.float())
    idx_cache[batch.slot_of_token, batch.positions] = ki

    def keys_of(slots, end):
        return torch.cat([lat_cache[slots, :end], rope_cache[slots, :end]], dim=-1), idx_cache[slots, :end]

    if batch.kind == "prefill":
        outs = []
        for slot, off, n, ctx in zip(batch.slots, batch.offsets, batch.lens, batch.ctx):
            seg = slice(off, off + n)
            keys, kidx = keys_of([slot], ctx + n)
            outs.append(sparse_attention(Q[None, seg], qi[None, seg], wts[None, seg], batch.positions[None, seg],
                                         keys, kidx, cfg.index_topk, cfg.sm_scale)[0])
        o_lat = torch.cat(outs, dim=0)
    else:
        n_seq, L = len(batch.slots), batch.lens[0]
        keys, kidx = keys_of(batch.slot_index, max(batch.ctx) + L)
        o_lat = sparse_attention(Q.view(n_seq, L, H, -1), qi.view(n_seq, L, HI, -1), wts.view(n_seq, L, HI),
                                 batch.positions.view(n_seq, L), keys, kidx, cfg.index_topk, cfg.sm_scale)
        o_lat = o_lat.reshape(n_tok, H, KV_LORA)
    o = torch.einsum("thc,hvc->thv", o_lat.to(x.dtype), w[p + "w_uv"].to(x.dtype))
    return lin(o.reshape(n_tok, H * dv), w[p + "o_proj"])

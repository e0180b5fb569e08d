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
                                              maybe_compiled, mxfp8_qdq, rmsnorm)

BLOCK_ELEMENTS = 1 << 28          # bound of the per-query-block intermediates (elements)
_HADAMARD: dict = {}              # device -> the orthonormal 128 x 128 Hadamard matrix


def _as_f32(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def topk_lowest_index(score: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """score.topk(kk) along the last axis with the ops' rule for ties: of equal scores the lower
    position wins (torch.topk leaves that order unspecified; ReLU makes exact ties, e.g. at 0)."""
    kth = score.topk(kk, dim=-1).values[..., -1:]
    above, tied = score > kth, score == kth
    room = kk - above.sum(-1, keepdim=True)
    take = above | (tied & (tied.cumsum(-1) <= room))                             # exactly kk per row
    idx = take.to(score.dtype).topk(kk, dim=-1).indices
    return score.gather(-1, idx), idx


def attend_block(Q, qi, wts, qpos, keys, kidx, kk: int, sm_scale: float) -> torch.Tensor:
    """One block of B queries (see sparse_attention): indexer scores, top-k, gather, attention."""
    dots = torch.relu(torch.einsum("nbhd,nsd->nbhs", qi, kidx))                   # [N, B, HI, S]
    score = torch.einsum("nbh,nbhs->nbs", wts, dots)
    span = torch.arange(kidx.shape[1], device=Q.device)
    score = score.masked_fill(span > qpos[:, :, None], float("-inf"))
    top, idx = topk_lowest_index(score, kk)                                       # [N, B, k]
    rows = torch.arange(Q.shape[0], device=Q.device)[:, None, None]
    sel = keys[rows, idx]                                                         # [N, B, k, 576]
    logits = torch.einsum("nbhd,nbkd->nbhk", Q, sel) * sm_scale
    logits = logits.masked_fill(~torch.isfinite(top)[:, :, None, :], float("-inf"))  # fewer than k positions
    p = torch.softmax(logits, dim=-1)
    return torch.einsum("nbhk,nbkc->nbhc", p, sel[..., :KV_LORA])


def sparse_attention(Q, qi, wts, qpos, keys, kidx, topk: int, sm_scale: float, compile: bool = False) -> torch.Tensor:
    """N sequences of L queries each over their S cached positions.
    Q [N, L, H, 576] (bf16-rounded), qi [N, L, HI, 128] (indexer queries, dequantised), wts [N, L, HI],
    qpos [N, L] (positions; a query sees s <= pos), keys [N, S, 576], kidx [N, S, 128].
    Returns o_lat [N, L, H, 512]."""
    N, L, H, _ = Q.shape
    HI, S = qi.shape[2], keys.shape[1]
    kk = min(topk, S)
    per_query = N * max(2 * HI * S, kk * (KV_LORA + ROPE_DIM) + 2 * H * kk)
    block = max(1, min(L, BLOCK_ELEMENTS // per_query))
    fn = maybe_compiled(attend_block, compile)
    out = [fn(Q[:, b0:b0 + block], qi[:, b0:b0 + block], wts[:, b0:b0 + block], qpos[:, b0:b0 + block],
              keys, kidx, kk, sm_scale) for b0 in range(0, L, block)]
    return torch.cat(out, dim=1)


def dsa_project(x, cos, sin, had, q_a, q_a_norm, q_b, kv_a, kv_a_norm, w_uk, idx_wq_b, idx_wk, idx_k_norm_w,
                idx_k_norm_b, idx_weights_proj, H: int, dn: int, HI: int, eps: float, quantize: bool):
    """Per token: the attention query Q [n, H, 576] (bf16), the cache row [n, 576] (FP8-tile latent
    | bf16 rope), the indexer query qi [n, HI, 128] and key ki [n, 128] (MXFP8) and head weights
    wts [n, HI]; quantize=False makes every quantisation point the identity (the exact model)."""
    if quantize:
        fp8, mx, bf16 = fp8_tile_qdq, mxfp8_qdq, bf16_round
    else:
        fp8 = mx = bf16 = _as_f32
    n_tok = x.shape[0]
    qa = rmsnorm(lin(x, q_a), q_a_norm, eps)
    q = lin(qa, q_b).view(n_tok, H, dn + ROPE_DIM)
    q_nope, q_pe = q[..., :dn], apply_rope(q[..., dn:], cos, sin)
    kv = lin(x, kv_a)
    c = rmsnorm(kv[:, :KV_LORA], kv_a_norm, eps)
    k_pe = apply_rope(kv[:, KV_LORA:], cos, sin)
    q_lat = torch.einsum("thn,hnc->thc", q_nope, w_uk.to(q_nope.dtype))
    Q = bf16(torch.cat([q_lat, q_pe], dim=-1).float())
    row = torch.cat([fp8(c), bf16(k_pe.float())], dim=-1)
    # Lightning Indexer: RoPE on dims [0, 64), orthonormal Hadamard, MXFP8
    qi = lin(qa, idx_wq_b).view(n_tok, HI, INDEX_DIM).float()
    qi = mx(apply_rope(qi, cos, sin) @ had)
    ki = layernorm(lin(x, idx_wk).float(), idx_k_norm_w, idx_k_norm_b, 1e-6)
    ki = mx(apply_rope(ki, cos, sin) @ had)
    wts = lin(x, idx_weights_proj).float() * HI ** -0.5
    return Q, row, qi, ki, wts


def _rows(cache: torch.Tensor, slots: list[int], slot_index: torch.Tensor, end: int) -> torch.Tensor:
    """cache[slots, :end]: a view when the slots are consecutive (no copy of the caches)."""
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return cache[slots[0]:slots[0] + len(slots), :end]
    return cache[slot_index, :end]


def dsa_layer(cfg, w: dict, p: str, x: torch.Tensor, batch, state, layer: int) -> torch.Tensor:
    """The DSA sublayer on the step's tokens x [Ntok, d] (already RMS-normed): writes the tokens'
    cache entries at (slot, position), then attends over each sequence's positions <= its own."""
    H, dn, dv, HI = cfg.mla_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.index_heads
    n_tok = x.shape[0]
    names = ("q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "w_uk", "idx_wq_b", "idx_wk", "idx_k_norm_w",
             "idx_k_norm_b", "idx_weights_proj")
    if x.device not in _HADAMARD:
        _HADAMARD[x.device] = hadamard(INDEX_DIM, x.device, torch.float32)
    Q, row, qi, ki, wts = maybe_compiled(dsa_project, batch.compile)(
        x, batch.cos, batch.sin, _HADAMARD[x.device], *[w[p + n] for n in names], H, dn, HI, cfg.rms_eps, batch.quantize)
    kv_cache, idx_cache = state.kv[layer], state.index[layer]
    kv_cache[batch.slot_of_token, batch.positions] = row
    idx_cache[batch.slot_of_token, batch.positions] = ki
    if batch.kind == "prefill":
        outs = []
        for slot, off, n, ctx in zip(batch.slots, batch.offsets, batch.lens, batch.ctx):
            seg = slice(off, off + n)
            outs.append(sparse_attention(Q[None, seg], qi[None, seg], wts[None, seg], batch.positions[None, seg],
                                         kv_cache[slot:slot + 1, :ctx + n], idx_cache[slot:slot + 1, :ctx + n],
                                         cfg.index_topk, cfg.sm_scale, batch.compile)[0])
        o_lat = torch.cat(outs, dim=0)
    else:
        n_seq, L = len(batch.slots), batch.lens[0]
        end = max(batch.ctx) + L
        keys = _rows(kv_cache, batch.slots, batch.slot_index, end)
        kidx = _rows(idx_cache, batch.slots, batch.slot_index, end)
        o_lat = sparse_attention(Q.view(n_seq, L, H, -1), qi.view(n_seq, L, HI, -1), wts.view(n_seq, L, HI),
                                 batch.positions.view(n_seq, L), keys, kidx, cfg.index_topk, cfg.sm_scale,
                                 batch.compile)
        o_lat = o_lat.reshape(n_tok, H, KV_LORA)
    o = torch.einsum("thc,hvc->thv", o_lat.to(x.dtype), w[p + "w_uv"].to(x.dtype))
    return lin(o.reshape(n_tok, H * dv), w[p + "o_proj"])

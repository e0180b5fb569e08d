"""fp64 oracles of the MLA side of DSA (k31dsl.ops.dsa.attention / fused), from research/dsa.md
sections 2-3 (own code, not the DSL kernels).

MLA latent cache record (FlashMLA "V32", 656 bytes per token, research 3.3):
  [0, 512)    the 512 latent values as E4M3 codes, tile t = elements [128t, 128t + 128)
  [512, 528)  4 fp32 little-endian scales, x = code * scale[t]
  [528, 656)  the 64 rope values as bfloat16 bytes
Scales follow the per-128-tile FP8 recipe of the quantizer oracle (quant.fp8_tile_quantize:
max(amax, 1e-4) / 448 in fp32, optionally rounded up to a power of two). Slot s lives at page
s // 64, row s % 64.

Sparse MLA attention (MQA mode, research 2.1 / 2.4), per query t and head h:
  K[s] = [latent[s]; rope[s]] (576), V[s] = latent[s] (512)
  valid(s) = 0 <= s < number of slots (entries -1 or out of range are dropped; a slot listed twice
             counts twice, as in FlashMLA)
  score = sm_scale * q[t, h] . K[s] over the valid entries; lse = log sum exp(score) (natural log)
  o = sum_s softmax(score)_s V[s]; a query with no valid entry: o = 0, lse = +inf.
"""
from __future__ import annotations

import numpy as np

from .fp import BF16, E4M3, F32, e4m3_decode, f32_bits, round_to
from .quant import fp8_tile_quantize

PAGE = 64
LATENT = 512
ROPE = 64
TILE = 128
RECORD = LATENT + 4 * (LATENT // TILE) + 2 * ROPE      # 656


def mla_records(kv_latent, k_rope, pow2: bool = False) -> np.ndarray:
    """The 656-byte records (uint8 [N, 656]) of N tokens."""
    codes, scales = fp8_tile_quantize(np.asarray(kv_latent, np.float64), TILE, pow2, 1e-4)
    sbytes = np.asarray(scales, np.float64).astype(np.float32).view(np.uint8).reshape(len(codes), -1)
    rope_bits = (f32_bits(round_to(k_rope, BF16)) >> 16).astype("<u2")
    rbytes = rope_bits.view(np.uint8).reshape(len(codes), -1)
    return np.concatenate([codes, sbytes, rbytes], axis=1).astype(np.uint8)


def mla_cache_write(cache, kv_latent, k_rope, slots, pow2: bool = False) -> np.ndarray:
    """A copy of cache (uint8 [P, 64, 656]) with each token's record at its slot; slot < 0 skips."""
    out = np.array(cache, np.uint8).reshape(-1, RECORD)
    rec = mla_records(kv_latent, k_rope, pow2)
    for i, s in enumerate(np.asarray(slots, np.int64)):
        if s >= 0:
            out[s] = rec[i]
    return out.reshape(np.shape(cache))


def mla_cache_decode(cache) -> tuple[np.ndarray, np.ndarray]:
    """(latent fp64 [S, 512], rope fp64 [S, 64]) of every slot of a uint8 [P, 64, 656] cache."""
    rec = np.asarray(cache, np.uint8).reshape(-1, RECORD)
    codes = e4m3_decode(rec[:, :LATENT]).reshape(-1, LATENT // TILE, TILE)
    scales = np.ascontiguousarray(rec[:, LATENT:LATENT + 16]).view("<f4").astype(np.float64)
    latent = (codes * scales[:, :, None]).reshape(-1, LATENT)
    bits = np.ascontiguousarray(rec[:, LATENT + 16:]).view("<u2").astype(np.uint32) << 16
    rope = bits.view(np.float32).astype(np.float64)
    return latent, rope


def sparse_mla_attention(q, latent, rope, indices, sm_scale: float):
    """(o fp64 [T, H, 512], lse fp64 [T, H]) over dequantized latent/rope ([S, 512] / [S, 64])."""
    q = np.asarray(q, np.float64)
    idx = np.asarray(indices, np.int64)
    n = latent.shape[0]
    keys = np.concatenate([latent, rope], axis=1)               # [S, 576]
    T, H, _ = q.shape
    o = np.zeros((T, H, LATENT))
    lse = np.full((T, H), np.inf)
    for t in range(T):
        sel = idx[t][(idx[t] >= 0) & (idx[t] < n)]
        if sel.size == 0:
            continue
        s = sm_scale * (q[t] @ keys[sel].T)                      # [H, n_sel]
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        z = e.sum(axis=1, keepdims=True)
        lse[t] = (m + np.log(z))[:, 0]
        o[t] = (e / z) @ latent[sel]
    return o, lse


def slots_of_positions(positions, block_table, rows) -> np.ndarray:
    """Physical slots of logical positions: block_table[row, pos // 64] * 64 + pos % 64, -1 where the
    position is negative. positions [T, K], rows [T] (the block-table row of each query)."""
    pos = np.asarray(positions, np.int64)
    bt = np.asarray(block_table, np.int64)
    out = np.full(pos.shape, -1, np.int64)
    for t in range(pos.shape[0]):
        ok = pos[t] >= 0
        out[t, ok] = bt[rows[t], pos[t, ok] // PAGE] * PAGE + pos[t, ok] % PAGE
    return out


__all__ = ["mla_records", "mla_cache_write", "mla_cache_decode", "sparse_mla_attention", "slots_of_positions",
           "round_to", "BF16", "E4M3", "F32"]

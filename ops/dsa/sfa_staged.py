"""Sparse MLA attention with the selected records staged first, the decode form whose two
products are dense GEMMs (attention.py has the cache layout and the gather kernels).

The gather kernels (one-pass, two-pass) address every block of records through a loaded index
tile, so Triton cannot keep copies in flight across blocks, and each block's E4M3 codes pass
through registers (widened to bf16) before an MMA can read them: both passes wait on one block at
a time (benchmarks/NOTES.md, DSA attention). Here a copy kernel first writes each query's selected
records as rows of one contiguous buffer, and the products read that buffer at addresses computed
from loop counters, so their loads pipeline and their operands go from memory to shared memory
to the tensor cores untouched:

  `sfa_stage`         program (query, block of BR indices): the records' latent codes widened to
                      bf16 (exact: a code is a small float) and the rope -> keys [T, K, 576] bf16,
                      the four tile scales -> key_scales [T, K, 4] fp32; an invalid index (-1,
                      outside the cache) stages a zero row with scales 0.
  `sfa_dense_scores`  program (key tile of BN, head block, query): scores [BH, BN] as five dots —
                      per latent tile g the [BH, 128] x [128, BN] product times the keys' scale g,
                      then the rope's — masked to -inf where the index is invalid, written to an
                      fp32 [T, H, K] buffer with the tile's softmax max m and sum l of exp(s - m).
  `sfa_dense_values`  program (128-column tile g, head block, query): lse from every key tile's
                      (m, l), then o[:, g] = sum over key blocks of (exp(s - lse) * scale_g) @ keys_g.

The numerics are the two-pass form's: codes times scales are never rounded (the scale multiplies
the fp32 product in pass 1 and the fp32 probability in pass 2, before its bf16 rounding).
Memory: the staged keys are T * K * 1152 bytes (151 MB at 64 queries x 2048 indices) on top of
the two-pass form's fp32 score buffer.
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.dsa.attention import LATENT, ROPE, TILE, CacheCodes, CacheRope, CacheScales
from k31dsl.ops.dsa.sfa_two_pass import fold_stats, segments_lse

DQK = LATENT + ROPE
STAGE_CONFIGS = [{"BR": 32, "num_warps": 4}]
SCORE_CONFIGS = [{"BH": 64, "BN": 64, "STAGES": 2, "num_warps": 4}]
VALUE_CONFIGS = [{"BH": 64, "BK": 64, "STAGES": 2, "num_warps": 4}]


@k.kernel(configs=STAGE_CONFIGS)
def sfa_stage(codes: CacheCodes, scales: CacheScales, rope: CacheRope, indices: k.Tensor[k.i32, "T", "K"],
              keys: k.Tensor[k.bf16, "T", "K", "DQK"], key_scales: k.Tensor[k.f32, "T", "K", "G"],
              BR: k.constexpr = 32):
    for rb, t in k.grid(k.cdiv(indices.shape[1], BR), indices.shape[0]):
        r0 = rb * BR
        idx = indices[t, k.span(r0, BR, other=-1)]
        valid = (idx >= 0) & (idx < codes.shape[0])
        keys[t, k.span(r0, BR), k.span(0, 512)] = k.where(
            valid[:, None], codes[idx, k.span(0, 512, other=0.0)].to(k.bf16), 0.0)
        keys[t, k.span(r0, BR), k.span(512, 64)] = k.where(valid[:, None], rope[idx, k.span(264, 64, other=0.0)], 0.0)
        key_scales[t, k.span(r0, BR), k.span(0, 4)] = k.where(
            valid[:, None], k.load(scales, (idx, k.span(128, 4)), other=0.0), 0.0)


@k.kernel(configs=SCORE_CONFIGS)
def sfa_dense_scores(q: k.Tensor["QT", "T", "H", "DQK"], keys: k.Tensor[k.bf16, "T", "K", "DQK"],
                     key_scales: k.Tensor[k.f32, "T", "K", "G"], indices: k.Tensor[k.i32, "T", "K"],
                     s: k.Tensor[k.f32, "T", "H", "K"], part_m: k.Tensor[k.f32, "NT", "T", "H"],
                     part_l: k.Tensor[k.f32, "NT", "T", "H"], n_slots: k.i32, sm_scale: k.f32,
                     QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64, BN: k.constexpr = 64,
                     STAGES: k.constexpr = 2):
    # Key tiles are the grid's fastest axis: a query's tiles run side by side and share its rows
    # of q from L2. The scale of tile g multiplies each tile's product (not the keys), so the dot
    # is a fresh one per tile and Triton waits on it; the loads of the next tiles are in flight.
    for n, hb, t in k.grid(k.cdiv(s.shape[2], BN), k.cdiv(s.shape[1], BH), s.shape[0]):
        h0 = hb * BH
        n0 = n * BN
        acc = k.zeros((BH, BN), k.f32)
        for g in k.range(4, stages=STAGES):
            a = q[t, k.span(h0, BH), k.span(g * TILE, TILE, other=0.0)].to(k.bf16)
            b = keys[t, k.span(n0, BN), k.span(g * TILE, TILE, other=0.0)]
            sg = k.load(key_scales, (t, k.span(n0, BN), g), other=0.0)
            acc += k.dot(a, b.T) * sg[None, :]
        a = q[t, k.span(h0, BH), k.span(LATENT, ROPE, other=0.0)].to(k.bf16)
        acc += k.dot(a, keys[t, k.span(n0, BN), k.span(LATENT, ROPE, other=0.0)].T)
        idx = indices[t, k.span(n0, BN, other=-1)]
        valid = (idx >= 0) & (idx < n_slots)
        sc = k.where(valid[None, :], acc * sm_scale, float("-inf"))
        s[t, k.span(h0, BH), k.span(n0, BN)] = sc
        m, l = fold_stats(k.full((BH,), float("-inf"), k.f32), k.zeros((BH,), k.f32), sc)
        part_m[n, t, k.span(h0, BH)] = m
        part_l[n, t, k.span(h0, BH)] = l


@k.kernel(configs=VALUE_CONFIGS)
def sfa_dense_values(keys: k.Tensor[k.bf16, "T", "K", "DQK"], key_scales: k.Tensor[k.f32, "T", "K", "G"],
                     s: k.Tensor[k.f32, "T", "H", "K"], part_m: k.Tensor[k.f32, "NT", "T", "H"],
                     part_l: k.Tensor[k.f32, "NT", "T", "H"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                     lse: k.Tensor[k.f32, "T", "H"], BH: k.constexpr = 64, BK: k.constexpr = 64,
                     NSB: k.constexpr = 1, STAGES: k.constexpr = 2):
    # NSB: the key-tile count of the score pass rounded up to a power of two (the caller passes
    # it). A masked score is -inf, so its probability is 0 whatever lse is (+inf for a lonely query).
    for g, hb, t in k.grid(k.cdiv(o.shape[2], TILE), k.cdiv(o.shape[1], BH), o.shape[0]):
        h0 = hb * BH
        row_lse = segments_lse(part_m, part_l, t, h0, BH, NSB)
        acc = k.zeros((BH, TILE), k.f32)
        for j in k.range(k.cdiv(s.shape[2], BK), stages=STAGES):
            sc = k.load(s, (t, k.span(h0, BH), k.span(j * BK, BK)), other=float("-inf"))
            sg = k.load(key_scales, (t, k.span(j * BK, BK), g), other=0.0)
            p = k.exp(sc - row_lse[:, None]) * sg[None, :]
            acc += k.dot(p.to(k.bf16), keys[t, k.span(j * BK, BK), k.span(g * TILE, TILE, other=0.0)])
        o[t, k.span(h0, BH), k.span(g * TILE, TILE)] = acc.to(k.bf16)
        lse[t, k.span(h0, BH)] = row_lse


def key_tiles(topk: int, bn: int) -> int:
    """The score pass's key tiles per query (its (m, l) partials)."""
    return -(-topk // bn)


def buffers(t: int, h: int, topk: int, bn: int) -> dict:
    """The staged form's intermediates by name -> (shape, dtype name)."""
    nt = key_tiles(topk, bn)
    return {"keys": ((t, topk, DQK), "bfloat16"), "key_scales": ((t, topk, 4), "float32"),
            "scores": ((t, h, topk), "float32"), "part_m": ((nt, t, h), "float32"),
            "part_l": ((nt, t, h), "float32")}


def kernel_configs(op: str, kw: dict) -> tuple[dict, dict, dict]:
    """The call's config keys per kernel (stage, scores, values): BR to the stage, BN to the
    scores, BK to the values, BH and STAGES and launch options (num_warps, ...) to both products;
    any other key is a K31Error."""
    from k31dsl.targets.triton.emit import LAUNCH_KEYS
    owners = {"BR": (0,), "BN": (1,), "BK": (2,), "BH": (1, 2), "STAGES": (1, 2), **{n: (1, 2) for n in LAUNCH_KEYS}}
    unknown = sorted(set(kw) - set(owners))
    if unknown:
        raise K31Error(f"{op}: the staged form takes no config key {', '.join(unknown)}",
                       hint="its kernels take BR (stage), BN (scores), BK (values), BH, STAGES and launch "
                            "options such as num_warps")
    parts = ({}, {}, {})
    for name, val in kw.items():
        for i in owners[name]:
            parts[i][name] = val
    return parts


def sparse_mla_attention_staged(target: str, q, views, idx, sm_scale: float, o, lse, kw: dict):
    """Launch the three kernels into o / lse (torch tensors allocated by the caller). kw: config
    keys pinned for the kernels that take them (kernel_configs)."""
    import torch
    kw_stage, kw_scores, kw_values = kernel_configs("sparse_mla_attention", kw)
    c, sc, r = views
    T, H, K = q.shape[0], q.shape[1], idx.shape[1]
    bn = kw_scores.get("BN", SCORE_CONFIGS[0]["BN"])
    bufs = {name: torch.empty(shape, dtype=getattr(torch, dt), device=q.device)
            for name, (shape, dt) in buffers(T, H, K, bn).items()}
    sfa_stage[target](c, sc, r, idx, bufs["keys"], bufs["key_scales"], **kw_stage)
    sfa_dense_scores[target](q, bufs["keys"], bufs["key_scales"], idx, bufs["scores"], bufs["part_m"],
                             bufs["part_l"], c.shape[0], float(sm_scale), **kw_scores)
    nsb = 1 << (key_tiles(K, bn) - 1).bit_length()
    sfa_dense_values[target](bufs["keys"], bufs["key_scales"], bufs["scores"], bufs["part_m"], bufs["part_l"],
                             o, lse, NSB=nsb, **kw_values)
    return o, lse

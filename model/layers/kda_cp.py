"""The KDA sublayer of a context-parallel prefill step (model/distributed.py; research/kda.md 3).

A rank holds two chunks of the sequence (zigzag: global chunks r and 2P-1-r, `chunk` tokens each,
rows [0, chunk) and [chunk, 2 chunk) of the step); a chunk may end in padding (the tokens past
the prompt). Per layer, on every rank, the same program:

  conv     each local chunk's last 3 pre-conv rows (`conv_tails`) are all-gathered; a chunk's
           halo is its predecessor's tail (`take_rows`, chunk 0: zeros), then the short conv
           runs over both chunks with their halos as the conv state, and `short_conv_commit_rows`
           gives the conv state after each chunk's real tokens (the decode hand-off)
  summary  kda_chunk_prep once over the four varlen pieces [chunk a real, chunk a padding,
           chunk b real, chunk b padding]; then two state passes of kda_chunk_state from it:
           E (start 0) and M (start I with zero values: the recurrence is linear in S, so that
           pass carries the K x K transition) - the affine summary S_out = M S_in + E per piece
  gather   M and E of the four pieces of every rank, fp32, all-gathered
  merge    the initial state of every global chunk in sequence order, S_0 = 0 and
           S_{i+1} = M_i S_i + E_i (`kda_merge_rows`, one launch per chunk: fp32, ieee dots)
  run      kda_chunk_state with h0 = [S_r, 0, S_{2P-1-r}, 0]: the outputs, and each piece's
           final state (the chunk holding the last prompt token has the sequence's state)

Inputs the driver gives (model/distributed.py `cp_inputs`): cp_pair [0, 1], cp_halo_src (row of
the gathered tails before each local chunk, -1: none), cp_real (real tokens per local chunk),
cp_chunk_order (gathered summary row of each global chunk), cp_h0_rows, the varlen map
kda_cp_{info,seq_chunks,cu}, and constants kda_cp_eye, kda_cp_u0, cp_states (row 0 zero).
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS, next_pow2
from k31dsl.model.layers.common import memo
from k31dsl.model.layers.kda import (CONV_NAMES, _output, _projections, chunk_prep, copy_state_rows, kda_chunk_state,
                                     kda_dims, short_conv_commit_rows, short_conv_rows)

PIECES = 4          # [chunk a real, chunk a padding, chunk b real, chunk b padding]
CHUNK_T = 64        # kda chunk rows (a CP chunk is a multiple of the 64-token page)


@k.kernel
def conv_tails(x: k.Tensor["XT", "N", "T", "C"], tails: k.Tensor[k.f32, "N", "3", "C"],
               XT: k.constexpr[FLOAT_INPUTS] = k.bf16, BC: k.constexpr = 256):
    # tails[n] = the last 3 rows of x[n] (T >= 3): the conv halo of the chunk after it
    for n, cb in k.grid(x.shape[0], k.cdiv(x.shape[2], BC)):
        for j in k.static_range(3):
            tails[n, j, k.span(cb * BC, BC)] = x[n, x.shape[1] - 3 + j, k.span(cb * BC, BC, other=0.0)].to(k.f32)


@k.kernel
def take_rows(src: k.Tensor[k.f32, "R", "A", "B"], rows: k.Tensor[k.i32, "N"], dst: k.Tensor[k.f32, "N", "A", "B"],
              BB: k.constexpr = 256):
    # dst[n] = src[rows[n]], zeros where rows[n] < 0
    for n, a, bb in k.grid(dst.shape[0], dst.shape[1], k.cdiv(dst.shape[2], BB)):
        r = rows[n]
        dst[n, a, k.span(bb * BB, BB)] = k.load(src, (k.maximum(r, 0), a, k.span(bb * BB, BB)), mask=r >= 0,
                                                other=0.0)


@k.kernel(configs=[{"BI": 32, "BV": 64, "num_warps": 4}, {"BI": 16, "BV": 128, "num_warps": 4}])
def kda_merge_rows(m: k.Tensor[k.f32, "N", "HV", "K", "K"], e: k.Tensor[k.f32, "N", "HV", "K", "V"],
                   order: k.Tensor[k.i32, "C"], states: k.Tensor[k.f32, "S", "HV", "K", "V"], step: k.i32,
                   BI: k.constexpr = 32, BJ: k.constexpr = 32, BV: k.constexpr = 64):
    # states[step + 1] = M[order[step]] states[step] + E[order[step]], one [BI, BV] block per program
    for hv, pi, pv in k.grid(m.shape[1], k.cdiv(m.shape[2], BI), k.cdiv(e.shape[3], BV)):
        src = order[step]
        acc = e[src, hv, k.span(pi * BI, BI, other=0.0), k.span(pv * BV, BV, other=0.0)]
        for j in range(k.cdiv(m.shape[2], BJ)):
            mt = m[src, hv, k.span(pi * BI, BI, other=0.0), k.span(j * BJ, BJ, other=0.0)]
            st = states[step, hv, k.span(j * BJ, BJ, other=0.0), k.span(pv * BV, BV, other=0.0)]
            acc = acc + k.dot(mt, st)
        states[step + 1, hv, k.span(pi * BI, BI), k.span(pv * BV, BV)] = acc


conv_tails, take_rows, kda_merge_rows = memo(conv_tails, take_rows, kda_merge_rows)


def cp_max_chunks(local_tokens: int) -> int:
    """KDA chunks of a rank's varlen map: every 64 rows, plus one per piece boundary inside a chunk."""
    return local_tokens // CHUNK_T + 2


def cp_chunk_map(chunk: int, real: tuple[int, int]) -> tuple[list, list, list]:
    """kda_chunk_prep's map of the four pieces of a rank's two chunks (`real` tokens of each):
    (chunk rows (first token, end of its piece) padded with empty chunks, first chunk of each
    piece, piece offsets)."""
    bounds = [0, real[0], chunk, chunk + real[1], 2 * chunk]
    info, firsts = [], []
    for s in range(PIECES):
        firsts.append(len(info))
        info += [(t, bounds[s + 1]) for t in range(bounds[s], bounds[s + 1], CHUNK_T)]
    firsts.append(len(info))
    info += [(2 * chunk, 2 * chunk)] * (cp_max_chunks(2 * chunk) - len(info))
    return info, firsts, bounds


def add_kda_cp(g, l, x):
    """Layer l's KDA sublayer on a rank's two chunks (x [2 chunk, d]) -> [2 chunk, d]."""
    cfg, p = g.cfg, g.p
    H, HV, K, V = kda_dims(cfg)
    T = x.shape[0]
    chunk, ranks = T // 2, g.shape.ranks
    pre, graw, beta, ogate = _projections(g, l, x, 2, chunk)      # pre[c]: [2, chunk, C]
    pair = g.input("cp_pair", (2,), k.i32)
    real = g.input("cp_real", (2,), k.i32)
    conv = {}
    for c in CONV_NAMES:
        ch = pre[c].shape[2]
        tails = p.call(conv_tails, pre[c], g.tensor(f"l{l}_{c}_tails", (2, 3, ch), k.f32), BC=min(256, next_pow2(ch)))
        every = g.tensor(f"l{l}_{c}_tails_all", (2 * ranks, 3, ch), k.f32)
        every = p.dist_all_gather(tails, every, name=f"l{l} conv {c} halo")
        halo = p.call(take_rows, every, g.input("cp_halo_src", (2,), k.i32), g.tensor(f"l{l}_{c}_conv_after", (2, 3, ch),
                                                                                     k.f32), BB=min(256, next_pow2(ch)))
        y = g.tensor(f"l{l}_{c}_conv", (2, chunk, ch))
        conv[c] = p.call(short_conv_rows, pre[c], g.weight(f"layers.{l}.attn.{c}_conv"), halo, pair, y, UPDATE=False,
                         BT=16, BC=min(64, next_pow2(ch)))
        after = p.call(short_conv_commit_rows, pre[c], halo, pair, real, BC=min(256, next_pow2(ch)))
        p.output(after)
    q = g.reshape(conv["q"], (T, H, K), f"l{l}_q")
    kk = g.reshape(conv["k"], (T, H, K), f"l{l}_k")
    v = g.reshape(conv["v"], (T, HV, V), f"l{l}_v")
    graw = g.reshape(graw, (T, HV, K), f"l{l}_graw3")
    nt = cp_max_chunks(T)
    info = g.input("kda_cp_info", (nt, 2), k.i32)
    seq_chunks = g.input("kda_cp_seq_chunks", (PIECES + 1,), k.i32)
    cu = g.input("kda_cp_cu", (PIECES + 1,), k.i32)
    bt = CHUNK_T
    w, u, qg, kb, aqk, gam = chunk_prep(g, l, q, kk, v, graw, beta, info, nt, bt)
    f32 = cfg.dtype == "float32"
    mt = k.f32 if f32 else k.bf16
    state_kw = dict(PREC="ieee" if f32 else "tf32", BK=K, BT=bt, BV=min(32, V))
    # the summary of each piece: E from the zero state, M from I with zero values
    e = g.tensor(f"l{l}_kda_e", (PIECES, HV, K, V), k.f32)
    o_e = g.tensor(f"l{l}_kda_o_e", (T, HV, V))
    e, _ = p.call(kda_chunk_state, w, u, qg, kb, aqk, gam, seq_chunks, cu, g.input("kda_cp_eye", (PIECES, HV, K, K),
                                                                                     k.f32),
                  e, o_e, HAS_H0=False, STORE_HT=True, **state_kw)
    m = g.tensor(f"l{l}_kda_m", (PIECES, HV, K, K), k.f32)
    o_m = g.tensor(f"l{l}_kda_o_m", (T, HV, K))
    m, _ = p.call(kda_chunk_state, w, g.input("kda_cp_u0", (nt, HV, bt, K), mt), qg, kb, aqk, gam, seq_chunks, cu,
                  g.input("kda_cp_eye", (PIECES, HV, K, K), k.f32), m, o_m, HAS_H0=True, STORE_HT=True, **state_kw)
    m_all = p.dist_all_gather(m, g.tensor(f"l{l}_kda_m_all", (PIECES * ranks, HV, K, K), k.f32), name=f"l{l} kda M")
    e_all = p.dist_all_gather(e, g.tensor(f"l{l}_kda_e_all", (PIECES * ranks, HV, K, V), k.f32), name=f"l{l} kda E")
    # initial states of the global chunks 1 .. 2P-1 (row 0 of cp_states stays zero)
    order = g.input("cp_chunk_order", (2 * ranks,), k.i32)
    states = g.state("cp_states", g.runner_states["cp_states"])
    for i in range(2 * ranks - 1):
        states = p.call(kda_merge_rows, m_all, e_all, order, states, i, BI=min(32, max(16, next_pow2(K))),
                        BJ=min(32, max(16, next_pow2(K))), BV=min(64, max(16, next_pow2(V))))
    h0 = g.tensor(f"l{l}_kda_h0", (PIECES, HV, K, V), k.f32)
    h0 = p.call(copy_state_rows, states, g.input("cp_h0_rows", (PIECES,), k.i32), h0,
                g.input("cp_pieces", (PIECES,), k.i32), BA=K, BB=V)
    ht = g.tensor(f"l{l}_kda_ht", (PIECES, HV, K, V), k.f32)
    o = g.tensor(f"l{l}_kda_o", (T, HV, V))
    ht, o = p.call(kda_chunk_state, w, u, qg, kb, aqk, gam, seq_chunks, cu, h0, ht, o, HAS_H0=True, STORE_HT=True,
                   **state_kw)
    p.output(ht)
    return _output(g, l, o, ogate)


def cp_buffers(cfg, ranks: int, local_tokens: int, dtype, device) -> dict:
    """Per-step constants of the CP KDA sublayers: identity starts, zero values, merged states."""
    import torch
    H, HV, K, V = kda_dims(cfg)
    if not cfg.kda_layers:
        return {}
    f32 = dict(dtype=torch.float32, device=device)
    eye = torch.eye(K, **f32).expand(PIECES, HV, K, K).contiguous()
    u0 = torch.zeros(cp_max_chunks(local_tokens), HV, CHUNK_T, K, dtype=dtype, device=device)
    return {"kda_cp_eye": eye, "kda_cp_u0": u0, "cp_states": torch.zeros(2 * ranks, HV, K, V, **f32)}

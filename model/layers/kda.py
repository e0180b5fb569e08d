"""The KDA sublayer (docs/model.md, kind K) in a step graph: projections, the short convolutions
with their conv state, the KDA recurrence over the fp32 state pool, output norm + gate, o_proj.

  prefill  one sequence's chunk padded to its bucket: chunk_kda's two kernels (gate and L2 norm
           in-kernel) with the slot's state copied in as h0 and the final state copied back
           (`copy_state_rows`: kda_chunk_state indexes its states by sequence, the pool by slot);
           the padding rows are a second varlen sequence; the conv states move by the real
           tokens only (short_conv_commit_rows with the real length)
  decode   kda_decode_step over the pool in place, conv states updated in place
  verify   kda_decode_step with T = gamma + 1, update_state off and the replay data (k, u, g)
           written to runner-owned buffers; the conv states are only read, and the pre-conv
           inputs are kept so that `add_commit` can replay the accepted prefix

The pool is [rows, HV, V, K] fp32 (K contiguous, `state_v_first`: kda_decode streams it at 4.0 TB/s
against 3.4 for [K, V] on an H200, benchmarks/NOTES.md, KDA decode v4; chunk_kda's h0/ht read and
write it with VFIRST); row num_slots is the spare row padding sequences of a decode bucket write to.
Context-parallel prefill keeps [K, V] states between ranks and transposes at the hand-off.
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.ops.common import next_pow2
from k31dsl.ops.kda.chunk import PREP_VARIANTS, DEFAULT_VARIANT, SUB_CHUNK, default_tiling
from k31dsl.ops.kda.chunk_kernels import kda_chunk_prep, kda_chunk_state
from k31dsl.ops.kda.chunk_pair import kda_chunk_pair_merge
from k31dsl.ops.kda.chunk_prep_wide import kda_chunk_prep_wide
from k31dsl.ops.kda.decode import kda_decode_step, kda_replay_prefix
from k31dsl.ops.kda.gate import GATE_LOWER, GATE_SOFTPLUS
from k31dsl.ops.nn import head_norm_gate_rows, short_conv_commit_rows, short_conv_rows
from k31dsl.model.layers.common import memo

(kda_chunk_prep, kda_chunk_state, kda_decode_step, kda_replay_prefix, head_norm_gate_rows, short_conv_commit_rows,
 short_conv_rows, kda_chunk_prep_wide, kda_chunk_pair_merge) = memo(
    kda_chunk_prep, kda_chunk_state, kda_decode_step, kda_replay_prefix, head_norm_gate_rows, short_conv_commit_rows,
    short_conv_rows, kda_chunk_prep_wide, kda_chunk_pair_merge)

CONV_NAMES = ("q", "k", "v")
# The prefill's prep kernel: "auto" (under the lower-bound gate at the model's chunk 32 whole-chunk
# halves of 16 paired, ops/kda/chunk_pair.py; otherwise chunk_kda's default_tiling at that chunk:
# the whole-chunk prep at 16 under the lower bound, sub-chunk steps for other gates), "sub", "wide"
# or "pair" (the last two under the lower-bound gate, "wide" at chunk 16/32/64 and "pair" at 32/64,
# else "sub"). benchmarks/model_profile.py --kda-prep compares them.
KDA_PREP = "auto"


@k.kernel
def copy_state_rows(src: k.Tensor[k.f32, "S", "HV", "A", "B"], src_rows: k.Tensor[k.i32, "N"],
                    dst: k.Tensor[k.f32, "SD", "HV", "A", "B"], dst_rows: k.Tensor[k.i32, "N"],
                    BA: k.constexpr = 128, BB: k.constexpr = 128):
    # dst[dst_rows[n]] = src[src_rows[n]], one (row, head) per program
    for n, hv in k.grid(src_rows.shape[0], src.shape[1]):
        dst[dst_rows[n], hv, k.span(0, BA), k.span(0, BB)] = \
            src[src_rows[n], hv, k.span(0, BA, other=0.0), k.span(0, BB, other=0.0)]


copy_state_rows = memo(copy_state_rows)


def chunk_size(t: int) -> int:
    """chunk_kda's chunk for a prefill of t tokens: the smallest of 16/32 that holds it (fewer
    padded rows under the interpreter), else 32 (measured on an H200 at T=8192 H=96: 2.81 ms at
    chunk 32 against 3.13 at 64 with the sub-chunk prep, 2.12 with the whole-chunk one)."""
    return min(32, max(16, next_pow2(t)))


def kda_dims(cfg):
    return cfg.kda_heads, cfg.kda_value_heads, cfg.kda_head_dim, cfg.kda_value_dim


def gate_args(cfg):
    """(GATE constexpr, lower bound) of the config's gate."""
    if cfg.kda_gate == "lower_bound":
        return GATE_LOWER, float(cfg.kda_lower_bound)
    return GATE_SOFTPLUS, 0.0


def prepared_weights(cfg, weights: dict) -> dict:
    """Derived KDA weights: A_log fp32 [HV], dt_bias fp32 [HV, K] (the kernels' layouts)."""
    import torch
    out = {}
    H, HV, K, V = kda_dims(cfg)
    for l in cfg.kda_layers:
        a = f"layers.{l}.attn."
        out[f"l{l}_kda_a_log"] = weights[a + "A_log"].to(torch.float32).contiguous()
        out[f"l{l}_kda_dt_bias"] = weights[a + "dt_bias"].to(torch.float32).reshape(HV, K).contiguous()
    return out


def _projections(g, l, x, n_seqs, q_len):
    """q, k, v pre-conv inputs [N, T, C] and the raw gate, beta, output gate rows."""
    a = f"layers.{l}.attn."
    pre = {}
    for c in CONV_NAMES:
        lin = g.linear(x, a + f"{c}_proj", f"l{l}_{c}_lin")
        pre[c] = g.reshape(lin, (n_seqs, q_len, lin.shape[1]), f"l{l}_{c}_pre")
    fa = g.linear(x, a + "f_a", f"l{l}_f_a")
    graw = g.linear(fa, a + "f_b", f"l{l}_graw")
    beta = g.linear(x, a + "b_proj", f"l{l}_beta", act="sigmoid")
    ogate = g.linear(x, a + "g_proj", f"l{l}_ogate")
    return pre, graw, beta, ogate


def _conv(g, l, pre, update: bool):
    """silu(conv(pre)) per q/k/v with the slot's conv state (updated in place when `update`)."""
    out = {}
    for c in CONV_NAMES:
        x = pre[c]
        n, t, ch = x.shape
        state = g.state(f"kda{l}_conv_{c}", g.runner_states[f"kda{l}_conv_{c}"])
        y = g.tensor(f"l{l}_{c}_conv", (n, t, ch))
        tiles = {"BT": max(1, min(16, next_pow2(t))), "BC": min(64, next_pow2(ch))}
        res = g.p.call(short_conv_rows, x, g.weight(f"layers.{l}.attn.{c}_conv"), state, g.state_slots, y,
                       UPDATE=update, **tiles)
        out[c] = res[-1] if isinstance(res, tuple) else res
    return out


def _output(g, l, o_heads, ogate):
    """rmsnorm_per_head(o) * sigmoid(gate) @ o_proj^T -> [T, d]."""
    H, HV, K, V = kda_dims(g.cfg)
    T = ogate.shape[0]
    y = g.tensor(f"l{l}_onorm", (T, HV * V))
    y = g.p.call(head_norm_gate_rows, o_heads, g.weight(f"layers.{l}.attn.o_norm"), ogate, y, g.cfg.rms_eps,
                 BM=max(1, min(8, next_pow2(T))), BV=max(16, next_pow2(V)))
    return g.linear(y, f"layers.{l}.attn.o_proj", f"l{l}_attn_out")


def prefill_chunk_map(t_real: int, t_pad: int) -> tuple[list, list, list]:
    """chunk_kda's varlen map for a prefill padded to t_pad rows: sequence 0 is the t_real real
    tokens, sequence 1 the padding (so every output row is computed: no undefined rows flow on).
    Chunk rows (first token, end of its sequence) padded to the program's fixed count with empty
    chunks; per-sequence first chunks; cu_seqlens."""
    bt = chunk_size(t_pad)
    info = [(t, t_real) for t in range(0, t_real, bt)] + [(t, t_pad) for t in range(t_real, t_pad, bt)]
    n0 = -(-t_real // bt)
    seq_chunks = [0, n0, len(info)]
    info += [(t_pad, t_pad)] * (max_chunks(t_pad) - len(info))
    return info, seq_chunks, [0, t_real, t_pad]


def max_chunks(t_pad: int) -> int:
    return -(-t_pad // chunk_size(t_pad)) + 1


def chunk_prep(g, l, q, kk, v, graw, beta, info, nt: int, bt: int):
    """kda_chunk_prep of layer l (gate and L2 norm in-kernel) over the chunk map `info` (nt chunks
    of bt rows): (w, u, qg, kb, aqk, gamma), the per-chunk factors every state pass reads."""
    H, HV, K, V = kda_dims(g.cfg)
    f32 = g.cfg.dtype == "float32"
    mt = k.f32 if f32 else k.bf16
    prec, solve, keep = ("ieee", "ieee", k.f32) if f32 else PREP_VARIANTS[DEFAULT_VARIANT]
    shapes = {"w": (nt, HV, bt, K), "u": (nt, HV, bt, V), "qg": (nt, HV, bt, K), "kb": (nt, HV, bt, K),
              "aqk": (nt, HV, bt, bt)}
    outs = [g.tensor(f"l{l}_kda_{n}", shape, mt) for n, shape in shapes.items()]
    outs.append(g.tensor(f"l{l}_kda_gamma", (nt, HV, K), k.f32))
    gate, lb = gate_args(g.cfg)
    prep = KDA_PREP
    if KDA_PREP == "auto":
        prep = "pair" if gate == GATE_LOWER and bt == 32 else default_tiling(gate == GATE_LOWER, bt)[1]
    if prep == "pair" and gate == GATE_LOWER and bt in (32, 64):
        return paired_prep(g, l, q, kk, v, graw, beta, info, nt, bt, outs, lb, mt, prec, solve)
    if prep == "wide" and gate == GATE_LOWER:
        return g.p.call(kda_chunk_prep_wide, q, kk, v, graw, beta, g.weight(f"l{l}_kda_a_log"),
                        g.weight(f"l{l}_kda_dt_bias"), info, *outs, K ** -0.5, lb, L2=True, PREC=prec, SOLVE=solve,
                        BK=K, BVV=V, BT=bt)
    return g.p.call(kda_chunk_prep, q, kk, v, graw, beta, g.weight(f"l{l}_kda_a_log"), g.weight(f"l{l}_kda_dt_bias"),
                    info, *outs, K ** -0.5, lb, GATE=gate, SAFE=(gate == GATE_LOWER), L2=True, PREC=prec,
                    SOLVE=solve, KEEP=keep, BC=SUB_CHUNK, BK=K, BVV=V, BT=bt)


def paired_prep(g, l, q, kk, v, graw, beta, info, nt: int, bt: int, outs, lb, mt, prec, solve):
    """chunk_prep by halves (ops/kda/chunk_pair.py): the whole-chunk prep writes chunks of bt / 2
    rows into [nt, 2 HV, bt / 2, *] tensors, the merge folds each pair into one chunk of bt in
    place, and `outs` (the chunk-shaped tensors) receive them by reshape (a view once the memory
    plan aliases it)."""
    H, HV, K, V = kda_dims(g.cfg)
    hb = bt // 2
    halves = [g.tensor(f"{t.storage}_halves", (nt, 2 * HV, hb, t.shape[3]), mt) for t in outs[:5]]
    halves.append(g.tensor(f"l{l}_kda_gamma_halves", (nt, 2 * HV, K), k.f32))
    halves = g.p.call(kda_chunk_prep_wide, q, kk, v, graw, beta, g.weight(f"l{l}_kda_a_log"),
                      g.weight(f"l{l}_kda_dt_bias"), info, *halves, K ** -0.5, lb, L2=True, PAIR=True, PREC=prec,
                      SOLVE=solve, BK=K, BVV=V, BT=hb)
    merged = g.p.call(kda_chunk_pair_merge, *halves, outs[5], PREC="ieee" if mt == k.f32 else "tf32",
                      BT=hb, BK=K, BVV=V)
    return tuple(g.p.host("reshape", [t], [dst]) for t, dst in zip(merged[:5], outs[:5])) + (merged[5],)


def add_kda_prefill(g, l, x):
    """One sequence's chunk (T rows: the real tokens, then padding to the bucket) with earlier
    context in the slot's state. The conv states are only read by the convolution, then moved
    on by the real tokens alone (short_conv_commit_rows with the real length); the recurrence
    treats the padding as a second sequence whose final state is dropped."""
    cfg = g.cfg
    H, HV, K, V = kda_dims(cfg)
    T = x.shape[0]
    pre, graw, beta, ogate = _projections(g, l, x, 1, T)
    conv = _conv(g, l, pre, update=False)
    real = g.input("prefill_len", (1,), k.i32)
    for c in CONV_NAMES:
        state = g.state(f"kda{l}_conv_{c}", g.runner_states[f"kda{l}_conv_{c}"])
        g.p.call(short_conv_commit_rows, pre[c], state, g.state_slots, real,
                 BC=min(256, next_pow2(pre[c].shape[2])))
    q = g.reshape(conv["q"], (T, H, K), f"l{l}_q")
    kk = g.reshape(conv["k"], (T, H, K), f"l{l}_k")
    v = g.reshape(conv["v"], (T, HV, V), f"l{l}_v")
    graw = g.reshape(graw, (T, HV, K), f"l{l}_graw3")
    bt = chunk_size(T)
    nt = max_chunks(T)
    info = g.input("kda_chunk_info", (nt, 2), k.i32)
    seq_chunks = g.input("kda_seq_chunks", (3,), k.i32)
    cu = g.input("kda_cu", (3,), k.i32)
    w, u, qg, kb, aqk, gam = chunk_prep(g, l, q, kk, v, graw, beta, info, nt, bt)
    f32 = cfg.dtype == "float32"
    pool = g.state(f"kda{l}_pool", g.runner_states[f"kda{l}_pool"])
    h0 = g.tensor(f"l{l}_kda_h0", (2, HV, V, K), k.f32)
    # h0 = [the slot's state, the spare row] (the padding sequence's start: any finite state)
    h0 = g.p.call(copy_state_rows, pool, g.input("h0_rows", (2,), k.i32), h0, g.input("h0_dst", (2,), k.i32),
                  BA=V, BB=K)
    ht = g.tensor(f"l{l}_kda_ht", (2, HV, V, K), k.f32)
    o = g.tensor(f"l{l}_kda_o", (T, HV, V))
    ht, o = g.p.call(kda_chunk_state, w, u, qg, kb, aqk, gam, seq_chunks, cu, h0, ht, o, HAS_H0=True,
                     STORE_HT=True, VFIRST=True, PREC="ieee" if f32 else "tf32", BK=K, BT=bt, BV=min(32, V))
    pool = g.state(f"kda{l}_pool", g.runner_states[f"kda{l}_pool"])
    g.p.call(copy_state_rows, ht, g.input("row_zero", (1,), k.i32), pool, g.state_slots, BA=V, BB=K)
    return _output(g, l, o, ogate)


def add_kda_decode(g, l, x, verify: bool = False):
    """N sequences x n tokens over the state pool (n = 1: decode, updates states in place;
    verify: states only read, replay data and pre-conv inputs kept for `add_commit`)."""
    cfg = g.cfg
    H, HV, K, V = kda_dims(cfg)
    N, n = g.shape.n_seqs, g.shape.q_len
    pre, graw, beta, ogate = _projections(g, l, x, N, n)
    if verify:       # the pre-conv inputs go to runner buffers: the commit replays the accepted ones
        for c in CONV_NAMES:
            keep = g.state(f"kda{l}_keep_{c}", g.runner_states[f"kda{l}_keep_{c}"])
            pre[c] = g.reshape(pre[c], keep.shape, None, into=keep)
    conv = _conv(g, l, pre, update=not verify)
    q = g.reshape(conv["q"], (N, n, H, K), f"l{l}_q")
    kk = g.reshape(conv["k"], (N, n, H, K), f"l{l}_k")
    v = g.reshape(conv["v"], (N, n, HV, V), f"l{l}_v")
    graw = g.reshape(graw, (N, n, HV, K), f"l{l}_graw4")
    beta = g.reshape(beta, (N, n, HV), f"l{l}_beta3")
    pool = g.state(f"kda{l}_pool", g.runner_states[f"kda{l}_pool"])
    o = g.tensor(f"l{l}_kda_o", (N, n, HV, V))
    if verify:
        rk = g.state(f"kda{l}_replay_k", g.runner_states[f"kda{l}_replay_k"])
        ru = g.state(f"kda{l}_replay_u", g.runner_states[f"kda{l}_replay_u"])
        rg = g.state(f"kda{l}_replay_g", g.runner_states[f"kda{l}_replay_g"])
    else:
        rk = ru = rg = g.input("no_replay", (1, 1, 1, 1), k.f32)
    gate, lb = gate_args(cfg)
    res = g.p.call(kda_decode_step, q, kk, v, graw, beta, pool, g.state_slots, o, g.weight(f"l{l}_kda_a_log"),
                   g.weight(f"l{l}_kda_dt_bias"), rk, ru, rg, K ** -0.5, lb, GATE=gate, L2NORM=True,
                   REPLAY=verify, UPDATE=not verify, VFIRST=True, BK=max(16, next_pow2(K)), BV=min(16, V),
                   PREFETCH=n > 1)          # one token: nothing to prefetch (and the one-warp config)
    o = [r for r in res if r.storage == o.storage][0] if isinstance(res, tuple) else res
    o = g.reshape(o, (N * n, HV, V), f"l{l}_kda_o3")
    return _output(g, l, o, ogate)


def add_commit(g, l):
    """After a verify: replay the first accepted[i] tokens of (k, u, g) onto the pool rows and
    the first accepted[i] pre-conv inputs onto the conv states."""
    H, HV, K, V = kda_dims(g.cfg)
    pool = g.state(f"kda{l}_pool", g.runner_states[f"kda{l}_pool"])
    acc = g.input("accepted", (g.shape.n_seqs,), k.i32)
    rk, ru, rg = (g.state(f"kda{l}_replay_{c}", g.runner_states[f"kda{l}_replay_{c}"]) for c in "kug")
    rows = g.input("checkpoint_rows", (g.shape.n_seqs,), k.i32)     # = state_slots (the pool is the checkpoint)
    g.p.call(kda_replay_prefix, pool, g.state_slots, pool, rows, rk, ru, rg, acc, VFIRST=True,
             BK=max(16, next_pow2(K)), BV=min(16, V))
    for c in CONV_NAMES:
        keep = g.state(f"kda{l}_keep_{c}", g.runner_states[f"kda{l}_keep_{c}"])
        state = g.state(f"kda{l}_conv_{c}", g.runner_states[f"kda{l}_conv_{c}"])
        g.p.call(short_conv_commit_rows, keep, state, g.state_slots, acc, BC=min(256, next_pow2(keep.shape[2])))


def new_states(cfg, num_slots: int, device) -> dict:
    """Pool ([rows, HV, V, K]) and conv states of every KDA layer (one spare row for padding)."""
    import torch
    H, HV, K, V = kda_dims(cfg)
    out = {}
    for l in cfg.kda_layers:
        out[f"kda{l}_pool"] = torch.zeros(num_slots + 1, HV, V, K, dtype=torch.float32, device=device)
        for c, ch in zip(CONV_NAMES, (H * K, H * K, HV * V)):
            out[f"kda{l}_conv_{c}"] = torch.zeros(num_slots + 1, 3, ch, dtype=torch.float32, device=device)
    return out


def replay_buffers(cfg, n_seqs: int, n: int, dtype, device) -> dict:
    """Verify-step buffers the commit reads: replay (k, u, g) fp32 and the pre-conv inputs."""
    import torch
    H, HV, K, V = kda_dims(cfg)
    f32 = dict(dtype=torch.float32, device=device)
    out = {}
    for l in cfg.kda_layers:
        out[f"kda{l}_replay_k"] = torch.zeros(n_seqs, n, H, K, **f32)
        out[f"kda{l}_replay_u"] = torch.zeros(n_seqs, n, HV, V, **f32)
        out[f"kda{l}_replay_g"] = torch.zeros(n_seqs, n, HV, K, **f32)
        for c, ch in zip(CONV_NAMES, (H * K, H * K, HV * V)):
            out[f"kda{l}_keep_{c}"] = torch.zeros(n_seqs, n, ch, dtype=dtype, device=device)
    return out

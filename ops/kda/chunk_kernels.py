"""The two kernels of chunk_kda (FlashKDA-style: the intra-chunk matrices never leave the chip
until they are final per-chunk operands of the state pass). Math: research/kda.md §2.1.

Kernel 1, `kda_chunk_prep`, grid (chunk, value head), all chunks in parallel. It walks the chunk
in sub-chunks of BC (=16) rows, unrolled: L2 norm of q/k, gate (raw -> log decay, in-kernel),
chunk-local cumsum G, the 16x16 blocks of Aqk = tril(Qt Kh^T) and Akk = strict(beta Kt Kh^T)
with anchors that are never a future row, the UT solve by block forward substitution
((I + Akk_cc)^-1 of each diagonal block as a Neumann product, off-diagonal blocks by dots), and
writes per chunk: W = Ainv beta Kt, U = Ainv beta V, Qt = scale q exp(G), Kb = k exp(G_C - G),
Aqk (lower blocks only) and gamma = exp(G_C).

Anchors (research §2.2). Row i in sub-chunk c, column j in sub-chunk c' (G decreasing in rows):
  * off-diagonal (c' < c): exp(G_i - G_j) = exp(G_i - P_c) * exp(P_c - G_j) with P_c = G of the
    row before sub-chunk c. Both factors are <= 1 (only underflow, harmless) for any gate: the kept
    key tiles k exp(P_c - G) are re-anchored by the decay of each sub-chunk as it completes
    (exp(E_c' - G_j) when written, E_c' = G of the last row of c'), so the q/k tiles of the
    sub-chunk are the A operands of all its blocks, and after the last sub-chunk they are Kb.
  * diagonal (SAFE, lower-bound gate lb >= -5): exp(G_i - P_c) * exp(P_c - G_j); the second factor
    is at most exp(BC * |lb|) = exp(80) < fp32 max. P_c is a past row, so outputs are causal.
  * diagonal (not SAFE: softplus gate or a given log decay, unbounded): exp(min(G_i - G_j, 0))
    elementwise per column (CUDA-core work, 16 columns per sub-chunk), exact for any gate.

Kernel 2, `kda_chunk_state`, grid (V / BV, sequence, value head), sequential over the sequence's
chunks with the fp32 state S [K, BV] in registers: Vn = U - W S, O = Qt S + tril(Aqk) Vn,
S <- gamma S + Kb^T Vn. Dots take MT operands (bf16 on the GPU: tensor cores) with fp32
accumulation, like fla's fwd_h."""

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS
from k31dsl.ops.kda.gate import GATE_LOWER, GATE_NONE, GATE_SOFTPLUS, gate_value

L2_EPS = 1e-6
PRECISIONS = ("ieee", "tf32", "bf16")     # "bf16": operands rounded to bf16 (tensor cores at full rate)
DOT_PRECISIONS = ("ieee", "tf32")         # k.dot's own (the state kernel's operands are MT already)


@k.func
def row_of(x, rid, i):
    """Row i of tile x [R, C] as [C]; exact (the other rows add zeros)."""
    return k.sum(k.where(rid[:, None] == i, x, 0.0), axis=0)


@k.func
def mm(a, b, PREC):
    """a @ b with fp32 accumulation; PREC "bf16" rounds the operands to bf16 first."""
    if PREC == "bf16":
        return k.dot(a.to(k.bf16), b.to(k.bf16))
    return k.dot(a, b, precision=PREC)


@k.func
def l2norm_rows(x):
    return x * k.rsqrt(k.sum(x * x, axis=1) + L2_EPS)[:, None]


@k.func
def unit_lower_inverse(L, rid, PREC):
    """(I + L)^-1 for strictly lower-triangular L [16, 16] (or a block diagonal of such blocks) as
    the exact Neumann product (I - L)(I + L^2)(I + L^4)(I + L^8) (L^16 = 0): six 16x16 dots
    instead of 15 dependent row updates (each a cross-thread reduction). Products of lower-triangular matrices keep exact zeros
    above the diagonal, so row i still depends on rows <= i only. PREC: the solve's precision
    ("ieee" for f32 inputs; "tf32" for 16-bit ones, whose W and U are rounded to bf16 anyway)."""
    eye = k.where(rid[:, None] == rid[None, :], 1.0, 0.0)
    l2 = mm(L, L, PREC)
    l4 = mm(l2, l2, PREC)
    l8 = mm(l4, l4, PREC)
    x = mm(eye - L, eye + l2, PREC)
    x = mm(x, eye + l4, PREC)
    return mm(x, eye + l8, PREC)


FACTOR_BOUND = 60.0     # largest decay from a sub-chunk's start that a factorised diagonal column takes


@k.func
def diag_exact(qs, kc, gc, rid, first):
    """Diagonal-block scores without a factorisation: columns j >= first (a runtime index; the
    others stay 0) of sum_d a_id k_jd exp(G_id - G_jd) for a = qs (Aqk) and a = kc (Akk), exponent
    clamped at 0 (rows i < j are masked later)."""
    aq = k.zeros((rid.shape[0], rid.shape[0]), k.f32)
    ak = k.zeros((rid.shape[0], rid.shape[0]), k.f32)
    for j in range(first, rid.shape[0]):
        kj = row_of(kc, rid, j)
        gj = row_of(gc, rid, j)
        p = k.exp(k.minimum(gc - gj[None, :], 0.0)) * kj[None, :]
        aq = k.where(rid[None, :] == j, k.sum(qs * p, axis=1)[:, None], aq)
        ak = k.where(rid[None, :] == j, k.sum(kc * p, axis=1)[:, None], ak)
    return aq, ak


@k.func
def half_chunk(chunk_info, nh, hv0, NH, BT):
    """Program (nh, hv0) of a prep grid over chunk_info.shape[0] * NH: (chunk n, half, output head,
    first row, its sequence's end). NH = 2 (pairing, ops/kda/chunk_pair.py): each program one half
    of BT rows, written as output head 2 hv0 + half of the [NT, 2 HV, BT, *] views; NH = 1: whole."""
    n = nh // NH
    half = nh % NH
    return n, half, hv0 * NH + half, chunk_info[n, 0] + half * BT, chunk_info[n, 1]


@k.func
def load_sub_chunk(q, kk, v, g, beta, r0, t1, h, hv, rid, BK, BVV):
    """Raw tiles of the 16 rows from r0 (rows at or past t1, the sequence end, read 0)."""
    live = (r0 + rid) < t1
    return (live, k.load(q, (k.span(r0, rid.shape[0]), h, k.span(0, BK)), mask=live[:, None], other=0.0),
            k.load(kk, (k.span(r0, rid.shape[0]), h, k.span(0, BK)), mask=live[:, None], other=0.0),
            k.load(v, (k.span(r0, rid.shape[0]), hv, k.span(0, BVV)), mask=live[:, None], other=0.0),
            k.load(beta, (k.span(r0, rid.shape[0]), hv), mask=live, other=0.0),
            k.load(g, (k.span(r0, rid.shape[0]), hv, k.span(0, BK)), mask=live[:, None], other=0.0))


# One config, no autotuning: every prep config is a ~40 s ptxas run per argument specialisation
# (the oracle-check shape, H=96 and H=12 each get their own), and the tuner could not tell the
# PREFETCH pair apart. ptxas for sm_90a with the GPU's divisibility-16 specialisation: 8 warps
# 255 registers + 472 B stack, the same with PREFETCH off or the kept tiles in bf16 (the kept
# tiles are not the register hog); the prefetch hides 3 of the 4 sub-chunk load latencies.
# chunk_kda always passes BT, so these are launch options per chunk size, never tuned. Chunk 32
# (2 sub-chunks per program): 226 registers, no spill at 8 warps (4 warps: 255 + 128 B).
PREP_CONFIGS = [{"BT": 64, "PREFETCH": True, "num_warps": 8, "num_stages": 1},
                {"BT": 32, "PREFETCH": True, "num_warps": 8, "num_stages": 1},
                # chunk 16, the halves of a paired chunk 32 (one sub-chunk; softplus gate: 4 warps
                # 162 registers, three programs per SM)
                {"BT": 16, "num_warps": 4, "num_stages": 1}]


@k.kernel(configs=PREP_CONFIGS)
def kda_chunk_prep(q: k.Tensor["XT", "T", "H", "K"], kk: k.Tensor["XT", "T", "H", "K"],
                   v: k.Tensor["XT", "T", "HV", "V"], g: k.Tensor["GT", "T", "HV", "K"],
                   beta: k.Tensor["BETAT", "T", "HV"], a_log: k.Tensor[k.f32, "HV"],
                   dt_bias: k.Tensor[k.f32, "HV", "K"], chunk_info: k.Tensor[k.i32, "NT", "2"],
                   w: k.Tensor["MT", "NT", "HO", "BT", "K"], u: k.Tensor["MT", "NT", "HO", "BT", "V"],
                   qg: k.Tensor["MT", "NT", "HO", "BT", "K"], kb: k.Tensor["MT", "NT", "HO", "BT", "K"],
                   aqk: k.Tensor["MT", "NT", "HO", "BT", "BA"], gam: k.Tensor[k.f32, "NT", "HO", "K"],
                   scale: k.f32, lb: k.f32,
                   XT: k.constexpr[FLOAT_INPUTS] = k.bf16, GT: k.constexpr[FLOAT_INPUTS] = k.f32,
                   BETAT: k.constexpr[FLOAT_INPUTS] = k.f32, MT: k.constexpr[k.bf16, k.f32] = k.bf16,
                   GATE: k.constexpr[GATE_NONE, GATE_SOFTPLUS, GATE_LOWER] = GATE_LOWER,
                   SAFE: k.constexpr = True, L2: k.constexpr = True, PREC: k.constexpr[PRECISIONS] = "tf32",
                   SOLVE: k.constexpr[PRECISIONS] = "tf32", KEEP: k.constexpr[k.bf16, k.f32] = k.f32,
                   PREFETCH: k.constexpr = True, PAIR: k.constexpr = False,
                   BT: k.constexpr = 64, BC: k.constexpr = 16, BK: k.constexpr = 128, BVV: k.constexpr = 128):
    NC = BT // BC
    assert BC == 16, "the diagonal blocks are inverted as 16x16 Neumann products"
    NH = 2 if PAIR else 1
    for nh, hv0 in k.grid(chunk_info.shape[0] * NH, v.shape[1]):
        n, half, hv, t0, t1 = half_chunk(chunk_info, nh, hv0, NH, BT)
        h = hv0 // (v.shape[1] // q.shape[1])
        alog = a_log[hv0]
        bias = dt_bias[hv0, k.span(0, BK)]
        rid = k.arange(0, BC)
        gp = k.zeros((BK,), k.f32)          # G of the row before the sub-chunk (0 at the chunk start)
        kcols, ws, us = (), (), ()
        nxt = load_sub_chunk(q, kk, v, g, beta, t0, t1, h, hv0, rid, BK, BVV)
        for c in k.static_range(NC):
            # PREFETCH: the next sub-chunk's loads are issued before this one's math (they cannot
            # move above this iteration's stores by themselves: outputs might alias the inputs);
            # costs ~0.1 KB more spill per thread on sm_90a, so it is a tuning choice
            if not PREFETCH and c > 0:
                nxt = load_sub_chunk(q, kk, v, g, beta, t0 + c * BC, t1, h, hv0, rid, BK, BVV)
            live, qc, kc, vc, bc, graw = nxt
            if PREFETCH and c + 1 < NC:
                nxt = load_sub_chunk(q, kk, v, g, beta, t0 + (c + 1) * BC, t1, h, hv0, rid, BK, BVV)
            qc, kc, vc, bc, graw = qc.to(k.f32), kc.to(k.f32), vc.to(k.f32), bc.to(k.f32), graw.to(k.f32)
            if L2:
                qc = l2norm_rows(qc)
                kc = l2norm_rows(kc)
            qc = qc * scale
            if GATE == GATE_NONE:
                a = graw
            else:                           # rows past the sequence decay by exp(0): G stays put
                a = k.where(live[:, None], gate_value(graw, alog, bias[None, :], lb, GATE), 0.0)
            # differences inside the sub-chunk come from its local cumsum lc (small magnitudes,
            # so exp(G_i - G_j) keeps fp32 accuracy after long runs of strong decay)
            lc = k.cumsum(a, axis=0)
            lend = row_of(lc, rid, BC - 1)
            gend = gp + lend
            e = k.exp(lc)                                      # exp(G_i - P_c) <= 1
            qe = qc * e
            ke = kc * e
            if SAFE:                                           # two tile exps per sub-chunk, the rest [BK] vectors
                einv = k.exp(-lc)                              # exp(P_c - G_j) <= exp(BC |lb|)
                kinv = kc * einv
                kcol = kinv * k.exp(lend)[None, :]             # exp(E_c - G_j) <= 1
                aq_d = mm(qe, kinv.T, PREC)
                ak_d = mm(ke, kinv.T, PREC)
            else:                                              # no bound on the decay: factorised where
                kcol = kc * k.exp(lend[None, :] - lc)          # the decay allows it, else exact
                # Column j of a diagonal block factorises as exp(G_i - P) exp(P - G_j) while its own
                # decay from the sub-chunk start stays within FACTOR_BOUND in every channel (then
                # exp(-lc_j) is finite, and a row i that decayed so far that exp(lc_i) underflows
                # carries a true factor below exp(-87 + FACTOR_BOUND)). Columns from the first one past
                # the bound (an extreme softplus gate) are computed exactly, one reduction step each.
                # Each column's choice depends on its own row only, so outputs stay causal.
                fits = k.min(lc, axis=1) >= -FACTOR_BOUND      # [BC]
                first = k.min(k.where(fits, BC, rid))          # BC: every column factorises
                kinv = kc * k.exp(k.minimum(-lc, FACTOR_BOUND))
                aq_x, ak_x = diag_exact(qc, kc, lc, rid, first)
                exact = (rid >= first)[None, :]
                aq_d = k.where(exact, aq_x, mm(qe, kinv.T, PREC))
                ak_d = k.where(exact, ak_x, mm(ke, kinv.T, PREC))
            aq_d = k.where(rid[:, None] >= rid[None, :], aq_d, 0.0)
            ak_d = k.where(rid[:, None] > rid[None, :], ak_d * bc[:, None], 0.0)
            aqk[n, hv, k.span(c * BC, BC), k.span(half * BT + c * BC, BC)] = aq_d.to(MT)
            eg = e * k.exp(gp)[None, :]                        # exp(G_i) <= 1
            rw = bc[:, None] * kc * eg                         # beta Kt
            ru = bc[:, None] * vc                              # beta V
            for c2 in k.static_range(c):                       # earlier sub-chunks: kcols[c2] is
                aq_o = mm(qe, kcols[c2].to(k.f32).T, PREC)     # k exp(P_c - G) (<= 1), so qe/ke are
                ak_o = mm(ke, kcols[c2].to(k.f32).T, PREC) * bc[:, None]   # the A operands of every block
                aqk[n, hv, k.span(c * BC, BC), k.span(half * BT + c2 * BC, BC)] = aq_o.to(MT)
                rw = rw - mm(ak_o, ws[c2].to(k.f32), SOLVE)
                ru = ru - mm(ak_o, us[c2].to(k.f32), SOLVE)
            ainv = unit_lower_inverse(ak_d, rid, SOLVE)            # BC == 16 (asserted above)
            wc = mm(ainv, rw, SOLVE)
            uc = mm(ainv, ru, SOLVE)
            w[n, hv, k.span(c * BC, BC), k.span(0, BK)] = wc.to(MT)
            u[n, hv, k.span(c * BC, BC), k.span(0, BVV)] = uc.to(MT)
            qg[n, hv, k.span(c * BC, BC), k.span(0, BK)] = (qc * eg).to(MT)
            # re-anchor the kept key tiles at P_(c+1) = E_c (decay across this sub-chunk, <= 1); the
            # new kcol is anchored there already. After the last sub-chunk they are Kb = k exp(G_C - G).
            dec = k.exp(lend)[None, :]
            kept = ()
            for c2 in k.static_range(c):
                kept = kept + ((kcols[c2].to(k.f32) * dec).to(KEEP),)
            kcols = kept + (kcol.to(KEEP),)
            ws, us = ws + (wc.to(KEEP),), us + (uc.to(KEEP),)
            gp = gend
        gam[n, hv, k.span(0, BK)] = k.exp(gp)
        for c in k.static_range(NC):
            kb[n, hv, k.span(c * BC, BC), k.span(0, BK)] = kcols[c].to(MT)


# ptxas for sm_90a with the GPU's divisibility-16 specialisation (the sizes and strides here are
# multiples of 16): every config below pipelines its W/U/Qt/Kb/Aqk loads through cp.async
# (num_stages 2), no spills except BV 128 (48 B). Registers / shared memory: BV 16 (4 warps) 155 /
# 120 KB, BV 32 (4 warps) 166 / 128 KB, BV 64 (8 warps) 206 / 144 KB, BV 128 (8 warps) 255 / 176 KB:
# one program per SM in every case (shared memory), so the grid's waves decide: at HV=96, N=1 BV
# 128 is one wave (96 programs), BV 32 three; at HV=12 BV 16 gives the most programs (96). The
# compiles take seconds, so the tuner picks among them per shape.
STATE_CONFIGS = [{"BT": 64, "BV": 64, "num_warps": 8, "num_stages": 2},
                 {"BT": 64, "BV": 128, "num_warps": 8, "num_stages": 2},
                 {"BT": 64, "BV": 32, "num_warps": 4, "num_stages": 2},
                 {"BT": 64, "BV": 16, "num_warps": 4, "num_stages": 2},
                 {"BT": 64, "BV": 16, "num_warps": 4, "num_stages": 3},
                 {"BT": 64, "BV": 32, "num_warps": 4, "num_stages": 3},
                 # chunk 32 (the whole-chunk prep's size): half the operand tiles, twice the steps.
                 # KDA run 9 (H200): at HV = 96 BV 64 / 2 stages won (0.70 ms at T=8192), at HV = 12
                 # the deepest pipeline did (BV 32: 3 stages 1.53 ms, 2 stages 2.12 ms at T=32768),
                 # so few-head shapes are load-latency bound: deeper ones are candidates too.
                 {"BT": 32, "BV": 64, "num_warps": 4, "num_stages": 2},
                 {"BT": 32, "BV": 64, "num_warps": 4, "num_stages": 3},
                 {"BT": 32, "BV": 128, "num_warps": 8, "num_stages": 2},
                 {"BT": 32, "BV": 32, "num_warps": 4, "num_stages": 3},
                 {"BT": 32, "BV": 32, "num_warps": 4, "num_stages": 4},
                 {"BT": 32, "BV": 16, "num_warps": 4, "num_stages": 3},
                 {"BT": 32, "BV": 16, "num_warps": 4, "num_stages": 4},
                 {"BT": 32, "BV": 16, "num_warps": 4, "num_stages": 5},
                 {"BT": 32, "BV": 32, "num_warps": 4, "num_stages": 5},
                 # KDA run 18 (T=8192 H=96): BV 64 / 4 warps / 3 stages 0.593 ms, BV 16 2.07 (122 KB of
                 # shared memory: one 4-warp program per SM); each program walks all 256 chunks at
                 # ~2.3 µs a step, so more warps per step are candidates (not yet timed)
                 {"BT": 32, "BV": 64, "num_warps": 8, "num_stages": 3},
                 {"BT": 32, "BV": 128, "num_warps": 8, "num_stages": 3},
                 # chunk 16 (the whole-chunk prep's tile without the pair merge; not yet timed). sm_90a:
                 # BV 16 / 4 warps 132 registers, 35 KB (3 stages) or 61 KB (5): three programs per SM;
                 # BV 64 / 4 warps 191 registers, 50 KB: two
                 {"BT": 16, "BV": 64, "num_warps": 4, "num_stages": 3},
                 {"BT": 16, "BV": 64, "num_warps": 4, "num_stages": 5},
                 {"BT": 16, "BV": 64, "num_warps": 8, "num_stages": 3},
                 {"BT": 16, "BV": 32, "num_warps": 4, "num_stages": 4},
                 {"BT": 16, "BV": 128, "num_warps": 8, "num_stages": 3},
                 {"BT": 16, "BV": 16, "num_warps": 4, "num_stages": 5}]


@k.kernel(configs=STATE_CONFIGS)
def kda_chunk_state(w: k.Tensor["MT", "NT", "HV", "BT", "K"], u: k.Tensor["MT", "NT", "HV", "BT", "V"],
                    qg: k.Tensor["MT", "NT", "HV", "BT", "K"], kb: k.Tensor["MT", "NT", "HV", "BT", "K"],
                    aqk: k.Tensor["MT", "NT", "HV", "BT", "BT"], gam: k.Tensor[k.f32, "NT", "HV", "K"],
                    seq_chunks: k.Tensor[k.i32, "N1"], cu: k.Tensor[k.i32, "N1"],
                    h0: k.Tensor[k.f32, "NS", "HS", "KS", "VS"], ht: k.Tensor[k.f32, "NF", "HF", "KF", "VF"],
                    o: k.Tensor["OT", "T", "HV", "V"],
                    MT: k.constexpr[k.bf16, k.f32] = k.bf16, OT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                    HAS_H0: k.constexpr = False, STORE_HT: k.constexpr = False, VFIRST: k.constexpr = False,
                    PREC: k.constexpr[DOT_PRECISIONS] = "tf32",
                    BT: k.constexpr = 64, BK: k.constexpr = 128, BV: k.constexpr = 32):
    for pv, s, hv in k.grid(k.cdiv(o.shape[2], BV), cu.shape[0] - 1, o.shape[1]):
        c0 = seq_chunks[s]
        c1 = seq_chunks[s + 1]
        t0 = cu[s]
        t1 = cu[s + 1]
        cols = pv * BV
        ii = k.arange(0, BT)
        if HAS_H0 and VFIRST:           # states stored [V, K] (state_v_first, K contiguous)
            st = h0[s, hv, k.span(cols, BV, other=0.0), k.span(0, BK)].T
        elif HAS_H0:
            st = h0[s, hv, k.span(0, BK), k.span(cols, BV, other=0.0)]
        else:
            st = k.zeros((BK, BV), k.f32)
        for c in range(c0, c1):
            sd = st.to(MT)
            vn = u[c, hv, k.span(0, BT), k.span(cols, BV, other=0.0)].to(k.f32) - k.dot(w[c, hv, k.span(0, BT), k.span(0, BK)],
                                                                         sd, precision=PREC)
            vd = vn.to(MT)
            a = k.where(ii[:, None] >= ii[None, :], aqk[c, hv, k.span(0, BT), k.span(0, BT)], 0.0)
            ob = k.dot(qg[c, hv, k.span(0, BT), k.span(0, BK)], sd, precision=PREC) + k.dot(a, vd, precision=PREC)
            r0 = t0 + (c - c0) * BT
            k.store(o, (k.span(r0, BT), hv, k.span(cols, BV)), ob.to(OT), mask=(r0 + ii < t1)[:, None])
            kbt = kb[c, hv, k.span(0, BT), k.span(0, BK)].T
            st = gam[c, hv, k.span(0, BK)][:, None] * st + k.dot(kbt, vd, precision=PREC)
        if STORE_HT and VFIRST:
            ht[s, hv, k.span(cols, BV), k.span(0, BK)] = st.T
        elif STORE_HT:
            ht[s, hv, k.span(0, BK), k.span(cols, BV)] = st

"""`kda_chunk_prep_wide`: the prep kernel of chunk_kda written over whole-chunk tiles (an
alternative to chunk_kernels.kda_chunk_prep, chosen by `chunk_kda(_prep="wide")`; same outputs,
same layout, so kda_chunk_state consumes either).

Why (benchmarks/NOTES.md, KDA run 4): the sub-chunk prep walks a chunk in 4 dependent steps of
16 rows, ~190 CTA barriers and 288 small (M = 16) mma per program at 255 registers, one program
per SM, and costs 2.44 of the 3.13 ms at T=8192 H=96. Here every product is a [BT, *] x [*, BT or
K] tile product with no dependency between sub-chunks:

  * scores. Every anchor is a past row of the rows that use it (research §2.2; causality stays
    bit-exact): for the rows after column block c' (E = G at its last row), Aqk[:, c'] = (q
    exp(G - E)) . (k_c' exp(E - G_c'))^T with both factors <= 1; the four diagonal blocks in one
    product with row i anchored at P(i), the row before its block (exp(G_i - P) <= 1, exp(P - G_j)
    <= exp(16 |lb|)), the cross-block products of that one masked. Column operands are whole
    [BT, K] tiles with the other blocks zeroed (no tile slicing in the DSL): NC products of BT x K
    x BT per matrix instead of ten 16x16 blocks — NC times the multiply-adds, on tensor cores, and no
    chain through the sub-chunks. Needs a bounded per-row decay: the lower-bound gate (|lb| <= 5).
  * UT solve without substitution: D = the 16x16 diagonal blocks of Akk, (I + D)^-1 as the exact
    Neumann product (I - D)(I + D^2)(I + D^4)(I + D^8) on the whole [BT, BT] tile (block diagonal
    stays block diagonal), then N = (I + D)^-1 L_off is strictly block-lower with NC <= 4 block
    rows, N^NC = 0, and (I + Akk)^-1 = (I + N)^-1 (I + D)^-1: six [BT, BT] products at NC = 1,
    eight at 2, ten at 4.
  * W = Ainv (beta k exp(G)), U = Ainv (beta v): two [BT, BT] x [BT, K | V] products.

The diagonal factors come from the cumsum inside each block (|G_i - P(i)| <= 80); the off-diagonal
ones from the chunk-level cumsum (|G| <= BT |lb| = 320), whose differences lose ~|G| x 6e-8
relative: far below the bf16 rounding of the outputs."""

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS
from k31dsl.ops.kda.chunk_kernels import L2_EPS, PRECISIONS, half_chunk, l2norm_rows, mm, row_of, unit_lower_inverse
from k31dsl.ops.kda.gate import GATE_LOWER, gate_value

# KDA run 13 (H200, bf16, K = V = 128, chunk 32): 4 warps (255 registers + 40 B spill, two programs
# per SM) 1.434 ms at T=8192 H=96 against 2.631 at 8 warps (181 registers, one per SM): the prep is
# latency-bound per program, so programs per SM decide. A runtime loop over 2-4 chunks per program
# at 2 stages (the next chunk's loads under this one's math) lost at 8 warps (2.80 ms) and spills
# 280 B at 4, so it was taken out again. So was walking the channels in 2 or 4 slices per program
# (KDA run 15: 185 registers at 4 slices, but the extra passes cost 1.6x / 2.6x: 2.30 / 3.76 ms).
# Chunk 16 (the halves of a paired chunk 32, or chunk 16; `one_block`): 4 warps 96 registers (five
# programs per SM), 2 warps 168 (six); before `one_block` 133 (three) and 243 (four), 0.97 / 0.91 ms
# at T=8192 H=96 (KDA run 18).
WIDE_CONFIGS = [{"BT": 64, "num_warps": 8, "num_stages": 1}, {"BT": 32, "num_warps": 4, "num_stages": 1},
                {"BT": 32, "num_warps": 8, "num_stages": 1}, {"BT": 16, "num_warps": 4, "num_stages": 1},
                {"BT": 16, "num_warps": 2, "num_stages": 1}]


@k.func
def one_block(qc, kc, bc, gc, rid, live, v, t0, hv0, w, u, qg, kb, aqk, gam, n, hv, half, MT, PREC, SOLVE, BT, BK, BVV):
    """A chunk of one 16-row block (BT = 16: the halves of a paired chunk 32, or chunk 16): no
    off-diagonal products, and the block's anchor is the chunk start, so each exp is taken once
    (KDA run 18: 4280 SASS instructions per warp at 2 warps, of which 222 MUFU and 1138 FMUL for
    ~7 and ~35 full-tile passes; issue was ~45 % of the program's time). Qt = q exp(G) is also the
    row operand of Aqk, k exp(G) that of Akk and (times beta) W's right factor, and
    Kb = k exp(G_last - G) = (k exp(-G)) exp(G_last), the column operand times a row vector.
    |G| <= 16 |lb| = 80 keeps exp(-G) finite."""
    eg = k.exp(gc)
    qt = qc * eg                                                   # Qt, <= |q|
    kt = kc * eg                                                   # k exp(G), <= |k|
    cold = kc * k.exp(-gc)                                         # k exp(-G), <= exp(80) |k|
    glast = k.exp(row_of(gc, rid, BT - 1))
    qg[n, hv, k.span(0, BT), k.span(0, BK)] = qt.to(MT)
    kb[n, hv, k.span(0, BT), k.span(0, BK)] = (cold * glast[None, :]).to(MT)
    gam[n, hv, k.span(0, BK)] = glast
    if PREC == "bf16":
        qs, ks, cs = qt.to(k.bf16), kt.to(k.bf16), cold.to(k.bf16)
    else:
        qs, ks, cs = qt, kt, cold
    aq = k.where(rid[:, None] >= rid[None, :], mm(qs, cs.T, PREC), 0.0)
    ak = k.where(rid[:, None] > rid[None, :], mm(ks, cs.T, PREC) * bc[:, None], 0.0)
    aqk[n, hv, k.span(0, BT), k.span(half * BT, BT)] = aq.to(MT)
    store_wu(unit_lower_inverse(ak, rid, SOLVE), bc[:, None] * kt, bc, v, t0, hv0, live, w, u, n, hv, MT, SOLVE,
             BT, BK, BVV)


@k.func
def store_wu(ainv, beta_kt, bc, v, t0, hv0, live, w, u, n, hv, MT, SOLVE, BT, BK, BVV):
    """W = Ainv beta Kt and U = Ainv beta V (v loaded last: the score products are the register peak)."""
    w[n, hv, k.span(0, BT), k.span(0, BK)] = mm(ainv, beta_kt, SOLVE).to(MT)
    vc = k.load(v, (k.span(t0, BT), hv0, k.span(0, BVV)), mask=live[:, None], other=0.0).to(k.f32)
    u[n, hv, k.span(0, BT), k.span(0, BVV)] = mm(ainv, bc[:, None] * vc, SOLVE).to(MT)


@k.kernel(configs=WIDE_CONFIGS)
def kda_chunk_prep_wide(q: k.Tensor["XT", "T", "H", "K"], kk: k.Tensor["XT", "T", "H", "K"],
                        v: k.Tensor["XT", "T", "HV", "V"], g: k.Tensor["GT", "T", "HV", "K"],
                        beta: k.Tensor["BETAT", "T", "HV"], a_log: k.Tensor[k.f32, "HV"],
                        dt_bias: k.Tensor[k.f32, "HV", "K"], chunk_info: k.Tensor[k.i32, "NT", "2"],
                        w: k.Tensor["MT", "NT", "HO", "BT", "K"], u: k.Tensor["MT", "NT", "HO", "BT", "V"],
                        qg: k.Tensor["MT", "NT", "HO", "BT", "K"], kb: k.Tensor["MT", "NT", "HO", "BT", "K"],
                        aqk: k.Tensor["MT", "NT", "HO", "BT", "BA"], gam: k.Tensor[k.f32, "NT", "HO", "K"],
                        scale: k.f32, lb: k.f32,
                        XT: k.constexpr[FLOAT_INPUTS] = k.bf16, GT: k.constexpr[FLOAT_INPUTS] = k.f32,
                        BETAT: k.constexpr[FLOAT_INPUTS] = k.f32, MT: k.constexpr[k.bf16, k.f32] = k.bf16,
                        L2: k.constexpr = True, PAIR: k.constexpr = False, PREC: k.constexpr[PRECISIONS] = "bf16",
                        SOLVE: k.constexpr[PRECISIONS] = "tf32",
                        BT: k.constexpr = 64, BC: k.constexpr = 16, BK: k.constexpr = 128, BVV: k.constexpr = 128):
    NC = BT // BC
    NH = 2 if PAIR else 1           # PAIR: chunk_info maps chunks of 2 BT; each program one half
    assert BC == 16 and NC <= 4, "16-row diagonal blocks, at most 4 per chunk (N^4 = 0)"
    for nh, hv0 in k.grid(chunk_info.shape[0] * NH, v.shape[1]):
        n, half, hv, t0, t1 = half_chunk(chunk_info, nh, hv0, NH, BT)
        h = hv0 // (v.shape[1] // q.shape[1])
        rid = k.arange(0, BT)
        live = (t0 + rid) < t1                 # rows past the sequence end read 0 and do not decay
        # loads in order of use (v last): the score loop is the register peak
        qc = k.load(q, (k.span(t0, BT), h, k.span(0, BK)), mask=live[:, None], other=0.0).to(k.f32)
        kc = k.load(kk, (k.span(t0, BT), h, k.span(0, BK)), mask=live[:, None], other=0.0).to(k.f32)
        graw = k.load(g, (k.span(t0, BT), hv0, k.span(0, BK)), mask=live[:, None], other=0.0).to(k.f32)
        bc = k.load(beta, (k.span(t0, BT), hv0), mask=live, other=0.0).to(k.f32)
        if L2:                                                     # the scale rides on q's row factor
            qc = qc * (k.rsqrt(k.sum(qc * qc, axis=1) + L2_EPS) * scale)[:, None]
            kc = l2norm_rows(kc)
        else:
            qc = qc * scale
        a = k.where(live[:, None], gate_value(graw, a_log[hv0], dt_bias[hv0, k.span(0, BK)][None, :], lb, GATE_LOWER),
                    0.0)
        gc = k.cumsum(a, axis=0)                                   # G_i (<= 0, falling)
        if NC == 1:
            one_block(qc, kc, bc, gc, rid, live, v, t0, hv0, w, u, qg, kb, aqk, gam, n, hv, half, MT, PREC, SOLVE,
                      BT, BK, BVV)
        else:
            # G_i - P(i), P(i) = G of the row before i's block: the cumsum inside each block
            lc = k.reshape(k.cumsum(k.reshape(a, (NC, BC, BK)), axis=1), (BT, BK))
            blk = rid // BC
            same = blk[:, None] == blk[None, :]
            # the diagonal blocks in one product: row i anchored at P(i), a past row (exp(G_i - P) <= 1,
            # exp(P - G_j) <= exp(16 |lb|) for j in the block); products across blocks are finite and masked
            qs, ks, cold = qc * k.exp(lc), kc * k.exp(lc), kc * k.exp(-lc)
            if PREC == "bf16":                                         # operands narrowed at once: fewer live registers
                qs, ks, cold = qs.to(k.bf16), ks.to(k.bf16), cold.to(k.bf16)
            aq = k.where(same, mm(qs, cold.T, PREC), 0.0)
            ak = k.where(same, mm(ks, cold.T, PREC), 0.0)
            eg = k.exp(gc)                                              # exp(G_i) <= 1
            glast = row_of(gc, rid, BT - 1)
            qg[n, hv, k.span(0, BT), k.span(0, BK)] = (qc * eg).to(MT)
            kb[n, hv, k.span(0, BT), k.span(0, BK)] = (kc * k.exp(glast[None, :] - gc)).to(MT)
            gam[n, hv, k.span(0, BK)] = k.exp(glast)
            for c in k.static_range(NC - 1):
                e = row_of(gc, rid, c * BC + BC - 1)                   # E_c: G at block c's last row
                # rows after block c x columns of block c, anchored at E_c (a past row for those rows)
                rowf = k.where((blk > c)[:, None], k.exp(k.minimum(gc - e[None, :], 0.0)), 0.0)   # <= 1
                col = k.where((blk == c)[:, None], kc * k.exp(k.minimum(e[None, :] - gc, 0.0)), 0.0)   # <= 1
                qs, ks = qc * rowf, kc * rowf
                if PREC == "bf16":
                    qs, ks, col = qs.to(k.bf16), ks.to(k.bf16), col.to(k.bf16)
                aq += mm(qs, col.T, PREC)
                ak += mm(ks, col.T, PREC)
            lower = rid[:, None] >= rid[None, :]
            aq = k.where(lower, aq, 0.0)
            ak = k.where(rid[:, None] > rid[None, :], ak * bc[:, None], 0.0)
            aqk[n, hv, k.span(0, BT), k.span(half * BT, BT)] = aq.to(MT)
            # (I + Akk)^-1 = (I + N)^-1 (I + D)^-1 with N = (I + D)^-1 L_off, strictly block-lower with
            # NC block rows, so N^NC = 0: (I + N)^-1 is I - N (NC = 2), (I - N)(I + N^2) (NC = 4).
            # Each product skipped is one step less in the program's dependent chain.
            dinv = unit_lower_inverse(k.where(same, ak, 0.0), rid, SOLVE)    # block diagonal: D^16 = 0
            if NC == 2:
                ainv = dinv - mm(mm(dinv, k.where(same, 0.0, ak), SOLVE), dinv, SOLVE)
            else:
                eye = k.where(rid[:, None] == rid[None, :], 1.0, 0.0)
                nn = mm(dinv, k.where(same, 0.0, ak), SOLVE)
                ainv = mm(mm(eye - nn, eye + mm(nn, nn, SOLVE), SOLVE), dinv, SOLVE)
            store_wu(ainv, bc[:, None] * kc * k.exp(gc), bc, v, t0, hv0, live, w, u, n, hv, MT, SOLVE, BT, BK, BVV)

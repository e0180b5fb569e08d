"""`kda_chunk_pair_merge`: two consecutive half-chunks of the whole-chunk prep (BT rows each) become
the operands of one chunk of 2 BT rows, so kda_chunk_state walks half as many dependent steps.

Why (benchmarks/NOTES.md, KDA v5): the whole-chunk prep is latency-bound per program, so smaller
chunks run more programs per SM (chunk 16: three per SM, chunk 32: two, chunk 64: spills), while
the state kernel wants big chunks: with few heads it is a chain of per-chunk steps of ~1.3 µs each
whatever the chunk size (T=32768 H=12: 0.92 ms at chunk 64 against 1.37 at chunk 32). So the prep
runs on half-chunks in PAIR mode, writing each half straight into the chunk tensors seen as
[NT, 2 HV, BT, *] (a contiguous reshape: head hv's halves are "heads" 2hv, 2hv+1), and this kernel
folds the first half a into the second half b (research/kda.md §2.1; the state
step vn = U - W S, O = Qt S + tril(Aqk) vn, S' = gam S + Kb^T vn, applied to a then b):

  S_mid = gam_a S + Kb_a^T vn_a, vn_a = U_a - W_a S, so with X = W_b Kb_a^T (BT x BT)
  vn_b = U_b - W_b S_mid = (U_b - X U_a) - (W_b diag(gam_a) - X W_a) S
  O_b  = Qt_b S_mid + tril(Aqk_b) vn_b = (Qt_b diag(gam_a)) S + [Qt_b Kb_a^T | tril(Aqk_b)] vn
  S'   = gam_b gam_a S + (Kb_a diag(gam_b))^T vn_a + Kb_b^T vn_b

i.e. in place: W_b, U_b, Qt_b and Kb_a rewritten, the Aqk block [b rows, a columns] filled, gamma of
the pair = gam_a gam_b. Every factor is bounded (gamma <= 1, Kb and Qt rows decayed), so no anchor
question arises; a half past its sequence's end is all zeros with gamma 1 and merges to a no-op."""

import k31dsl as k
from k31dsl.ops.kda.chunk_kernels import DOT_PRECISIONS


# sm_90a (bf16, K = V = 128), tiles kept in bf16: 4 warps 138 registers (three programs per SM),
# 8 warps 134 (one); with fp32 tiles 4 warps took 222 and 0.222 ms at T=32768 H=12 (KDA run 13:
# 1.9x its 500 MB byte floor), 8 warps 0.350. Halves of 16: 4 warps 96 registers (0.335 ms at
# T=8192 H=96, 1.4x its 1.0 GB floor), 2 warps 128 (more programs in flight per SM; not yet timed,
# halves of 32 spill 24 B there). The GPU tunes among them.
@k.kernel(configs=[{"num_warps": 4, "num_stages": 1}, {"num_warps": 8, "num_stages": 1},
                   {"num_warps": 2, "num_stages": 1}])
def kda_chunk_pair_merge(w: k.Tensor["MT", "NT", "H2", "BT", "K"], u: k.Tensor["MT", "NT", "H2", "BT", "V"],
                         qg: k.Tensor["MT", "NT", "H2", "BT", "K"], kb: k.Tensor["MT", "NT", "H2", "BT", "K"],
                         aqk: k.Tensor["MT", "NT", "H2", "BT", "BA"], gam_half: k.Tensor[k.f32, "NT", "H2", "K"],
                         gam: k.Tensor[k.f32, "NT", "HV", "K"],
                         MT: k.constexpr[k.bf16, k.f32] = k.bf16, PREC: k.constexpr[DOT_PRECISIONS] = "tf32",
                         BT: k.constexpr = 32, BK: k.constexpr = 128, BVV: k.constexpr = 128):
    # operands in the prep's layout: head hv's halves are rows 2 hv (a) and 2 hv + 1 (b) of H2 = 2 HV
    # (the chunk tensors seen as [NT, 2 HV, BT, *]); Aqk's rows of b hold columns a | b.
    # Tiles stay in MT (bf16 on the GPU: half the registers) and feed the dots as they are, X
    # rounded to MT like the state kernel rounds S: fp32 accumulation throughout.
    for n, hv in k.grid(w.shape[0], gam.shape[1]):
        a = 2 * hv
        b = a + 1
        ga = gam_half[n, a, k.span(0, BK)]
        gb = gam_half[n, b, k.span(0, BK)]
        kba = kb[n, a, k.span(0, BT), k.span(0, BK)]
        wb = w[n, b, k.span(0, BT), k.span(0, BK)]
        qgb = qg[n, b, k.span(0, BT), k.span(0, BK)]
        x = k.dot(wb, kba.T, precision=PREC).to(MT)                 # W_b Kb_a^T
        aqk[n, b, k.span(0, BT), k.span(0, BT)] = k.dot(qgb, kba.T, precision=PREC).to(MT)
        qg[n, b, k.span(0, BT), k.span(0, BK)] = (qgb.to(k.f32) * ga[None, :]).to(MT)
        kb[n, a, k.span(0, BT), k.span(0, BK)] = (kba.to(k.f32) * gb[None, :]).to(MT)
        wa = w[n, a, k.span(0, BT), k.span(0, BK)]
        w[n, b, k.span(0, BT), k.span(0, BK)] = (wb.to(k.f32) * ga[None, :] - k.dot(x, wa, precision=PREC)).to(MT)
        ua = u[n, a, k.span(0, BT), k.span(0, BVV)]
        ub = u[n, b, k.span(0, BT), k.span(0, BVV)].to(k.f32)
        u[n, b, k.span(0, BT), k.span(0, BVV)] = (ub - k.dot(x, ua, precision=PREC)).to(MT)
        gam[n, hv, k.span(0, BK)] = ga * gb

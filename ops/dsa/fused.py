"""Fused Lightning Indexer + top-k + sparse MLA attention for decode (`fused_li_sfa`), and the
unfused path it must agree with (`li_sfa_unfused`: lightning_indexer -> topk -> slots ->
sparse_mla_attention), with `li_sfa` choosing between them per shape.

DESIGN (one program per query token, or per (token, head block) for small batches; nothing but o
and lse reaches global memory):
  1. select — the query's indexer operands (64 heads x 128, MXFP8) stay in registers; the keys of
     its range [ks, ke) are scored page by page straight from the paged MXFP8 key cache through
     the block table (indexer.indexer_page_scores, shared with lightning_indexer), assembled into
     chunks of KP = next_pow2(topk) scores, and each chunk is merged into a running top-KP list
     by one k.topk over the 2*KP concatenation [running, chunk] of i64 sort keys (score order
     bits << 32 | 2^31 - 1 - position): ties go to the lower position, the list is exactly
     topk()'s result in the same order (score descending, position ascending), and the
     positions ride in the keys, so the merge needs no gather (a k.take of positions after a
     value top-k costs O(n^2/32) warp shuffles at n = 4096 on Hopper, and minutes of compile).
  2. attend — the first min(topk, valid) positions are mapped to physical slots through the
     block table and attended exactly like sparse_mla_attention (same @k.funcs: per-128-tile
     scale folded into the score / probability tiles, online softmax over blocks of BK), the slot
     list kept in registers as [KP / BK, BK] rows (block j = a masked row sum, no gather).
Why not a two-pass threshold or a split-L merge: an exact k-th-largest threshold needs either a
histogram (a scatter-add the DSL has no op for) or the logits kept between passes (global
memory); splitting L over programs needs the per-split candidate lists merged across programs,
i.e. written to global memory — both break "no logits or indices in global memory" or need new
IR ops. The running list costs one 2*KP bitonic top-k per KP keys, which is what bounds this
kernel at long contexts (benchmarks/NOTES.md, DSA section); the unfused path wins there.

For tests the kernel can also write the selected logical positions (return_indices=True): the
same positions topk() returns, -1 padded.
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import next_pow2, require_tensor, resolve_target
from k31dsl.ops.dsa import attention as A
from k31dsl.ops.dsa.attention import empty_online_state, finish, load_query, online_block
from k31dsl.ops.dsa.indexer import indexer_page_scores, indexer_query
from k31dsl.ops.registry import CaseResult, OpSpec, register

# One config: at KP = 2048 each specialisation takes minutes to compile, so no autotuning.
FUSED_CONFIGS = [{"PB": 1, "BH": 64, "BK": 32, "num_warps": 8}]
# Longest context (keys per query) for which li_sfa picks the fused kernel by default. GPU run 3
# (H200): fused 2.3x slower than unfused at L = 32K and 4.8x at 128K (each further 2048 keys cost
# one more 4096-wide merge in one program); with a single chunk both paths do one merge per
# query and the fused one saves three launches.
FUSED_MAX_KEYS = 2048
# Up to this many (token, head block) programs, each head block gets its own program (selection
# repeated per head block); beyond it one program per token does all head blocks. ~2 waves of
# an H200's 132 SMs.
HEAD_SPLIT_PROGRAMS = 264


NO_KEY = -2139095041 * 2 ** 32          # the sort key of a -inf score: below every valid key


@k.func
def sort_keys(v, pos):
    """i64 keys ordering (score descending, position ascending): the score's order-preserving
    int32 (-0 as +0, NaN lowest) in the high half, 2^31 - 1 - position in the low half. Keys of
    -inf or NaN scores are <= NO_KEY."""
    b = v.bitcast(k.i32)
    o = k.where(v == 0.0, 0, b ^ ((b >> 31) & 0x7FFFFFFF))
    o = k.where(v != v, -2147483647 - 1, o)
    return (o.to(k.i64) << 32) | (2147483647 - pos).to(k.i64)


@k.func
def merge_running(run, v, pos, KP):
    """Merge a chunk (scores v, positions pos, [KP]) into the running list of the KP largest sort
    keys (descending). Positions live in the keys, so one k.topk of the 2*KP concatenation
    does it, with no gather."""
    top, _ = k.topk(k.cat(run, sort_keys(v, pos)), KP)
    return top


@k.func
def chunk_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, block_table, b, c, lo, hi, HI, KP, PB):
    """Scores [KP] of positions c*KP .. c*KP+KP-1 of sequence b (-inf outside [lo, hi))."""
    BS = PB * 64
    NSUB = KP // BS
    if NSUB == 1:
        pages = block_table[b, k.span(c * (KP // 64), PB, other=-1)]
        sc = k.reshape(indexer_page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, 1, HI, PB), (KP,))
        pos = c * KP + k.arange(KP)
        return k.where((pos >= lo) & (pos < hi), sc, float("-inf"))
    rows = k.arange(NSUB)
    chunk = k.full((NSUB, BS), float("-inf"), k.f32)
    for u in range(NSUB):
        pages = block_table[b, k.span(c * (KP // 64) + u * PB, PB, other=-1)]
        sc = k.reshape(indexer_page_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, pages, 1, HI, PB), (BS,))
        pos = c * KP + u * BS + k.arange(BS)
        sc = k.where((pos >= lo) & (pos < hi), sc, float("-inf"))
        chunk = k.where(rows[:, None] == u, sc[None, :], chunk)
    return k.reshape(chunk, (KP,))


@k.kernel(configs=FUSED_CONFIGS)
def fused_li_sfa_decode(q_codes: k.Tensor[k.f8e4m3, "T", "HI", "DI"], q_scales: k.Tensor[k.e8m0, "T", "HI", "DI // 32"],
                        weights: k.Tensor[k.f32, "T", "HI"], kc: k.Tensor[k.f8e4m3, "P", "PG", "DI"],
                        ksc: k.Tensor[k.e8m0, "P", "PG", "DI // 32"], q: k.Tensor["QT", "T", "H", "DQK"],
                        codes: k.Tensor[k.f8e4m3, "S", "R"], scales: k.Tensor[k.f32, "S", "R // 4"],
                        rope: k.Tensor[k.bf16, "S", "R // 2"], block_table: k.Tensor[k.i32, "B", "MP"],
                        ks: k.Tensor[k.i32, "T"], ke: k.Tensor[k.i32, "T"], o: k.Tensor[k.bf16, "T", "H", "DV"],
                        lse: k.Tensor[k.f32, "T", "H"], sel: k.Tensor[k.i32, "T", "KS"],
                        n_per_seq: k.i32, topk: k.i32, sm_scale: k.f32,
                        QT: k.constexpr[k.bf16, k.f32] = k.bf16, HI: k.constexpr = 64, KP: k.constexpr = 2048,
                        PB: k.constexpr = 1, BH: k.constexpr = 64, BK: k.constexpr = 32, HB: k.constexpr = 1,
                        WRITE_SEL: k.constexpr = False):
    # Program (t, hp): query token t, head blocks [hp*HB, hp*HB + HB) of BH heads. With HB below
    # the number of head blocks, the programs of one token each redo the selection (same keys,
    # read from L2 by the second) to put more SMs on small batches.
    nhb = k.cdiv(q.shape[1], BH)
    for t, hp in k.grid(q.shape[0], k.cdiv(q.shape[1], BH * HB)):
        b = t // n_per_seq
        lo = k.maximum(ks[t], 0)
        hi = k.minimum(ke[t], block_table.shape[1] * 64)
        # 1. select: running exact top-KP over the query's key range, chunk by chunk
        q0, q1, q2, q3, s0, s1, s2, s3, w = indexer_query(q_codes, q_scales, weights, t, 1, HI)
        run = k.full((KP,), NO_KEY, k.i64)
        for c in range(lo // KP, k.cdiv(hi, KP)):
            v = chunk_scores(q0, q1, q2, q3, s0, s1, s2, s3, w, kc, ksc, block_table, b, c, lo, hi, HI, KP, PB)
            run = merge_running(run, v, c * KP + k.arange(KP), KP)
        chosen = (k.arange(KP) < topk) & (run > NO_KEY + 2147483647)
        run_i = (2147483647 - (run & 2147483647)).to(k.i32)
        if WRITE_SEL:
            sel[t, k.span(0, KP)] = k.where(chosen, run_i, -1)
        # 2. attend over the chosen keys (a prefix of the list), slots from the block table
        page = k.load(block_table, (b, k.where(chosen, run_i // 64, 0)), other=-1)
        slots = k.where(chosen, page * 64 + run_i % 64, -1)
        n_sel = k.sum(chosen.to(k.i32))
        slot_rows = k.reshape(slots, (KP // BK, BK))       # block j of the list = row j (no gather)
        row_ids = k.arange(KP // BK)
        n_slots = codes.shape[0]
        for hb in range(hp * HB, k.minimum(hp * HB + HB, nhb)):
            h0 = hb * BH
            ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
            m, l, a0, a1, a2, a3 = empty_online_state(BH)
            for j in range(k.cdiv(n_sel, BK)):
                idx = k.sum(k.where(row_ids[:, None] == j, slot_rows, 0), axis=0)
                valid = (idx >= 0) & (idx < n_slots)
                m, l, a0, a1, a2, a3 = online_block(ql0, ql1, ql2, ql3, qr, codes, scales, rope, idx, valid,
                                                    sm_scale, m, l, a0, a1, a2, a3)
            finish(o, lse, t, h0, m, l, a0, a1, a2, a3, BH)


# ---------------------------------------------------------------- public functions

def _common_checks(op, q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache, block_table, ks, ke,
                   topk, sm_scale):
    import torch
    from k31dsl.ops.dsa.indexer import _check_cache
    _check_cache(op, idx_cache)
    A._require_cache(op, mla_cache)
    require_tensor(op, "q_idx_codes", q_idx_codes, (k.f8e4m3,), 3)
    require_tensor(op, "q_idx_scales", q_idx_scales, (k.e8m0,), 3)
    require_tensor(op, "idx_weights", idx_weights, (k.f32,), 2)
    require_tensor(op, "mla_q", mla_q, (k.bf16, k.f32), 3)
    t, hi = q_idx_codes.shape[0], q_idx_codes.shape[1]
    if q_idx_codes.shape[2] != 128 or tuple(q_idx_scales.shape) != (t, hi, 4) or tuple(idx_weights.shape) != (t, hi):
        raise K31Error(f"{op}: indexer query must be codes [T, H_I, 128], scales [T, H_I, 4], weights [T, H_I]; got "
                       f"{list(q_idx_codes.shape)}, {list(q_idx_scales.shape)}, {list(idx_weights.shape)}")
    if hi & (hi - 1) or not 16 <= hi <= 128:
        raise K31Error(f"{op}: {hi} indexer heads; a power of two between 16 and 128 is needed")
    if mla_q.shape[0] != t or mla_q.shape[2] != A.LATENT + A.ROPE:
        raise K31Error(f"{op}: `mla_q` must be [{t}, H, {A.LATENT + A.ROPE}], got {list(mla_q.shape)}")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise K31Error(f"{op}: `block_table` must be an int32 tensor [B, max_pages]")
    b = block_table.shape[0]
    if b == 0 or t % b:
        raise K31Error(f"{op}: {t} query tokens do not split evenly over the {b} sequences of `block_table`",
                       hint="pass n query tokens per sequence, sequence-major (T = B * n)")
    if not (isinstance(topk, int) and not isinstance(topk, bool) and 1 <= topk <= 4096):
        raise K31Error(f"{op}: topk={topk!r} must be an int in [1, 4096]")
    A._check_scale(op, sm_scale)
    return t, b, A._int32(op, "ks", ks, 1), A._int32(op, "ke", ke, 1)


def fused_li_sfa(q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache, block_table, ks, ke,
                 topk: int, sm_scale, *, return_indices: bool = False, target: str | None = None, **config):
    """One decode step of DSA attention in one kernel: indexer scores of each query token over its
    key range [ks, ke) (logical positions of its sequence; T = B * n tokens, sequence-major),
    exact top-`topk` (ties to the lower position), sparse MLA attention over those keys.

    Indexer side as lightning_indexer (q_idx_codes e4m3 [T, H_I, 128], q_idx_scales e8m0
    [T, H_I, 4], idx_weights fp32 [T, H_I], idx_cache uint8 [P, 8448]); attention side as
    sparse_mla_attention (mla_q [T, H, 576], mla_cache uint8 [P, 64, 656]); both caches share
    block_table int32 [B, max_pages]. Returns (o [T, H, 512] bf16, lse [T, H] fp32), plus the
    selected logical positions int32 [T, topk] (-1 padded) when return_indices."""
    import torch
    target = resolve_target(target)
    op = "fused_li_sfa"
    t, b, ks32, ke32 = _common_checks(op, q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache,
                                      block_table, ks, ke, topk, sm_scale)
    h = mla_q.shape[1]
    o = torch.zeros((t, h, A.LATENT), dtype=torch.bfloat16, device=mla_q.device)
    lse = torch.full((t, h), float("inf"), dtype=torch.float32, device=mla_q.device)
    sel = torch.full((t, topk), -1, dtype=torch.int32, device=mla_q.device)
    if t == 0 or h == 0:
        return (o, lse, sel) if return_indices else (o, lse)
    from k31dsl.ops.dsa.indexer import indexer_cache_views
    kc, ksc = indexer_cache_views(idx_cache)
    c, s, r = A.cache_views(mla_cache)
    kw = {"HI": q_idx_codes.shape[1], "KP": max(64, next_pow2(topk)), **config}
    if kw["KP"] < topk or kw["KP"] & (kw["KP"] - 1) or kw["KP"] % (64 * kw.get("PB", 1)):
        raise K31Error(f"{op}: KP={kw['KP']} must be a power of two >= topk ({topk}) and a multiple of 64 * PB")
    cap = A.max_head_block(target)
    if "BH" not in config and (h < cap or cap < 64):
        kw["BH"] = min(max(16, next_pow2(h)), cap)
    nhb = -(-h // kw.get("BH", 64))
    if "HB" not in config and t * nhb > HEAD_SPLIT_PROGRAMS:
        kw["HB"] = nhb                                   # enough tokens: one program per token
    if return_indices:
        kw["WRITE_SEL"] = True
        sel_arg = sel
    else:
        sel_arg = torch.empty(1, dtype=torch.int32, device=mla_q.device).expand(t, 1)   # never touched
    fused_li_sfa_decode[target](q_idx_codes.contiguous(), q_idx_scales.contiguous(), idx_weights.contiguous(), kc, ksc,
                                mla_q.contiguous(), c, s, r, block_table.contiguous(), ks32, ke32, o, lse, sel_arg,
                                t // b, int(topk), float(sm_scale), **kw)
    return (o, lse, sel) if return_indices else (o, lse)


def li_sfa_unfused(q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache, block_table, ks, ke,
                   topk: int, sm_scale, *, return_indices: bool = False, max_len: int | None = None,
                   target: str | None = None):
    """The same step as fused_li_sfa in four launches: lightning_indexer (fp32 logits [T, max_len]
    to global memory) -> topk -> slots_of_positions -> sparse_mla_attention. max_len (default:
    max(ke), a host sync) bounds the logits' width."""
    from k31dsl.ops.dsa.indexer import lightning_indexer
    from k31dsl.ops.dsa.topk import topk as topk_op
    target = resolve_target(target)
    op = "li_sfa_unfused"
    t, b, ks32, ke32 = _common_checks(op, q_idx_codes, q_idx_scales, idx_weights, idx_cache, mla_q, mla_cache,
                                      block_table, ks, ke, topk, sm_scale)
    if max_len is None:
        max_len = min(block_table.shape[1] * A.PAGE, max(1, int(ke32.max()) if t else 1))
    scores = lightning_indexer(q_idx_codes, q_idx_scales, idx_cache, block_table, idx_weights, ks32, ke32, max_len,
                               target=target)
    pos = topk_op(scores, topk, target=target)
    slots = A.slots_of_positions(pos, block_table, t // b, target=target)
    o, lse = A.sparse_mla_attention(mla_q, mla_cache, slots, sm_scale, target=target)
    return (o, lse, pos) if return_indices else (o, lse)


def li_sfa(*args, impl: str = "auto", target: str | None = None, **kwargs):
    """fused_li_sfa or li_sfa_unfused (same arguments): impl="auto" takes the fused kernel when the
    longest key range is at most FUSED_MAX_KEYS (set from the GPU benchmark)."""
    if impl not in ("auto", "fused", "unfused"):
        raise K31Error(f"li_sfa: impl={impl!r} must be 'auto', 'fused' or 'unfused'")
    if impl == "auto":
        ke = args[8] if len(args) > 8 else kwargs["ke"]
        ks = args[7] if len(args) > 7 else kwargs["ks"]
        longest = int((ke.to(dtype=ks.dtype) - ks).max()) if ke.numel() else 0
        impl = "fused" if longest <= FUSED_MAX_KEYS else "unfused"
    fn = fused_li_sfa if impl == "fused" else li_sfa_unfused
    return fn(*args, target=target, **kwargs)


# ---------------------------------------------------------------- inputs and the registry check

def random_decode_step(g, ctx, n, heads_idx=16, heads=4, spare_pages=3, ks_from=None):
    """Random inputs of fused_li_sfa: caches holding B sequences of lengths ctx (pages shuffled over the pool), and n query tokens
    per sequence: token i of sequence b sees keys [ks, ctx[b] - n + i + 1). Returns the argument
    tuple up to ke (topk and sm_scale follow)."""
    import torch
    B = len(ctx)
    pages_of = [-(-c // A.PAGE) for c in ctx]
    P = sum(pages_of) + spare_pages
    perm = torch.randperm(P, generator=g).int()
    bt = torch.randint(0, P, (B, max(pages_of) + 1), generator=g, dtype=torch.int32)   # stale entries past the end
    used = 0
    for b, np_ in enumerate(pages_of):
        bt[b, :np_] = perm[used:used + np_]
        used += np_
    slots = torch.cat([bt[b, torch.arange(c) // A.PAGE] * A.PAGE + torch.arange(c) % A.PAGE
                       for b, c in enumerate(ctx)]).int()
    N = slots.numel()
    from k31dsl.ops.dsa.indexer import indexer_cache_write, new_indexer_cache
    icache = new_indexer_cache(P)
    kcodes = (torch.randn(N, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    kscales = torch.randint(122, 130, (N, 4), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    indexer_cache_write(icache, kcodes, kscales, slots, target="numpy")
    mcache = A.new_mla_cache(P)
    A.mla_cache_write(mcache, A.random_latent(N, g, torch.float32), torch.randn(N, A.ROPE, generator=g), slots,
                      target="numpy")
    T = B * n
    qc = (torch.randn(T, heads_idx, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    qs = torch.randint(122, 130, (T, heads_idx, 4), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    w = torch.randn(T, heads_idx, generator=g)
    q = torch.randn(T, heads, A.LATENT + A.ROPE, generator=g).bfloat16()
    ke = torch.tensor([ctx[t // n] - n + t % n + 1 for t in range(T)], dtype=torch.int32)
    ks = torch.zeros(T, dtype=torch.int32) if ks_from is None else ks_from(ke)
    return qc, qs, w, icache, q, mcache, bt, ks, ke


def _check_fused(target: str, seed: int = 0) -> list[CaseResult]:
    """fused_li_sfa on a small decode step: the selected positions against the fp64 oracle's
    top-k (swaps only between fp32-tied scores), o / lse against the fp64 attention oracle."""
    import numpy as np
    import torch
    from k31dsl.ops.testing import bytes_of, device_for, load_oracle, to_f64
    ref, iref = load_oracle("dsa_attention"), load_oracle("dsa_indexer")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for ctx, n, topk in (([100, 20], 1, 16), ([70], 2, 16)):
        args = random_decode_step(g, ctx, n)
        qc, qs, w, icache, q, mcache, bt, ks, ke = args
        o, lse, sel = fused_li_sfa(*(a.to(dev) for a in args), topk, 0.135234, return_indices=True, target=target)
        sa = (bytes_of(qc), bytes_of(qs), to_f64(w), icache.numpy(), bt.numpy(), ks.numpy(), ke.numpy(),
              bt.shape[1] * A.PAGE)
        scores, mag = iref.indexer_scores(*sa), iref.indexer_scores_magnitude(*sa)
        want = iref.topk(scores, topk)
        bad = 0
        for r, row in enumerate(sel.cpu().numpy()):
            G, W = set(row.tolist()) - {-1}, set(want[r].tolist()) - {-1}
            kth = min((scores[r, i] for i in W), default=0.0)
            bad += len(G) != len(W) or any(abs(scores[r, i] - kth) > 1e-5 * (mag[r, i] + 1) for i in G ^ W)
        name = f"contexts {ctx}, next_n={n}, topk={topk}"
        out.append(CaseResult(f"{name}: selected keys", bad, 0, bad == 0, "rows whose key set differs from top-k"))
        lat, rope = ref.mla_cache_decode(mcache.numpy())
        slots = ref.slots_of_positions(sel.cpu().numpy(), bt.numpy(), np.arange(q.shape[0]) // n)
        want_o, want_l = ref.sparse_mla_attention(to_f64(q), lat, rope, slots, 0.135234)
        e_o, e_l = A.sfa_errors(o, lse, want_o, want_l)
        out.append(CaseResult(f"{name}: o", e_o, 2e-2, e_o <= 2e-2, "max abs err / max |o| (bf16 output)"))
        out.append(CaseResult(f"{name}: lse", e_l, 1e-3, e_l <= 1e-3, "max abs err (natural log)"))
    return out


register(OpSpec("fused_li_sfa", "dsa", fused_li_sfa, [fused_li_sfa_decode],
                "DSA decode step in one kernel: MXFP8 indexer scores, exact top-k, sparse MLA attention",
                _check_fused, tags=["dsa", "attention", "fused"]))

"""The DSA sublayer (docs/model.md, kind D) in a step graph: MLA in absorbed form over the paged
FP8 latent cache, with the Lightning Indexer choosing each query's keys.

Every step kind is the same graph (T = sequences x n tokens, tokens of one sequence together):
  q side    q_a -> rmsnorm -> q_b -> mla_q_rows (w_uk absorbed, rope) -> Q bf16 [T, H, 576]
  kv side   kv_a -> mla_kv_rows (rmsnorm, rope) -> mla_cache_write_rows at slot_mapping
  indexer   prolog chains (q codes; keys into the paged MXFP8 cache at slot_mapping; head weights)
            -> scores [T, pages x 64] -> topk_segments -> slots_of_positions_rows; a step whose
            key width is at most index_topk (pages x 64 <= topk: short contexts) has nothing to
            choose, so it skips the query chain, the head weights, the scores and the top-k
            and takes every key in range (slots_of_range_rows); the key chain still fills the cache
  attend    sparse MLA attention over the chosen slots -> mla_out_rows (w_uv) -> o_proj; the form
            is ops/dsa's sfa_form choice: one pass (flash-decoding split + combine for few queries),
            two passes on a GPU for >= 64 heads at decode sizes, keys-major on a GPU for <= 16 heads
            when no split is needed (prefill)
Causality comes from the key ranges: a query at position p scores keys [0, p + 1) only, and the
step's own keys are in the caches before any query reads them (the graph orders the writes first).

The indexer cache is one byte tensor, written through the prolog's key chains. On a GPU the
scores come from ops/dsa's lightning_indexer_paged (f16 keys-major scoring) over the cache's
whole-page code and scale views (indexer_page_views: contiguous, as graph programs pass them),
which an `order` host op ties to the byte writes. Elsewhere `indexer_scores_flat` reads the bytes
itself (same page layout, the same @k.func for the query operands, the same fp8 dots and scale
products as indexer_page_scores).
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.model.config import INDEX_DIM, KV_LORA, PAGE, ROPE_DIM
from k31dsl.ops.common import next_pow2, rmsnorm_rows
from k31dsl.ops.dsa.attention import combine_tiles, max_head_block, mla_cache_write_rows, sfa_form, sfa_split, \
    sparse_mla_attention_combine, sparse_mla_attention_fwd, sparse_mla_attention_split
from k31dsl.ops.dsa.slots import short_ranges, slots_of_positions_rows, slots_of_range_rows
from k31dsl.ops.dsa.sfa_keys_major import sfa_keys_major
from k31dsl.ops.dsa.sfa_two_pass import buffers as sfa_buffers, score_segments, segments_pow2, sfa_scores, sfa_values
from k31dsl.ops.dsa.indexer import CODE_BYTES, PAGE_BYTES, graph_config, indexer_query, lightning_indexer_paged
from k31dsl.ops.dsa.mla import mla_kv_rows, mla_out_rows, mla_q_rows
from k31dsl.ops.dsa.prolog import indexer_head_weights, indexer_k_chain, indexer_k_chain_parts, indexer_q_chain
from k31dsl.ops.dsa.topk import tile_options, topk_segments
from k31dsl.model.layers.common import linear_rows_splitk, linear_splitk_reduce, linear_tiles, memo, prefill_min_tokens

(rmsnorm_rows, mla_cache_write_rows, slots_of_positions_rows, sparse_mla_attention_fwd, mla_kv_rows, mla_out_rows,
 mla_q_rows, indexer_head_weights, indexer_k_chain, indexer_q_chain, topk_segments, sparse_mla_attention_split,
 sparse_mla_attention_combine, indexer_k_chain_parts, sfa_scores, sfa_values, lightning_indexer_paged,
 sfa_keys_major, slots_of_range_rows) = memo(
    rmsnorm_rows, mla_cache_write_rows, slots_of_positions_rows, sparse_mla_attention_fwd, mla_kv_rows, mla_out_rows,
    mla_q_rows, indexer_head_weights, indexer_k_chain, indexer_q_chain, topk_segments, sparse_mla_attention_split,
    sparse_mla_attention_combine, indexer_k_chain_parts, sfa_scores, sfa_values, lightning_indexer_paged,
    sfa_keys_major, slots_of_range_rows)


@k.func
def flat_group_logits(qg, sg, cache, base, rows, g):
    """One MX group of the 64 keys of the page at byte `base` (< 0: none) against the query tile
    qg [H, 32] (codes) with scales sg [H]: [H, 64] logits with the power-of-two scale products."""
    cidx = k.reshape(base + rows[:, None] * 128 + g * 32 + k.arange(0, 32)[None, :], (2048,))
    codes = k.load(cache, (cidx,), mask=cidx >= 0, other=0)
    kg = k.reshape(codes.bitcast(k.f8e4m3), (64, 32))
    sidx = base + CODE_BYTES + rows * 4 + g
    sk = k.load(cache, (sidx,), mask=sidx >= CODE_BYTES, other=127).bitcast(k.e8m0).to(k.f32)
    return k.dot(qg, kg.T) * sg[:, None] * sk[None, :]


SCORE_CONFIGS = [{"NQ": 1, "num_warps": 4}, {"NQ": 2, "num_warps": 4}, {"NQ": 4, "num_warps": 8}]


@k.kernel(configs=SCORE_CONFIGS)
def indexer_scores_flat(q_codes: k.Tensor[k.f8e4m3, "T", "H", "128"], q_scales: k.Tensor[k.e8m0, "T", "H", "4"],
                        weights: k.Tensor[k.f32, "T", "H"], cache: k.Tensor[k.u8, "NB"],
                        block_table: k.Tensor[k.i32, "B", "MP"], ks: k.Tensor[k.i32, "T"], ke: k.Tensor[k.i32, "T"],
                        scores: k.Tensor[k.f32, "T", "L"], n_per_seq: k.i32, H: k.constexpr = 64,
                        NQ: k.constexpr = 1):
    # Program (tb, j): query tokens tb*NQ .. +NQ (one sequence: NQ divides n_per_seq) against
    # logical page j of their sequence: I[t, s] = sum_h w[t,h] relu(sum_g sq sk (q8 . k8)); -inf
    # outside [ks, ke). A page outside every token's range is not scored (a loop of 0 or 1
    # trips: no runtime branches in the DSL): half of a prefill's (token, page) pairs.
    for tb, j in k.grid(k.cdiv(q_codes.shape[0], NQ), k.cdiv(scores.shape[1], 64)):
        t0 = tb * NQ
        tmask = t0 + k.arange(0, NQ) < q_codes.shape[0]
        lo_t = k.load(ks, (k.span(t0, NQ),), mask=tmask, other=0)
        hi_t = k.load(ke, (k.span(t0, NQ),), mask=tmask, other=0)
        lo = k.min(k.where(tmask, lo_t, 2147483647))
        hi = k.max(k.where(tmask, hi_t, 0))
        live = ((j * 64 < hi) & (j * 64 + 64 > lo)).to(k.i32)
        pos = j * 64 + k.arange(0, 64)
        for _ in range(1 - live):
            k.store(scores, (k.span(t0, NQ), k.span(j * 64, 64)), k.full((NQ, 64), float("-inf"), k.f32),
                    mask=tmask[:, None])
        for _ in range(live):
            page = block_table[t0 // n_per_seq, j]
            base = k.where(page >= 0, page * PAGE_BYTES, -PAGE_BYTES)
            rows = k.arange(0, 64)
            q0, q1, q2, q3, s0, s1, s2, s3, w = indexer_query(q_codes, q_scales, weights, t0, NQ, H)
            acc = flat_group_logits(q0, s0, cache, base, rows, 0)
            acc += flat_group_logits(q1, s1, cache, base, rows, 1)
            acc += flat_group_logits(q2, s2, cache, base, rows, 2)
            acc += flat_group_logits(q3, s3, cache, base, rows, 3)
            sc = k.sum(k.reshape(k.relu(acc) * w[:, None], (NQ, H, 64)), axis=1)
            ok = (pos[None, :] >= lo_t[:, None]) & (pos[None, :] < hi_t[:, None])
            k.store(scores, (k.span(t0, NQ), k.span(j * 64, 64)), k.where(ok, sc, float("-inf")),
                    mask=tmask[:, None])


indexer_scores_flat = memo(indexer_scores_flat)


def prepared_weights(cfg, weights: dict) -> dict:
    """Derived DSA weights: fp32 indexer key-norm parameters (the prolog's type) and the
    orthonormal Hadamard matrix."""
    import torch
    from k31dsl.ops.dsa.prolog import hadamard_matrix
    out = {}
    for l in cfg.dsa_layers:
        a = f"layers.{l}.attn."
        out[f"l{l}_idx_k_norm_w"] = weights[a + "idx_k_norm_w"].to(torch.float32).contiguous()
        out[f"l{l}_idx_k_norm_b"] = weights[a + "idx_k_norm_b"].to(torch.float32).contiguous()
    if cfg.dsa_layers:
        out["hadamard"] = hadamard_matrix("cpu").clone()
    return out


def cp_buffers(cfg, ranks: int, local_tokens: int, device) -> dict:
    """Per DSA layer for a context-parallel step: this rank's staging caches (its tokens, local
    slots) and the gathered caches (every rank's staging pages in rank order: the sequence's
    caches, read through the step's block table), each like `new_caches`."""
    stage, full = new_caches(cfg, local_tokens // 64, device), new_caches(cfg, ranks * local_tokens // 64, device)
    out = {n.replace(f"dsa{l}_", f"dsa{l}_stage_").replace("_index_cache", "_index"): t
           for l in cfg.dsa_layers for n, t in stage.items() if n.startswith(f"dsa{l}_")}
    return {**out, **full}


def new_caches(cfg, num_pages: int, device) -> dict:
    """Per DSA layer: the paged MLA latent cache (three typed views of one uint8 storage, the
    kernels' views) and the paged indexer key cache (flat bytes)."""
    from k31dsl.ops.dsa.attention import cache_views, new_mla_cache
    from k31dsl.ops.dsa.indexer import indexer_page_views, new_indexer_cache
    out = {}
    for l in cfg.dsa_layers:
        mla = new_mla_cache(num_pages, device)
        codes, scales, rope = cache_views(mla)
        out[f"dsa{l}_mla"] = mla              # the storage (not a program tensor)
        out[f"dsa{l}_mla_codes"], out[f"dsa{l}_mla_scales"], out[f"dsa{l}_mla_rope"] = codes, scales, rope
        index = new_indexer_cache(num_pages, device)
        out[f"dsa{l}_index_cache"] = index.view(-1)     # written as bytes (the prolog's key chains)
        # read as codes and scales by lightning_indexer_paged on a GPU (its whole-page views)
        out[f"dsa{l}_index_codes"], out[f"dsa{l}_index_scales"] = indexer_page_views(index)
    return out


# GPU: sparse attention gathers the next index block before folding the current one when the
# head block is <= 32 (sm_90a, BH 16 BK 32 8 warps: 202 registers instead of 238, 25 barriers
# instead of 32, no spill; BH 64 spills more with it). benchmarks/model_profile.py --sfa-prefetch off
# measures the other side.
SFA_PREFETCH = True
QUERY_BLOCK = 16384          # most query rows a DSA layer scores at once in a long prefill ...
SCORE_ELEMENTS = 2 ** 31     # ... and most fp32 scores (8 GiB) one block may hold: rows x width


def block_rows(width: int, most: int | None = None) -> int:
    """Query rows per block of a prefill whose keys span `width` positions: at most `most`
    (default QUERY_BLOCK) and at most SCORE_ELEMENTS // width, whole pages."""
    most = min(QUERY_BLOCK, SCORE_ELEMENTS // width) if most is None else most
    return max(PAGE, most // PAGE * PAGE)


def prefill_query_blocks(shape) -> tuple:
    """A one-sequence prefill of more than block_rows rows in query blocks (first row, rows, key
    width), () otherwise. The step's m >= prefill_min_tokens(T) real tokens come first and are
    the last of the context, which ends within max_pages pages, so row i sits at most at position
    max_pages * 64 - m + i and a block ending at row e needs keys [0, max_pages * 64 - m + e)
    only. The blocks run one after another with one block's scores alive at a time (instead of
    [T, max_pages * 64] fp32), and a prompt prefilled from position 0 scores and scans about
    the causal triangle, not the square (the same blocks as a context-parallel rank's,
    model/distributed.py)."""
    T, full = shape.q_len, shape.max_pages * PAGE
    most = block_rows(full)
    if shape.kind != "prefill" or shape.n_seqs != 1 or T <= most:
        return ()
    slack = full - prefill_min_tokens(T)
    return tuple((r0, min(most, T - r0), min(full, -(-(slack + min(r0 + most, T)) // PAGE) * PAGE))
                 for r0 in range(0, T, most))


def add_dsa(g, l, x):
    """The DSA sublayer of layer l on x [T, d] -> [T, d]."""
    cfg, p = g.cfg, g.p
    a = f"layers.{l}.attn."
    T = x.shape[0]
    H, dn, HI = cfg.mla_heads, cfg.qk_nope_dim, cfg.index_heads
    bt = max(1, min(16, next_pow2(T)))           # token rows per program of the row kernels
    dot_bt = 16                                  # ... of the kernels with k.dot (compiled targets: dims >= 16)
    # q side
    qa = g.linear(x, a + "q_a", f"l{l}_qa_lin")
    qa = p.call(rmsnorm_rows, qa, g.weight(a + "q_a_norm"), g.tensor(f"l{l}_qa", qa.shape), cfg.rms_eps,
                BM=bt, BD=max(16, next_pow2(cfg.q_lora_rank)), ONE_TILE=True)
    qb = g.linear(qa, a + "q_b", f"l{l}_q_lin")
    q3 = g.reshape(qb, (T, H, dn + ROPE_DIM), f"l{l}_q_heads")
    big_q = g.tensor(f"l{l}_mla_q", (T, H, KV_LORA + ROPE_DIM), k.bf16)     # Q is bf16 (docs/model.md)
    big_q = p.call(mla_q_rows, q3, g.weight(a + "w_uk"), g.cos, g.sin, big_q, BT=dot_bt, BL=128,
                   BK=max(16, min(64, next_pow2(dn))))
    # kv side: latent and rope key in fp32 into the cache write (it quantises once, like the reference)
    kv = g.linear(x, a + "kv_a", f"l{l}_kv_lin")
    lat = g.tensor(f"l{l}_latent", (T, KV_LORA), k.f32)
    kr = g.tensor(f"l{l}_k_rope", (T, ROPE_DIM), k.f32)
    lat, kr = p.call(mla_kv_rows, kv, g.weight(a + "kv_a_norm"), g.cos, g.sin, lat, kr, cfg.rms_eps, BT=bt)
    codes = g.state(f"dsa{l}_mla_codes", g.runner_states[f"dsa{l}_mla_codes"])
    scales = g.state(f"dsa{l}_mla_scales", g.runner_states[f"dsa{l}_mla_scales"])
    rope = g.state(f"dsa{l}_mla_rope", g.runner_states[f"dsa{l}_mla_rope"])
    cp = g.shape.kind == "cp_prefill"
    if cp:       # context parallel: this rank's tokens into its staging cache, then every rank's
        stage = [g.state(f"dsa{l}_stage_mla_{n}", g.runner_states[f"dsa{l}_stage_mla_{n}"]) for n in ("codes", "scales", "rope")]
        sc, ss, sr = p.call(mla_cache_write_rows, lat, kr, g.slot_mapping, *stage, 1e-4, BM=bt)
        codes, scales, rope = p.dist_all_gather(sc, codes, name=f"l{l} mla cache", also=[(ss, scales), (sr, rope)])
    else:
        codes, scales, rope = p.call(mla_cache_write_rows, lat, kr, g.slot_mapping, codes, scales, rope, 1e-4, BM=bt)
    # indexer: queries, keys into the cache, head weights
    had = g.weight("hadamard")
    # rows per program of the prolog chains; ascendc: the rope + k chain superkernel at 64 rows needs
    # 207 KB of the 192 KB Unified Buffer, 32 fit
    ibm = min(32 if g.target == "ascendc" else 64, max(16, next_pow2(T)))
    decode_gpu = g.gpu and T <= 64
    blocks = g.shape.blocks if cp else prefill_query_blocks(g.shape)
    # the indexer's queries and head weights serve the scores only: a step whose every query
    # block attends to all its keys (select_attend) needs neither
    scored = not all(attends_every_key(cfg, width)
                     for width in ([w for _, _, w in blocks] or [g.shape.max_pages * PAGE]))
    qc = qs = iw = None
    if scored:
        qc = g.tensor(f"l{l}_idx_q_codes", (T, HI, INDEX_DIM), k.f8e4m3)
        qs = g.tensor(f"l{l}_idx_q_scales", (T, HI, INDEX_DIM // 32), k.e8m0)
        qc, qs = p.call(indexer_q_chain, qa, g.weight(a + "idx_wq_b"), g.cos, g.sin, had, qc, qs,
                        BM=(16 if decode_gpu else 64) if g.gpu else ibm)      # GPU: (T / BM) x heads programs
    icache = g.state(f"dsa{l}_index_cache", g.runner_states[f"dsa{l}_index_cache"])
    gathered = icache
    if cp:
        icache = g.state(f"dsa{l}_stage_index", g.runner_states[f"dsa{l}_stage_index"])
    kn_w, kn_b = g.weight(f"l{l}_idx_k_norm_w"), g.weight(f"l{l}_idx_k_norm_b")
    if scored:
        iw = g.tensor(f"l{l}_idx_weights", (T, HI), k.f32)
    if decode_gpu:
        # one program per 16..64 tokens would stream the [128, dim] key and [HI, dim] weight
        # projections alone: split-K projections into fp32 partials, then the chain's rest
        dm = x.shape[1]
        kt = linear_tiles(T, INDEX_DIM, dm, True)
        kpart = g.tensor(f"l{l}_idx_k_splitk", (kt.pop("SPLIT"), T, INDEX_DIM), k.f32)
        kpart = p.call(linear_rows_splitk, x, g.weight(a + "idx_wk"), kpart, **kt)
        icache = p.call(indexer_k_chain_parts, kpart, kn_w, kn_b, g.cos, g.sin, had, g.slot_mapping, icache, 1e-6,
                        BM=16)
        if scored:
            wt = linear_tiles(T, HI, dm, True)
            wpart = g.tensor(f"l{l}_idx_w_splitk", (wt.pop("SPLIT"), T, HI), k.f32)
            wpart = p.call(linear_rows_splitk, x, g.weight(a + "idx_weights_proj"), wpart, **wt)
            iw = p.call(linear_splitk_reduce, wpart, iw, HI ** -0.5, BM=16 if T <= 16 else 64, BN=128)
    else:
        icache = p.call(indexer_k_chain, x, g.weight(a + "idx_wk"), kn_w, kn_b, g.cos, g.sin, had, g.slot_mapping,
                        icache, 1e-6, BM=32 if g.gpu else ibm)
        if scored:
            iw = p.call(indexer_head_weights, x, g.weight(a + "idx_weights_proj"), iw, HI ** -0.5, H=HI, BM=ibm)
    if cp:
        icache = p.dist_all_gather(icache, gathered, name=f"l{l} indexer keys")
    keys = (icache,)
    if g.gpu and scored:       # the scorer reads the cache's code and scale views, after the key writes above
        keys = p.host("order", [icache], [g.state(f"dsa{l}_index_{v}", g.runner_states[f"dsa{l}_index_{v}"])
                                          for v in ("codes", "scales")])
    mla = (codes, scales, rope)
    if not blocks:
        o = select_attend(g, l, qc, qs, iw, keys, big_q, mla, g.ks, g.ke, g.shape.max_pages * 64, "")
    else:        # query blocks, each over its own causal width of the sequence
        o = g.tensor(f"l{l}_mla_o", (T, H, KV_LORA), k.bf16)
        for b, (row0, rows, width) in enumerate(blocks):
            # a block's slices also read `o` as placed so far (row_slice ignores the extra input):
            # the blocks run one after another and share one score buffer (on parallel streams
            # each would hold its own [rows, width] fp32 scores at once)
            after = [o] if b else []
            part = [x if x is None else
                    p.host("row_slice", [x] + after, [g.tensor(f"l{l}_q{b}_{name}", (rows,) + tuple(x.shape[1:]),
                                                               x.dtype)], start=row0)
                    for name, x in (("qc", qc), ("qs", qs), ("iw", iw), ("ks", g.ks), ("ke", g.ke), ("q", big_q))]
            bqc, bqs, biw, bks, bke, bq = part
            ob = select_attend(g, l, bqc, bqs, biw, keys, bq, mla, bks, bke, width, f"_q{b}")
            o = p.host("row_put", [ob], [o], start=row0)
    y = g.tensor(f"l{l}_mla_heads", (T, H * cfg.v_head_dim))
    y = p.call(mla_out_rows, o, g.weight(a + "w_uv"), y, BT=dot_bt, BD=max(16, min(64, next_pow2(cfg.v_head_dim))),
               BK=128)
    return g.linear(y, a + "o_proj", f"l{l}_attn_out")


def attends_every_key(cfg, width: int) -> bool:
    """Whether query rows over keys [0, width) skip the indexer: no range holds more than
    index_topk keys, so the top-k would choose them all (unless K31_SHORT_RANGES=score)."""
    return width <= cfg.index_topk and short_ranges() == "all"


def select_attend(g, l, qc, qs, iw, keys, big_q, mla, ks, ke, width: int, tag: str):
    """Indexer scores of the query rows over keys [0, width) of the sequence, exact top-k,
    physical slots, sparse MLA attention -> o bf16 [rows, H, 512] (`tag` names the temps of a
    query block). keys: the indexer cache as (flat bytes,) or, on a GPU, its (codes, scales)
    page views. A width of at most index_topk keys leaves nothing to choose: every key in range
    is attended, without scores (qc, qs, iw may be None then)."""
    cfg, p = g.cfg, g.p
    T, HI = big_q.shape[0], cfg.index_heads
    n = T if g.shape.kind == "cp_prefill" else g.shape.q_len     # query rows per block-table row
    topk = cfg.index_topk
    if attends_every_key(cfg, width):
        pos = g.tensor(f"l{l}{tag}_range_pos", (T, topk), k.i32)
        slots = g.tensor(f"l{l}{tag}_topk_slots", (T, topk), k.i32)
        pos, slots = p.call(slots_of_range_rows, ks, ke, g.block_table, pos, slots, n, width,
                            BK=max(16, min(128, next_pow2(topk))))
        return attend(g, l, big_q, mla, slots, tag)
    scores = g.tensor(f"l{l}{tag}_idx_scores", (T, width), k.f32)
    if g.gpu:       # the op's kernel: f16 operands, keys on the dot's rows (ops/dsa/indexer.py)
        rows = T // g.block_table.shape[0]                        # a query block's rows, else n
        icfg, nsplit = graph_config(g.block_table.shape[0], rows, width)
        scores = p.call(lightning_indexer_paged, qc, qs, iw, *keys, g.block_table, ks, ke, scores, rows, nsplit, H=HI,
                        **icfg)
    else:
        scores = p.call(indexer_scores_flat, qc, qs, iw, *keys, g.block_table, ks, ke, scores, n, H=HI, NQ=1)
    kp = max(16, next_pow2(topk))
    pos = g.tensor(f"l{l}{tag}_topk_pos", (T, topk), k.i32)
    no_idx = g.input(f"unread_topk_idx_{T}x{width}", (T, width), k.i32)   # parameters FINAL never reads
    no_val = g.input(f"unread_topk_val_{T}x{topk}", (T, topk), k.f32)
    seg = -(-width // kp) * kp
    pos = p.call(topk_segments, scores, no_idx, no_val, pos, ke, seg, KP=kp, FINAL=True, HAS_END=True,
                 **tile_options(seg, bl=4096))   # each row scans its own key range [0, ke), not the whole width
    slots = g.tensor(f"l{l}{tag}_topk_slots", (T, topk), k.i32)
    slots = p.call(slots_of_positions_rows, pos, g.block_table, slots, n, BK=max(16, min(128, next_pow2(topk))))
    return attend(g, l, big_q, mla, slots, tag)


def attend(g, l, big_q, mla, slots, tag: str):
    """Sparse MLA attention of the query rows over their chosen slots -> o bf16 [rows, H, 512], in
    the form ops/dsa's sfa_form picks for the step."""
    cfg, p = g.cfg, g.p
    codes, scales, rope = mla
    T, H, topk = big_q.shape[0], cfg.mla_heads, cfg.index_topk
    o = g.tensor(f"l{l}{tag}_mla_o", (T, H, KV_LORA), k.bf16)
    lse = g.tensor(f"l{l}{tag}_mla_lse", (T, H), k.f32)
    bh = min(max(16, next_pow2(H)), max_head_block(g.target))
    form = sfa_form(T, H, topk, g.gpu)
    if form == "keys_major":                                   # prefill on a GPU, few heads
        o, lse = p.call(sfa_keys_major, big_q, codes, scales, rope, slots, o, lse, cfg.sm_scale, BH=bh, BK=32)
        return o
    if form == "two_pass":                                     # decode on a GPU, many heads
        ns = score_segments(T, H, topk, bh)
        s, part_m, part_l = (g.tensor(f"l{l}{tag}_mla_{name}", shape, k.f32)
                             for name, shape in sfa_buffers(T, H, topk, ns).items())
        s, part_m, part_l = p.call(sfa_scores, big_q, codes, scales, rope, slots, s, part_m, part_l, cfg.sm_scale,
                                   BH=bh)
        o, lse = p.call(sfa_values, codes, scales, slots, s, part_m, part_l, o, lse, BH=bh, NSB=segments_pow2(ns))
        return o
    split = sfa_split(T, H, topk, bh) if g.gpu else 1        # decode on a GPU: flash-decoding segments
    prefetch = bool(g.gpu and SFA_PREFETCH and bh <= 32)
    if split > 1:
        part_o = g.tensor(f"l{l}{tag}_mla_part_o", (split, T, H, KV_LORA), k.f32)
        part_lse = g.tensor(f"l{l}{tag}_mla_part_lse", (split, T, H), k.f32)
        part_o, part_lse = p.call(sparse_mla_attention_split, big_q, codes, scales, rope, slots, part_o, part_lse,
                                  cfg.sm_scale, BH=bh, BK=32, PREFETCH=prefetch)
        o, lse = p.call(sparse_mla_attention_combine, part_o, part_lse, o, lse, BH=bh, **combine_tiles(T, H, bh))
    else:
        o, lse = p.call(sparse_mla_attention_fwd, big_q, codes, scales, rope, slots, o, lse, cfg.sm_scale, BH=bh,
                        BK=32, PREFETCH=prefetch)
    return o

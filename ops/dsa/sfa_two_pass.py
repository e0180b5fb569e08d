"""Sparse MLA attention in two passes, the decode form for a GPU (attention.py has the one-pass
kernels and the cache layout).

The one-pass kernel holds, per program, the query's [64, 576] operands, the [64, 512] fp32 output
accumulators and the score tile at once: on sm_90a that is 255 registers, one 8-warp program per
SM and spilled MMA descriptors reloaded every block (benchmarks/NOTES.md, DSA). Splitting the
softmax from the value product leaves each pass with half of that state:

  pass 1 `sfa_scores`  program (query, head block, index segment): the scaled scores of the
         segment's gathered records, written to an fp32 [T, H, topk] buffer (-inf where the index
         is not valid), and the segment's running max m and sum l of exp(score - m).
  pass 2 `sfa_values`  program (query, head block, 128-column tile g of the latent): lse from the
         segments' (m, l); then o[:, g] = sum over the live blocks of (exp(s - lse) * scale_g) @ code_g,
         already normalised, so no online rescaling and one [BH, 128] accumulator.

Traffic: pass 1 gathers whole 656-byte records (once per head block, the second from L2 in
the main); pass 2's four column programs each gather only their 128-byte code tile and its scale,
so the 512 code bytes of a record are read once more in all. The scores make one fp32 round trip
(T * H * topk * 4 B written once, read by the four column tiles' programs, mostly from L2).
Scores past a query's last valid index (top-k lists come compacted) are neither written nor
read: both passes walk live_blocks only. Each pass loads block j + 1's indices during block j,
so a block's record gathers are not also waiting on its index load.
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.dsa.attention import (LATENT, MAX_TWO_PASS_QUERIES, TILE, CacheCodes, CacheRope, CacheScales,
                                      live_blocks, load_query, records_at, score_tile, segment_blocks)

# Candidates from probes/sfa_forms.py (H200, the DSA step's shapes, 128 heads; NOTES.md, DSA, and
# results/sfa_forms*.md). Score pass: two programs per SM at one pipeline stage (q's [64, 576] bf16
# tile alone is 72 KB of shared memory; sm_90a: BK 32 230 registers / 110 KB): 0.144 ms at 64
# queries against 0.204 for BK 64 at three stages. Value pass: BK 64 at one stage 0.140 ms, two
# stages 0.155; all 128 heads per program 0.165; a register cap of 80 (spills) 0.213; two or four
# column tiles per program (the score tile read once) 0.21 / 0.26 at two stages. Either loop as
# k.range(stages=2 or 3) (every load pipelined, the score tile and indices too): values 0.155,
# scores at BK 16 0.217-0.236 (results/sfa_forms_stages.md). Each record field gathered right before
# its dot and the five products summed as they come (sm_90a: 158 registers / 86 KB at BK 32, 127 /
# 80 KB at BK 16 / 8 warps): 0.186 and 0.325 ms against 0.142 (results/sfa_forms_late.md). The next
# block's records gathered into registers one block ahead (BK 16: 187 registers, no spill; BK 32:
# 255 + spills): 0.186 (as BK 16 without) and 0.220 ms (results/sfa_forms_prefetch.md). Head
# blocks of 32 or 16 (three or four programs per SM, mma.sync, 2-4x the gathers): scores 0.244 /
# 0.332, values 0.251 / 0.295 (results/sfa_forms_heads.md).
# BK 16 and BK 64 / 3 stages were tuner candidates too, but the cold-L2 tuner's margins between
# the three are within its noise (0.100 / 0.107 / 0.114 ms at B=32 L=128K in one run, BK 32 first
# in another) while in the step graph BK 32 wins clearly (DSA step SFA 0.141 ms with BK 32 picked,
# 0.158 with BK 16 and 0.176 with BK 64; hot-L2 probes 0.075 / 0.094 / 0.104): one config.
SCORE_CONFIGS = [{"BH": 64, "BK": 32, "num_warps": 4, "num_stages": 1}]
# Value pass: BH 128 and two stages lose in every hot-L2 probe (0.174 / 0.145 ms against 0.123 at
# B=64 L=32K, results/sfa_forms_vpf2_old.md), but the cold tuner once timed BH 64 at 0.142 against
# 0.095 for BH 128 at B=32 L=128K and took it (DSA step SFA 0.137 -> 0.161 ms): one config.
VALUE_CONFIGS = [{"BH": 64, "BK": 64, "num_warps": 8, "num_stages": 1}]
SCORE_BUDGET = 256 << 20          # largest fp32 score buffer (bytes) the auto form accepts


@k.kernel(configs=SCORE_CONFIGS)
def sfa_scores(q: k.Tensor["QT", "T", "H", "DQK"], codes: CacheCodes,
               scales: CacheScales, rope: CacheRope,
               indices: k.Tensor[k.i32, "T", "K"], s: k.Tensor[k.f32, "T", "H", "K"],
               part_m: k.Tensor[k.f32, "NS", "T", "H"], part_l: k.Tensor[k.f32, "NS", "T", "H"], sm_scale: k.f32,
               QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64, BK: k.constexpr = 64):
    # Segment sg of query t's live index blocks (segment_blocks; an empty one writes m = -inf, l = 0).
    # Block j + 1's indices are loaded after block j's dots (before them: 0.144 -> 0.153 ms; here:
    # 0.144 -> 0.140 at B=64 L=32K, 0.0776 -> 0.0752 at B=32 L=128K; results/sfa_scores_ahead.md).
    for t, hb, sg in k.grid(q.shape[0], k.cdiv(q.shape[1], BH), part_m.shape[0]):
        h0 = hb * BH
        ql0, ql1, ql2, ql3, qr = load_query(q, t, h0, BH)
        n_slots = codes.shape[0]
        first, count = segment_blocks(indices, t, n_slots, BK, sg, part_m.shape[0])
        m = k.full((BH,), float("-inf"), k.f32)
        l = k.zeros((BH,), k.f32)
        ahead = indices[t, k.span(first * BK, BK, other=-1)]
        for j in range(count):
            j0 = (first + j) * BK
            valid, c0, c1, c2, c3, s0, s1, s2, s3, kr = records_at(codes, scales, rope, ahead, n_slots)
            sc = score_tile(ql0, ql1, ql2, ql3, qr, c0.to(k.bf16), c1.to(k.bf16), c2.to(k.bf16), c3.to(k.bf16),
                            s0, s1, s2, s3, kr, valid, sm_scale)
            ahead = indices[t, k.span(j0 + BK, BK, other=-1)]           # past the segment: never used
            s[t, k.span(h0, BH), k.span(j0, BK)] = sc
            m, l = fold_stats(m, l, sc)
        part_m[sg, t, k.span(h0, BH)] = m
        part_l[sg, t, k.span(h0, BH)] = l


@k.func
def fold_stats(m, l, sc):
    """The running softmax statistics [BH] after one more score tile sc [BH, BK]: max m and sum l
    of exp(score - m); a row with nothing valid yet (all -inf) keeps m = -inf, l = 0 (no NaN)."""
    m_new = k.maximum(m, k.max(sc, axis=1))
    m_safe = k.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, l * k.exp(m - m_safe) + k.sum(k.exp(sc - m_safe[:, None]), axis=1)


@k.func
def segments_lse(part_m, part_l, t, h0, BH, NSB):
    """lse [BH] of query t's heads from the segments' (m, l): max m + log sum l exp(m - max m);
    +inf for a head without any valid index (every l = 0)."""
    pm = k.load(part_m, (k.span(0, NSB), t, k.span(h0, BH)), other=float("-inf"))      # [NSB, BH]
    pl = k.load(part_l, (k.span(0, NSB), t, k.span(h0, BH)), other=0.0)
    mx = k.max(pm, axis=0)
    ms = k.where(mx == float("-inf"), 0.0, mx)
    den = k.sum(pl * k.exp(pm - ms[None, :]), axis=0)
    ok = den > 0.0
    return k.where(ok, ms + k.log(k.where(ok, den, 1.0)), float("inf"))


# The value pass takes the views without k.aligned: it gathers whole 128-byte code tiles and one
# scale per record, which the promise does not widen, and with it ptxas schedules the same loop
# body in another order that measured 4 % slower (0.1203 against 0.1152 ms at B=64 L=32K, 0.0614
# against 0.0589 at B=32 L=128K; results/sfa_forms_align_*.json).
@k.kernel(configs=VALUE_CONFIGS)
def sfa_values(codes: k.Tensor[k.f8e4m3, "S", "R"], scales: k.Tensor[k.f32, "S", "R // 4"],
               indices: k.Tensor[k.i32, "T", "K"], s: k.Tensor[k.f32, "T", "H", "K"],
               part_m: k.Tensor[k.f32, "NS", "T", "H"], part_l: k.Tensor[k.f32, "NS", "T", "H"],
               o: k.Tensor[k.bf16, "T", "H", "DV"], lse: k.Tensor[k.f32, "T", "H"],
               BH: k.constexpr = 64, BK: k.constexpr = 64, NSB: k.constexpr = 1):
    # NSB: the segment count rounded up to a power of two (the caller passes it). Every column
    # tile's program computes the same lse and writes it. Block j + 1's indices are loaded during
    # block j, so a block's gathers wait on one memory round trip, not two (index, then codes):
    # 0.140 -> 0.121 ms at B=64 L=32K, 0.068 -> 0.060 at B=32 L=128K (results/sfa_probs.md). Where
    # the loads sit in the body matters as much: the code tile gathered before the score tile's
    # load made this pass 0.208 ms (results/sfa_values_ahead.md, NOTES).
    # The column tile is the grid's fastest axis: a (query, head block)'s four programs, which read
    # the same score tiles and index list, run side by side (L2 hits) instead of a wave apart.
    for g, hb, t in k.grid(k.cdiv(o.shape[2], 128), k.cdiv(o.shape[1], BH), o.shape[0]):
        h0 = hb * BH
        row_lse = segments_lse(part_m, part_l, t, h0, BH, NSB)
        n_slots = codes.shape[0]
        acc = k.zeros((BH, 128), k.f32)
        ahead = indices[t, k.span(0, BK, other=-1)]
        for j in range(live_blocks(indices, t, n_slots, BK)):
            idx = ahead
            ahead = indices[t, k.span(j * BK + BK, BK, other=-1)]          # past the list: -1, never used
            valid = (idx >= 0) & (idx < n_slots)
            sc = k.load(s, (t, k.span(h0, BH), k.span(j * BK, BK)), other=float("-inf"))
            p = k.where(valid[None, :], k.exp(sc - row_lse[:, None]), 0.0)
            c = codes[idx, k.span(g * 128, 128, other=0.0)].to(k.bf16)
            sg = k.load(scales, (idx, 128 + g), other=0.0)
            acc += k.dot((p * sg[None, :]).to(k.bf16), c)
        o[t, k.span(h0, BH), k.span(g * 128, 128)] = acc.to(k.bf16)
        lse[t, k.span(h0, BH)] = row_lse


def score_segments(t: int, h: int, topk: int, bh: int, bk: int = 64, sm_count: int = 132) -> int:
    """Index segments per (query, head block) for pass 1: doubled while the programs stay within
    ~2 per SM (the score pass's occupancy) and each segment keeps at least one BK block."""
    programs = t * -(-h // bh)
    blocks = -(-topk // bk)
    ns = 1
    while ns * 2 <= blocks and programs * ns * 2 <= 2 * sm_count:
        ns *= 2
    return ns


def fits(t: int, h: int, topk: int) -> bool:
    """Whether the fp32 score buffer of a call stays within SCORE_BUDGET (decode-sized calls) and
    its queries within pass 2's grid."""
    return t * h * topk * 4 <= SCORE_BUDGET and t <= MAX_TWO_PASS_QUERIES


def pass_configs(op: str, kw: dict) -> tuple[dict, dict]:
    """The call's config keys for each pass (a key goes to every pass that has it: BH, BK and
    launch options to both); a key of neither pass is a K31Error."""
    from k31dsl.targets.triton.emit import LAUNCH_KEYS          # the launch options config_for passes on
    parts = tuple({key: val for key, val in kw.items() if key in set(kd.signature().constexprs) | set(LAUNCH_KEYS)}
                  for kd in (sfa_scores, sfa_values))
    unknown = sorted(set(kw) - set(parts[0]) - set(parts[1]))
    if unknown:
        raise K31Error(f"{op}: the two-pass form takes no config key {', '.join(unknown)}",
                       hint="its passes take BH, BK and launch options such as num_warps; "
                            "PREFETCH belongs to form=\"one_pass\"")
    return parts


def buffers(t: int, h: int, topk: int, segments: int) -> dict:
    """The passes' fp32 intermediates by name -> shape: the scores and the segments' (m, l)."""
    return {"scores": (t, h, topk), "part_m": (segments, t, h), "part_l": (segments, t, h)}


def new_buffers(t: int, h: int, topk: int, segments: int, device):
    """Empty torch tensors for `buffers`' three intermediates, in its order: (scores, part_m, part_l)."""
    import torch
    return tuple(torch.empty(shape, dtype=torch.float32, device=device)
                 for shape in buffers(t, h, topk, segments).values())


def segments_pow2(segments: int) -> int:
    """pass 2's NSB: the segment count rounded up to a power of two."""
    return 1 << (segments - 1).bit_length()


def sparse_mla_attention_two_pass(target: str, q, views, idx, sm_scale: float, o, lse, segments: int, kw: dict):
    """Launch both passes into o / lse (torch tensors allocated by the caller). kw: config keys
    pinned for the passes that take them (pass_configs)."""
    kw_scores, kw_values = pass_configs("sparse_mla_attention", kw)
    c, sc, r = views
    s, part_m, part_l = new_buffers(q.shape[0], q.shape[1], idx.shape[1], segments, q.device)
    sfa_scores[target](q, c, sc, r, idx, s, part_m, part_l, float(sm_scale), **kw_scores)
    sfa_values[target](c, sc, idx, s, part_m, part_l, o, lse, NSB=segments_pow2(segments), **kw_values)
    return o, lse


assert LATENT == 4 * TILE            # pass 2's column tiles are the cache's 128-column scale tiles

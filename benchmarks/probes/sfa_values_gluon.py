"""Probe: the SFA value pass hand-scheduled in Gluon (Triton's explicit-layout language, not the
DSL): what the pass gains when its MMA runs asynchronously while the next block is prepared.

The DSL's value pass (`sfa_two_pass.sfa_values`, Triton `tl`) computes per block of 64 selected
keys p = exp(s - lse) * scale_g (registers), widens the gathered E4M3 code tile to bf16 and
multiplies them; Triton waits on every such wgmma (its left operand is computed in the loop) and
each block's loads are issued in the block (NOTES: 31 % of the pass's stall samples wait on the
score tile). Here, per program (column tile g, head block, query), with one warpgroup or two
(NW 4 / 8; the second takes half of the 128 columns):
  - with PREFETCH, block j + 1's score tile, scales, indices and code rows are loaded into
    registers while block j is worked on (a register double buffer);
  - block j's probabilities (bf16) and widened codes go to one of two shared-memory buffers each,
    and the wgmma reading them is asynchronous: it is waited on only after block j + 1's wgmma is
    issued (`warpgroup_mma_wait(1)`), so it overlaps block j + 1's exponentials and conversions.
    Block 0 is peeled with use_acc=False: a zero-initialised accumulator carried into the loop
    makes ptxas serialise every wgmma (C7515), whatever the operands. (A first version with the
    probabilities as a register operand was built only before that fix: 255 registers.)
Same inputs and numerics as `sfa_values`: the outputs came out bit-identical. Measured slower
(0.187 against 0.115 ms at B=64 L=32K at best; NOTES, session of 07:47 UTC 2 Dec). CUDA-graph
medians; writes results/sfa_values_gluon.json and .md. Needs Triton 3.6's Gluon and a GPU.

    python benchmarks/probes/sfa_values_gluon.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia import hopper  # noqa: E402

SM_SCALE = 0.135234
RECORD = gl.constexpr(656)   # bytes per cache record (codes view row); the fp32 scales view has 164 per row


@gluon.jit
def _block_loads(codes, scales, indices, s, t, h0, g, j, K, S, H,
                 BH: gl.constexpr, BK: gl.constexpr, LS: gl.constexpr, LC: gl.constexpr):
    """Block j's score tile [BH, BK] (LS), code rows [BK, 128] (LC, E4M3) and scales [BK]."""
    hs = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, LS))
    ks = j * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, LS))
    s_off = (t * H + hs[:, None]).to(gl.int64) * K + ks[None, :]
    sc = gl.load(s + s_off, mask=(hs[:, None] < H) & (ks[None, :] < K), other=float("-inf"))
    kc = j * BK + gl.arange(0, BK, layout=gl.SliceLayout(1, LC))
    idx = gl.load(indices + t * K + kc, mask=kc < K, other=-1)
    ok = (idx >= 0) & (idx < S)
    cols = g * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LC))
    c_off = idx.to(gl.int64)[:, None] * RECORD + cols[None, :]
    code = gl.load(codes + c_off, mask=ok[:, None], other=0.0)
    ks2 = j * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, LS))
    idx2 = gl.load(indices + t * K + ks2, mask=ks2 < K, other=-1)
    ok2 = (idx2 >= 0) & (idx2 < S)
    sg = gl.load(scales + idx2.to(gl.int64) * (RECORD // 4) + 128 + g, mask=ok2, other=0.0)
    return sc, code, sg, ok2


@gluon.jit
def _block_mma(sc, code, sg, ok, lse_s, pslot, vslot, acc, use_acc):
    """Block j's probabilities and widened codes into their shared-memory slots, its wgmma issued
    asynchronously; returns once at most this one is in flight (block j - 1's is done, so its
    slots may be written again)."""
    p = gl.where(ok[None, :], gl.exp(sc - lse_s[:, None]), 0.0) * sg[None, :]
    pslot.store(p.to(gl.bfloat16))
    vslot.store(code.to(gl.bfloat16))
    hopper.fence_async_shared()
    acc = hopper.warpgroup_mma(pslot, vslot, acc, use_acc=use_acc, is_async=True)
    return hopper.warpgroup_mma_wait(num_outstanding=1, deps=[acc])


@gluon.jit
def segments_lse(part_m, part_l, t, h0, T, H, NS, NSB: gl.constexpr, BH: gl.constexpr, LP: gl.constexpr):
    """lse [BH] (layout SliceLayout(0, LP)) of query t's heads h0.. from the score pass's segment
    statistics, as `sfa_two_pass.segments_lse`: +inf for a head without any valid index."""
    rows = gl.arange(0, NSB, layout=gl.SliceLayout(1, LP))
    hs = h0 + gl.arange(0, BH, layout=gl.SliceLayout(0, LP))
    p_off = (rows[:, None] * T + t) * H + hs[None, :]
    p_ok = (rows[:, None] < NS) & (hs[None, :] < H)
    pm = gl.load(part_m + p_off, mask=p_ok, other=float("-inf"))
    pl = gl.load(part_l + p_off, mask=p_ok, other=0.0)
    mx = gl.max(pm, axis=0)
    ms = gl.where(mx == float("-inf"), 0.0, mx)
    den = gl.sum(pl * gl.exp(pm - ms[None, :]), axis=0)
    okd = den > 0.0
    return gl.where(okd, ms + gl.log(gl.where(okd, den, 1.0)), float("inf"))


@gluon.jit
def sfa_values_gluon(codes, scales, indices, s, part_m, part_l, o, lse, S, K, H, T, NS, nblk,
                     BH: gl.constexpr, BK: gl.constexpr, NSB: gl.constexpr, PSW: gl.constexpr,
                     PREFETCH: gl.constexpr, NW: gl.constexpr):
    g = gl.program_id(0)
    hb = gl.program_id(1)
    t = gl.program_id(2)
    h0 = hb * BH
    LS: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])       # [BH, BK] fp32 tiles
    LC: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])      # [BK, 128] byte rows
    LP: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])      # [NSB, BH] partials
    # one warpgroup per 64 rows; a second one (8 warps) takes the other half of the 128 columns
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                  instr_shape=[16, 128 // (NW // 4), 16])
    VSH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    row_lse = segments_lse(part_m, part_l, t, h0, T, H, NS, NSB, BH, LP)
    lse_s = gl.convert_layout(row_lse, gl.SliceLayout(1, LS))

    PSH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=PSW, element_bitwidth=16, rank=2)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [2, BK, 128], VSH)
    pbuf = gl.allocate_shared_memory(gl.bfloat16, [2, BH, BK], PSH)
    # Block 0 is peeled: its wgmma starts the accumulator (use_acc=False), so no other instruction
    # defines the accumulator registers while a wgmma is in flight (ptxas would serialize them).
    sc, code, sg, ok = _block_loads(codes, scales, indices, s, t, h0, g, 0, K, S, H, BH, BK, LS, LC)
    acc = _block_mma(sc, code, sg, ok, lse_s, pbuf.index(0), vbuf.index(0),
                     gl.zeros([BH, 128], gl.float32, layout=MMA), False)
    if PREFETCH:
        sc, code, sg, ok = _block_loads(codes, scales, indices, s, t, h0, g, 1, K, S, H, BH, BK, LS, LC)
    for j in range(1, nblk):
        if PREFETCH:       # block j + 1's loads in flight while block j is worked on
            nsc, ncode, nsg, nok = _block_loads(codes, scales, indices, s, t, h0, g, j + 1, K, S, H, BH, BK, LS, LC)
        else:
            sc, code, sg, ok = _block_loads(codes, scales, indices, s, t, h0, g, j, K, S, H, BH, BK, LS, LC)
        acc = _block_mma(sc, code, sg, ok, lse_s, pbuf.index(j % 2), vbuf.index(j % 2), acc, True)
        if PREFETCH:
            sc, code, sg, ok = nsc, ncode, nsg, nok
    acc = hopper.warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    LO: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    out = gl.convert_layout(acc.to(gl.bfloat16), LO)
    ho = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, LO))
    co = g * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LO))
    gl.store(o + (t * H + ho[:, None]).to(gl.int64) * 512 + co[None, :], out, mask=ho[:, None] < H)
    hl = h0 + gl.arange(0, BH, layout=gl.SliceLayout(0, LP))
    gl.store(lse + t * H + hl, gl.convert_layout(row_lse, gl.SliceLayout(0, LP)), mask=(hl < H) & (g == 0))


def launch(views, idx, s, part_m, part_l, o, lse, live_blocks: int, BH: int = 64, BK: int = 64,
           prefetch: bool = False, warps: int = 4, maxnreg: int | None = None):
    codes, scales, _ = views
    T, H, K = s.shape
    ns = part_m.shape[0]
    nsb = 1 << (ns - 1).bit_length()
    grid = (4, -(-H // BH), T)
    sfa_values_gluon[grid](codes, scales, idx, s, part_m, part_l, o, lse, codes.shape[0], K, H, T, ns, live_blocks,
                           BH=BH, BK=BK, NSB=max(nsb, 2), PSW=min(128, 2 * BK), PREFETCH=prefetch,
                           NW=warps, num_warps=warps, **({"maxnreg": maxnreg} if maxnreg else {}))


def scored_step(b: int, length: int):
    """The value pass's inputs at the DSA step (dsa.py's), shared by the value-pass probes: the
    committed score pass run once into its buffers, and the committed value pass as a callable
    writing o_ref / l_ref. Returns (views, slots, scores, part_m, part_l, o_ref, l_ref, committed)."""
    import torch

    from dsa import step_attention_inputs
    from k31dsl.ops.dsa import sfa_two_pass as TP
    q, _mcache, views, slots = step_attention_inputs(b, length)
    T, H, K = q.shape[0], q.shape[1], slots.shape[1]
    ns = TP.score_segments(T, H, K, 64, 32)
    s, pm, pl = TP.new_buffers(T, H, K, ns, "cuda")
    TP.sfa_scores["triton"](q, *views, slots, s, pm, pl, SM_SCALE, **TP.SCORE_CONFIGS[0])
    o_ref, l_ref = torch.empty(T, H, 512, dtype=torch.bfloat16, device="cuda"), torch.empty(T, H, device="cuda")

    def committed():
        TP.sfa_values["triton"](views[0], views[1], slots, s, pm, pl, o_ref, l_ref, NSB=TP.segments_pow2(ns),
                                **TP.VALUE_CONFIGS[0])
    committed()
    return views, slots, s, pm, pl, o_ref, l_ref, committed


def main(argv=None) -> int:
    import torch

    import harness
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        views, slots, s, pm, pl, o_ref, l_ref, committed = scored_step(b, length)
        K = slots.shape[1]
        base = {"B": b, "L": length}
        rows.append({**base, "kernel": "sfa_values (DSL, committed)", "ms": harness.graph_median_ms(committed)})
        print(rows[-1], flush=True)
        for bk, pf, nw, cap in ((64, False, 4, 0), (64, False, 8, 0), (64, True, 8, 0), (64, True, 8, 128),
                                (32, True, 8, 0), (32, True, 8, 128)):
            o, lse = torch.full_like(o_ref, float("nan")), torch.full_like(l_ref, float("nan"))

            def hand(bk=bk, pf=pf, nw=nw, cap=cap, o=o, lse=lse):
                launch(views, slots, s, pm, pl, o, lse, -(-K // bk), BK=bk, prefetch=pf, warps=nw, maxnreg=cap)
            try:
                hand()
                torch.cuda.synchronize()
                err = float((o.float() - o_ref.float()).abs().max() / o_ref.float().abs().max())
                lerr = float((lse - l_ref).abs().max())
                ms = harness.graph_median_ms(hand)
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                print("failed", bk, pf, nw, type(e).__name__, str(e)[:300], flush=True)
                ms = err = lerr = float("nan")
            name = f"sfa_values_gluon BK={bk} prefetch={pf} warps={nw} maxnreg={cap or '-'}"
            rows.append({**base, "kernel": name, "ms": ms, "o rel diff": err, "lse diff": lerr})
            print(rows[-1], flush=True)
        rows.append({**base, "kernel": "sfa_values (DSL, committed) again", "ms": harness.graph_median_ms(committed)})
        print(rows[-1], flush=True)
    harness.report("sfa_values_gluon", ["B", "L", "kernel", "ms", "o rel diff", "lse diff"], rows,
                   notes="CUDA-graph medians; the hand-scheduled pass reads the committed score pass's buffers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

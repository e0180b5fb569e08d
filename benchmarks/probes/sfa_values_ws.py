"""Probe: the SFA value pass warp-specialised in Gluon (FlashMLA's structure: producer warps gather
and widen, consumer warps multiply), to test what every earlier SFA note named as the remaining
lever. Outside the DSL: Triton's `tl` has no producer/consumer partitions over gathers.

The DSL's pass (`sfa_two_pass.sfa_values`) runs each 64-key block's chain in one program: index ->
code-row gather (a DRAM round trip) -> widen to bf16 -> shared memory -> wgmma, waited every block,
two 8-warp programs per SM. Here each program (column tile g, head block, query) splits in two:

  loader (worker partition, LW warps): block j + 1's score tile [BH, BK] fp32 and scales [BK]
         copied to a ring slot by cp.async while block j's E4M3 code rows, loaded into registers
         one block earlier, are widened to bf16 into the slot's wgmma operand; then the next
         block's code rows are issued and the slot is marked ready (mbarrier). So two blocks'
         memory reads are in flight at every moment, and the gather latency leaves the
         consumer's path.
  consumer (default partition, one warpgroup per 64 heads: BH 128 is FlashMLA's shape, two
         warpgroups sharing each slot's codes): waits for a ready slot, p = exp(s - lse) * scale
         in the wgmma accumulator's layout, bf16, converted to the register A operand,
         wgmma(p, codes_slot) into the [BH, 128] accumulator, frees the slot (mbarrier). With
         ASYNC the wgmma is waited one block later (the slot is freed then).

Same inputs and numerics as `sfa_values`: o came out bit-identical. Measured slower: 0.159 ms at
best (BH 64; BH 128 0.36) against 0.114 for the DSL's pass (B=64 L=32K; NOTES, session of 22:43 UTC 2 Dec). ASYNC is
not safe: it gave a wrong o once (the next block's p may reuse the registers an in-flight wgmma
still reads). CUDA-graph medians next to the committed DSL pass; writes results/sfa_values_ws*.json
and .md. Needs Triton 3.6's Gluon and a GPU; `--build-only` compiles the variants for sm_90a on a
machine without one and prints their registers and shared memory.

    python benchmarks/probes/sfa_values_ws.py [--shapes 64x32768,32x131072] [--build-only]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia import hopper  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier  # noqa: E402

from sfa_values_gluon import segments_lse  # noqa: E402


RECORD = gl.constexpr(656)   # bytes per cache record (codes view row); the fp32 scales view has 164 per row


@gluon.jit
def _block_indices(indices, t, j, K, BK: gl.constexpr, LC: gl.constexpr):
    """Block j's cache slots [BK] (-1 past the list), in the layout of the code rows' row axis."""
    kc = j * BK + gl.arange(0, BK, layout=gl.SliceLayout(1, LC))
    return gl.load(indices + t * K + kc, mask=kc < K, other=-1)


@gluon.jit
def _code_rows(codes, idx, g, S, LC: gl.constexpr):
    """The E4M3 code rows [BK, 128] of column tile g at slots idx (0 where a slot is not valid)."""
    ok = (idx >= 0) & (idx < S)
    cols = g * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LC))
    return gl.load(codes + idx.to(gl.int64)[:, None] * RECORD + cols[None, :], mask=ok[:, None], other=0.0)


@gluon.jit
def _copy_scores(s, scales, idx, sbuf, gbuf, t, h0, g, j, K, S, H,
                 BH: gl.constexpr, BK: gl.constexpr, LT: gl.constexpr):
    """cp.async of block j's score tile [BH, BK] and, at its slots idx, the code-tile scales [BK]
    into one ring slot (a scale is copied by each of the threads that hold its slot: same bytes)."""
    hs = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, LT))
    ks = j * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, LT))
    s_ptr = s + (t * H + hs[:, None]).to(gl.int64) * K + ks[None, :]
    async_copy.async_copy_global_to_shared(sbuf, s_ptr, mask=(hs[:, None] < H) & (ks[None, :] < K))
    ok = (idx >= 0) & (idx < S)
    async_copy.async_copy_global_to_shared(gbuf, scales + idx.to(gl.int64) * (RECORD // 4) + 128 + g, mask=ok)
    async_copy.commit_group()


@gluon.jit
def _loader(codes, scales, indices, s, bufs, bars, t, h0, g, K, S, H, nblk,
            BH: gl.constexpr, BK: gl.constexpr, LW: gl.constexpr):
    sbufs, gbufs, vbufs = bufs
    ready, empty = bars
    NBUF: gl.constexpr = sbufs.type.shape[0]
    LC: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [LW, 1], [1, 0])       # [BK, 128] byte rows
    LT: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [LW, 1], [1, 0])       # [BH, BK] fp32, 16 B a copy
    # Each block's slots are loaded one block before its gathers use them (as the DSL pass does),
    # so no gather waits on an index load: block 0's copies and rows are issued before the loop.
    idx = _block_indices(indices, t, 0, K, BK, LC)
    _copy_scores(s, scales, idx, sbufs.index(0), gbufs.index(0), t, h0, g, 0, K, S, H, BH, BK, LT)
    code = _code_rows(codes, idx, g, S, LC)
    idx = _block_indices(indices, t, 1, K, BK, LC)
    for j in range(nblk):
        slot = j % NBUF
        nxt = (j + 1) % NBUF
        if j + 1 < nblk:      # block j + 1's score tile into its slot once the consumer freed it
            mbarrier.wait(empty.index(nxt), ((j + 1) // NBUF & 1) ^ 1)
            _copy_scores(s, scales, idx, sbufs.index(nxt), gbufs.index(nxt), t, h0, g, j + 1, K, S, H, BH, BK, LT)
        else:
            async_copy.commit_group()                 # an empty group keeps wait_group(1) uniform
        vbufs.index(slot).store(code.to(gl.bfloat16))
        code = _code_rows(codes, idx, g, S, LC)       # block j + 1 (past the list: masked, unused)
        idx = _block_indices(indices, t, j + 2, K, BK, LC)
        async_copy.wait_group(1)                      # block j's copies have landed
        hopper.fence_async_shared()                   # the widened codes, for the consumer's wgmma
        gl.thread_barrier()                           # every loader thread's part of the slot is in
        mbarrier.arrive(ready.index(slot), count=1)


@gluon.jit
def _consume(bufs, bars, j, acc, lse_p, use_acc, MMA: gl.constexpr, LP: gl.constexpr, ASYNC: gl.constexpr):
    """Block j: p from the slot's scores and scales, one wgmma into acc; frees the slot (ASYNC: the
    previous block's slot, once that block's wgmma is known done)."""
    sbufs, gbufs, vbufs = bufs
    ready, empty = bars
    NBUF: gl.constexpr = sbufs.type.shape[0]
    slot = j % NBUF
    mbarrier.wait(ready.index(slot), j // NBUF & 1)
    sc = sbufs.index(slot).load(LP)
    sg = gbufs.index(slot).load(gl.SliceLayout(0, LP))
    p = (gl.exp(sc - lse_p[:, None]) * sg[None, :]).to(gl.bfloat16)
    a = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
    if ASYNC:
        acc = hopper.warpgroup_mma(a, vbufs.index(slot), acc, use_acc=use_acc, is_async=True)
        acc = hopper.warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        mbarrier.arrive(empty.index((j + NBUF - 1) % NBUF), count=1, pred=j > 0)
    else:
        acc = hopper.warpgroup_mma(a, vbufs.index(slot), acc, use_acc=use_acc)
        mbarrier.arrive(empty.index(slot), count=1)
    return acc


@gluon.jit
def _consumer(bufs, bars, row_lse, nblk, BH: gl.constexpr, BK: gl.constexpr, ASYNC: gl.constexpr):
    # one warpgroup per 64 heads: BH 128 has two consumer warpgroups sharing each code slot
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BH // 16, 1], instr_shape=[16, 128, 16])
    LP: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BH // 16, 1], instr_shape=[16, BK, 16])
    lse_p = gl.convert_layout(row_lse, gl.SliceLayout(1, LP))
    # block 0 starts the accumulator (use_acc=False): a zero-initialised accumulator carried into
    # the loop makes ptxas serialise every wgmma (C7515; sfa_values_gluon.py)
    acc = _consume(bufs, bars, 0, gl.zeros([BH, 128], gl.float32, layout=MMA), lse_p, False, MMA, LP, ASYNC)
    for j in range(1, nblk):
        acc = _consume(bufs, bars, j, acc, lse_p, True, MMA, LP, ASYNC)
    if ASYNC:
        acc = hopper.warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)          # warp_specialize takes the default partition's results as a tuple


@gluon.jit
def sfa_values_ws(codes, scales, indices, s, part_m, part_l, o, lse, S, K, H, T, NS, nblk,
                  BH: gl.constexpr, BK: gl.constexpr, NSB: gl.constexpr, NBUF: gl.constexpr,
                  LW: gl.constexpr, LREGS: gl.constexpr, ASYNC: gl.constexpr, SWZ: gl.constexpr):
    g = gl.program_id(0)
    hb = gl.program_id(1)
    t = gl.program_id(2)
    h0 = hb * BH
    # lse of the head block from the score pass's segments, before the fork
    LPART: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [BH // 16, 1], [1, 0])  # [NSB, BH]
    row_lse = segments_lse(part_m, part_l, t, h0, T, H, NS, NSB, BH, LPART)

    # The consumer reads the score tile in the wgmma accumulator's layout: 8-byte pairs, a warp's
    # 8 rows 256 B apart, which unswizzled all fall in the same banks (8-way conflicts). 32-byte
    # units XOR-swizzled by row spread them over all 32 banks; the loader's 16-byte copies stay whole.
    SSH: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0]) if SWZ else gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    VSH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    sbufs = gl.allocate_shared_memory(gl.float32, [NBUF, BH, BK], SSH)
    gbufs = gl.allocate_shared_memory(gl.float32, [NBUF, BK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    vbufs = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BK, 128], VSH)
    ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    bufs = (sbufs, gbufs, vbufs)
    bars = (ready, empty)
    acc, = gl.warp_specialize([
        (_consumer, (bufs, bars, row_lse, nblk, BH, BK, ASYNC)),
        (_loader, (codes, scales, indices, s, bufs, bars, t, h0, g, K, S, H, nblk, BH, BK, LW)),
    ], [LW], [LREGS])
    LO: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [BH // 16, 1], [1, 0])
    out = gl.convert_layout(acc.to(gl.bfloat16), LO)
    ho = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, LO))
    co = g * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LO))
    gl.store(o + (t * H + ho[:, None]).to(gl.int64) * 512 + co[None, :], out, mask=ho[:, None] < H)
    hl = h0 + gl.arange(0, BH, layout=gl.SliceLayout(0, LPART))
    gl.store(lse + t * H + hl, gl.convert_layout(row_lse, gl.SliceLayout(0, LPART)), mask=(hl < H) & (g == 0))


VARIANTS = [  # (NBUF, loader warps, loader registers, ASYNC, maxnreg, swizzled scores, heads per program)
    (3, 4, 96, False, 128, False, 64), (3, 4, 96, True, 128, False, 64), (2, 4, 96, False, 128, False, 64),
    (3, 2, 96, False, 128, False, 64), (4, 4, 96, True, 128, False, 64),
    (3, 4, 96, False, 128, True, 64), (3, 4, 96, True, 128, True, 64), (4, 4, 96, True, 128, True, 64),
    # FlashMLA's shape: all 128 heads in one program, two consumer warpgroups (one program per SM)
    (3, 4, 96, False, 168, True, 128), (2, 4, 96, False, 168, True, 128), (4, 4, 96, False, 168, True, 128),
]  # ASYNC needs NBUF >= 3


def launch(views, idx, s, part_m, part_l, o, lse, live_blocks: int, nbuf: int, lw: int, lregs: int, use_async: bool,
           maxnreg: int, swizzle: bool, BH: int = 64, BK: int = 64):
    if use_async and nbuf < 3:      # the loader would wait for the slot the consumer frees only after it
        raise ValueError("ASYNC frees a slot one block late: it needs NBUF >= 3")
    codes, scales, _ = views
    T, H, K = s.shape
    ns = part_m.shape[0]
    nsb = max(2, 1 << (ns - 1).bit_length())
    sfa_values_ws[(4, -(-H // BH), T)](codes, scales, idx, s, part_m, part_l, o, lse, codes.shape[0], K, H, T, ns,
                                       live_blocks, BH=BH, BK=BK, NSB=nsb, NBUF=nbuf, LW=lw, LREGS=lregs,
                                       ASYNC=use_async, SWZ=swizzle, num_warps=BH // 16, maxnreg=maxnreg)


def build_only() -> int:
    """Compile every variant for sm_90a (no GPU needed) and print registers and shared memory."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"codes": "*fp8e4nv", "scales": "*fp32", "indices": "*i32", "s": "*fp32", "part_m": "*fp32",
           "part_l": "*fp32", "o": "*bf16", "lse": "*fp32", "S": "i32", "K": "i32", "H": "i32", "T": "i32",
           "NS": "i32", "nblk": "i32"}
    bindir = Path(triton.__file__).parent / "backends/nvidia/bin"
    for nbuf, lw, lregs, use_async, cap, swz, bh in VARIANTS:
        consts = {"BH": bh, "BK": 64, "NSB": 2, "NBUF": nbuf, "LW": lw, "LREGS": lregs, "ASYNC": use_async, "SWZ": swz}
        src = GluonASTSource(sfa_values_ws, {**sig, **{k: "constexpr" for k in consts}}, consts)
        try:
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": bh // 16, "maxnreg": cap})
        except Exception as e:  # noqa: BLE001 - a variant that does not build is a result
            print(f"NBUF {nbuf} LW {lw} ASYNC {use_async} maxnreg {cap}: does not build: {str(e)[-1500:]}")
            continue
        with tempfile.TemporaryDirectory() as d:
            cub = Path(d) / "k.cubin"
            cub.write_bytes(ck.asm["cubin"])
            sass = subprocess.run([str(bindir / "cuobjdump"), "-sass", str(cub)], capture_output=True, text=True).stdout
            res = subprocess.run([str(bindir / "cuobjdump"), "-res-usage", str(cub)], capture_output=True,
                                 text=True).stdout
        regs = re.search(r"REG:(\d+)", res).group(1)
        Path(f"/tmp/sfa_ws_{nbuf}_{lw}_{int(use_async)}_{cap}.sass").write_text(sass)
        Path(f"/tmp/sfa_ws_{nbuf}_{lw}_{int(use_async)}_{cap}.ptx").write_text(ck.asm["ptx"])
        ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
        print(f"BH {bh} NBUF {nbuf} LW {lw} LREGS {lregs} ASYNC {use_async} maxnreg {cap} swizzled {swz}: regs {regs} "
              f"smem {ck.metadata.shared} B, {len(ops)} SASS, HGMMA {sum(o.startswith('HGMMA') for o in ops)}, "
              f"LDGSTS {sum(o.startswith('LDGSTS') for o in ops)}, SYNCS {sum(o.startswith('SYNCS') for o in ops)}, "
              f"DEPBAR {sum(o.startswith('WARPGROUP.DEPBAR') for o in ops)}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--build-only", action="store_true", help="compile for sm_90a and print resources; no GPU")
    ap.add_argument("--variants", default="", help="positions in VARIANTS joined by , or + (default: all)")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    args = ap.parse_args(argv)
    chosen = [VARIANTS[int(i)] for i in args.variants.replace("+", ",").split(",") if i] or VARIANTS
    if args.build_only:
        return build_only()
    import torch

    import harness
    from sfa_values_gluon import scored_step
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        views, slots, s, pm, pl, o_ref, l_ref, committed = scored_step(b, length)
        K = slots.shape[1]
        base = {"B": b, "L": length}
        rows.append({**base, "kernel": "sfa_values (DSL, committed)", "ms": harness.graph_median_ms(committed)})
        print(rows[-1], flush=True)
        for nbuf, lw, lregs, use_async, cap, swz, bh in chosen:
            o, lse = torch.full_like(o_ref, float("nan")), torch.full_like(l_ref, float("nan"))

            def hand(nbuf=nbuf, lw=lw, lregs=lregs, use_async=use_async, cap=cap, swz=swz, bh=bh, o=o, lse=lse):
                launch(views, slots, s, pm, pl, o, lse, -(-K // 64), nbuf, lw, lregs, use_async, cap, swz, BH=bh)
            try:
                hand()
                torch.cuda.synchronize()
                err = float((o.float() - o_ref.float()).abs().max() / o_ref.float().abs().max())
                same = bool(torch.equal(o, o_ref))
                lerr = float((lse - l_ref).abs().max())
                ms = harness.graph_median_ms(hand)
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                print("failed", nbuf, lw, use_async, type(e).__name__, str(e)[:300], flush=True)
                ms = err = lerr = float("nan")
                same = False
            name = f"ws BH={bh} NBUF={nbuf} loader={lw}w/{lregs}r async={use_async} maxnreg={cap} swizzled={swz}"
            rows.append({**base, "kernel": name, "ms": ms, "o rel diff": err, "o bit-identical": same,
                         "lse diff": lerr})
            print(rows[-1], flush=True)
        rows.append({**base, "kernel": "sfa_values (DSL, committed) again", "ms": harness.graph_median_ms(committed)})
        print(rows[-1], flush=True)
    harness.report("sfa_values_ws" + (f"_{args.tag}" if args.tag else ""), ["B", "L", "kernel", "ms", "o rel diff", "o bit-identical", "lse diff"], rows,
                   notes="CUDA-graph medians; the warp-specialised pass reads the committed score pass's buffers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

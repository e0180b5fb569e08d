"""tests/ptxemu, the PTX emulator: each instruction form against its definition in the PTX ISA
manual (hand-written PTX, expected values computed here from the manual's formulas), divergence,
barriers that wait for every thread, shared-memory races, and k31dsl kernels whose sm_90 code
(Triton's real compiler in a subprocess) runs in the emulator and agrees with the numpy target."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from ptxemu import Emulator, Memory, SharedMemoryRace, Unsupported


def run_ptx(body: str, threads: int = 32, shared: bool = False, extra_regs: str = "") -> np.ndarray:
    """Run `body` in a one-CTA kernel whose thread t ends by storing %r9 to out[t] (u32)."""
    ptx = textwrap.dedent(f"""
        .version 8.7
        .target sm_90a
        .address_size 64
        .extern .shared .align 16 .b8 global_smem[];
        .visible .entry probe(
            .param .u64 probe_param_0
        )
        .reqntid {threads}
        {{
            .reg .pred %p<8>;
            .reg .b16 %rs<8>;
            .reg .b32 %r<16>;
            .reg .b64 %rd<8>;
            {extra_regs}
            ld.param.b64 %rd1, [probe_param_0];
            mov.u32 %r1, %tid.x;
        """) + textwrap.dedent(body) + textwrap.dedent("""
            mul.wide.u32 %rd2, %r1, 4;
            add.s64 %rd3, %rd1, %rd2;
            st.global.b32 [%rd3], %r9;
            ret;
        }
        """)
    out = np.zeros(threads, np.uint32)
    mem = Memory()
    Emulator(ptx).launch((1, 1, 1), [mem.add(out.view(np.uint8))], mem)
    return out


def test_prmt_picks_and_sign_replicates_bytes():
    # prmt.b32 d, a, b, c: byte k of d is byte c[4k+2:4k] of {b, a}; with bit 4k+3 set, that byte's
    # sign bit fills it
    got = run_ptx("""
        mul.lo.u32 %r2, %r1, 0x01030507;
        xor.b32 %r3, %r2, 0x80A0C0E0;
        prmt.b32 %r9, %r2, %r3, 0x9C40;
    """)
    for t, v in enumerate(got):
        a = (t * 0x01030507) & 0xFFFFFFFF
        pool = ((a ^ 0x80A0C0E0) << 32) | a
        want = 0
        for k, sel in enumerate((0x0, 0x4, 0xC, 0x9)):
            byte = (pool >> (8 * (sel & 7))) & 0xFF
            if sel & 8:
                byte = 0xFF if byte & 0x80 else 0
            want |= byte << (8 * k)
        assert v == want, (t, hex(int(v)), hex(want))


def test_bfe_extracts_signed_and_unsigned_fields():
    got = run_ptx("""
        mov.u32 %r2, 0xB7E15163;
        and.b32 %r3, %r1, 15;
        bfe.s32 %r4, %r2, %r3, 7;
        bfe.u32 %r5, %r2, %r3, 7;
        xor.b32 %r9, %r4, %r5;
    """, threads=16)
    for t, v in enumerate(got):
        field = (0xB7E15163 >> t) & 0x7F
        signed = field - 0x80 if field & 0x40 else field
        assert v == (signed & 0xFFFFFFFF) ^ field


@pytest.mark.parametrize("mode,b,c", [("bfly", 5, 0x1F), ("up", 3, 0), ("down", 6, 0x1F), ("idx", 13, 0x1F),
                                      ("idx", 2, 0x181F)])
def test_shuffles_follow_the_lane_formulas(mode, b, c):
    got = run_ptx(f"""
        mad.lo.u32 %r2, %r1, 3, 7;
        shfl.sync.{mode}.b32 %r9|%p1, %r2, {b}, {c}, -1;
    """)
    for lane, v in enumerate(got):
        seg = (c >> 8) & 0x1F
        max_lane = (lane & seg) | ((c & 0x1F) & ~seg)
        j = {"bfly": lane ^ b, "up": lane - b, "down": lane + b, "idx": (lane & seg) | (b & ~seg)}[mode]
        ok = j >= max_lane if mode == "up" else j <= max_lane
        assert v == (j if ok else lane) * 3 + 7, (lane, v)


def test_conversions_extend_saturate_and_round_as_the_manual_says():
    # an 8-bit result sign-extends into its 16-bit register; float -> int rounds as asked,
    # saturates, and NaN gives 0; a 64-bit literal moved into 32 bits keeps its low half (Triton
    # 3.6 filled i8 loads with `mov.u32 %r, 0xfffffffffffffffe`: bytes fe ff ff ff)
    got = run_ptx("""
        sub.s32 %r2, 10, %r1;
        mul.lo.s32 %r2, %r2, 37;
        cvt.s8.s32 %rs1, %r2;
        cvt.s32.s16 %r3, %rs1;
        cvt.rn.f32.s32 %r4, %r2;
        mul.rn.f32 %r4, %r4, 0f3FC00000;
        cvt.rzi.s8.f32 %rs2, %r4;
        cvt.s32.s8 %r5, %rs2;
        mov.u32 %r6, 0xfffffffffffffffe;
        xor.b32 %r9, %r3, %r5;
        xor.b32 %r9, %r9, %r6;
    """)
    for t, v in enumerate(got):
        x = (10 - t) * 37
        low = ((x + 128) % 256) - 128
        f = np.float32(x) * np.float32(1.5)
        sat = int(max(-128, min(127, np.trunc(f))))
        assert v == ((low & 0xFFFFFFFF) ^ (sat & 0xFFFFFFFF) ^ 0xFFFFFFFE), t


def test_warp_votes_and_reductions():
    # ballot: bit l set when lane l's predicate holds; redux.sync: the op over the warp, to every lane
    got = run_ptx("""
        and.b32 %r2, %r1, 31;
        mul.lo.u32 %r3, %r2, %r2;
        and.b32 %r4, %r3, 5;
        setp.ne.u32 %p1, %r4, 0;
        vote.sync.ballot.b32 %r5, %p1, -1;
        redux.sync.max.s32 %r6, %r3, -1;
        redux.sync.add.s32 %r7, %r2, -1;
        xor.b32 %r9, %r5, %r6;
        add.u32 %r9, %r9, %r7;
    """, threads=64)
    ballot = sum(1 << lane for lane in range(32) if (lane * lane) & 5)
    np.testing.assert_array_equal(got, [((ballot ^ 31 * 31) + 496) & 0xFFFFFFFF] * 64)


def test_float_min_max_skip_nan_and_order_signed_zeros():
    got = run_ptx("""
        setp.eq.u32 %p1, %r1, 0;
        selp.f32 %r2, 0f7FC00000, 0f40400000, %p1;
        min.f32 %r3, %r2, 0f3F800000;
        max.f32 %r4, 0f80000000, 0f00000000;
        min.f32 %r5, 0f80000000, 0f00000000;
        add.f32 %r9, %r3, %r4;
        xor.b32 %r9, %r9, %r5;
    """, threads=2)
    assert list(got) == [0x3F800000 ^ 0x80000000, 0x3F800000 ^ 0x80000000]


def test_divergent_branches_and_loops_reconverge():
    # odd lanes skip a block; every lane loops tid times; all store once after reconverging
    got = run_ptx("""
        mov.u32 %r9, 0;
        and.b32 %r2, %r1, 1;
        setp.eq.u32 %p1, %r2, 1;
        @%p1 bra SKIP;
        add.u32 %r9, %r9, 1000;
    SKIP:
        mov.u32 %r3, %r1;
        setp.eq.u32 %p2, %r3, 0;
        @%p2 bra DONE;
    LOOP:
        add.u32 %r9, %r9, 3;
        sub.u32 %r3, %r3, 1;
        setp.ne.u32 %p3, %r3, 0;
        @%p3 bra LOOP;
    DONE:
    """)
    np.testing.assert_array_equal(got, [(0 if t % 2 else 1000) + 3 * t for t in range(32)])


BARRIER_AFTER_A_COLD_BLOCK = """
    // odd threads compute their value in a block placed after the barrier and jump back (LLVM
    // lays out cold blocks so); every thread then reads its neighbour's value after the barrier
    mov.b32 %r8, global_smem;
    shl.b32 %r2, %r1, 2;
    add.s32 %r3, %r8, %r2;
    and.b32 %r4, %r1, 1;
    setp.eq.u32 %p1, %r4, 1;
    mov.u32 %r5, %r1;
    @%p1 bra COLD;
BACK:
    st.shared.b32 [%r3], %r5;
    {sync}
    add.u32 %r6, %r1, 1;
    and.b32 %r6, %r6, 63;
    shl.b32 %r6, %r6, 2;
    add.s32 %r6, %r8, %r6;
    ld.shared.b32 %r9, [%r6];
    bra.uni END;
COLD:
    mul.lo.u32 %r5, %r1, 100;
    bra.uni BACK;
END:
"""


def test_a_barrier_waits_for_threads_in_blocks_laid_out_after_it():
    got = run_ptx(BARRIER_AFTER_A_COLD_BLOCK.format(sync="bar.sync 0;"), threads=64)
    want = [(t + 1) % 64 for t in range(64)]
    np.testing.assert_array_equal(got, [w * 100 if w % 2 else w for w in want])


def test_shared_memory_read_without_a_barrier_is_a_race():
    with pytest.raises(SharedMemoryRace, match="read of another warp's write"):
        run_ptx(BARRIER_AFTER_A_COLD_BLOCK.format(sync=""), threads=64)


def test_ldmatrix_hands_each_lane_its_cells():
    # an 8x8 b16 matrix, row r at shared byte 32 r (16 bytes used); lanes 0-7 give the row
    # addresses; lane l gets cells (l // 4, 2 (l % 4) + {0, 1}), transposed: (2 (l % 4) + {0, 1}, l // 4)
    for trans in ("", ".trans"):
        got = run_ptx(f"""
            mov.b32 %r8, global_smem;
            and.b32 %r2, %r1, 7;
            shl.b32 %r3, %r2, 5;
            add.s32 %r3, %r8, %r3;
            mov.u32 %r4, 0;
        FILL:
            shl.b32 %r5, %r2, 4;
            add.u32 %r5, %r5, %r4;
            cvt.u16.u32 %rs1, %r5;
            shl.b32 %r6, %r4, 1;
            add.s32 %r6, %r3, %r6;
            setp.lt.u32 %p1, %r1, 8;
            @%p1 st.shared.b16 [%r6], %rs1;
            add.u32 %r4, %r4, 1;
            setp.lt.u32 %p2, %r4, 8;
            @%p2 bra FILL;
            bar.sync 0;
            ldmatrix.sync.aligned.m8n8.x1{trans}.shared.b16 {{%r9}}, [%r3];
        """)
        for lane, v in enumerate(got):
            r, c = lane // 4, 2 * (lane % 4)
            cells = [(c, r), (c + 1, r)] if trans else [(r, c), (r, c + 1)]
            assert v == (16 * cells[0][0] + cells[0][1]) | (16 * cells[1][0] + cells[1][1]) << 16, (trans, lane)


def test_unknown_instructions_and_modifiers_are_refused_by_name():
    # an ignored modifier is a silent wrong answer: min.relu.s32 was one before it was modelled
    with pytest.raises(Unsupported, match="instruction atom"):
        run_ptx("atom.global.add.u32 %r9, [%rd1], 1;")
    with pytest.raises(Unsupported, match="modifier .cc of add"):
        run_ptx("add.cc.u32 %r9, %r1, 1;")


def test_sass_check_counts_only_narrow_conversions_the_ptx_does_not_ask_for():
    # seed 312814's SASS (ptxas 12.8): a byte store of a `selp.f32` register became F2IP.U8.F32
    from ptxemu.sass import unasked_narrow_conversions
    bug = "/*4460*/ F2IP.U8.F32.TRUNC.NTZ R87, RZ, R86, RZ ;\n/*4500*/ STS.U8 [R12+UR4], R87 ;\n" * 2
    assert unasked_narrow_conversions("selp.f32 %r386, 0f00000000, %r354, %p261;\nst.shared.b8 [%r460], %r386;", bug) == 2
    asked = "F2I.S16.BF16.TRUNC.NTZ R3, R4 ;\nF2I.U8.F32.TRUNC.NTZ R5, R6 ;"
    assert unasked_narrow_conversions("cvt.rzi.s16.bf16 %rs1, %rs2;\ncvt.rzi.sat.u8.f32 %rs3, %r4;", asked) == 0
    # integer division's reciprocal and a rematerialised 32-bit conversion are not counted
    wide = "I2F.U32.RP R24, R9 ;\nF2I.FTZ.U32.TRUNC.NTZ R19, R24 ;\nF2I.U32.TRUNC.NTZ R5, R8 ;\nF2I.U32.TRUNC.NTZ R9, R8 ;"
    assert unasked_narrow_conversions("rem.s32 %r1, %r2, %r3;\ncvt.rzi.u32.f32 %r5, %r8;", wide) == 0


# ---------------------------------------------------------------- k31dsl kernels, real compiler

def test_gpu_code_of_semantics_kernels_agrees_in_emulation(rng):
    """Kernels that found GPU miscompiles (test_target_semantics.py), compiled for sm_90 by this
    machine's Triton and emulated, against the numpy target, on fresh inputs."""
    from hopper import run_compiler_script
    seed = int(rng.integers(2 ** 31))
    script = textwrap.dedent(f"""
        import sys, tempfile
        import numpy as np, torch
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import k31dsl as k
        import test_target_semantics as s
        from ptxemu import run_gpu_code
        from target_check import compare
        rng = np.random.default_rng({seed})
        ints = lambda lo, hi, shape, dt: torch.from_numpy(rng.integers(lo, hi, shape, dtype=np.int64).astype(dt))
        z = torch.zeros
        i32, i8, i64 = torch.int32, torch.int8, torch.int64
        cases = [
            (s.negated_extremes, [ints(-1000, 1000, (29, 45), np.int32), ints(0, 2 ** 32, (29, 45), np.uint32)],
             [z(4, 45, dtype=i32)], [-7]),
            (s.narrow_fills, [ints(-128, 128, (14, 64), np.int8),
                              ints(0, 256, (14, 64), np.uint8).view(torch.float8_e4m3fn),
                              torch.from_numpy(rng.random((14, 64)) < 0.5)],
             [z(64, 32, dtype=i8), z(32, 64), z(32, 64, dtype=i32), z(32, 64, dtype=i8)], []),
            (s.narrow_transposes, [ints(-128, 128, (45, 70), np.int8), ints(0, 2 ** 32, (45, 70), np.uint32),
                                   torch.from_numpy(rng.standard_normal((45, 70)).astype(np.float32))],
             [z(70, 45, dtype=i8), z(70, 45, dtype=i8), z(70, 45, dtype=i32), z(70, 45, dtype=i8)], []),
            (s.signed_zeros, [torch.tensor([0.0, -0.0, 1.5, -2.0] * 20), torch.tensor([0.0, -0.0, 1.5, -2.0] * 20).to(torch.bfloat16)],
             [z(3, 80)], []),
            (s.reread_stores, [torch.from_numpy((rng.standard_normal((64, 128)) * 8).astype(np.float16)),
                               torch.from_numpy(rng.standard_normal((64, 128)).astype(np.float32)).to(torch.float8_e4m3fn)],
             [z(2, 64, 128, dtype=i32), z(64, 128), z(64, 128, dtype=torch.float16), z(2, 64, 128, dtype=i8)], []),
            (s.wrapping_abs, [torch.tensor([-2 ** 31, -7, -1, 0, 5, 2 ** 31 - 1, -2 ** 31 + 1, 12], dtype=i32),
                              torch.tensor([-128, -7, -1, 0, 5, 127, -127, 12], dtype=i8),
                              torch.tensor([-2 ** 63, -7, -1, 0, 5, 2 ** 63 - 1, -2 ** 63 + 1, 12], dtype=i64)],
             [z(2, 8, dtype=i32), z(8, dtype=i8), z(8, dtype=i64)], []),
        ]
        folder = tempfile.mkdtemp()
        for kern, ins, outs, scalars in cases:
            ref = [o.clone() for o in outs]
            k.compile(kern, target="numpy")(*ins, *ref, *scalars)
            got = [o.clone() for o in outs]
            run_gpu_code(kern, *[x.clone() for x in ins], *got, *scalars, folder=folder)
            named = lambda ts: {{str(i): t for i, t in enumerate(ts)}}
            compare({{"numpy": named(ref), "ptx": named(got)}})
            print(kern.ir().name, "agrees")
        """)
    out = run_compiler_script(script, TRITON_DEFAULT_FP_FUSION="0")
    assert out.split() == ["negated_extremes", "agrees", "narrow_fills", "agrees", "narrow_transposes", "agrees",
                           "signed_zeros", "agrees", "reread_stores", "agrees", "wrapping_abs", "agrees"], out


# the library's ops through their own Triton launch path, gpu-mode code emulated, against their
# fp64 oracles (the full list, with times: benchmarks/results/ptx_emu_ops.md); these run in CI
EMULATED_OPS = ["fused_li_sfa", "lightning_indexer", "attnres", "mxfp8_quantize", "topk", "kda_decode",
                "linear", "kda_cp_merge", "mla_cache_write"]


@pytest.mark.parametrize("name", EMULATED_OPS)
def test_op_gpu_code_matches_oracle_in_emulation(name, rng):
    from hopper import run_compiler_script
    seed = int(rng.integers(2 ** 31))
    script = textwrap.dedent(f"""
        import sys, tempfile
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from ptxemu import emulate_triton_target
        emulate_triton_target(tempfile.mkdtemp())
        from k31dsl.ops.registry import all_ops
        results = all_ops()[{name!r}].check("triton", {seed})
        bad = [f"{{r.case}}: {{r.max_err}} > {{r.tol}} {{r.detail}}" for r in results if not r.passed]
        print(len(results), "cases;", "; ".join(bad) if bad else "all pass")
        """)
    out = run_compiler_script(script, TRITON_DEFAULT_FP_FUSION="0").strip().splitlines()[-1]
    assert out.endswith("all pass") and not out.startswith("0 "), f"{name} (seed {seed}): {out}"

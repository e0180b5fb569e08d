"""The superkernel pass: it fuses a producer into its consumer where program-local dependence
holds and refuses, with a reason, where it does not; what it does not fuse it may put in one
launch group (one launch, a grid barrier between members), which the AscendC emulator runs.
Fusion preserves results (pass on vs off, numpy and the Triton interpreter)."""
import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl.lowering.graph import Program, compile_program, run
from k31dsl.lowering.passes.superkernel import superkernel
from k31dsl.ops.attnres import attnres_update_rows, rmsnorm_row
from k31dsl.ops.common import rmsnorm_rows
from pass_programs import TARGETS, assert_same, on_off, rand, row_add, row_scale, row_shift, two_rows


@k.kernel
def pair_sum(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BT: k.constexpr = 2,
             BD: k.constexpr = 64):
    for i in k.grid(k.cdiv(x.shape[0], BT)):
        y[k.span(i * BT, BT), k.span(0, BD)] = x[k.span(i * BT, BT, other=0.0), k.span(0, BD, other=0.0)] + 1.0


@pytest.mark.parametrize("target", TARGETS)
def test_superkernel_fuses_attnres_update_with_rmsnorm(target):
    T, D = int(np.random.randint(1, 7)), int(np.random.randint(9, 60))
    p = Program("update_norm")
    ins = dict(partial=rand(T, D), delta=rand(T, D, dtype=torch.bfloat16), q=rand(D), o=rand(T, D),
               m=rand(T), l=torch.rand(T) + 1.0, w=rand(D))
    part = p.input("partial", (T, D), k.f32)
    args = [p.input(n, tuple(ins[n].shape), k.bf16 if n == "delta" else k.f32) for n in ("delta", "q", "o", "m", "l")]
    w = p.weight("w", (D,), k.f32)
    h = p.tensor("h", (T, D), k.bf16)
    y = p.tensor("y", (T, D), k.bf16)
    bd = max(16, 1 << (D - 1).bit_length())
    part, h = p.call(attnres_update_rows, part, *args, h, 1e-6, BD=bd)
    y = p.call(rmsnorm_row, h, w, y, 1e-5, BD=bd)
    p.output(y, part)
    fused = superkernel(p)
    assert len(p.calls()) == 2 and len(fused.calls()) == 1
    assert fused.meta["superkernel"]["fused"] == 1
    assert "fused attnres_update_rows + rmsnorm_row" in fused.report[-1]
    assert "%h" not in fused.g                         # the intermediate never reaches memory
    ex = compile_program(p, target, passes=["verify", "superkernel"])
    on = ex({n: v.clone() for n, v in ins.items()})
    assert ex.launches == 1
    _, off = on_off(p, [], ins, target)
    assert_same(on, off)


@pytest.mark.parametrize("target", TARGETS)
def test_superkernel_fuses_a_chain_of_three(target):
    T, D = 6, 33
    p = Program("chain")
    x = p.input("x", (T, D), k.f32)
    w = p.weight("w", (D,), k.f32)
    a, b, c = (p.tensor(n, (T, D), k.f32) for n in "abc")
    a = p.call(rmsnorm_rows, x, w, a, 1e-6, BM=2, BD=64, ONE_TILE=True)
    b = p.call(rmsnorm_rows, a, w, b, 1e-6, BM=2, BD=64, ONE_TILE=True)
    c = p.call(rmsnorm_rows, b, w, c, 1e-6, BM=2, BD=64, ONE_TILE=True)
    p.output(a, c)                                     # `a` stays stored: it is returned
    s = superkernel(p)
    assert len(s.calls()) == 1 and s.node(s.calls()[0]).attrs["fused"] == ["rmsnorm_rows", "rmsnorm_rows_1", "rmsnorm_rows_2"]
    assert "%a.1" in s.g and "%b" not in s.g
    on, off = on_off(p, ["superkernel"], {"x": rand(T, D), "w": rand(D)}, target)
    assert_same(on, off, 1e-6)


def _refused(p):
    s = superkernel(p)
    assert len(s.calls()) == len(p.calls()), "nothing may be fused here"
    groups = s.meta["superkernel"]["groups"]
    return s, " ".join(s.report), groups


@pytest.mark.parametrize("target", TARGETS)
def test_superkernel_refuses_a_read_of_another_programs_row(target):
    s, report, groups = _refused(two_rows(row_shift))
    assert "reads `h` at [t + 1, 0:0 + 64]" in report and "other programs write the rest" in report
    assert "ops/" not in report and "pass_programs.py:" in report          # the load's own line
    assert list(groups.values()) == [["row_scale", "row_shift"]]         # one launch, grid barrier
    on, off = on_off(two_rows(row_shift), ["superkernel"], {"x": rand(5, 40)}, target)
    assert_same(on, off)


def test_superkernel_refuses_different_grids():
    _, report, groups = _refused(two_rows(pair_sum))
    assert "grids differ: `row_scale` launches [5] programs, `pair_sum` [3]" in report
    assert len(groups) == 1


def test_superkernel_refuses_a_producer_that_stores_in_a_loop():
    p = Program("looped")
    x = p.input("x", (4, 40), k.f32)
    w = p.weight("w", (40,), k.f32)
    h = p.tensor("h", (4, 40), k.f32)
    y = p.tensor("y", (4, 40), k.f32)
    h = p.call(rmsnorm_rows, x, w, h, 1e-6, BM=1, BD=16, ONE_TILE=False)
    y = p.call(row_scale, h, y, 2.0)
    p.output(y)
    _, report, _ = _refused(p)
    assert "stores inside a loop" in report


def test_superkernel_refuses_when_another_node_lies_between():
    p = Program("diamond")
    x = p.input("x", (5, 40), k.f32)
    h, g, y = (p.tensor(n, (5, 40), k.f32) for n in "hgy")
    h = p.call(row_scale, x, h, 2.0)
    g = p.all_reduce([h, x], g)                        # a host op between producer and consumer
    y = p.call(row_add, h, g, y)
    p.output(y)
    _, report, groups = _refused(p)
    assert "all_reduce" in report and "depends on `row_scale` and feeds `row_add`" in report
    assert groups == {}


def test_superkernel_refuses_a_consumer_writing_what_the_producer_reads():
    p = Program("war")
    x = p.input("x", (5, 40), k.f32)
    h = p.tensor("h", (5, 40), k.f32)
    h = p.call(row_scale, x, h, 2.0)
    x = p.call(row_scale, h, x, 0.5)                   # overwrites the producer's input
    p.output(x)
    _, report, _ = _refused(p)
    assert "writes `x`, which `row_scale` also reads" in report


def test_superkernel_groups_only_linear_chains():
    p = Program("fan")
    x = p.input("x", (5, 40), k.f32)
    a, b, c = (p.tensor(n, (5, 40), k.f32) for n in "abc")
    a = p.call(row_scale, x, a, 2.0)
    b = p.call(row_shift, a, b)                        # refused (another program's row) ...
    c = p.call(row_shift, a, c)                        # ... twice: `a` feeds two branches
    p.output(b, c)
    s, report, groups = _refused(p)
    assert groups == {} and report.count("not grouped either") == 2


def test_fused_kernel_keeps_the_launch_options_of_its_parts():
    @k.kernel(configs=[{"BD": 64, "num_warps": 2}, {"BD": 128, "num_warps": 8}])
    def scale_w(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = 64):
        for t in k.grid(x.shape[0]):
            y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] * 2.0

    p = Program("warps")
    x = p.input("x", (3, 100), k.f32)
    h, y = p.tensor("h", (3, 100), k.f32), p.tensor("y", (3, 100), k.f32)
    h = p.call(scale_w, x, h, BD=128)
    y = p.call(row_scale, h, y, 1.0, BD=128)
    p.output(y)
    s = superkernel(p)
    assert s.node(s.calls()[0]).kernel.configs == [{"num_warps": 8}]


# ---------------------------------------------------------------- the AscendC emulator: fusion, launch groups

def test_ascendc_runs_the_fused_update_on_the_emulator():
    T, D = 3, 24
    p = Program("update_norm")
    ins = dict(partial=rand(T, D), delta=rand(T, D, dtype=torch.bfloat16), q=rand(D), o=rand(T, D),
               m=rand(T), l=torch.rand(T) + 1.0, w=rand(D))
    part = p.input("partial", (T, D), k.f32)
    args = [p.input(n, tuple(ins[n].shape), k.bf16 if n == "delta" else k.f32) for n in ("delta", "q", "o", "m", "l")]
    w = p.weight("w", (D,), k.f32)
    h, y = p.tensor("h", (T, D), k.bf16), p.tensor("y", (T, D), k.bf16)
    part, h = p.call(attnres_update_rows, part, *args, h, 1e-6, BD=32)
    y = p.call(rmsnorm_row, h, w, y, 1e-6, BD=32)
    p.output(y, part)
    ex = compile_program(p, "ascendc")
    on = ex({n: v.clone() for n, v in ins.items()})
    assert ex.launches == 1
    off = run(p, {n: v.clone() for n, v in ins.items()}, target="numpy", passes=["verify"])
    torch.testing.assert_close(on["partial"], off["partial"], rtol=0, atol=1e-6)
    torch.testing.assert_close(on["y"].float(), off["y"].float(), rtol=1e-2, atol=1e-2)


def test_ascendc_launch_group_is_one_syncall_launch_on_the_emulator():
    """Each program of row_shift reads a row another block wrote: only the barrier makes the
    single launch correct (37 rows over 8 emulated cores, grid-stride)."""
    p = two_rows(row_shift, T=37, D=40)
    ex = compile_program(p, "ascendc", cores=8)
    x = rand(37, 40)
    got = ex({"x": x})["y"]
    assert ex.launches == 1 and "AscendC::SyncAll();" in ex._groups["g0"].source
    want = run(p, {"x": x}, target="numpy", passes=["verify"])["y"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_ascendc_group_of_two_specialisations_of_one_kernel():
    """A launch group running linear_rows twice at different constexprs (activation, tiles; the
    model's KDA gate chain f_a -> f_b): each member runs its own specialisation (the emitted code is
    named after the kernel, so the second is renamed), not the last one's code for both."""
    from k31dsl.ops.nn import linear_rows
    M, D, R, N = 3, 40, 24, 56
    ins = dict(x=rand(M, D), w1=rand(R, D), w2=rand(N, R))
    p = Program("chain")
    x = p.input("x", (M, D), k.f32)
    w1, w2 = p.weight("w1", (R, D), k.f32), p.weight("w2", (N, R), k.f32)
    h, y = p.tensor("h", (M, R), k.f32), p.tensor("y", (M, N), k.f32)
    f32 = dict(XT=k.f32, WT=k.f32, YT=k.f32, BM=16)
    h = p.call(linear_rows, x, w1, h, ACT="sigmoid", BN=32, BK=64, **f32)
    y = p.call(linear_rows, h, w2, y, ACT="none", BN=64, BK=32, **f32)
    p.output(y)
    ex = compile_program(p, "ascendc")
    on = ex({n: v.clone() for n, v in ins.items()})
    assert ex.launches == 1 and "K31Kernel_linear_rows_v1" in ex._groups["g0"].source
    want = torch.sigmoid(ins["x"].double() @ ins["w1"].double().T) @ ins["w2"].double().T
    torch.testing.assert_close(on["y"].double(), want, rtol=1e-4, atol=1e-5)
    # the CANN host code names the two specialisations apart too (files, tilings, group entry)
    from k31dsl.targets.ascendc.program import host_files
    files = host_files(ex.p)
    host, entry = files["chain_host.cpp"], files["chain_groups.cpp"]
    assert '#include "linear_rows_tiling.h"' in host and '#include "linear_rows_v1_tiling.h"' in host
    assert "K31Tiling_linear_rows_v1 td1" in host and "// linear_rows_v1: linear_rows at other constexprs" in host
    assert entry.index("K31Kernel_linear_rows op0") < entry.index("K31Kernel_linear_rows_v1 op1")
    # a program calling one specialisation twice keeps one name
    q = Program("twice")
    x = q.input("x", (M, D), k.f32)
    w = q.weight("w", (D, D), k.f32)
    a, b = q.tensor("a", (M, D), k.f32), q.tensor("b", (M, D), k.f32)
    a = q.call(linear_rows, x, w, a, ACT="none", BN=64, BK=64, **f32)
    b = q.call(linear_rows, a, w, b, ACT="none", BN=64, BK=64, **f32)
    q.output(b)
    assert "_v1" not in "".join(host_files(compile_program(q, "ascendc").p).values())

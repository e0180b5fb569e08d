"""MoE FFN (ops/moe.py): the op against its fp64 oracle on every target runs in tests/test_ops.py
(the registered check); here: the routing kernels' own invariants (top-k ids and weights against
the oracle's routing, the counting sort's row lists), ties, the graph builder `add_moe` inside a
Program through each target's default graph pipeline (== `moe`), argument errors, and sm_90
compilation at the H200 tiles (prefill and decode)."""

import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.lowering.graph import Program, compile_program
from k31dsl.ops import moe as mo
from k31dsl.ops.testing import device_for, load_oracle, to_f64

from hopper import Specialised, assert_compiles_for_hopper

TARGETS = ["numpy", "triton"]
ref = load_oracle("moe")


def _gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


def _route(x, router, top_k, target, plan):
    """Run the router and align kernels alone (on the target's device) -> (ids, wgt, pair_row,
    row_tok, blk_exp, chunk_cnt) as NumPy."""
    m, dev = x.shape[0], device_for(target)
    x, router = x.to(dev), router.to(dev)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=dev)
    wgt = torch.empty((m, top_k), dtype=torch.float32, device=dev)
    pair_row = torch.empty((m, top_k), dtype=torch.int32, device=dev)
    row_tok = torch.full((plan.rows,), 12345, dtype=torch.int32, device=dev)      # every row must be written
    blk_exp = torch.full((plan.nb,), 12345, dtype=torch.int32, device=dev)
    chunk_cnt = torch.full((plan.g, plan.ep), 12345, dtype=torch.int32, device=dev)
    mo.moe_router[target](x, router, ids, wgt, chunk_cnt, **plan.router_cx())
    mo.moe_align[target](ids, chunk_cnt, pair_row, row_tok, blk_exp, plan.e, **plan.align_cx())
    return [t.cpu().numpy() for t in (ids, wgt, pair_row, row_tok, blk_exp, chunk_cnt)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m, e, top_k", [(29, 5, 2), (3, 8, 2), (40, 3, 3), (70, 2, 1)])
def test_routing_and_sort_invariants(target, m, e, top_k, rng):
    d = 24
    x = torch.from_numpy(rng.standard_normal((m, d)).astype(np.float32))
    router = torch.from_numpy((rng.standard_normal((e, d)) / d ** 0.5).astype(np.float32))
    plan = mo.MoEPlan(m, d, e, 16, 16, top_k)
    ids, wgt, pair_row, row_tok, blk_exp, chunk_cnt = _route(x, router, top_k, target, plan)
    top, w = ref.route(to_f64(x), to_f64(router), top_k)
    np.testing.assert_array_equal(ids, top)
    np.testing.assert_allclose(wgt, w, rtol=1e-5, atol=1e-6)
    assert plan.g > 1 or m <= 16                                       # several chunks when M allows
    for c in range(plan.g):                                            # pairs per expert per chunk
        want = np.bincount(top[c * plan.ch:(c + 1) * plan.ch].ravel(), minlength=plan.ep)
        np.testing.assert_array_equal(chunk_cnt[c], want)
    bm = plan.bm
    counts = np.bincount(top.ravel(), minlength=e)
    seg = np.concatenate([[0], np.cumsum(-(-counts // bm) * bm)])      # each expert's padded rows
    want_tok = np.full(plan.rows, -1)
    for ex in range(e):
        tok, slot = np.nonzero(top == ex)                              # (token, slot) order
        rows = seg[ex] + np.arange(tok.size)
        want_tok[rows] = tok
        np.testing.assert_array_equal(pair_row[tok, slot], rows)
    np.testing.assert_array_equal(row_tok, want_tok)
    want_blk = np.full(plan.nb, -1)
    for ex in range(e):
        want_blk[seg[ex] // bm: seg[ex + 1] // bm] = ex
    np.testing.assert_array_equal(blk_exp, want_blk)


@pytest.mark.parametrize("target", TARGETS)
def test_router_ties_pick_the_lower_expert(target, rng):
    """Experts 1, 2 and 3 have the same router row: equal logits, so the top 2 of a token whose
    best is that row are experts 1 and 2, each weighted 1/2."""
    d, e = 16, 5
    row = rng.standard_normal(d)
    router = rng.standard_normal((e, d)) * 0.1
    router[1:4] = row
    x = np.stack([row * 3 + rng.standard_normal(d) * 0.01 for _ in range(7)])
    x_t, r_t = torch.tensor(x, dtype=torch.float32), torch.tensor(router, dtype=torch.float32)
    plan = mo.MoEPlan(7, d, e, 16, 16, 2)
    ids, wgt, *_ = _route(x_t, r_t, 2, target, plan)
    assert (ids == [1, 2]).all(), ids
    np.testing.assert_allclose(wgt, 0.5, rtol=1e-6)
    top, _ = ref.route(to_f64(x_t), to_f64(r_t), 2)
    assert (top == [1, 2]).all()


def _program(m, d, weights, top_k, layers: int, dtype, target):
    """x -> MoE -> MoE ... (each layer its own weights), the last output returned."""
    p = Program("moe_layers")
    h = p.input("x", (m, d), dtype)
    for i in range(layers):
        refs = {n: p.weight(f"l{i}_{n}", tuple(t.shape), dtype) for n, t in weights[i].items()}
        h = mo.add_moe(p, h, refs, top_k, target=target)
    p.output(h)
    return p


@pytest.mark.parametrize("target", TARGETS + ["ascendc"])
def test_add_moe_in_a_program_equals_moe(target, rng):
    """Two MoE layers built with add_moe, run through the target's default graph passes: the
    same values as two `moe` calls (the same kernels and tiles), and near the fp64 oracle. On a
    GPU `moe` autotunes its tiles (the program keeps the plan's), so there the two agree to fp32
    summation order only."""
    m, d, f, fs, e, top_k = 13, 40, 24, 20, 5, 2
    g, dev = _gen(rng), device_for(target)
    layers = []
    for _ in range(2):
        args = [a.to(dev) for a in mo.moe_inputs(m, d, f, fs, e, top_k, "f32", "random", g)]
        layers.append(dict(zip(mo.MOE_WEIGHTS, args[1:])))
    x = args[0]
    exe = compile_program(_program(m, d, layers, top_k, 2, k.f32, target), target)
    inputs = {"x": x, **{f"l{i}_{n}": t for i, w in enumerate(layers) for n, t in w.items()}}
    (got,) = exe(inputs).values()
    want = x
    oracle = to_f64(x)
    for w in layers:
        want = mo.moe(want, *(w[n] for n in mo.MOE_WEIGHTS), top_k, target=target)
        oracle = ref.moe(oracle, *(to_f64(w[n]) for n in mo.MOE_WEIGHTS), top_k)
    if dev == "cpu":
        assert torch.equal(got, want)
    else:
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    assert np.abs(to_f64(got) - oracle).max() <= 1e-4 * np.abs(oracle).max()
    assert sum(1 for nid in exe.p.calls()) == 12


def test_moe_plan_regimes():
    """Block rows by rows per expert; the static row list always holds every expert's padding;
    the counting sort's programs cover it."""
    assert mo.MoEPlan(1, 2048, 8, 1024, 1024, 2).bm == 16                # decode
    assert mo.MoEPlan(64, 2048, 8, 1024, 1024, 2).bm == 16
    assert mo.MoEPlan(32768, 2048, 8, 1024, 1024, 2).bm == 128           # prefill
    for m, e, top_k in [(1, 8, 2), (64, 8, 2), (32768, 8, 2), (37, 3, 3), (5, 6, 1), (100, 4, 2)]:
        plan = mo.MoEPlan(m, 64, e, 16, 16, top_k)
        pairs = m * top_k
        # the most blocks any routing needs: n experts with one row each, the rest in full blocks
        worst = max(n + (pairs - n) // plan.bm for n in range(1, min(e, pairs) + 1))
        assert worst <= plan.nb <= worst + e
        assert plan.rows == plan.nb * plan.bm
        # the count/align programs cover every token, row and block; the count table is one tile
        assert plan.g * plan.ch >= m and plan.g * plan.cr >= plan.rows and plan.cr % plan.bm == 0
        assert plan.g <= plan.gp <= 512


def test_empty_batch():
    args = mo.moe_inputs(1, 16, 8, 8, 3, 2, "f32", "random", torch.Generator().manual_seed(0))
    out = mo.moe(args[0][:0], *args[1:], 2, target="numpy")
    assert out.shape == (0, 16) and out.dtype == torch.float32


# ---------------------------------------------------------------- errors

def _args(dtype="f32"):
    return mo.moe_inputs(4, 16, 8, 8, 3, 2, dtype, "random", torch.Generator().manual_seed(0))


@pytest.mark.parametrize("change, match", [
    (lambda a: (a[0].reshape(2, 2, 16), *a[1:], 2), "must be \\[M, D\\]"),
    (lambda a: (a[0].to(torch.bfloat16), *a[1:], 2), "runs in one dtype"),
    (lambda a: (a[0], a[1][:, :8], *a[2:], 2), "`router` must be"),
    (lambda a: (a[0], a[1], a[2][:, :5], *a[3:], 2), "`gate_up` must be"),
    (lambda a: (a[0], a[1], a[2], a[3][:2], *a[4:], 2), "`down` must be"),
    (lambda a: (*a[:4], a[4][:, :3], a[5], 2), "`shared_gate_up` must be"),
    (lambda a: (*a[:5], a[5][:, :3], 2), "`shared_down` must be"),
    (lambda a: (*a, 0), "top_k must be an int in \\[1, 3\\]"),
    (lambda a: (*a, 4), "top_k must be an int"),
    (lambda a: (*a, True), "top_k must be an int"),
    (lambda a: (a[0].to(torch.int32), *a[1:], 2), "dtype int32"),
    (lambda a: (a[0].numpy(), *a[1:], 2), "must be a torch.Tensor"),
])
def test_bad_inputs_raise(change, match):
    with pytest.raises(K31Error, match=match):
        mo.moe(*change(_args()), target="numpy")


def test_add_moe_bad_inputs_raise():
    args = _args()
    p = Program("bad")
    x = p.input("x", (4, 16), k.f32)
    refs = {n: p.weight(n, tuple(t.shape), k.f32) for n, t in zip(mo.MOE_WEIGHTS, args[1:])}
    with pytest.raises(K31Error, match="exactly the keys"):
        mo.add_moe(p, x, {n: r for n, r in refs.items() if n != "down"}, 2)
    bad = dict(refs, down=p.weight("down2", (3, 16, 9), k.f32))
    with pytest.raises(K31Error, match="weight shapes do not fit"):
        mo.add_moe(p, x, bad, 2)
    with pytest.raises(K31Error, match="runs in one dtype"):
        mo.add_moe(p, x, dict(refs, router=p.weight("r16", (3, 16), k.bf16)), 2)
    with pytest.raises(K31Error, match="top_k"):
        mo.add_moe(p, x, refs, 5)
    with pytest.raises(K31Error, match="`out` must be"):
        mo.add_moe(p, x, refs, 2, out=p.tensor("o", (4, 15), k.f32))
    out = mo.add_moe(p, x, refs, 2)                                   # and then a good call
    assert out.shape == (4, 16)


# ---------------------------------------------------------------- sm_90

def _h200(m: int) -> dict:
    """The constexprs of every kernel at the small preset's MoE (D 2048, F 1024, E 8, top-2, bf16)."""
    plan = mo.MoEPlan(m, 2048, 8, 1024, 1024, 2)
    return {"router": Specialised(mo.moe_router, XT=k.bf16, **plan.router_cx()),
            "align": Specialised(mo.moe_align, **plan.align_cx()),
            "gate_up": Specialised(mo.moe_gate_up, XT=k.bf16, BM=plan.bm, **plan.tile("gate_up")),
            "down": Specialised(mo.moe_down, XT=k.bf16, BM=plan.bm, **plan.tile("down")),
            "shared": Specialised(mo.moe_shared_gate_up, XT=k.bf16, BM=plan.dense_bm, **plan.tile("gate_up")),
            "combine": Specialised(mo.moe_combine, XT=k.bf16, BM=plan.dense_bm, **plan.tile("down"))}


PREFILL = _h200(32768)
DECODE = _h200(64)
(PF_ROUTER, PF_ALIGN, PF_GATE_UP, PF_DOWN, PF_SHARED, PF_COMBINE) = PREFILL.values()
(DC_ROUTER, DC_ALIGN, DC_GATE_UP, DC_DOWN, DC_SHARED, DC_COMBINE) = DECODE.values()


def test_kernels_compile_for_hopper(tmp_path):
    names = ["PF_ROUTER", "PF_ALIGN", "PF_GATE_UP", "PF_DOWN", "PF_SHARED", "PF_COMBINE",
             "DC_GATE_UP", "DC_DOWN", "DC_COMBINE"]        # the decode router/align/shared differ only in tiles
    assert_compiles_for_hopper(__file__, names, tmp_path, index_types=("int32",))


# ---------------------------------------------------------------- AscendC tiles

@pytest.mark.parametrize("m", [64, 32768])
def test_ascendc_tiles_fit_the_unified_buffer(m):
    """The tiles the plan picks for ascendc (prefill and decode) fit a vector core's 192 KB UB:
    every kernel emits without a CapacityError, in f32 (the largest tiles) and bf16."""
    from k31dsl.lowering.pipeline import run_pipeline
    from k31dsl.targets.ascendc.emit import emit_all
    plan = mo.MoEPlan(m, 2048, 8, 1024, 1024, 2, target="ascendc")
    assert plan.bm <= 64 and plan.dense_bm <= 64
    for dt in (k.f32, k.bf16):
        kernels = [(mo.moe_router, dict(XT=dt, **plan.router_cx())), (mo.moe_align, plan.align_cx()),
                   (mo.moe_gate_up, dict(XT=dt, BM=plan.bm, **plan.tile("gate_up"))),
                   (mo.moe_down, dict(XT=dt, BM=plan.bm, **plan.tile("down"))),
                   (mo.moe_shared_gate_up, dict(XT=dt, BM=plan.dense_bm, **plan.tile("gate_up"))),
                   (mo.moe_combine, dict(XT=dt, BM=plan.dense_bm, **plan.tile("down")))]
        for kdef, cx in kernels:
            assert emit_all(run_pipeline(kdef.ir(**cx), "ascendc")), kdef.name

"""chunk_kda and kda_gate against the fp64 KDA oracle (tests/oracles/kda.py): ragged T, T < chunk,
both gate forms at extreme values, GVA, initial/final state, varlen; chunked == recurrent;
causality (bit-for-bit on numpy); input errors; and the kernels compile for sm_90 at K=V=128,
chunk 64 (the GPU configuration)."""

import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.ops.kda import chunk_kda, kda_gate
from k31dsl.ops.kda.chunk import make_inputs
from k31dsl.ops.kda.chunk_kernels import kda_chunk_prep, kda_chunk_state
from k31dsl.ops.kda.chunk_pair import kda_chunk_pair_merge
from k31dsl.ops.kda.chunk_prep_wide import kda_chunk_prep_wide
from k31dsl.ops.kda.gate import kda_gate_rows
from k31dsl.ops.testing import load_oracle, max_rel_err, to_f64

TARGETS = ["numpy", "triton"]
# Errors are max |got - want| / max(|want|, FLOOR * max|want|). f32: FLOOR 0.1 (element-wise down
# to a tenth of the largest value), 2e-4. bf16: the per-chunk operands (W, U, Qt, Kb, Aqk) and the
# state fed to the tensor-core dots are bf16 as in fla, so small outputs carry absolute errors of a
# few 1e-3 of max|o|: measured normwise (FLOOR 1) <= 8e-3 for o and state over 24 cases (with
# FLOOR 0.1 up to 4.9e-2); bf16 cases are checked normwise at the house bf16 tolerance 2e-2.
TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
FLOOR = {torch.float32: 0.1, torch.bfloat16: 1.0, torch.float16: 1.0}


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def _run(args, kw, target, chunk, **extra):
    return chunk_kda(*args, **kw, output_final_state=True, chunk_size=chunk, target=target, **extra)


def _assert_close(got, want, tol, what, seed, floor=0.1):
    scale = max(1e-3, float(np.abs(want).max()))
    err = max_rel_err(to_f64(got), want, floor=floor * scale)
    assert err <= tol, f"{what}: rel err {err:.3g} > {tol} (seed {seed})"


def _assert_causal(args, kw, times, seed, chunk, **extra):
    """o[:t] bit-identical on numpy when q, k, v, beta and the raw gate change at every position >= t."""
    o1, _ = _run(args, kw, "numpy", chunk, **extra)
    for t in times:
        pert = [a.clone() for a in args]
        for a in pert[:3]:
            a[:, t:] = a[:, t:] * 3.0 + 0.5
        pert[4][:, t:] = 1.0 - pert[4][:, t:]
        pert[3][:, t:] = pert[3][:, t:] * 40
        o2, _ = _run(pert, kw, "numpy", chunk, **extra)
        assert torch.equal(o1[:, :t], o2[:, :t]), f"t={t}: earlier outputs changed (seed {seed})"


CASES = {  # name: (B, T, H, HV, K, V, dtype, gate, chunk, varlen seqs, initial state)
    "ragged_T_lb": (1, 37, 1, 1, 16, 16, torch.float32, "lb", 16, 0, True),
    "T_below_chunk": (1, 5, 1, 1, 16, 32, torch.float32, "lb", 16, 0, False),
    "T_below_chunk_32": (1, 21, 1, 1, 16, 16, torch.float32, "softplus", 32, 0, True),
    "gva_hv_2h": (2, 19, 2, 4, 16, 16, torch.float32, "lb", 16, 0, True),
    "softplus_two_subchunks": (1, 50, 1, 1, 16, 16, torch.float32, "softplus", 32, 0, False),
    "logdecay_given": (1, 33, 1, 2, 32, 16, torch.float32, "logdecay", 16, 0, False),
    "varlen_3_odd": (1, 43, 1, 2, 16, 16, torch.float32, "lb", 16, 3, True),
    "varlen_softplus": (1, 39, 1, 1, 16, 16, torch.float32, "softplus", 32, 3, True),
    "bf16_lb": (1, 45, 1, 2, 32, 32, torch.bfloat16, "lb", 32, 0, True),
    "f16_softplus_batch": (2, 21, 1, 2, 16, 16, torch.float16, "softplus", 16, 0, True),
}
WIDE_CASES = {  # the whole-chunk prep kernel (ops/kda/chunk_prep_wide.py): lower-bound gate, chunk 16 / 32 / 64
    "wide_ragged_64": (1, 83, 1, 1, 16, 16, torch.float32, "lb", 64, 0, True),
    "wide_gva_batch_32": (2, 45, 2, 4, 16, 32, torch.float32, "lb", 32, 0, False),
    "wide_varlen_64": (1, 151, 1, 2, 32, 16, torch.float32, "lb", 64, 3, True),
    "wide_bf16_64": (1, 70, 1, 2, 32, 32, torch.bfloat16, "lb", 64, 0, True),
    "wide_varlen_16": (1, 77, 1, 2, 16, 16, torch.float32, "lb", 16, 3, True),
}
PAIR_CASES = {  # chunk-32 whole-chunk halves paired into chunk 64 (ops/kda/chunk_pair.py)
    "pair_ragged": (1, 83, 1, 1, 16, 16, torch.float32, "lb", 64, 0, True),
    "pair_below_half": (1, 21, 1, 2, 16, 16, torch.float32, "lb", 64, 0, False),
    "pair_varlen": (1, 151, 1, 2, 32, 16, torch.float32, "lb", 64, 3, True),
    "pair_gva_batch_bf16": (2, 70, 2, 4, 32, 32, torch.bfloat16, "lb", 64, 0, True),
    "pair_16_varlen": (1, 151, 1, 2, 32, 16, torch.float32, "lb", 32, 3, True),
    "pair_16_bf16": (1, 45, 1, 2, 32, 32, torch.bfloat16, "lb", 32, 0, True),
    # other gates: halves by the sub-chunk prep
    "pair_softplus_varlen": (1, 151, 1, 2, 16, 16, torch.float32, "softplus", 32, 3, True),
    "pair_logdecay_64": (2, 70, 1, 2, 32, 16, torch.float32, "logdecay", 64, 0, False),
    "pair_softplus_bf16": (1, 45, 1, 2, 32, 32, torch.bfloat16, "softplus", 32, 0, True),
}
PREP_OF = {**{c: "sub" for c in CASES}, **{c: "wide" for c in WIDE_CASES}, **{c: "pair" for c in PAIR_CASES}}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(PREP_OF))
def test_chunk_kda_matches_oracle(case, target):
    prep = PREP_OF[case]
    B, T, H, HV, K, V, dtype, gate, chunk, ns, h0 = {**CASES, **WIDE_CASES, **PAIR_CASES}[case]
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    args, kw = make_inputs(gen, B, T, H, HV, K, V, dtype, gate, ns, h0)
    if ns:
        lens = kw["cu_seqlens"].diff()
        assert len(lens) == ns and (lens % 2 == 1).all() and (lens > 0).all(), lens
    o, ht = _run(args, kw, target, chunk, _prep=prep)
    assert o.shape == (B, T, HV, V) and o.dtype == dtype
    assert ht.shape == (ns or B, HV, K, V) and ht.dtype == torch.float32
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    _assert_close(o, want_o, TOL[dtype], f"{case} o", seed, FLOOR[dtype])
    _assert_close(ht, want_s, TOL[dtype], f"{case} final state", seed, FLOOR[dtype])


def _extreme_inputs(gen, gate, T=40, K=16, V=16, HV=2):
    args, kw = make_inputs(gen, 1, T, 1, HV, K, V, torch.float32, gate, 0, True)
    q, kk, v, g, beta = args
    if gate == "lb":        # saturated sigmoid: a = -5 nearly every step, G reaches -160 in a chunk of 32
        g = torch.full_like(g, 80.0)
        g[0, ::3] = -80.0   # and some steps with a ~ 0
    else:                   # softplus: per-step decay up to -exp(A_log) * 2000 (G ~ -1e4 within a sub-chunk)
        g = g * 100.0
        g[0, 5:9] = 2000.0
    return (q, kk, v, g, beta), kw


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("gate", ["lb", "softplus"])
def test_extreme_gates_stay_finite_and_exact(gate, target):
    seed = _seed()
    args, kw = _extreme_inputs(torch.Generator().manual_seed(seed), gate)
    o, ht = _run(args, kw, target, 32)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all(), f"non-finite output (seed {seed})"
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    # softplus at these inputs gives per-step log decays of -1e3..-1e4: the fp32 cumsum then
    # holds |G| ~ 1e4 whose ulp (~1e-3) is the absolute error of every later exp(G_i - G_j), the
    # same in any fp32 kernel; 5e-4 relative is seen, 3e-3 allowed (a wrong anchor gives O(1) or NaN)
    tol = 2e-4 if gate == "lb" else 3e-3
    _assert_close(o, want_o, tol, f"extreme {gate} o", seed)
    _assert_close(ht, want_s, tol, f"extreme {gate} state", seed)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("chunk", [32, 64])
def test_softplus_sub_chunks_mix_factorised_and_exact_blocks(chunk, target):
    """One sequence whose sub-chunks decay mildly (factorised diagonal blocks) except rows 20-23
    (per-step decays ~1e3: that sub-chunk's blocks are computed exactly): against the oracle."""
    seed = _seed()
    args, kw = make_inputs(torch.Generator().manual_seed(seed), 1, 70, 1, 2, 16, 16, torch.float32, "softplus", 0,
                           True)
    q, kk, v, g, beta = args
    g = g.clone()
    g[0, 20:24] = 1000.0
    args = (q, kk, v, g, beta)
    o, ht = _run(args, kw, target, chunk)
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    _assert_close(o, want_o, 3e-3, "mixed softplus o", seed)
    _assert_close(ht, want_s, 3e-3, "mixed softplus state", seed)


@pytest.mark.parametrize("chunk", [32, 64])
def test_pair_of_sub_chunk_halves_at_extreme_softplus_and_causal(chunk):
    """Paired halves made by the sub-chunk prep (softplus gate): finite and exact at per-step
    log decays of -1e3..-1e4, and o[:t] bit-identical when every input at positions >= t changes."""
    seed = _seed()
    args, kw = _extreme_inputs(torch.Generator().manual_seed(seed), "softplus")
    o, ht = _run(args, kw, "numpy", chunk, _prep="pair")
    assert torch.isfinite(o).all() and torch.isfinite(ht).all(), f"non-finite output (seed {seed})"
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    _assert_close(o, want_o, 3e-3, "extreme softplus o (pair)", seed)
    _assert_close(ht, want_s, 3e-3, "extreme softplus state (pair)", seed)
    args, kw = make_inputs(torch.Generator().manual_seed(seed), 1, 60, 1, 2, 16, 16, torch.float32, "softplus", 0, True)
    _assert_causal(args, kw, (7, 21, 40), seed, chunk, _prep="pair")


@pytest.mark.parametrize("target", TARGETS)
def test_state_v_first_layout(target):
    """state_v_first: initial and final states are [N, HV, V, K]; same results as [N, HV, K, V]."""
    seed = _seed()
    args, kw = make_inputs(torch.Generator().manual_seed(seed), 1, 37, 1, 2, 16, 32, torch.float32, "lb", 2, True)
    o, ht = _run(args, kw, target, 16)
    kw_t = dict(kw, initial_state=kw["initial_state"].transpose(-1, -2).contiguous())
    o2, ht2 = _run(args, kw_t, target, 16, state_v_first=True)
    assert ht2.shape == (2, 2, 32, 16)
    assert torch.equal(o, o2) and torch.equal(ht, ht2.transpose(-1, -2)), f"seed {seed}"
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    _assert_close(ht2.transpose(-1, -2), want_s, 2e-4, "v-first state", seed)


def test_chunked_equals_recurrent():
    """The oracle's chunked WY/UT form equals its recurrence, and the kernels at chunk 16, 32 and
    64 (numpy) all match the recurrence: the chunking is invisible up to rounding."""
    ref = load_oracle("kda")
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    args, kw = make_inputs(gen, 1, 70, 1, 2, 16, 16, torch.float32, "lb", 2, True)
    want_o, want_s = ref.kda(*args, **kw)
    for c in (16, 32):
        o, s = ref.kda(*args, **kw, chunked=c)
        assert np.abs(o - want_o).max() < 1e-12 and np.abs(s - want_s).max() < 1e-12
    for c in (16, 32, 64):
        o, ht = _run(args, kw, "numpy", c)
        _assert_close(o, want_o, 2e-4, f"chunk {c} o", seed)
        _assert_close(ht, want_s, 2e-4, f"chunk {c} state", seed)


@pytest.mark.parametrize("gate", ["lb", "softplus", "logdecay"])
def test_causality_bit_exact(gate):
    """Perturbing every input (gates, q, k, v, beta) at positions >= t leaves o[:t] bit-identical:
    no anchor or mask lets a future row into an earlier output (t inside a sub-chunk, chunk 32)."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    args, kw = make_inputs(gen, 1, 60, 1, 2, 16, 16, torch.float32, gate, 0, True)
    o1, _ = _run(args, kw, "numpy", 32)
    for t in (7, 21, 40):
        pert = [a.clone() for a in args]
        q, kk, v, g, beta = pert
        for a in (q, kk, v):
            a[:, t:] = a[:, t:] * 3.0 + 0.5
        beta[:, t:] = 1.0 - beta[:, t:]
        g[:, t:] = -g[:, t:].abs() * 7 if gate == "logdecay" else g[:, t:] * 40
        o2, _ = _run(pert, kw, "numpy", 32)
        assert torch.equal(o1[:, :t], o2[:, :t]), f"t={t}: earlier outputs changed (seed {seed})"
        assert not torch.equal(o1[:, t:], o2[:, t:])


@pytest.mark.parametrize("chunk, prep", [(32, "wide"), (64, "wide"), (64, "pair"), (32, "pair")])
def test_wide_prep_at_the_strongest_decay(chunk, prep):
    """lb = -5 saturated on most steps: G falls to ~-300 within a chunk of 64, so the row factors
    of the rows before a column block hit the exp(80) clamp and those after it underflow to 0;
    the masked entries stay finite and the kept ones exact."""
    seed = _seed()
    args, kw = _extreme_inputs(torch.Generator().manual_seed(seed), "lb", T=150)
    o, ht = _run(args, kw, "numpy", chunk, _prep=prep)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all(), f"non-finite output (seed {seed})"
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    _assert_close(o, want_o, 2e-4, f"extreme lb o ({prep})", seed)
    _assert_close(ht, want_s, 2e-4, f"extreme lb state ({prep})", seed)


@pytest.mark.parametrize("prep", ["wide", "pair"])
def test_wide_prep_is_causal_bit_exact(prep):
    seed = _seed()
    args, kw = make_inputs(torch.Generator().manual_seed(seed), 1, 100, 1, 2, 16, 16, torch.float32, "lb", 0, True)
    _assert_causal(args, kw, (9, 30, 70), seed, 64, _prep=prep)


@pytest.mark.parametrize("chunk", [32, 64])
def test_pair_tiling_edge_cases(chunk):
    """The default tiling's paired halves with an empty sequence in a varlen batch (its state
    passes through), the [V, K] state layout (bit-equal to [K, V]), no final state, and T = 0."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    args, kw = make_inputs(gen, 1, 40, 1, 2, 16, 16, torch.float32, "lb", 0, False)
    kw["cu_seqlens"] = torch.tensor([0, 9, 9, 40], dtype=torch.int32)
    kw["initial_state"] = torch.randn(3, 2, 16, 16, generator=gen)
    o, ht = _run(args, kw, "numpy", chunk, _prep="pair")
    assert torch.equal(ht[1], kw["initial_state"][1]), f"seed {seed}"
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    _assert_close(o, want_o, 2e-4, "pair varlen o", seed)
    _assert_close(ht, want_s, 2e-4, "pair varlen state", seed)
    kw_t = dict(kw, initial_state=kw["initial_state"].transpose(-1, -2).contiguous())
    o2, ht2 = _run(args, kw_t, "numpy", chunk, _prep="pair", state_v_first=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2.transpose(-1, -2)), f"seed {seed}"
    o3, ht3 = chunk_kda(*args, **kw, chunk_size=chunk, _prep="pair", target="numpy")
    assert ht3 is None and torch.equal(o3, o)
    args0, kw0 = make_inputs(gen, 2, 0, 1, 2, 16, 16, torch.float32, "lb", 0, True)
    o4, ht4 = _run(args0, kw0, "numpy", chunk, _prep="pair")
    assert o4.shape == (2, 0, 2, 16) and torch.equal(ht4, kw0["initial_state"])


def test_outputs_without_final_state_and_defaults():
    gen = torch.Generator().manual_seed(_seed())
    args, kw = make_inputs(gen, 1, 20, 1, 1, 16, 16, torch.float32, "logdecay", 0, False)
    o, ht = chunk_kda(*args, chunk_size=16, target="numpy")
    assert ht is None and o.shape == (1, 20, 1, 16)
    o2, _ = chunk_kda(*args, chunk_size=16, scale=16 ** -0.5, target="numpy")
    assert torch.equal(o, o2)
    want, _ = load_oracle("kda").kda(*args, use_qk_l2norm=False)
    o3, _ = chunk_kda(*args, chunk_size=16, use_qk_l2norm=False, target="numpy")
    assert max_rel_err(to_f64(o3), want, floor=0.1 * np.abs(want).max()) < 2e-4


def test_empty_sequence_in_varlen_passes_state_through():
    gen = torch.Generator().manual_seed(_seed())
    args, kw = make_inputs(gen, 1, 20, 1, 1, 16, 16, torch.float32, "lb", 0, False)
    kw["cu_seqlens"] = torch.tensor([0, 9, 9, 20], dtype=torch.int32)
    kw["initial_state"] = torch.randn(3, 1, 16, 16)
    o, ht = _run(args, kw, "numpy", 16)
    assert torch.equal(ht[1], kw["initial_state"][1])
    want_o, want_s = load_oracle("kda").kda(*args, **kw)
    assert max_rel_err(to_f64(o), want_o, floor=0.1 * np.abs(want_o).max()) < 2e-4


def test_empty_sequence_batch_returns_initial_state():
    gen = torch.Generator().manual_seed(_seed())
    args, kw = make_inputs(gen, 2, 0, 1, 2, 16, 16, torch.float32, "lb", 0, True)
    o, ht = _run(args, kw, "numpy", 16)
    assert o.shape == (2, 0, 2, 16) and torch.equal(ht, kw["initial_state"])


def test_kda_gate_shapes_and_forms():
    x = torch.randn(3, 5, 2, 16)
    a_log, bias = torch.randn(2), torch.randn(2, 16)
    ref = load_oracle("kda")
    for lb in (None, -5.0, -0.5):
        y = kda_gate(x, a_log, bias, lb, target="numpy")
        assert y.shape == x.shape and y.dtype == torch.float32
        np.testing.assert_allclose(y.numpy(), ref.kda_gate(x.numpy(), a_log, bias, lb), rtol=2e-6, atol=1e-6)
    assert (kda_gate(x * 100, None, None, -5.0, target="numpy") >= -5.0).all()


@pytest.mark.parametrize("call, needle", [
    (lambda a: chunk_kda(*a, chunk_size=48), "chunk_size"),
    (lambda a: chunk_kda(*a, lower_bound=-6.0), "lower_bound"),
    (lambda a: chunk_kda(a[0], a[1], a[2][:, :, :1], a[3], a[4]), "`g` must have shape"),
    (lambda a: chunk_kda(a[0], a[1][:, :3], a[2], a[3], a[4]), "`k` must have the shape"),
    (lambda a: chunk_kda(*a, cu_seqlens=torch.tensor([0, 5, 3, 20])), "cu_seqlens must rise"),
    (lambda a: chunk_kda(*a, initial_state=torch.zeros(2, 2, 16, 16)), "initial_state"),
    (lambda a: chunk_kda(*a, A_log=torch.zeros(3)), "A_log"),
    (lambda a: chunk_kda(a[0][..., :12], a[1][..., :12], a[2], a[3][..., :12], a[4]), "K=12"),
    (lambda a: chunk_kda(a[0].to(torch.int32), *a[1:]), "dtype int32"),
    (lambda a: kda_gate(a[3], None, torch.zeros(5), -1.0), "dt_bias"),
    (lambda a: chunk_kda(*a, chunk_size=64, _prep="wide"), "needs the lower-bound gate"),
    (lambda a: chunk_kda(*a, chunk_size=16, _prep="pair"), "got chunk_size=16"),
    (lambda a: chunk_kda(*a, _prep="fast"), "not a prep kernel"),
    (lambda a: chunk_kda(*a, lower_bound=-1.0, chunk_size=16, _prep="pair"), "got chunk_size=16"),
])
def test_bad_inputs_raise_k31error(call, needle):
    args, _ = make_inputs(torch.Generator().manual_seed(0), 1, 20, 1, 2, 16, 16, torch.float32, "lb", 0, False)
    with pytest.raises(K31Error) as e:
        call(args)
    assert needle in str(e.value)


# ---------------------------------------------------------------- sm_90 compile (GPU configuration)

class GpuSpec:
    """A kernel at fixed constexprs (what the GPU run specialises), for tests/hopper.py."""

    def __init__(self, kdef, **constexprs):
        self.kdef, self.cx = kdef, constexprs

    def ir(self):
        return self.kdef.ir(**self.cx)


PREP_LB_GPU = GpuSpec(kda_chunk_prep, XT=k.bf16, GT=k.bf16, BETAT=k.bf16, MT=k.bf16, GATE=2, SAFE=True,
                      PREC="bf16", SOLVE="tf32", BT=64, BC=16, BK=128, BVV=128)
PREP_SOFTPLUS_GPU = GpuSpec(kda_chunk_prep, XT=k.bf16, GT=k.f32, BETAT=k.f32, MT=k.bf16, GATE=1, SAFE=False,
                            PREC="bf16", SOLVE="tf32", BT=64, BC=16, BK=128, BVV=128)
PREP_WIDE_GPU = GpuSpec(kda_chunk_prep_wide, XT=k.bf16, GT=k.bf16, BETAT=k.bf16, MT=k.bf16, PREC="bf16", SOLVE="tf32",
                        BT=64, BK=128, BVV=128)
PREP_WIDE16_GPU = GpuSpec(kda_chunk_prep_wide, XT=k.bf16, GT=k.bf16, BETAT=k.bf16, MT=k.bf16, PREC="bf16",
                          SOLVE="tf32", PAIR=True, BT=16, BK=128, BVV=128)
STATE_GPU = GpuSpec(kda_chunk_state, MT=k.bf16, OT=k.bf16, HAS_H0=True, STORE_HT=True, BT=64, BK=128, BV=32)
STATE_VFIRST_GPU = GpuSpec(kda_chunk_state, MT=k.bf16, OT=k.bf16, HAS_H0=True, STORE_HT=True, VFIRST=True,
                           BT=64, BK=128, BV=64)
PAIR_MERGE_GPU = GpuSpec(kda_chunk_pair_merge, MT=k.bf16, PREC="tf32", BT=32, BK=128, BVV=128)
GATE_GPU = GpuSpec(kda_gate_rows, XT=k.bf16, MODE=2, BM=16, BK=128)


def test_kernels_compile_for_hopper(tmp_path):
    from hopper import assert_compiles_for_hopper
    # the softplus prep differs from PREP_LB_GPU only in its diagonal blocks (CUDA-core loops); it
    # compiles too but costs another minute of ptxas on 2 cores, so CI checks the benchmarked pair
    assert_compiles_for_hopper(__file__, ["PREP_LB_GPU", "PREP_WIDE_GPU", "PREP_WIDE16_GPU", "STATE_GPU",
                                          "STATE_VFIRST_GPU", "PAIR_MERGE_GPU"], tmp_path,
                               index_types=("int32",))


def test_default_tiling_is_the_measured_choice():
    """chunk_kda with chunk_size / prep left open: for few (head, sequence) pairs prep halves of
    32 paired into chunk 64, whatever the gate; otherwise the whole-chunk prep at chunk 16 under
    the lower bound and the sub-chunk prep at chunk 16 for the other gates (bit-for-bit the
    explicit call on numpy); an explicit chunk keeps the unpaired kernels, an explicit prep is
    kept."""
    from k31dsl.ops.kda.chunk import PAIR_MAX_HEADS, default_tiling
    assert default_tiling(True) == (16, "wide") and default_tiling(False) == (16, "sub")
    assert default_tiling(True, None, None, PAIR_MAX_HEADS) == (64, "pair")
    assert default_tiling(True, None, None, PAIR_MAX_HEADS + 1) == (16, "wide")
    assert default_tiling(False, None, None, 1) == (64, "pair") and default_tiling(False, 64) == (64, "sub")
    assert default_tiling(True, 32) == (32, "wide") and default_tiling(True, 64, None, 1) == (64, "sub")
    assert default_tiling(True, 16) == (16, "wide") and default_tiling(False, 16) == (16, "sub")
    assert default_tiling(True, None, "sub") == (64, "sub") and default_tiling(True, None, "wide", 2) == (32, "wide")
    assert default_tiling(True, None, "wide", 96) == (16, "wide")
    assert default_tiling(True, None, "pair", 96) == (32, "pair") and default_tiling(True, None, "pair", 2) == (64, "pair")
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    for gate, hv, batch, want in (("lb", 2, 1, (64, "pair")), ("lb", 2 * PAIR_MAX_HEADS, 1, (16, "wide")),
                                  ("lb", 4, PAIR_MAX_HEADS // 2, (16, "wide")), ("softplus", 2, 1, (64, "pair")),
                                  ("softplus", 2 * PAIR_MAX_HEADS, 1, (16, "sub"))):
        args, kw = make_inputs(g, batch, 45 if batch == 1 else 5, 2, hv, 16, 16, torch.float32, gate)
        o, s = chunk_kda(*args, **kw, output_final_state=True, target="numpy")
        o2, s2 = _run(args, kw, "numpy", want[0], _prep=want[1])
        assert torch.equal(o, o2) and torch.equal(s, s2), f"{gate} HV={hv} B={batch} (seed {seed})"

"""Attention Residuals: the fp64 oracle's three formulations agree (full == naive block == two-phase),
the ops against the oracle on every target through tests/test_ops.py (registered checks) plus
the semantics tested here: in-place partial update, the norm gain fold, a block network run
through the ops end to end, every prepare config, the superkernel fusion of update + RMSNorm (one
kernel, h not stored when not returned, bit-identical to the two kernels), argument errors, and
sm_90 compilation of the kernels (the fused one included)."""


import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.ops import attnres as ar
from k31dsl.ops import attnres_cached as ac
from k31dsl.ops.testing import load_oracle, to_f64

from hopper import Specialised, assert_compiles_for_hopper

TARGETS = ["numpy", "triton"]
ref = load_oracle("attnres")


def _rng():
    return np.random.default_rng(np.random.SeedSequence().entropy)


def _tanh_layers(rng, n_layers: int, d: int):
    """Stand-in sublayers: f_l(h) = tanh(h W_l) with random W_l."""
    ws = [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(n_layers)]
    return [(lambda h, w=w: np.tanh(h @ w)) for w in ws]


# ---------------------------------------------------------------- the oracle with itself

@pytest.mark.parametrize("n_layers, block", [(6, 2), (7, 3), (5, 1), (4, 4), (8, 8)])
def test_oracle_two_phase_equals_naive_block(n_layers, block):
    rng = _rng()
    t, d = 5, 16
    emb = rng.standard_normal((t, d))
    queries = rng.standard_normal((n_layers + 1, d))
    f = _tanh_layers(rng, n_layers, d)
    out_naive, hs_naive = ref.block_attnres_naive(emb, queries, f, block, 1e-6)
    out_two, hs_two = ref.block_attnres_two_phase(emb, queries, f, block, 1e-6)
    np.testing.assert_allclose(out_two, out_naive, rtol=1e-12, atol=1e-12)
    for a, b in zip(hs_two, hs_naive):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_oracle_block_size_one_is_full_attnres():
    """block = 1: every layer's output is its own source, so Block AttnRes is full AttnRes over
    [emb, f_0(h_0), f_1(h_1), ...]."""
    rng = _rng()
    t, d, n_layers = 4, 12, 5
    emb = rng.standard_normal((t, d))
    queries = rng.standard_normal((n_layers + 1, d))
    f = _tanh_layers(rng, n_layers, d)
    out, hs = ref.block_attnres_naive(emb, queries, f, 1, 1e-6)
    srcs = [emb]
    for l in range(n_layers):
        h = emb if l == 0 else ref.attnres(np.stack(srcs), queries[l], 1e-6)
        np.testing.assert_allclose(hs[l], h, rtol=1e-12, atol=1e-12)
        srcs.append(f[l](h))
    np.testing.assert_allclose(out, ref.attnres(np.stack(srcs), queries[n_layers], 1e-6), rtol=1e-12, atol=1e-12)


def test_oracle_update_is_attention_over_the_union():
    """prepare + update == full AttnRes over blocks + [partial], written independently here:
    softmax weights from explicit per-source logits."""
    rng = _rng()
    n, t, d = 4, 3, 10
    blocks, p, q = rng.standard_normal((n, t, d)), rng.standard_normal((t, d)), rng.standard_normal(d)
    o, m, l = ref.prepare(blocks, q[None], 1e-6)
    h = ref.update(p, q, o[0], m[0], l[0], 1e-6)
    srcs = np.concatenate([blocks, p[None]])
    z = np.array([[srcs[i, j] @ q / np.sqrt(np.mean(srcs[i, j] ** 2) + 1e-6) for j in range(t)]
                  for i in range(n + 1)])
    a = np.exp(z) / np.exp(z).sum(0)
    np.testing.assert_allclose(h, (a[..., None] * srcs).sum(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref.attnres(srcs, q, 1e-6), h, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- the ops

def _t(a, dtype=torch.float32):
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_two_phase_ops_equal_full_attnres_op(target):
    """prepare + update through the ops == the full op over blocks + [partial] (both vs fp64)."""
    rng = _rng()
    n, t, d = 3, 6, 77
    blocks = _t(rng.standard_normal((n, t, d)))
    q = _t(rng.standard_normal(d) * 2 / np.sqrt(d))
    gain = _t(1 + 0.2 * rng.standard_normal(d))
    partial0 = _t(rng.standard_normal((t, d)))
    delta = _t(rng.standard_normal((t, d)), torch.bfloat16)
    o, m, l = ar.attnres_prepare(blocks, q[None], norm_weights=gain, target=target)
    partial = partial0.clone()
    h, _ = ar.attnres_update(partial, delta, q * gain, o[0], m[0], l[0], torch.ones(d), target=target)
    full = ar.attnres(torch.cat([blocks, partial[None]]), q, norm_weight=gain, out_dtype=torch.float32,
                      target=target)
    want = ref.attnres(np.concatenate([to_f64(blocks), to_f64(partial0 + delta.float())[None]]),
                       to_f64(q) * to_f64(gain), 1e-6)
    assert np.abs(to_f64(full) - want).max() <= 1e-4 * np.abs(want).max()
    assert np.abs(to_f64(h) - want).max() <= 1e-2 * np.abs(want).max()


@pytest.mark.parametrize("target", TARGETS)
def test_block_network_through_the_ops_matches_naive_block_attnres(target):
    """A Block AttnRes network (L = 7 layers, blocks of 3, K3 boundary convention) run the
    production way: attnres_prepare at each block start, attnres_update per later layer (the
    running partial updated in place, bf16 h), the block's first layer reading O / L, and the
    final aggregation as one more update — against the oracle's naive formulation (attention over
    blocks + partial at every layer). Sublayers return bf16 in both."""
    fp = load_oracle("fp")
    rng = _rng()
    t, d, n_layers, block = 4, 64, 7, 3
    emb = rng.standard_normal((t, d))
    queries = rng.standard_normal((n_layers + 1, d)) * 2 / np.sqrt(d)
    ws = [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(n_layers)]
    f = [(lambda h, w=w: fp.round_to(np.tanh(h @ w), fp.BF16)) for w in ws]
    want_out, want_hs = ref.block_attnres_naive(emb, queries, f, block, 1e-6)

    q = _t(queries)
    ones = torch.ones(d)
    blocks, prefix, hs, delta = [], _t(emb), [], None
    for b0 in range(0, n_layers, block):
        if delta is not None:                         # the previous block's last output joins its sum
            prefix = partial + delta.float()
        blocks.append(prefix)
        o, m, l = ar.attnres_prepare(torch.stack(blocks), q[b0:b0 + block], target=target)
        partial = torch.zeros(t, d)
        for i, layer in enumerate(range(b0, min(b0 + block, n_layers))):
            if layer == 0:
                h = _t(emb, torch.bfloat16)
            elif i == 0:
                h = (o[0] / l[0][:, None]).to(torch.bfloat16)
            else:
                h, _ = ar.attnres_update(partial, delta, q[layer], o[i], m[i], l[i], ones, target=target)
            hs.append(h)
            delta = torch.tanh(h.float() @ _t(ws[layer])).to(torch.bfloat16)
    o, m, l = ar.attnres_prepare(torch.stack(blocks), q[n_layers:], target=target)
    out, _ = ar.attnres_update(partial, delta, q[n_layers], o[0], m[0], l[0], ones, out_dtype=torch.float32,
                               target=target)
    for got, want in zip(hs + [out], want_hs + [want_out]):
        assert np.abs(to_f64(got) - want).max() <= 3e-2 * np.abs(want).max()


@pytest.mark.parametrize("target", TARGETS)
def test_update_writes_partial_in_place_and_repeats(target):
    """Two updates in a row accumulate both deltas into the same buffer (the running block sum)."""
    rng = _rng()
    t, d = 3, 40
    partial = _t(rng.standard_normal((t, d)))
    start = partial.clone()
    ptr = partial.data_ptr()
    d1, d2 = (_t(rng.standard_normal((t, d)), torch.bfloat16) for _ in range(2))
    o, m, l = ar.attnres_prepare(_t(rng.standard_normal((2, t, d))), _t(rng.standard_normal((2, d)) * 0.3),
                                 target=target)
    w = torch.ones(d)
    ar.attnres_update(partial, d1, torch.zeros(d), o[0], m[0], l[0], w, target=target)
    ar.attnres_update(partial, d2, torch.zeros(d), o[1], m[1], l[1], w, target=target)
    assert partial.data_ptr() == ptr
    assert torch.equal(partial, (start + d1.float()) + d2.float())


@pytest.mark.parametrize("target", TARGETS)
def test_zero_query_is_uniform_average(target):
    """All pseudo-queries are zero at init (paper section 5): AttnRes is the mean of its sources."""
    rng = _rng()
    v = _t(rng.standard_normal((5, 3, 33)))
    h = ar.attnres(v, torch.zeros(33), target=target)
    np.testing.assert_allclose(to_f64(h), to_f64(v).mean(0), rtol=1e-5, atol=1e-6)


def test_empty_token_dim():
    o, m, l = ar.attnres_prepare(torch.zeros(2, 0, 8), torch.zeros(3, 8), target="numpy")
    assert o.shape == (3, 0, 8) and m.shape == (3, 0) and l.shape == (3, 0)
    h, y = ar.attnres_update(torch.zeros(0, 8), torch.zeros(0, 8, dtype=torch.bfloat16), torch.zeros(8),
                             torch.zeros(0, 8), torch.zeros(0), torch.zeros(0), torch.ones(8), target="numpy")
    assert h.shape == y.shape == (0, 8) and h.dtype == torch.bfloat16
    assert ar.attnres(torch.zeros(2, 0, 8), torch.zeros(8), target="numpy").shape == (0, 8)


@pytest.mark.parametrize("target", TARGETS)
def test_every_prepare_config_matches_the_oracle(target):
    """The GPU autotuner may pick any config (chunk size, sweep variants): each must be right."""
    rng = _rng()
    n, t, d, s = 3, 2, 70, 3                   # D = 70: a ragged last chunk (BD 32)
    v = _t(rng.standard_normal((n, t, d)) * np.exp(rng.standard_normal((n, t, 1))))
    q = _t(rng.standard_normal((s, d)) * 2 / np.sqrt(d))
    want = ref.prepare(to_f64(v), to_f64(q), 1e-6)
    for cfg in ar.PREPARE_CONFIGS:
        cx = {key: val for key, val in cfg.items() if key not in ("num_warps", "BD")}
        nan = float("nan")                     # not empty(): a freed block could hold the last config's answer
        o, m, l = torch.full((s, t, d), nan), torch.full((s, t), nan), torch.full((s, t), nan)
        ar.attnres_prepare_rows[target](v, q, o, m, l, 1e-6, NB=4, SB=4, BD=min(cfg["BD"], 32), **cx)
        for got, w in zip((o, m, l), want):
            assert np.abs(to_f64(got) - w).max() <= 1e-5 * np.abs(w).max(), cfg
    vb = v.to(torch.bfloat16)                   # full AttnRes (FINAL): bf16 in and out, one query
    full = ref.attnres(to_f64(vb), to_f64(q[0]), 1e-6)
    for cfg in ar.PREPARE_CONFIGS:
        cx = {key: val for key, val in cfg.items() if key not in ("num_warps", "BD")}
        h, stats = torch.full((1, t, d), float("nan"), dtype=torch.bfloat16), torch.empty(1, t)
        ar.attnres_prepare_rows[target](vb, q[:1], h, stats, stats, 1e-6, NB=4, SB=1, BD=min(cfg["BD"], 32),
                                        FINAL=True, **cx)
        assert np.abs(to_f64(h[0]) - full).max() <= 8e-3 * np.abs(full).max(), cfg


@pytest.mark.parametrize("target", TARGETS)
def test_every_cached_config_and_the_pinned_variant_match_the_oracle(target):
    """The cached prepare's two kernels under each GPU config (paired: the logit GEMM's row tiles
    and the sweep's chunk widths, cut to the ragged D = 70) on a source buffer filled block by
    block (the rows past the live n are NaN: never read), and 17 blocks of one query each through
    the op, past the configs' sizes (NB 32: the pinned plain sweep), where the newest block is
    scored against up to 17 queries (QB 32)."""
    rng = _rng()
    t, d, nb = 2, 70, 17
    v = _t(rng.standard_normal((nb, t, d)) * np.exp(rng.standard_normal((nb, t, 1))))
    buf = torch.full((6, t, d), float("nan"))
    q = _t(rng.standard_normal((nb, d)) * 2 / np.sqrt(d))
    score, weigh = ac.kernels(target)
    pairs = [(lc, ac.CACHED_CONFIGS[i % len(ac.CACHED_CONFIGS)]) for i, lc in enumerate(ac.LOGIT_CONFIGS)]
    for cfgs in pairs + [None]:
        z = torch.full((nb, nb, t), float("nan"))
        for b in range(3 if cfgs else nb):
            if cfgs is None:
                o, m, l = ac.attnres_prepare_cached(v[:b + 1], q, z, b, 1, target=target)
            else:
                lcfg, ccfg = ({key: val for key, val in c.items() if not key.startswith("num_")} for c in cfgs)
                o, m, l = torch.empty(1, t, d), torch.empty(1, t), torch.empty(1, t)
                buf[b] = v[b]
                score(buf, q, z, 1e-6, b, b + 1, **dict(lcfg, **ac.logit_constexprs(nb - b)))
                weigh(buf, z, o, m, l, b, b + 1, **dict(ccfg, BD=min(ccfg["BD"], 32), **ac.cached_constexprs(b + 1, 1)))
            for got, w in zip((o, m, l), ref.prepare(to_f64(v[:b + 1]), to_f64(q[b:b + 1]), 1e-6)):
                assert np.abs(to_f64(got) - w).max() <= ac.LOGIT_TOL * np.abs(w).max(), (cfgs, b)


@pytest.mark.parametrize("bad, needle", [
    (dict(queries=torch.zeros(4, 9)), "`queries` must be [Q >= 1, 8]"),
    (dict(first=4), "`first` must be an int in 0..3"),
    (dict(first=True), "`first`"),
    (dict(count=0), "`count` must be an int in 1..3"),
    (dict(first=2, count=3), "`count` must be an int in 1..2"),
    (dict(logits=torch.zeros(1, 4, 3)), "`logits` must be float32 [N >= 2, 4, 3]"),
    (dict(logits=torch.zeros(2, 4, 3, dtype=torch.float64)), "`logits`"),
    (dict(logits=torch.zeros(2, 3, 4).transpose(1, 2)), "contiguous"),
    (dict(queries=torch.zeros(300, 8), logits=torch.zeros(2, 300, 3), first=0), "at most 256"),
    (dict(eps=-1.0), "eps"),
    (dict(form="tiles"), "form='tiles' is not a logit form"),
])
def test_cached_prepare_bad_inputs_raise_and_change_nothing(bad, needle):
    """Each bad argument is a K31Error naming it, raised before the logit cache is touched."""
    kw = dict(blocks=torch.zeros(2, 3, 8), queries=torch.zeros(4, 8), logits=torch.zeros(2, 4, 3), first=1, count=2)
    kw.update(bad)
    before = kw["logits"].clone()
    with pytest.raises(K31Error) as e:
        ac.attnres_prepare_cached(**kw, target="numpy")
    assert needle in str(e.value)
    assert torch.equal(kw["logits"], before)


# ---------------------------------------------------------------- the superkernel fusion

def _update_args(rng, t, d):
    return (_t(rng.standard_normal((t, d))), _t(rng.standard_normal((t, d)), torch.bfloat16),
            _t(rng.standard_normal(d) * 2 / np.sqrt(d)), _t(rng.standard_normal((t, d))), _t(rng.standard_normal(t)),
            _t(rng.random(t) + 1), _t(1 + 0.2 * rng.standard_normal(d), torch.bfloat16))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("return_h", [True, False])
def test_update_program_is_fused_into_one_kernel(target, return_h):
    """The graph pipeline's superkernel pass inlines the row RMSNorm into the update kernel; h is
    forwarded on chip, and not stored at all when it is not an output."""
    from k31dsl.lowering.graph.bind import stored_params
    exe = ar.update_executable(target, 5, 100, k.bf16, k.bf16, k.bf16, 1e-6, 1e-6, return_h)
    calls = exe.p.calls()
    assert len(calls) == 1, exe.p.report
    kern = exe.p.node(calls[0]).kernel
    assert "fused attnres_update_rows + rmsnorm_row" in " ".join(exe.p.report)
    assert ("h" in stored_params(kern)) == return_h
    assert set(stored_params(kern)) >= {"partial", "y"}
    unfused = ar.update_executable(target, 5, 100, k.bf16, k.bf16, k.bf16, 1e-6, 1e-6, return_h,
                                   passes=["build", "verify"])
    assert len(unfused.p.calls()) == 2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("t, d", [(3, 96), (6, 200), (1, 1)])
def test_fused_update_equals_two_kernels(target, t, d):
    """Fused (one kernel, h on chip) and unfused (h through memory) give identical bits: the fused
    kernel forwards exactly the stored bf16 h."""
    rng = _rng()
    a = _update_args(rng, t, d)
    b = tuple(x.clone() for x in a)
    h1, y1 = ar.attnres_update(*a, 1e-6, 1e-5, fused=True, target=target)
    h2, y2 = ar.attnres_update(*b, 1e-6, 1e-5, fused=False, target=target)
    assert torch.equal(h1, h2) and torch.equal(y1, y2) and torch.equal(a[0], b[0])
    y3 = ar.attnres_update(*(x.clone() for x in b), 1e-6, 1e-5, fused=True, return_h=False, target=target)
    assert torch.equal(y3, ar.attnres_update(*(x.clone() for x in b), 1e-6, 1e-5, fused=False, return_h=False,
                                             target=target))


def test_fused_program_launches_once_per_step():
    """Through the program executor: one launch per step fused, two with the superkernel pass off."""
    rng = _rng()
    a = _update_args(rng, 4, 48)
    inputs = dict(zip(("partial", "delta", "query", "O", "M", "L", "norm_weight"), a))
    fused = ar.update_executable("numpy", 4, 48, k.bf16, k.bf16, k.bf16, 1e-6, 1e-6, True)
    plain = ar.update_executable("numpy", 4, 48, k.bf16, k.bf16, k.bf16, 1e-6, 1e-6, True, passes=["build", "verify"])
    counts = []
    for exe in (fused, plain):
        before = exe.launches
        outs = [exe(dict(inputs, partial=a[0].clone())) for _ in range(3)]
        counts.append(exe.launches - before)
        assert all(torch.equal(o["y"], outs[0]["y"]) for o in outs)
    assert counts == [3, 6]
    api = ar.attnres_update(*(x.clone() for x in a), 1e-6, 1e-6, target="numpy")    # the direct launcher
    assert torch.equal(api[0], outs[0]["h"]) and torch.equal(api[1], outs[0]["y"])


def test_fused_true_without_the_superkernel_pass_raises(monkeypatch):
    """fused=True promises one kernel: with the pass taken out of the pipeline it is a K31Error,
    while the default (fused=None) still runs the two-call program correctly."""
    from k31dsl.lowering.graph import pipeline
    monkeypatch.setitem(pipeline.GRAPH_PIPELINES, "numpy", ["build", "verify", "streams", "memory_plan"])
    monkeypatch.setattr(ar, "_FUSED", {})
    monkeypatch.setattr(ar, "_EXECUTABLES", {})
    rng = _rng()
    a = _update_args(rng, 3, 24)
    b = tuple(x.clone() for x in a)
    with pytest.raises(K31Error, match="did not fuse"):
        ar.attnres_update(*(x.clone() for x in a), fused=True, target="numpy")
    h, y = ar.attnres_update(*a, target="numpy")
    h2, y2 = ar.attnres_update(*b, fused=False, target="numpy")
    assert torch.equal(h, h2) and torch.equal(y, y2) and torch.equal(a[0], b[0])


def test_one_fused_launcher_serves_every_t(monkeypatch):
    """Calls with different T after each other: the fused kernel bakes nothing of T (the RMSNorm
    zeroes lanes past D itself), so the launcher built for the first T serves the others."""
    monkeypatch.setattr(ar, "_FUSED", {})
    rng = _rng()
    for t in (3, 1, 5, 3):
        a = _update_args(rng, t, 40)
        b = tuple(x.clone() for x in a)
        fused, plain = ar.attnres_update(*a, target="numpy"), ar.attnres_update(*b, fused=False, target="numpy")
        assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1])
    rest = (40, k.bf16, k.bf16, k.bf16, 1e-6, 1e-6, True)
    assert sorted(ar._FUSED, key=str) == sorted([("numpy", 3) + rest, ("numpy", None) + rest], key=str)


def _upd(**over):
    t, d = 4, 16
    kw = dict(partial=torch.zeros(t, d), delta=torch.zeros(t, d, dtype=torch.bfloat16), query=torch.zeros(d),
              O=torch.zeros(t, d), M=torch.zeros(t), L=torch.ones(t), norm_weight=torch.ones(d))
    kw.update(over)
    return lambda: ar.attnres_update(**kw, target="numpy")


@pytest.mark.parametrize("call, needle", [
    (lambda: ar.attnres(torch.zeros(4, 8), torch.zeros(8)), "[n, T, D]"),
    (lambda: ar.attnres(torch.zeros(0, 2, 8), torch.zeros(8)), "at least one source"),
    (lambda: ar.attnres(torch.zeros(2, 3, 8), torch.zeros(7)), "`query` must have shape [8]"),
    (lambda: ar.attnres(torch.zeros(2, 3, 8), torch.zeros(8), norm_weight=torch.ones(9)), "norm_weight"),
    (lambda: ar.attnres(torch.zeros(2, 3, 8, dtype=torch.int32), torch.zeros(8)), "dtype int32"),
    (lambda: ar.attnres(torch.zeros(2, 3, 8), torch.zeros(8), eps=0.0), "eps"),
    (lambda: ar.attnres(torch.zeros(2, 3, 8), torch.zeros(8), out_dtype=torch.int8), "out_dtype"),
    (lambda: ar.attnres(torch.zeros(2, 3, 8), torch.zeros(8), target="gpu"), "unknown target"),
    (lambda: ar.attnres_prepare(torch.zeros(2, 3, 8), torch.zeros(8)), "[S, D]"),
    (lambda: ar.attnres_prepare(torch.zeros(2, 3, 8), torch.zeros(0, 8)), "at least one pseudo-query"),
    (lambda: ar.attnres_prepare(torch.zeros(2, 3, 8), torch.zeros(2, 9)), "`queries` must have shape [2, 8]"),
    (lambda: ar.attnres_prepare(torch.zeros(2, 3, 8), torch.zeros(2, 8), eps=float("nan")), "eps"),
    # a gain on another device than the query (a CPU gain for a CUDA query crashed in torch before;
    # "meta" stands in for the GPU here)
    (lambda: ar.attnres(torch.zeros(2, 3, 8), torch.zeros(8), norm_weight=torch.ones(8, device="meta")),
     "different devices"),
    (lambda: ar.attnres_prepare(torch.zeros(2, 3, 8), torch.zeros(2, 8), norm_weights=torch.ones(8, device="meta")),
     "different devices"),
    (_upd(partial=torch.zeros(4, 16, dtype=torch.bfloat16)), "`partial` has dtype bfloat16"),
    (_upd(partial=torch.zeros(16, 4).t()), "contiguous"),
    (_upd(partial=torch.zeros(4, 16, 1)), "[T, D]"),
    (_upd(delta=torch.zeros(4, 15, dtype=torch.bfloat16)), "`delta` must have shape [4, 16]"),
    (_upd(query=torch.zeros(15)), "`query`"),
    (_upd(O=torch.zeros(3, 16)), "`O` must have shape [4, 16]"),
    (_upd(M=torch.zeros(4, 1)), "`M` must have shape [4]"),
    (_upd(L=torch.zeros(4, dtype=torch.bfloat16)), "`L` has dtype bfloat16"),
    (_upd(norm_weight=torch.ones(4)), "`norm_weight`"),
    (lambda: ar.attnres_update(torch.zeros(4, 16), torch.zeros(4, 16), torch.zeros(16), torch.zeros(4, 16),
                               torch.zeros(4), torch.ones(4), torch.ones(16), norm_eps=-1.0), "norm_eps"),
    (lambda: ar.attnres_update(torch.zeros(4, 16), torch.zeros(4, 16), torch.zeros(16), torch.zeros(4, 16),
                               torch.zeros(4), torch.ones(4), torch.ones(16), out_dtype=torch.int32), "out_dtype"),
])
def test_bad_inputs_raise_k31error(call, needle):
    with pytest.raises(K31Error) as e:
        call()
    assert needle in str(e.value)


# the benchmark's shapes: S = 6 -> SB 8, n = 8, the largest chunk; D = 7168 -> one 8192 row tile
PREPARE_BENCH = Specialised(ar.attnres_prepare_rows, NB=8, SB=8, BD=128, WARPS=4, ROWS3D=True, STAGES=6)
PREPARE_PREFETCH = Specialised(ar.attnres_prepare_rows, NB=8, SB=8, BD=512, WARPS=16, PREFETCH=True)
PREPARE_HINTS = Specialised(ar.attnres_prepare_rows, NB=8, SB=8, BD=256, WARPS=8, PREFETCH=True, KEEP="last",
                            DROP="first")
CACHED_LOGITS = Specialised(ac.attnres_block_logits, QB=16, BT=32, BK=64)
CACHED_LOGITS_ROWS = Specialised(ac.attnres_block_logits_rows, **ac.form_constexprs("rows", 48, 7168))
CACHED_BENCH = Specialised(ac.attnres_prepare_cached_rows, NB=8, SB=8, BD=256, WARPS=8, STAGES=6, DROP="first")
FULL_BF16 = Specialised(ar.attnres_prepare_rows, VT=k.bf16, OT=k.bf16, NB=16, SB=1, FINAL=True)
UPDATE_ROW = Specialised(ar.attnres_update_rows, BD=8192, WARPS=16)
RMSNORM_ROW = Specialised(ar.rmsnorm_row, BD=8192, WT=k.bf16)


class _FusedUpdate:
    """The superkernel pass's fused update + RMSNorm kernel at D = 7168."""

    def ir(self):
        exe = ar.update_executable("numpy", 2, 7168, k.bf16, k.bf16, k.bf16, 1e-6, 1e-6, False)
        return exe.p.node(exe.p.calls()[0]).kernel


FUSED_UPDATE = _FusedUpdate()


def test_kernels_compile_for_hopper(tmp_path):
    names = ["PREPARE_BENCH", "PREPARE_PREFETCH", "PREPARE_HINTS", "CACHED_LOGITS", "CACHED_LOGITS_ROWS",
             "CACHED_BENCH", "FULL_BF16", "UPDATE_ROW", "RMSNORM_ROW",
             "FUSED_UPDATE"]
    assert_compiles_for_hopper(__file__, names, tmp_path, index_types=("int32",))


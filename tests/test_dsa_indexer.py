"""DSA indexer side: cache layout bytes, the Lightning Indexer on causal prefill and decode with
drafts, indexer + top-k end to end (contexts shorter than k), top-k ties/padding, the Hadamard
rotation, the prolog's three streams == in-order execution, input errors, sm_90 compilation.
The per-op oracle checks on every target run in tests/test_ops.py (registry)."""

import numpy as np
import pytest
import torch
from hopper import Specialised, assert_compiles_for_hopper, run_compiler_script

from k31dsl import K31Error
from k31dsl.ops.dsa import indexer as I
from k31dsl.ops.dsa import indexer_checks as C
from k31dsl.ops.dsa import prolog as P
from k31dsl.ops.dsa.topk import topk, topk_order, topk_rank_keys, topk_segments
from k31dsl.ops.testing import bytes_of, load_oracle

ref = load_oracle("dsa_indexer")
TARGETS = ["numpy", "triton"]


def _gen():
    seed = int(np.random.SeedSequence().entropy % 2**31)
    return torch.Generator().manual_seed(seed), seed


# ---------------------------------------------------------------- cache layout

def test_cache_layout_is_block_split():
    """Token (page 2, offset 5): codes at bytes 5*128.., scales at 8192 + 5*4.. of page 2's row."""
    cache = I.new_indexer_cache(3)
    codes = torch.arange(128, dtype=torch.uint8).view(1, 128).view(torch.float8_e4m3fn)
    scales = torch.tensor([[120, 121, 122, 123]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    I.indexer_cache_write(cache, codes, scales, torch.tensor([2 * 64 + 5], dtype=torch.int32), target="numpy")
    row = cache[2]
    assert torch.equal(row[5 * 128:6 * 128], torch.arange(128, dtype=torch.uint8))
    assert row[8192 + 20:8192 + 24].tolist() == [120, 121, 122, 123]
    assert int(cache.sum()) == int(torch.arange(128).sum()) + 486          # nothing else written
    kc, ksc = I.indexer_cache_views(cache)
    assert kc.shape == (3, 64, 128) and ksc.shape == (3, 64, 4) and kc.stride(0) == I.PAGE_BYTES
    assert kc[2, 5].view(torch.uint8).tolist() == list(range(128))


@pytest.mark.parametrize("target", TARGETS)
def test_cache_write_then_read_back_bit_exact(target):
    g, seed = _gen()
    cache = torch.zeros((4, I.PAGE_BYTES), dtype=torch.uint8)
    kc, ksc = C.random_keys(100, g)
    slots = torch.randperm(256, generator=g)[:100].to(torch.int32)
    I.indexer_cache_write(cache, kc, ksc, slots, target=target)
    codes, scales = I.indexer_cache_views(cache)
    sl = slots.long()
    assert torch.equal(codes[sl // 64, sl % 64].view(torch.uint8), kc.view(torch.uint8)), seed
    assert torch.equal(scales[sl // 64, sl % 64].view(torch.uint8), ksc.view(torch.uint8)), seed


# ---------------------------------------------------------------- lightning indexer

def _scores_check(got, args):
    want = ref.indexer_scores(*args)
    mag = ref.indexer_scores_magnitude(*args)
    got = got.numpy().astype(np.float64)
    assert (np.isneginf(got) == np.isneginf(want)).all()
    fin = np.isfinite(want)
    assert (np.abs(got[fin] - want[fin]) <= 1e-5 * mag[fin] + 1e-30).all()
    return want


@pytest.mark.parametrize("target", TARGETS)
def test_causal_prefill_scores(target):
    """One sequence, T queries over its own keys: ks = 0 (or a sliding start), ke = t + 1."""
    g, seed = _gen()
    t = 70 if target == "numpy" else 24
    cache, table, qc, qs, w, _, _ = C.paged_setup([t], t, 16, g)
    ke = torch.arange(1, t + 1, dtype=torch.int32)
    ks = torch.clamp(ke - 50, min=0).to(torch.int32)
    got = I.lightning_indexer(qc, qs, cache, table, w, ks, ke, max_len=t, target=target,
                              mma="bf16" if target == "triton" else "fp8")
    assert got.shape == (t, t)
    _scores_check(got, (bytes_of(qc), bytes_of(qs), w.double().numpy(), cache.numpy(), table.numpy(),
                        ks.numpy(), ke.numpy(), t))
    assert torch.isneginf(got[torch.ones(t, t, dtype=torch.bool).triu(1)]).all(), seed       # causal


@pytest.mark.parametrize("n, config", [(1, {"PB": 1}), (1, {"PB": 2}), (2, {"NQ": 2, "PB": 1}),
                                       (1, {"PB": 1, "F16": True}), (2, {"NQ": 2, "PB": 2, "F16": True})])
def test_keys_major_scoring(n, config):
    """The KEYS_MAJOR bf16 scorer (keys on the dot's rows, head sum along its columns, the [keys,
    tokens] result transposed back) and its f16 form on the Triton interpreter: ragged contexts,
    shuffled pages."""
    g, seed = _gen()
    cache, table, qc, qs, w, ks, ke = C.paged_setup([150, 20, 67], n, 16, g)
    got = I.lightning_indexer(qc, qs, cache, table, w, ks, ke, mma="bf16", config={**config, "KEYS_MAJOR": True},
                              target="triton")
    _scores_check(got, (bytes_of(qc), bytes_of(qs), w.double().numpy(), cache.numpy(), table.numpy(),
                        ks.numpy(), ke.numpy(), got.shape[1]))


@pytest.mark.parametrize("target", TARGETS[:2])
def test_f16_scoring_splits_wide_scales(target):
    """The f16 scorer's scale split: group scales 2^-12 .. 2^12 apart inside a token, token scales
    from 2^-60 to 2^60 (far outside f16), a NaN scale (E8M0 0xFF) on one key: scores within a few
    ulps of the fp64 oracle's magnitude, NaN exactly where the oracle's are."""
    from k31dsl.ops.quant import mxfp8_quantize
    g, seed = _gen()
    lens, n, h = (130, 45), 2, 16
    cache, table, _, _, w, ks, ke = C.paged_setup(lens, n, h, g)
    spread = torch.exp2(torch.randint(-6, 7, (1, 4, 1), generator=g).float())
    for rows, bound in ((None, 60), ("q", 40)):
        m = sum(lens) if rows is None else len(lens) * n * h
        v = torch.randn(m, 4, 32, generator=g) * spread * torch.exp2(
            torch.randint(-bound, bound + 1, (m, 1, 1), generator=g).float())
        codes, scales = mxfp8_quantize(v.reshape(m, 128), target="numpy")
        if rows is None:
            slots = [int(table[i, j // 64]) * 64 + j % 64 for i, ln in enumerate(lens) for j in range(ln)]
            scales.view(torch.uint8)[7, 2] = 0xFF                  # a NaN scale on one key
            I.indexer_cache_write(cache, codes, scales, torch.tensor(slots, dtype=torch.int32), target="numpy")
        else:
            qc, qs = codes.reshape(-1, h, 128), scales.reshape(-1, h, 4)
    got = I.lightning_indexer(qc, qs, cache, table, w, ks, ke, mma="bf16", config={"PB": 1, "NQ": 2, "F16": True},
                              target=target).numpy().astype(np.float64)
    args = (bytes_of(qc), bytes_of(qs), w.double().numpy(), cache.numpy(), table.numpy(), ks.numpy(), ke.numpy(),
            got.shape[1])
    want, mag = ref.indexer_scores(*args), ref.indexer_scores_magnitude(*args)
    assert np.isnan(want).any() and (np.isnan(got) == np.isnan(want)).all(), seed
    assert (np.isneginf(got) == np.isneginf(want)).all(), seed
    fin = np.isfinite(want)
    assert (np.abs(got[fin] - want[fin]) <= 1e-5 * mag[fin] + 1e-30).all(), seed


def test_key_splits_fill_whole_waves():
    """The decode split count: whole waves at the pinned config's occupancy (B=64 L=32K on 132 SMs
    at three programs each: 6 splits = 384 programs, not 8 = 512; at four: 8), and the cheapest
    count a brute force finds."""
    assert I.key_splits(64, 512, 396) == 6 and I.key_splits(32, 2048, 396) == 12
    assert I.key_splits(64, 512, 528) == 8 and I.key_splits(32, 2048, 528) == 16
    rng = np.random.default_rng()
    for _ in range(50):
        progs, blocks, slots = int(rng.integers(1, 300)), int(rng.integers(1, 80)), int(rng.integers(8, 400))

        def cost(s):
            per = -(-blocks // s)
            return -(-progs * -(-blocks // per) // slots) * (per + 2)
        got = I.key_splits(progs, blocks, slots)
        cap = min(blocks, 4 * -(-slots // progs))
        assert 1 <= got <= max(1, cap) and cost(got) == min(cost(s) for s in range(1, max(1, cap) + 1))


def test_indexer_config_keys_are_checked():
    g, _ = _gen()
    cache, table, qc, qs, w, ks, ke = C.paged_setup([20], 1, 16, g)
    with pytest.raises(K31Error, match="not indexer constexprs"):
        I.lightning_indexer(qc, qs, cache, table, w, ks, ke, config={"BK": 2}, target="numpy")


def test_mma_auto_is_bf16_only_for_triton_on_cuda():
    """mma="auto" (the ops' default) names bf16 scoring for the Triton target on a CUDA device (the
    faster one on the H200) and fp8 everywhere else; a bad name is a K31Error that lists the three,
    raised before any launch (the scores of the default call equal those of mma="fp8" on the CPU)."""
    import torch
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert I.resolve_mma("op", "auto", "triton", cuda) == "bf16"
    assert [I.resolve_mma("op", "auto", t, d) for t, d in (("triton", cpu), ("numpy", cuda), ("ascendc", cpu))] == \
        ["fp8"] * 3
    assert [I.resolve_mma("op", m, "numpy", cpu) for m in ("fp8", "bf16")] == ["fp8", "bf16"]
    g, _ = _gen()
    cache, table, qc, qs, w, ks, ke = C.paged_setup([37, 5], 1, 16, g)
    with pytest.raises(K31Error, match='"auto", "fp8" or "bf16"'):
        I.lightning_indexer(qc, qs, cache, table, w, ks, ke, mma="fp16", target="numpy")
    assert torch.equal(I.lightning_indexer(qc, qs, cache, table, w, ks, ke, target="numpy"),
                       I.lightning_indexer(qc, qs, cache, table, w, ks, ke, mma="fp8", target="numpy"))


def test_fp_fusion_switch_reaches_the_triton_build(monkeypatch):
    """indexer.FP_FUSION (off: measured -1 % on the H200, NOTES) compiles lightning_indexer with
    multiply-add contraction for Triton only; the scores of a call are those of the plain kernel
    (the interpreter does not contract)."""
    assert I.paged_kernel("triton") is I.lightning_indexer_paged["triton"]
    monkeypatch.setattr(I, "FP_FUSION", True)
    fused = I.paged_kernel("triton")
    assert fused.options.get("fp_fusion") is True and I.paged_kernel("numpy") is I.lightning_indexer_paged["numpy"]
    assert "enable_fp_fusion=True" in I.lightning_indexer_paged.compile("triton", fp_fusion=True, mode="gpu").source()
    g, _ = _gen()
    cache, table, qc, qs, w, ks, ke = C.paged_setup([37, 5], 1, 16, g)
    got = I.lightning_indexer(qc, qs, cache, table, w, ks, ke, mma="bf16", target="triton")
    monkeypatch.setattr(I, "FP_FUSION", False)
    assert torch.equal(got, I.lightning_indexer(qc, qs, cache, table, w, ks, ke, mma="bf16", target="triton"))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_decode_with_drafts_then_topk(n):
    """next_n = 1..4 query tokens per sequence (per-token limits), ragged contexts incl. ones
    shorter than k, shuffled pages; indexer + top-k against the oracle end to end."""
    g, seed = _gen()
    lens = [130, 20, 67][: 3 if n < 3 else 2]
    cache, table, qc, qs, w, ks, ke = C.paged_setup(lens, n, 16, g)
    scores = I.lightning_indexer(qc, qs, cache, table, w, ks, ke, target="numpy")
    want = _scores_check(scores, (bytes_of(qc), bytes_of(qs), w.double().numpy(), cache.numpy(), table.numpy(),
                                  ks.numpy(), ke.numpy(), scores.shape[1]))
    idx = topk(scores, 48, target="numpy").numpy()
    # top-k is exact on the scores it is given; the fp64 scores can differ in the last bits, so
    # against them only the count and, when every key fits, the chosen set are compared
    assert (idx == ref.topk(scores.numpy().astype(np.float64), 48)).all(), seed
    want_idx = ref.topk(want, 48)
    for r in range(idx.shape[0]):
        valid = int(ke[r] - ks[r])
        assert (idx[r] >= 0).sum() == min(48, valid), seed
        if valid <= 48:
            assert set(idx[r][idx[r] >= 0]) == set(want_idx[r][want_idx[r] >= 0]), seed


def test_empty_key_ranges_score_nothing():
    """ks >= ke (a padded token), ke beyond max_len: rows of -inf, top-k all -1."""
    g, seed = _gen()
    cache, table, qc, qs, w, ks, ke = C.paged_setup([90, 30], 2, 16, g)
    ks[0], ke[0] = 50, 50
    ks[1], ke[1] = 60, 10
    ks[3], ke[3] = 0, 1000                # past the sequence (30 keys) and max_len: clipped to max_len
    got = I.lightning_indexer(qc, qs, cache, table, w, ks, ke, max_len=100, target="numpy")
    assert torch.isneginf(got[:2]).all(), seed
    assert torch.isfinite(got[3, :30]).all() and got.shape == (4, 100)     # slots past 30: stale bytes
    assert (topk(got, 8, target="numpy")[:2] == -1).all()


# ---------------------------------------------------------------- top-k

@pytest.mark.parametrize("target", TARGETS)
def test_topk_ties_go_to_the_lower_position_and_pad(target):
    x = torch.zeros(2, 40)
    x[0, 30:] = float("-inf")                      # 30 valid, k = 33: three -1
    x[1, ::7] = 1.0                                # 1.0 at 0, 7, .., 35 then zeros in order
    got = topk(x, 33, chunks=1, target=target).tolist()
    assert got[0] == list(range(30)) + [-1, -1, -1]
    assert got[1] == [0, 7, 14, 21, 28, 35] + [i for i in range(40) if i % 7][:27]


def test_topk_large_row_two_stages_numpy():
    g, seed = _gen()
    x = torch.randint(-50, 50, (3, 5000), generator=g).float()
    x[2, 100:] = float("-inf")
    for kk, ch in ((2048, None), (300, 1), (1000, 2)):
        got = topk(x, kk, chunks=ch, target="numpy").numpy()
        assert (got == ref.topk(x.double().numpy(), kk)).all(), (kk, ch, seed)


@pytest.mark.parametrize("target", TARGETS)
def test_topk_streamed_segments(target):
    """k > 2048: KP 4096 makes stage-1 segments of 16384 scores, more than a tile holds (BL 8192),
    so the search streams its second tile each step (ONE_TILE off) while the final level fits one
    tile; ties and a short row included."""
    g, seed = _gen()
    x = torch.randint(-3000, 3000, (2, 20000), generator=g).float()
    x[1, 9000:] = float("-inf")
    got = topk(x, 3000, sorted=False, target=target).numpy()
    want = ref.topk(x.double().numpy(), 3000)
    assert (np.sort(got, axis=1) == np.sort(want, axis=1)).all(), seed


@pytest.mark.parametrize("target", TARGETS)
def test_topk_tie_cut_inside_a_later_selection_tile(target):
    """The selection's one scan counts the keys above the threshold and the equal ones together:
    here the equal keys (the threshold value on every odd lane of row 0) run out partway through
    the second 2048-lane tile of a segment, so some tiles take all, one some and the later ones
    none of their equal keys; row 1 is one long tie ending in -inf. Two stage-1 segments and the
    final level, both with ties."""
    g, seed = _gen()
    n = 9000
    x = torch.zeros(2, n)
    x[0, 1::2] = 1.0
    top = torch.randperm(n, generator=g)[:100]
    x[0, top] = 5.0 + torch.rand(100, generator=g)
    x[1] = 2.0
    x[1, n - int(torch.randint(1, 3000, (1,), generator=g)):] = float("-inf")
    got = topk(x, 2048, sorted=False, target=target).numpy()
    want = ref.topk(x.double().numpy(), 2048)
    assert (got == np.sort(want, axis=1)).all(), seed


@pytest.mark.parametrize("target", TARGETS[:2])
def test_topk_multi_level_sorted_and_set(target):
    """Segments of one KP (chunks=1) force a 4:1 level (13 -> 4 lists) between stage 1 and the final
    selection; sorted=False gives the same set in position order."""
    g, seed = _gen()
    x = torch.randint(-8, 8, (2, 200), generator=g).float()
    x[1, 40:] = float("-inf")
    x[1, 3] = float("nan")
    want = ref.topk(x.double().numpy(), 10)
    got = topk(x, 10, chunks=1, target=target).numpy()
    assert (got == want).all(), seed
    got_set = topk(x, 10, chunks=1, sorted=False, target=target).numpy()
    assert (got_set == np.sort(want, axis=1)).all(), seed


def test_topk_api():
    assert topk(torch.randn(3, 0), 5, target="numpy").tolist() == [[-1] * 5] * 3
    assert topk(torch.randn(0, 10), 5, target="numpy").shape == (0, 5)
    assert topk(torch.randn(2, 10), 1, target="numpy").dtype == torch.int32


# ---------------------------------------------------------------- prolog

def test_hadamard_is_orthonormal_and_keeps_dot_products():
    h = P.hadamard_matrix().double()                   # fp32 entries +-fp32(128^-1/2)
    assert torch.allclose(h @ h.T, torch.eye(128, dtype=torch.float64), atol=1e-6)
    assert torch.equal(h, h.T) and set(h.abs().unique().tolist()) == {float(np.float32(128 ** -0.5))}
    np.testing.assert_allclose(ref.hadamard(), h.numpy(), rtol=2e-8)
    q, kk = torch.randn(128, dtype=torch.float64), torch.randn(128, dtype=torch.float64)
    assert abs(float((q @ h) @ (kk @ h)) - float(q @ kk)) < 1e-5 * float(q.abs() @ kk.abs())


@pytest.mark.parametrize("target", TARGETS)
def test_prolog_three_streams_equal_in_order(target):
    """The streams pass gives the three chains three streams; the results equal in-order runs."""
    from k31dsl.lowering.graph.pipeline import run_graph_pipeline
    from k31dsl.dsl import dtypes as D
    g, seed = _gen()
    args = C.prolog_inputs(13, 64, 48, 16, g)
    cache2 = args[9].clone()
    a = P.indexer_prolog(*args, target=target)
    b = P.indexer_prolog(*args[:9], cache2, args[10], streams=False, target=target)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                           y.view(torch.uint8) if y.element_size() == 1 else y), seed
    assert torch.equal(args[9], cache2)
    prog = run_graph_pipeline(P.prolog_program(13, 64, 48, 16, args[9].numel(), D.bf16, D.bf16), target)
    streams = {prog.node(n).attrs.get("stream") for n in prog.calls()}
    assert len(streams) == 3


def test_prolog_padding_slots_write_nothing():
    g, _ = _gen()
    args = list(C.prolog_inputs(6, 64, 32, 16, g))
    args[10] = torch.full((6,), -1, dtype=torch.int32)
    P.indexer_prolog(*args, target="numpy")
    assert int(args[9].sum()) == 0


# ---------------------------------------------------------------- errors

def _li_args():
    g = torch.Generator().manual_seed(0)
    return list(C.paged_setup([40, 20], 1, 16, g))


@pytest.mark.parametrize("mutate, needle", [
    (lambda a: a.__setitem__(0, torch.zeros(2, 16, 128)), "`q_codes`"),
    (lambda a: a.__setitem__(1, torch.zeros(2, 16, 3, dtype=torch.float8_e8m0fnu)), "`q_scales`"),
    (lambda a: a.__setitem__(0, torch.zeros(2, 16, 130, dtype=torch.float8_e4m3fn)), "[T, H, 128]"),
    (lambda a: a.__setitem__(1, a[1].to(torch.float32).view(-1)), "`q_scales`"),
    (lambda a: a.__setitem__(1, torch.zeros(2, 16, 4, dtype=torch.float8_e8m0fnu)[:, :, :3]), "`q_scales`"),
    (lambda a: a.__setitem__(0, torch.zeros(3, 16, 128, dtype=torch.float8_e4m3fn)), "`q_scales`"),
    (lambda a: a.__setitem__(2, torch.zeros(3, 2, dtype=torch.int32)), "split evenly"),
    (lambda a: a.__setitem__(2, a[2].long()), "`block_table`"),
    (lambda a: a.__setitem__(4, a[4].double()), "`weights`"),
    (lambda a: a.__setitem__(5, a[5][:1]), "`ks`"),
    (lambda a: a.__setitem__(6, a[6].float()), "`ke`"),
])
def test_lightning_indexer_bad_inputs(mutate, needle):
    cache, table, qc, qs, w, ks, ke = _li_args()
    a = [qc, qs, table, cache, w, ks, ke]
    mutate(a)
    qc, qs, table, cache, w, ks, ke = a
    with pytest.raises(K31Error) as e:
        I.lightning_indexer(qc, qs, cache, table, w, ks, ke, target="numpy")
    assert needle.strip("`") in str(e.value)


@pytest.mark.parametrize("call, needle", [
    (lambda: I.new_indexer_cache(0), "num_pages"),
    (lambda: I.indexer_cache_views(torch.zeros(2, 8192, dtype=torch.uint8)), "8448"),
    (lambda: I.indexer_cache_write(torch.zeros(2, 8448, dtype=torch.uint8),
                                   torch.zeros(3, 128, dtype=torch.float8_e4m3fn),
                                   torch.zeros(3, 4, dtype=torch.float8_e8m0fnu),
                                   torch.tensor([0, 1, 128], dtype=torch.int32)), "past the cache"),
    (lambda: I.indexer_cache_write(torch.zeros(2, 8448, dtype=torch.uint8),
                                   torch.zeros(3, 128, dtype=torch.float8_e4m3fn),
                                   torch.zeros(3, 2, dtype=torch.float8_e8m0fnu),
                                   torch.tensor([0, 1, 2], dtype=torch.int32)), "k_scales"),
    (lambda: topk(torch.randn(4), 3), "2-D"),
    (lambda: topk(torch.randn(2, 4), 0), "k=0"),
    (lambda: topk(torch.randn(2, 4), 5000), "k=5000"),
    (lambda: topk(torch.randn(2, 4).double(), 2), "dtype float64"),
    (lambda: topk(torch.randn(2, 4), 2, ends=torch.tensor([1, 2, 3], dtype=torch.int32)), "`ends` must be int32 [2]"),
    (lambda: topk(torch.randn(2, 4), 2, ends=torch.tensor([1, 2])), "ends"),
])
def test_cache_and_topk_bad_inputs(call, needle):
    with pytest.raises(K31Error) as e:
        call()
    assert needle in str(e.value)


def test_prolog_bad_inputs():
    g = torch.Generator().manual_seed(0)
    args = list(C.prolog_inputs(4, 64, 32, 16, g))
    bad = list(args)
    bad[2] = args[2][:100]
    with pytest.raises(K31Error, match="wq_b"):
        P.indexer_prolog(*bad, target="numpy")
    bad = list(args)
    bad[7] = args[7][:, :16]
    with pytest.raises(K31Error, match="cos"):
        P.indexer_prolog(*bad, target="numpy")
    bad = list(args)
    bad[6] = args[6][:12]
    with pytest.raises(K31Error, match="power of two"):
        P.indexer_prolog(*bad, target="numpy")
    bad = list(args)
    bad[0] = args[0][None]                              # a batch dimension the op does not take
    with pytest.raises(K31Error, match="`x` must be a matrix"):
        P.indexer_prolog(*bad, target="numpy")
    bad = list(args)
    bad[9] = args[9].to("meta")                         # "meta" stands in for another device
    with pytest.raises(K31Error, match="different devices"):
        P.indexer_prolog(*bad, target="numpy")
    on_meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(K31Error, match="Triton target here runs on cpu tensors"):   # the interpreter
        P.indexer_prolog(*on_meta, target="triton")
    bad = list(args)
    bad[9] = args[9][:0]                                # the slots point past a cache of no pages
    with pytest.raises(K31Error, match="past the cache"):
        P.indexer_prolog(*bad, target="numpy")


# ---------------------------------------------------------------- sm_90

# 64 heads x 128 everywhere; token tiles at the decode choice (BM=16) for the projection chains
# (their fp32 Hadamard dots are slow to compile: ~15 s each at BM=64 on one core)
LI_DECODE = Specialised(I.lightning_indexer_paged, H=64, NQ=1, PB=2)
LI_PREFILL = Specialised(I.lightning_indexer_paged, H=64, NQ=2, PB=2)
LI_BF16 = Specialised(I.lightning_indexer_paged, H=64, NQ=2, PB=2, MMA_BF16=True)
LI_KEYS_MAJOR = Specialised(I.lightning_indexer_paged, H=64, NQ=1, PB=1, MMA_BF16=True, KEYS_MAJOR=True)
LI_F16 = Specialised(I.lightning_indexer_paged, H=64, NQ=1, PB=1, MMA_BF16=True, F16=True)
TOPK_MERGE = Specialised(topk_segments, KP=2048, HAS_IDX=True, FINAL=True, BL=8192, ONE_TILE=True)
TOPK_STAGE1 = Specialised(topk_segments, KP=2048, BL=8192, ONE_TILE=True)
TOPK_STREAM = Specialised(topk_segments, KP=2048, FINAL=True, HAS_END=True, BL=4096)     # the model's graph call
TOPK_ORDER = Specialised(topk_order)
TOPK_RANK_KEYS = Specialised(topk_rank_keys)
Q_CHAIN = Specialised(P.indexer_q_chain, BM=16)
K_CHAIN = Specialised(P.indexer_k_chain, BM=16)
W_CHAIN = Specialised(P.indexer_head_weights, H=64, BM=64)
CACHE_WRITE = Specialised(I.indexer_cache_write_rows)


def test_kernels_compile_for_hopper(tmp_path):
    assert_compiles_for_hopper(__file__, ["LI_DECODE", "LI_PREFILL", "LI_BF16", "LI_KEYS_MAJOR", "LI_F16", "CACHE_WRITE",
                                          "Q_CHAIN", "K_CHAIN", "W_CHAIN", "TOPK_MERGE", "TOPK_STAGE1", "TOPK_STREAM",
                                          "TOPK_ORDER", "TOPK_RANK_KEYS"],
                               tmp_path, index_types=("int32",))


def test_decode_register_cap_reaches_the_cubin(tmp_path):
    """DECODE_BF16's maxnreg (a launch key like num_warps) is a launch option of the gpu-mode
    module, and the sm_90 cubin Triton builds with it stays within 128 registers (157 without)."""
    from k31dsl.targets.triton.emit import LAUNCH_KEYS, TritonEmitter
    cx = {k_: v for k_, v in I.DECODE_BF16.items() if k_ not in LAUNCH_KEYS}
    launch = {k_: v for k_, v in I.DECODE_BF16.items() if k_ in LAUNCH_KEYS}
    assert launch["maxnreg"] == 128
    kern = I.lightning_indexer_paged.ir(H=64, MMA_BF16=True, **cx)
    assert TritonEmitter(kern, launch).launch_options()["maxnreg"] == 128
    script = (
        "import pathlib\n"
        "from k31dsl.ops.dsa import indexer as I\n"
        "from k31dsl.targets.triton.aot import compile_for_gpu\n"
        "from k31dsl.targets.triton.resources import register_usage\n"
        f"kern = I.lightning_indexer_paged.ir(H=64, MMA_BF16=True, **{cx!r})\n"
        f"c = compile_for_gpu(kern, pathlib.Path({str(tmp_path)!r}), arch=90, **{launch!r})\n"
        f"f = pathlib.Path({str(tmp_path)!r}) / 'k.cubin'; f.write_bytes(c.asm['cubin'])\n"
        "print(register_usage(f))\n")
    out = run_compiler_script(script)
    regs = [int(w.split(":")[1]) for w in out.split() if w.startswith("REG:")]
    assert regs and max(regs) <= 128, out

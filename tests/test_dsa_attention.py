"""The paged MLA latent cache (write, byte layout, round trip), sparse MLA attention and the
logical -> physical slot map against the fp64 oracles of tests/oracles/dsa_attention.py, on the
numpy and triton targets (Triton interpreter on a CPU), plus input errors and the sm_90 compile."""

import numpy as np
import pytest
import torch

from hopper import assert_compiles_for_hopper
from k31dsl import K31Error
from k31dsl.ops.dsa import attention as A
from k31dsl.ops.dsa import slots as S
from k31dsl.ops.testing import load_oracle, to_f64

TARGETS = ["numpy", "triton"]
ref = load_oracle("dsa_attention")
fp = load_oracle("fp")


def _gen():
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print("seed", seed)
    return torch.Generator().manual_seed(seed)


def _filled_cache(g, pages, dtype=torch.float32, pow2=False, spread=True):
    n = pages * A.PAGE
    kv = A.random_latent(n, g, dtype) if spread else torch.randn(n, A.LATENT, generator=g).to(dtype)
    cache = A.new_mla_cache(pages)
    A.mla_cache_write(cache, kv, torch.randn(n, A.ROPE, generator=g).to(dtype),
                      torch.randperm(n, generator=g).int(), pow2_scale=pow2, target="numpy")
    return cache


# ---------------------------------------------------------------- cache write

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n, pages, dtype, pow2", [(70, 3, torch.bfloat16, False), (9, 1, torch.float32, True),
                                                    (130, 4, torch.float16, False)])
def test_cache_write_bytes_match_oracle(target, n, pages, dtype, pow2):
    g = _gen()
    kv, kr = A.random_latent(n, g, dtype), (torch.randn(n, A.ROPE, generator=g) * 5).to(dtype)
    kv[1, 300] = float("nan")                                 # a NaN tile: scale NaN, codes 0x7F
    slots = torch.randperm(pages * A.PAGE, generator=g)[:n].long()      # int64 accepted
    slots[::7] = -1                                           # padding tokens write nothing
    before = torch.randint(0, 256, (pages, A.PAGE, A.RECORD), generator=g, dtype=torch.uint8)
    cache = before.clone()
    assert A.mla_cache_write(cache, kv, kr, slots, pow2_scale=pow2, target=target) is cache
    want = ref.mla_cache_write(before.numpy(), to_f64(kv), to_f64(kr), slots.numpy(), pow2)
    np.testing.assert_array_equal(cache.numpy(), want)
    rec = cache.view(-1, A.RECORD)[int(slots[1])]
    assert (rec[256:384] == 0x7F).all() and torch.isnan(rec[512:528].view(torch.float32)[2])


def test_cache_round_trip_error_bound():
    """Written then decoded: latent within E4M3's rounding bound of its tile scale, rope = bf16(rope)."""
    g = _gen()
    n = 150
    kv, kr = A.random_latent(n, g, torch.float32), torch.randn(n, A.ROPE, generator=g)
    cache = A.new_mla_cache(3)
    slots = torch.randperm(3 * A.PAGE, generator=g)[:n].int()
    A.mla_cache_write(cache, kv, kr, slots, target="numpy")
    lat, rope = ref.mla_cache_decode(cache.numpy())
    lat, rope = lat[slots.numpy()], rope[slots.numpy()]
    x = to_f64(kv)
    scale = np.repeat(np.maximum(np.abs(x).reshape(n, 4, 128).max(-1), 1e-4) / 448, 128, axis=1)
    bound = np.maximum(2.0 ** -4 * np.abs(x), 2.0 ** -10 * scale) * (1 + 1e-6)
    assert (np.abs(lat - x) <= bound).all()
    np.testing.assert_array_equal(rope, fp.round_to(to_f64(kr), fp.BF16))


# ---------------------------------------------------------------- sparse attention

def _check_sfa(o, lse, q, cache, idx, scale, tol_o=2e-2):
    lat, rope = ref.mla_cache_decode(cache.numpy())
    want_o, want_l = ref.sparse_mla_attention(fp.round_to(to_f64(q), fp.BF16), lat, rope, idx.numpy(), scale)
    e_o, e_l = A.sfa_errors(o, lse, want_o, want_l)
    assert e_o <= tol_o and e_l <= 1e-3, (e_o, e_l)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("T, H, K, pages, qdt, scale, bk", [
    (4, 5, 40, 3, torch.bfloat16, 0.135234, None),      # heads padded to a 16-row block
    (3, 20, 70, 2, torch.float32, 0.05, 16),            # f32 q, several index blocks
    (2, 16, 33, 1, torch.bfloat16, 1.0, 16),            # large scores: softmax stability
])
def test_sfa_matches_oracle(target, T, H, K, pages, qdt, scale, bk):
    g = _gen()
    cache = _filled_cache(g, pages)
    n = pages * A.PAGE
    q = torch.randn(T, H, A.LATENT + A.ROPE, generator=g).to(qdt)
    idx = torch.randint(-2, n + 3, (T, K), generator=g, dtype=torch.int32)   # -1, -2 and past the end
    idx[0, 1::3] = idx[0, 0]                                     # duplicates count twice
    idx[1, :K // 2] = -1                                         # whole leading blocks invalid
    idx[-1] = -1                                                 # a lonely query
    idx[-1, -1] = n                                              # ... whose only entry is past the cache
    cfg = {} if bk is None else {"BK": bk}
    o, lse = A.sparse_mla_attention(q, cache, idx, scale, target=target, **cfg)
    _check_sfa(o, lse, q, cache, idx, scale)
    assert (o[-1] == 0).all() and torch.isinf(lse[-1]).all() and (lse[-1] > 0).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("T, H, K, pages, qdt, split, bks", [
    (4, 5, 40, 3, torch.bfloat16, None, (None, None)),  # heads padded to a 16-row block, one segment
    (3, 20, 70, 2, torch.float32, 3, (16, 32)),         # f32 q; pass 2 reads blocks pass 1 wrote in halves
    (2, 70, 150, 3, torch.bfloat16, 5, (32, 16)),       # two head blocks; empty segments
])
def test_sfa_two_pass_matches_oracle(target, T, H, K, pages, qdt, split, bks):
    """The two-pass form (scores + statistics, then the value product per 128-column tile) on the
    one-pass test's inputs: ragged heads and index counts, several segments (some empty, some of
    only -1), each pass with its own block size, lonely queries, both score-pass forms."""
    from k31dsl.ops.dsa import sfa_two_pass as TP
    g = _gen()
    cache = _filled_cache(g, pages)
    n = pages * A.PAGE
    q = torch.randn(T, H, A.LATENT + A.ROPE, generator=g).to(qdt)
    idx = torch.randint(-2, n + 3, (T, K), generator=g, dtype=torch.int32)
    idx[0, K // 3:] = -1                                         # a compacted list: -1 padding at the end
    idx[1, :K // 2] = -1                                         # leading segments without a valid index
    idx[-1] = -1                                                 # a lonely query
    if bks == (None, None):
        o, lse = A.sparse_mla_attention(q, cache, idx, 0.1, form="two_pass", split=split, target=target)
    else:                                                        # the passes by hand, each with its BK
        o = torch.full((T, H, A.LATENT), float("nan"), dtype=torch.bfloat16)
        lse = torch.full((T, H), float("nan"))
        bh = 1 << (H - 1).bit_length() if H <= 64 else 64
        cfg1 = {"BH": min(bh, 64), "BK": bks[0]}
        views = A.cache_views(cache)
        s = torch.full((T, H, K), float("nan"))                  # unwritten columns must never be read
        part_m, part_l = torch.empty(split, T, H), torch.empty(split, T, H)
        TP.sfa_scores[target](q, *views, idx, s, part_m, part_l, 0.1, **cfg1)
        TP.sfa_values[target](views[0], views[1], idx, s, part_m, part_l, o, lse, NSB=8, BH=cfg1["BH"], BK=bks[1])
    _check_sfa(o, lse, q, cache, idx, 0.1)
    assert (o[-1] == 0).all() and torch.isinf(lse[-1]).all() and (lse[-1] > 0).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("T, H, K, pages, qdt, split, cfg", [
    (4, 5, 40, 3, torch.bfloat16, None, {}),                   # heads padded to a 16-column block
    (3, 20, 70, 2, torch.float32, None, {"BK": 16}),           # f32 q, BH 32, several index blocks
    (3, 9, 100, 2, torch.bfloat16, 3, {"BK": 16}),             # split: partials + the combine
])
def test_sfa_keys_major_matches_oracle(target, T, H, K, pages, qdt, split, cfg):
    """The keys-major form (gathered keys on the MMA rows, transposed accumulators) on ragged
    heads and index counts, invalid and duplicate indices, a compacted list, a query whose first
    segment holds no valid index, and a lonely query."""
    g = _gen()
    cache = _filled_cache(g, pages)
    n = pages * A.PAGE
    q = torch.randn(T, H, A.LATENT + A.ROPE, generator=g).to(qdt)
    idx = torch.randint(-2, n + 3, (T, K), generator=g, dtype=torch.int32)
    idx[0, 1::3] = idx[0, 0]                                     # duplicates count twice
    idx[1, K // 3:] = -1                                         # a compacted list
    idx[0, :K // 2] = -1                                         # leading blocks (segments) invalid
    idx[-1] = -1                                                 # a lonely query
    o, lse = A.sparse_mla_attention(q, cache, idx, 0.1, form="keys_major", split=split, target=target, **cfg)
    _check_sfa(o, lse, q, cache, idx, 0.1)
    assert (o[-1] == 0).all() and torch.isinf(lse[-1]).all() and (lse[-1] > 0).all()


def test_sfa_form_choice():
    """GPU: two passes for >= 64 heads at decode sizes, keys-major for <= 16 heads when no split is
    needed (prefill sizes), one pass otherwise; every other target: one pass."""
    assert A.sfa_form(64, 128, 2048, True) == "two_pass"
    assert A.sfa_form(4096, 16, 2048, True) == "keys_major"
    assert A.sfa_form(64, 16, 2048, True) == "one_pass"          # 64 programs: split 8, heads-major
    assert A.sfa_form(4096, 32, 2048, True) == "one_pass"
    assert A.sfa_form(4096, 16, 2048, False) == "one_pass"
    assert A.sfa_form(65535, 64, 16, True) == "two_pass"          # pass 2's grid: queries on CUDA's z axis
    assert A.sfa_form(65536, 64, 16, True) == "one_pass"


@pytest.mark.parametrize("target", TARGETS)
def test_sfa_two_pass_config_keys_reach_their_pass(target):
    """Config keys of the public call go to the passes that take them (BK and num_warps to both);
    results as the default."""
    g = _gen()
    cache = _filled_cache(g, 2)
    q = torch.randn(3, 24, A.LATENT + A.ROPE, generator=g).bfloat16()
    idx = torch.randint(-1, 2 * A.PAGE, (3, 50), generator=g, dtype=torch.int32)
    o, lse = A.sparse_mla_attention(q, cache, idx, 0.1, form="two_pass", split=2, target=target, BK=16, num_warps=4)
    _check_sfa(o, lse, q, cache, idx, 0.1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("split", [1, 3])
def test_sfa_prefetch_changes_nothing(target, split):
    """PREFETCH gathers block j + 1 before folding block j (the step graph's GPU form): the same
    blocks are folded in the same order, so the results equal the plain loop's bit for bit, in the
    unsplit kernel and in split segments (whose prefetch past their end reads the next segment's
    first block and drops it)."""
    g = _gen()
    cache = _filled_cache(g, 3)
    n = 3 * A.PAGE
    q = torch.randn(3, 16, A.LATENT + A.ROPE, generator=g).bfloat16()
    idx = torch.randint(-2, n + 3, (3, 150), generator=g, dtype=torch.int32)
    idx[1, 70:] = -1                                             # a compacted list: -1 padding
    runs = [A.sparse_mla_attention(q, cache, idx, 0.1, split=split, target=target, BK=16, PREFETCH=pf)
            for pf in (False, True)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    _check_sfa(*runs[1], q, cache, idx, 0.1)


@pytest.mark.parametrize("target", TARGETS)
def test_sfa_combine_under_each_config(target):
    """sparse_mla_attention_combine with each GPU config's tiles (column blocks of 32 to 128,
    segment blocks of 2 to 8) against the merge in fp64: o = sum_s exp(lse_s - lse) o_s, lse =
    logsumexp_s lse_s; segments without a valid index (lse -inf) weigh nothing, a head with none
    at all gets o = 0 and lse = +inf. 3 segments, ragged heads (20 at BH 16)."""
    g = _gen()
    ns, t, h, dv = 3, 2, 20, A.LATENT
    po = torch.randn(ns, t, h, dv, generator=g)
    pl = torch.randn(ns, t, h, generator=g) * 3
    pl[1, 0, :5] = float("-inf")                                   # a segment without a valid index
    pl[:, 1, 7] = float("-inf")                                    # a head without any
    want_l = torch.logsumexp(pl.double(), 0)
    want_o = (torch.exp(pl.double() - want_l)[..., None] * po.double()).sum(0)
    want_o[1, 7] = 0.0
    for cfg in A.COMBINE_CONFIGS:
        tiles = {key: val for key, val in cfg.items() if key != "num_warps"}
        o = torch.full((t, h, dv), float("nan"), dtype=torch.bfloat16)
        lse = torch.full((t, h), float("nan"))
        A.sparse_mla_attention_combine[target](po, pl, o, lse, BH=16, **tiles)
        assert float((o.double() - want_o).abs().max()) <= 1e-2 * float(want_o.abs().max()), tiles
        fin = torch.isfinite(want_l)
        assert torch.allclose(lse.double()[fin], want_l[fin], atol=1e-5) and torch.isinf(lse[1, 7]) and lse[1, 7] > 0
    assert A.combine_tiles(1, 16, 16) == {"BD": 32, "SB": 8} and A.combine_tiles(64, 16, 16)["BD"] == 128


def test_sfa_all_128_heads_fit_ascendc_ub():
    """The real head count on the emulated Ascend core: heads go in blocks of 32 there (BH = 64
    needs ~340 KB of the 192 KB UB), and the result still matches the fp64 oracle."""
    g = _gen()
    cache = _filled_cache(g, 1)
    q = torch.randn(2, 128, A.LATENT + A.ROPE, generator=g).to(torch.bfloat16)
    idx = torch.randint(-1, A.PAGE, (2, 8), generator=g, dtype=torch.int32)
    o, lse = A.sparse_mla_attention(q, cache, idx, 0.07, target="ascendc")
    _check_sfa(o, lse, q, cache, idx, 0.07)


@pytest.mark.parametrize("target", TARGETS)
def test_sfa_single_key_reads_the_record_back(target):
    """One valid index per query: softmax weight 1, so o is the dequantized latent of that slot
    (exact with power-of-two scales) and lse the score itself."""
    g = _gen()
    cache = _filled_cache(g, 2, pow2=True)
    T, H = 5, 3
    q = torch.randn(T, H, A.LATENT + A.ROPE, generator=g).bfloat16()
    idx = torch.full((T, 8), -1, dtype=torch.int32)
    pick = torch.randint(0, 2 * A.PAGE, (T,), generator=g)
    idx[torch.arange(T), torch.randint(0, 8, (T,), generator=g)] = pick.int()
    o, lse = A.sparse_mla_attention(q, cache, idx, 0.25, target=target)
    lat, rope = ref.mla_cache_decode(cache.numpy())
    want = fp.round_to(lat[pick.numpy()], fp.BF16)
    np.testing.assert_array_equal(to_f64(o), np.broadcast_to(want[:, None, :], o.shape))
    keys = np.concatenate([lat, rope], 1)[pick.numpy()]
    score = 0.25 * np.einsum("thd,td->th", to_f64(q), keys)
    np.testing.assert_allclose(to_f64(lse), score, rtol=1e-5, atol=1e-4)


def test_sfa_no_indices_and_empty_shapes():
    cache = A.new_mla_cache(1)
    q = torch.randn(3, 2, 576).bfloat16()
    o, lse = A.sparse_mla_attention(q, cache, torch.empty(3, 0, dtype=torch.int32), 0.1, target="numpy")
    assert (o == 0).all() and torch.isinf(lse).all()
    o, lse = A.sparse_mla_attention(q[:0], cache, torch.empty(0, 4, dtype=torch.int32), 0.1, target="numpy")
    assert o.shape == (0, 2, 512) and lse.shape == (0, 2)


# ---------------------------------------------------------------- logical -> physical slots

@pytest.mark.parametrize("target", TARGETS)
def test_slots_of_positions(target):
    g = _gen()
    B, n, mp, K = 3, 2, 5, 40
    bt = torch.randperm(20, generator=g)[:B * mp].int().view(B, mp)          # unordered, non-contiguous
    pos = torch.randint(-1, mp * A.PAGE, (B * n, K), generator=g, dtype=torch.int32)
    got = S.slots_of_positions(pos, bt, n, target=target)
    want = ref.slots_of_positions(pos.numpy(), bt.numpy(), np.arange(B * n) // n)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("target", TARGETS + ["ascendc"])
def test_slots_of_range_is_the_topk_of_short_ranges(target):
    """slots_of_range (the step's path when no query has more than k keys in range): the fp64
    oracle's top-k of any scores finite on [ks, ke) cut to [0, width), as a set in position order,
    and its slots. Ranges starting before 0, empty (ks >= ke) and cut by width; non-contiguous
    unordered block tables, next_n = 2."""
    iref = load_oracle("dsa_indexer")
    g = _gen()
    B, n, mp, K, width = 3, 2, 4, 40, 150
    bt = torch.randperm(20, generator=g)[:B * mp].int().view(B, mp)
    ke = torch.randint(0, width + 30, (B * n,), generator=g, dtype=torch.int32)
    ks = torch.clamp(ke - torch.randint(0, K + 1, (B * n,), generator=g, dtype=torch.int32), max=width)
    ks[0], ks[1], ke[2] = -7, ke[1], 0
    ke = torch.clamp(ke, max=ks.clamp(min=0) + K)                 # at most K keys in every range
    pos, slots = S.slots_of_range(ks, ke, bt, n, K, width, target=target)
    scores = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=g))).normal(size=(B * n, width))
    cols = np.arange(width)
    scores[(cols < ks.numpy()[:, None]) | (cols >= ke.numpy()[:, None])] = -np.inf
    want = np.sort(np.where((sel := iref.topk(scores, K)) < 0, np.iinfo(np.int64).max, sel), axis=1)
    want[want == np.iinfo(np.int64).max] = -1
    np.testing.assert_array_equal(pos.numpy(), want)
    np.testing.assert_array_equal(slots.numpy(), ref.slots_of_positions(want, bt.numpy(), np.arange(B * n) // n))
    assert (pos[1] == -1).all() and (pos[2] == -1).all()


# ---------------------------------------------------------------- errors and compile

@pytest.mark.parametrize("call, needle", [
    (lambda: A.mla_cache_write(torch.zeros(2, 64, 600, dtype=torch.uint8), torch.randn(1, 512), torch.randn(1, 64),
                               torch.zeros(1, dtype=torch.int32)), "[num_pages, 64, 656]"),
    (lambda: A.mla_cache_write(A.new_mla_cache(1), torch.randn(2, 500), torch.randn(2, 64),
                               torch.zeros(2, dtype=torch.int32)), "kv_latent"),
    (lambda: A.mla_cache_write(A.new_mla_cache(1), torch.randn(2, 512), torch.randn(3, 64),
                               torch.zeros(2, dtype=torch.int32)), "k_rope"),
    (lambda: A.mla_cache_write(A.new_mla_cache(1), torch.randn(2, 512), torch.randn(2, 64),
                               torch.tensor([0, 64], dtype=torch.int32)), "past the cache"),
    (lambda: A.mla_cache_write(A.new_mla_cache(1), torch.randn(2, 512), torch.randn(2, 64),
                               torch.zeros(2)), "slot_mapping"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 512).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), 0.1), "576"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).half(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), 0.1), "dtype float16"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(3, 8, dtype=torch.int32), 0.1), "one row per query"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), None), "sm_scale"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), float("nan")), "sm_scale"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), 0.1, form="three_pass"), "form"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), 0.1, form="two_pass", split=0), "split"),
    (lambda: A.sparse_mla_attention(torch.randn(2, 4, 576).bfloat16(), A.new_mla_cache(1),
                                    torch.zeros(2, 8, dtype=torch.int32), 0.1, form="two_pass", PREFETCH=True),
     "two-pass form takes no config key PREFETCH"),
    (lambda: S.slots_of_positions(torch.zeros(5, 4, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32), 2),
     "next_n"),
    (lambda: A.sparse_mla_attention(torch.zeros(1, 1, 576).bfloat16().expand(65536, 1, 576), A.new_mla_cache(1),
                                    torch.zeros(65536, 1, dtype=torch.int32), 0.1, form="two_pass"),
     "at most 65535 queries"),
])
def test_bad_inputs_raise_k31error(call, needle):
    with pytest.raises(K31Error) as e:
        call()
    assert needle in str(e.value)


def test_sm_scale_has_no_default():
    with pytest.raises(TypeError):
        A.sparse_mla_attention(torch.randn(1, 1, 576).bfloat16(), A.new_mla_cache(1), torch.zeros(1, 1, dtype=torch.int32))


def test_compiles_for_hopper(tmp_path):
    """Default constexprs are the real decode sizes: 64-head blocks of 576/512, 32 indices a step."""
    assert_compiles_for_hopper(A.__file__, ["mla_cache_write_rows", "sparse_mla_attention_fwd"], tmp_path)
    assert_compiles_for_hopper(S.__file__, ["slots_of_positions_rows", "slots_of_range_rows"], tmp_path)
    from k31dsl.ops.dsa import sfa_two_pass
    assert_compiles_for_hopper(sfa_two_pass.__file__, ["sfa_scores", "sfa_values"], tmp_path)
    from k31dsl.ops.dsa import sfa_keys_major
    assert_compiles_for_hopper(sfa_keys_major.__file__, ["sfa_keys_major", "sfa_keys_major_split"], tmp_path)

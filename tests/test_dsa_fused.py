"""fused_li_sfa (score + exact top-k + sparse MLA attention in one decode kernel) against the fp64
oracles (indexer scores and top-k of tests/oracles/dsa_indexer.py, attention of
tests/oracles/dsa_attention.py) and against the unfused path (lightning_indexer -> topk ->
sparse_mla_attention): the same keys as a set, outputs within bf16 tolerance. Ragged contexts,
contexts shorter than top-k, next_n = 1..4 query tokens per sequence with per-token limits,
shuffled non-contiguous block tables, key ranges starting past 0, lonely queries."""

import numpy as np
import pytest
import torch

import k31dsl as k

from hopper import Specialised, assert_compiles_for_hopper
from k31dsl import K31Error
from k31dsl.ops.dsa import attention as A
from k31dsl.ops.dsa import fused as F
from k31dsl.ops.dsa.fused import append_keys, reselect
from k31dsl.ops.dsa.fused import random_decode_step as decode_step
from k31dsl.ops.testing import bytes_of, load_oracle, to_f64

TARGETS = ["numpy", "triton"]
ref = load_oracle("dsa_attention")
iref = load_oracle("dsa_indexer")
fp = load_oracle("fp")


def _gen():
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print("seed", seed)
    return torch.Generator().manual_seed(seed)


def oracle_scores(args):
    qc, qs, w, icache, q, mcache, bt, ks, ke = args
    L = bt.shape[1] * A.PAGE
    a = (bytes_of(qc), bytes_of(qs), to_f64(w), icache.numpy(), bt.numpy(), ks.numpy(), ke.numpy(), L)
    return iref.indexer_scores(*a), iref.indexer_scores_magnitude(*a)


def assert_same_keys(got, want, scores, mag, tol=1e-5):
    """Row-wise equal key sets, except swaps between keys whose scores tie with the k-th largest
    within fp32 rounding (tol x the scores' magnitude)."""
    for r in range(got.shape[0]):
        G, W = set(got[r].tolist()) - {-1}, set(want[r].tolist()) - {-1}
        assert len(G) == len(W), (r, sorted(G), sorted(W))
        if G != W:
            kth = min(scores[r, i] for i in W)
            for i in G ^ W:
                assert abs(scores[r, i] - kth) <= tol * (mag[r, i] + 1.0), (r, i, scores[r, i], kth)


def check_step(args, topk, scale, target, impl, **config):
    qc, qs, w, icache, q, mcache, bt, ks, ke = args
    T = q.shape[0]
    n = T // bt.shape[0]
    o, lse, sel = impl(*args, topk, scale, return_indices=True, target=target, **config)
    scores, mag = oracle_scores(args)
    want_sel = iref.topk(scores, topk)
    assert_same_keys(sel.numpy(), want_sel, scores, mag)
    lat, rope = ref.mla_cache_decode(mcache.numpy())
    slots = ref.slots_of_positions(sel.numpy(), bt.numpy(), np.arange(T) // n)
    want_o, want_l = ref.sparse_mla_attention(to_f64(q), lat, rope, slots, scale)
    e_o, e_l = A.sfa_errors(o, lse, want_o, want_l)
    assert e_o <= 2e-2 and e_l <= 1e-3, (e_o, e_l)
    return o, lse, sel


CASES = {  # name: (context lengths, next_n, topk, ks rule, config)
    "ragged_next1": ([150, 10, 290], 1, 16, None, {}),
    "drafts_next4": ([200, 70], 4, 16, None, {}),
    "next2_window_lonely": ([300, 40], 2, 100, lambda ke: torch.clamp(ke - 180, min=0), {}),
    "next3_short": ([5, 130], 3, 16, None, {}),
}
# The Triton interpreter runs k.topk as Python-level reductions (~1 s per merge on a CI core):
# fewer, shorter sequences there; KP=128 makes a chunk two pages (the chunk-assembly loop).
TRITON_CASES = {
    "ragged_next1": ([150, 10], 1, 16, None, {"KP": 128}),
    "next2_window_lonely": ([150, 40], 2, 16, lambda ke: torch.clamp(ke - 100, min=0), {}),
}


@pytest.mark.parametrize("case, target", [(c, "numpy") for c in sorted(CASES)] +
                         [(c, "triton") for c in sorted(TRITON_CASES)])
def test_fused_matches_oracle_and_unfused(case, target):
    g = _gen()
    ctx, n, topk, ks_rule, config = (CASES if target == "numpy" else TRITON_CASES)[case]
    args = decode_step(g, ctx, n, ks_from=ks_rule)
    if case == "next2_window_lonely":
        args[7][1] = args[8][1]                          # empty key range: a lonely query
    o, lse, sel = check_step(args, topk, 0.135234, target, F.fused_li_sfa, **config)
    uo, ul, usel = F.li_sfa_unfused(*args, topk, 0.135234, return_indices=True, target="numpy")
    if target == "numpy":                                # same arithmetic: identical lists and outputs
        assert torch.equal(sel, usel)
    else:
        scores, mag = oracle_scores(args)
        assert_same_keys(sel.numpy(), usel.numpy(), scores, mag)
    e_o, e_l = A.sfa_errors(o, lse, to_f64(uo), to_f64(ul))
    assert e_o <= 2e-2 and e_l <= 1e-3, (e_o, e_l)
    if case == "next2_window_lonely":
        assert (sel[1] == -1).all() and (o[1] == 0).all() and torch.isinf(lse[1]).all()


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_scoring_fused_matches_unfused(target):
    """mma="bf16" (operands dequantized exactly to bf16, one K=128 dot) in both paths: the oracle's
    keys and attention; on numpy the two paths do the same arithmetic, so identical results."""
    g = _gen()
    args = decode_step(g, [150, 40] if target == "numpy" else [100, 20], 2 if target == "numpy" else 1)
    o, lse, sel = check_step(args, 16, 0.1, target, F.fused_li_sfa, mma="bf16")
    uo, ul, usel = F.li_sfa_unfused(*args, 16, 0.1, return_indices=True, mma="bf16", target=target)
    if target == "numpy":
        assert torch.equal(sel, usel) and torch.equal(o, uo) and torch.equal(lse, ul)


@pytest.mark.parametrize("target, splits", [("numpy", 2), ("numpy", 4), ("triton", 2)])
def test_split_l_fused_matches_oracle_and_unfused(target, splits):
    """splits > 1: the key range of each token scored and pre-selected by several programs, the
    lists merged by the attention kernel: the same winners (position order) and outputs."""
    g = _gen()
    ctx, n, topk = ([300, 40, 130], 2, 16) if target == "numpy" else ([150, 10], 1, 16)
    args = decode_step(g, ctx, n, ks_from=lambda ke: torch.clamp(ke - 200, min=0))
    o, lse, sel = check_step(args, topk, 0.1, target, F.fused_li_sfa, splits=splits)
    uo, ul, usel = F.li_sfa_unfused(*args, topk, 0.1, return_indices=True, target=target)
    if target == "numpy":
        assert torch.equal(sel, usel) and torch.equal(o, uo) and torch.equal(lse, ul)


def test_unfused_matches_oracle():
    g = _gen()
    check_step(decode_step(g, [150, 40], 2), 16, 0.1, "numpy", F.li_sfa_unfused)


@pytest.mark.parametrize("target, split", [("numpy", 3), ("triton", 2)])
def test_unfused_with_split_attention_matches_oracle(target, split):
    """li_sfa_unfused(sfa_split=N): the attention in N index-list segments plus the combine (the
    form a GPU takes for steps of few queries) gives the oracle's step too; a bad N is refused."""
    g = _gen()
    args = decode_step(g, [150, 40], 2) if target == "numpy" else decode_step(g, [100, 20], 1)
    check_step(args, 16, 0.1, target, F.li_sfa_unfused, sfa_split=split)
    for bad in (0, 2.0, True):
        with pytest.raises(K31Error, match="sfa_split must be an int"):
            F.li_sfa_unfused(*args, 16, 0.1, sfa_split=bad, target=target)


def test_fused_without_indices_and_dispatch():
    g = _gen()
    args = decode_step(g, [100, 20], 1)
    o, lse, _ = F.fused_li_sfa(*args, 16, 0.1, return_indices=True, target="numpy")
    o2, lse2 = F.fused_li_sfa(*args, 16, 0.1, target="numpy")
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    for impl in ("auto", "fused", "unfused"):
        o3, lse3 = F.li_sfa(*args, 16, 0.1, impl=impl, target="numpy")
        assert torch.equal(o3, o2) and torch.equal(lse3, lse2)


@pytest.mark.parametrize("target", TARGETS)
def test_short_ranges_skip_the_indexer(target, monkeypatch):
    """No query with more than topk keys in range: li_sfa_unfused takes every key without scoring
    (one launch for positions and slots), with the oracle's keys and attention and the scored
    path's lists, o and lse exactly; one longer range brings the indexer back."""
    from k31dsl.ops.dsa import indexer
    g = _gen()
    args = decode_step(g, [12, 30, 3], 2, ks_from=lambda ke: torch.clamp(ke - 16, min=0))
    args[7][0], args[7][1] = -5, args[8][1]              # a range starting before 0; a lonely query
    scored = [F.li_sfa_unfused(*args, 16, 0.1, return_indices=True, always_score=True, max_len=m, target=target)
              for m in (None, 13)]
    calls = []
    real = indexer.lightning_indexer
    monkeypatch.setattr(indexer, "lightning_indexer", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    o, lse, sel = check_step(args, 16, 0.1, target, F.li_sfa_unfused)      # found by the sync max(ke) needs
    cut = F.li_sfa_unfused(*args, 16, 0.1, return_indices=True, max_len=13, target=target)   # by max_len, no sync
    assert not calls
    for got, want in zip(((o, lse, sel), cut), scored):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert (sel[1] == -1).all() and torch.isinf(lse[1]).all() and (cut[2] < 13).all()
    monkeypatch.setenv("K31_SHORT_RANGES", "score")       # the A/B switch: scores anyway
    assert all(torch.equal(a, b) for a, b in zip(F.li_sfa_unfused(*args, 16, 0.1, return_indices=True,
                                                                  target=target), scored[0]))
    assert calls == [1]
    monkeypatch.setenv("K31_SHORT_RANGES", "skip")
    with pytest.raises(K31Error, match="K31_SHORT_RANGES"):
        F.li_sfa_unfused(*args, 16, 0.1, target=target)
    monkeypatch.delenv("K31_SHORT_RANGES")
    calls.clear()
    args[7][2] = 0                                        # 17 keys in range for token 2
    check_step(args, 16, 0.1, target, F.li_sfa_unfused)
    assert calls == [1]
    with pytest.raises(K31Error, match="max_len"):
        F.li_sfa_unfused(*args, 16, 0.1, max_len=args[6].shape[1] * A.PAGE + 1, target=target)


@pytest.mark.parametrize("call, needle", [
    (lambda a: F.fused_li_sfa(*a, 0, 0.1), "topk"),
    (lambda a: F.fused_li_sfa(*a, 16, -1.0), "sm_scale"),
    (lambda a: F.fused_li_sfa(*a[:4], a[4][:, :, :512], *a[5:], 16, 0.1), "mla_q"),
    (lambda a: F.fused_li_sfa(*a[:6], a[6].long(), *a[7:], 16, 0.1), "block_table"),
    (lambda a: F.fused_li_sfa(*a[:6], a[6][:2], *a[7:], 16, 0.1), "do not split evenly"),
    (lambda a: F.fused_li_sfa(a[0][:, :8], a[1][:, :8], a[2][:, :8], *a[3:], 16, 0.1), "indexer heads"),
    (lambda a: F.li_sfa(*a, 16, 0.1, impl="fast"), "impl"),
    (lambda a: F.fused_li_sfa(*a, 16, 0.1, mma="int8"), "mma"),
    (lambda a: F.fused_li_sfa(*a, 16, 0.1, splits=3), "splits"),
    (lambda a: F.li_sfa_unfused(*a[:7], a[7][:-1], a[8], 16, 0.1), "one limit per query token"),
    (lambda a: F.li_sfa_unfused(*a[:8], a[8][:0], 16, 0.1), "one limit per query token"),
    (lambda a: F.fused_li_sfa(*a[:8], a[8][:-1], 16, 0.1), "one limit per query token"),
])
def test_bad_inputs_raise_k31error(call, needle):
    args = decode_step(torch.Generator().manual_seed(0), [70, 30, 5], 1)
    with pytest.raises(K31Error) as e:
        call(args)
    assert needle in str(e.value)


# The real decode sizes (64 indexer heads, top-k 2048: a 4096-lane candidate buffer, KC = 256
# (four pages per chunk: the chunk-assembly loop), 64-head MLA blocks): ~30 s of Triton + ptxas.
# K31_HOPPER_FULL=1 adds the bf16-scoring variant (another ~25 s).
FUSED_REAL = Specialised(F.fused_li_sfa_decode, KP=2048, KC=256)
FUSED_BF16 = Specialised(F.fused_li_sfa_decode, KP=2048, KC=256, MMA_BF16=True)
SPLIT_SELECT = Specialised(F.fused_li_select_split, KP=2048, KC=256, NS=4)      # ~10 s
SPLIT_MERGE = Specialised(F.fused_sfa_merge, KP=2048, NS=4)                     # ~12 s


def test_compiles_for_hopper(tmp_path):
    import os
    names = ["FUSED_REAL", "SPLIT_SELECT", "SPLIT_MERGE"] + (["FUSED_BF16"] if os.environ.get("K31_HOPPER_FULL") else [])
    assert_compiles_for_hopper(__file__, names, tmp_path, index_types=("int32",))


# ---------------------------------------------------------------- the streaming selection alone

@k.kernel
def stream_select(scores: k.Tensor[k.f32, "R", "L"], out: k.Tensor[k.i32, "R", "K"],
                  cand_o: k.Tensor[k.i32, "R", "CAP"], cand_p: k.Tensor[k.i32, "R", "CAP"], topk: k.i32,
                  KP: k.constexpr = 32, KC: k.constexpr = 16):
    # fused_li_sfa_decode's selection loop over precomputed scores: append above the threshold,
    # cut back to the top-k when the next chunk might not fit, a final cut, winners to `out`
    CAP = 2 * KP
    for r in k.grid(scores.shape[0]):
        n = 0
        thr = -2147483647 - 1
        for c in range(k.cdiv(scores.shape[1], KC)):
            v = scores[r, k.span(c * KC, KC, other=float("-inf"))]
            for _ in range(k.where(n > CAP - KC, 1, 0)):
                n, thr, _, _, _, _ = reselect(cand_o, cand_p, r, n, topk, CAP)
            n = append_keys(cand_o, cand_p, r, n, thr, v, c * KC + k.arange(KC))
        n_sel, _, chosen, col, pos, _ = reselect(cand_o, cand_p, r, n, topk, CAP)
        k.store(out, (r, col), pos, mask=chosen)
        k.store(out, (r, k.span(0, KP)), k.full((KP,), -1, k.i32), mask=k.arange(KP) >= n_sel)


@pytest.mark.parametrize("target", TARGETS)
def test_streaming_selection_adversarial_orders(target):
    """Rows that force a cut every few chunks (scores ascending with position), none after the
    first (descending), all-equal rows (ties only), integer scores with many ties, -inf gaps,
    NaN, -0 vs +0, fewer valid keys than k, and a row with none: the winners are the oracle's
    top-k set, in position order."""
    g = _gen()
    L, kk = 150, 27
    x = torch.randint(-6, 6, (8, L), generator=g).float()
    x[0] = torch.arange(L).float()                          # ascending: the worst case
    x[1] = -torch.arange(L).float()                         # descending
    x[2] = 3.0                                              # all tied
    x[3, ::3] = float("-inf")
    x[3, 7], x[3, 8], x[3, 9] = float("nan"), -0.0, 0.0
    x[4, 20:] = float("-inf")                               # 20 valid < k
    x[5] = float("-inf")                                    # nothing valid
    x[6] += torch.randn(L, generator=g) * (torch.rand(L, generator=g) < 0.3)
    out = torch.empty(8, kk, dtype=torch.int32)
    cand = torch.empty(8, 64, dtype=torch.int32)
    stream_select[target](x, out, cand, cand.clone(), kk)
    want = iref.topk(x.double().numpy(), kk)
    for r in range(8):
        w = sorted(i for i in want[r].tolist() if i >= 0)
        assert out[r].tolist() == w + [-1] * (kk - len(w)), r


@k.kernel
def topk_i64_keys(x: k.Tensor[k.i64, "R", "L"], out: k.Tensor[k.i64, "R", "N"], L: k.constexpr = 64,
                  N: k.constexpr = 16):
    for r in k.grid(x.shape[0]):
        top, _ = k.topk(x[r, k.span(0, L)], N)
        out[r, k.span(0, N)] = top


@k.kernel
def topk_i64_positions(x: k.Tensor[k.i64, "R", "L"], out: k.Tensor[k.i32, "R", "N"], L: k.constexpr = 64,
                       N: k.constexpr = 16):
    for r in k.grid(x.shape[0]):
        _, pos = k.topk(x[r, k.span(0, L)], N)
        out[r, k.span(0, N)] = pos


@pytest.mark.parametrize("target", TARGETS)
def test_topk_of_i64_sort_keys(target):
    """The merge's k.topk on i64 keys: exact order of keys that differ only in low bits (beyond
    fp64 precision), equal keys, negative keys."""
    g = _gen()
    hi = torch.randint(-5, 5, (3, 64), generator=g, dtype=torch.int64) << 40
    x = hi | torch.randint(0, 2 ** 31, (3, 64), generator=g, dtype=torch.int64)
    x[0, :10] = x[0, 10]                                          # ties
    out = torch.empty(3, 16, dtype=torch.int64)
    topk_i64_keys[target](x, out)
    assert torch.equal(out, x.sort(dim=1, descending=True).values[:, :16])


def test_topk_i64_positions_refused_on_triton():
    with pytest.raises(K31Error) as e:
        topk_i64_positions["triton"](torch.zeros(2, 64, dtype=torch.int64), torch.empty(2, 16, dtype=torch.int32))
    assert "positions" in str(e.value)

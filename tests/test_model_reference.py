"""The torch reference model (k31dsl.model.reference): its KDA forms agree, its quantisation points
are the ops' formats, its Runner paths (prefill chunks, decode, verify + commit, ragged batches)
agree with the whole-sequence forward, it is causal, and its AttnRes follows the K3 block
convention of the fp64 oracle.

Tolerances: with quantize=False (the exact model) the paths differ only by fp32 rounding (matmul
blockings of 1 vs T tokens, chunked vs recurrent KDA): per position max |diff| <= 1e-4 x max
|logit| (seen <= 3.8e-5 over 400 seeds) plus 16x the position's own fp32 sensitivity: how far
forward() moves there when the embeddings move by about one ulp (`_exact_bound`). The second term
matters where the math amplifies rounding: a KDA head whose output is near zero is rescaled by its
per-head RMSNorm (seed 658468268: one head at 1/20 of its usual RMS, its position 30x as sensitive
as the rest and 1.09e-4 apart on the CI machine). With the quantisation points on, a path's fp32 rounding can move a value
across an E4M3 rounding boundary (one FP8 step, up to 1/8 of that element) or an MXFP8 group's
scale: per position max |diff| <= 4e-3 x max |logit| (seen <= 1.2e-3), held at every position
when top-k selects nothing. Such a flip in an indexer key can also swap the last place of a top-k
selection at a near tie (one position in 5 of 750 seeds, up to 0.24 x max |logit|; seed 5145: a
second, later position at 0.011, as the swapped key's effect stays in the caches): there the
quantised comparison allows up to three positions above 4e-3, each below 0.5. A real bug moves
logits by O(max |logit|) at many positions.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import PAGE, TINY
from k31dsl.model.reference import ReferenceModel, forward, run_layers
from k31dsl.model.reference.dsa import sparse_attention, topk_lowest_index
from k31dsl.model.reference.functions import (causal_conv, fp8_tile_qdq, kda_gate, l2norm, moe, mxfp8_qdq, route,
                                              swiglu)
from k31dsl.model.reference.kda import kda_chunk, kda_recurrent
from k31dsl.model.step import Step
from k31dsl.model.weights import init_weights
from k31dsl.ops.testing import load_oracle

attnres_oracle = load_oracle("attnres")
quant_oracle = load_oracle("quant")

EXACT_TOL = 1e-4
QUANT_TOL = 4e-3
# top-k engaged from position 16 on (tiny prompts are <= 40 tokens); softplus gate on the side
CFG = TINY.replace(index_topk=16)
CFG_SOFTPLUS = TINY.replace(index_topk=16, kda_gate="softplus", layer_pattern="KD")


def _seed(rng) -> int:
    return int(rng.integers(0, 2**31))


def _tokens(rng, n: int) -> list[int]:
    return rng.integers(0, 256, n).tolist()


def _pages(n: int) -> list[int]:
    return list(range(-(-n // PAGE)))


def _prefill(tokens, ctx=0, slot=0):
    return Step("prefill", [tokens], [ctx], [slot], [_pages(ctx + len(tokens))])


def _decode(tokens, ctxs, slots):
    return Step("decode", [[t] for t in tokens], list(ctxs), list(slots), [_pages(c + 1) for c in ctxs])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _exact_bound(cfg, w: dict, toks: list[int]) -> torch.Tensor:
    """Per position of forward(toks) [T]: the largest |diff| two fp32 paths of the exact model may
    show there. EXACT_TOL x max |logit| plus 16x the position's spread under a ~1-ulp change of the
    embeddings; capped at 1e-2 x max |logit|, far below what a bug does."""
    want = forward(cfg, w, toks, quantize=False)
    g = torch.Generator().manual_seed(len(toks))
    nudged = dict(w, embed=w["embed"] * (1 + 2.0**-23 * torch.randn(w["embed"].shape, generator=g)))
    spread = (forward(cfg, nudged, toks, quantize=False) - want).abs().amax(-1)
    scale = float(want.abs().max())
    return (EXACT_TOL * scale + 16 * spread).clamp(max=1e-2 * scale)


def _assert_exact(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
    """got, want [..., T, vocab] within `bound` [T] per position."""
    diff = (got - want).abs().amax(-1)
    assert bool((diff <= bound).all()), (diff / bound).max()


# ---------------------------------------------------------------- KDA forms

def _kda_inputs(rng, T, H, HV, K, V, gate, dtype):
    g = torch.Generator().manual_seed(_seed(rng))

    def randn(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)
    q, k = l2norm(randn(T, H, K)), l2norm(randn(T, H, K))
    v = randn(T, HV, V)
    a = kda_gate(2 * randn(T, HV, K), torch.log(1 + 15 * torch.rand(HV, generator=g, dtype=torch.float64)),
                 0.1 * randn(HV, K), gate, -5.0)
    beta = torch.rand(T, HV, generator=g, dtype=torch.float64)
    s0 = randn(HV, K, V)
    return [x.to(dtype) for x in (q, k, v, a, beta, s0)]


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
def test_chunked_kda_equals_recurrent_fp64(rng, gate):
    for H, HV, K, V in ((2, 4, 32, 16), (1, 1, 16, 32)):          # GVA and plain
        T = int(rng.integers(1, 200))                              # ragged: partial last chunk
        q, k, v, a, beta, s0 = _kda_inputs(rng, T, H, HV, K, V, gate, torch.float64)
        o_c, s_c = kda_chunk(q, k, v, a, beta, s0)
        o_r, s_r = kda_recurrent(q[None], k[None], v[None], a[None], beta[None], s0[None])
        assert float((o_c - o_r[0]).abs().max()) < 1e-10 * float(o_r.abs().max()), (T, H, HV)
        assert float((s_c - s_r[0]).abs().max()) < 1e-10 * float(s_r.abs().max())
        o_a, s_a = kda_chunk(q, k, v, a, beta, None)               # zero initial state
        o_b, s_b = kda_recurrent(q[None], k[None], v[None], a[None], beta[None], torch.zeros_like(s0)[None])
        assert torch.allclose(o_a, o_b[0], atol=1e-12) and torch.allclose(s_a, s_b[0], atol=1e-12)


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
def test_chunked_kda_fp32_strong_decay(rng, gate):
    """Within a chunk G reaches -320 (lb = -5) or worse (softplus): exp(-G) would overflow fp32."""
    q, k, v, a, beta, s0 = _kda_inputs(rng, 130, 2, 4, 32, 32, gate, torch.float64)
    a = torch.minimum(a, torch.full_like(a, -4.0)) if gate == "lower_bound" else a * 4
    o_r, s_r = kda_recurrent(q[None], k[None], v[None], a[None], beta[None], s0[None])
    o_c, s_c = kda_chunk(*[x.float() for x in (q, k, v, a, beta, s0)])
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    assert _rel(o_c.double(), o_r[0]) < 1e-4 and _rel(s_c.double(), s_r[0]) < 1e-4


def test_causal_conv_transcription(rng):
    n, C = int(rng.integers(1, 9)), 6
    full = torch.tensor(rng.standard_normal((3 + n, C)))
    w = torch.tensor(rng.standard_normal((C, 4)))
    want = torch.zeros(n, C, dtype=torch.float64)
    for t in range(n):                          # y[t] = sum_j w[:, j] x[t - 3 + j], full = 3 earlier + x
        for j in range(4):
            want[t] += w[:, j] * full[t + j]
    assert torch.allclose(causal_conv(full, w), want, atol=1e-12)


# ---------------------------------------------------------------- quantisation points = the ops' formats

def test_fp8_tile_and_mxfp8_match_the_quant_oracles(rng):
    x = rng.standard_normal((37, 512)) * np.exp(rng.uniform(-12, 6, (37, 1)))
    x[3, :128] = 0.0                                                   # eps-floored tile
    x[5, 7] = 448.0 * 1.5                                              # a large outlier
    xt = torch.tensor(x, dtype=torch.float32)
    x32 = xt.double().numpy()
    codes, scales = quant_oracle.fp8_tile_quantize(x32, 128, False, 1e-4)
    want = quant_oracle.fp8_tile_dequantize(codes, scales, 128, out="f32")
    assert np.array_equal(fp8_tile_qdq(xt).double().numpy(), want)
    y = xt.reshape(37, 4, 128)
    codes, sb = quant_oracle.mxfp8_quantize(y.double().numpy(), "ceil")
    want = quant_oracle.mxfp8_dequantize(codes, sb, out="f32")
    assert np.array_equal(mxfp8_qdq(y).double().numpy(), want)


# ---------------------------------------------------------------- Runner paths vs forward

@pytest.mark.parametrize("cfg", [CFG, CFG_SOFTPLUS], ids=["lower_bound", "softplus"])
@pytest.mark.parametrize("quantize", [False, True], ids=["exact", "quantized"])
def test_prefill_then_decode_equals_forward(rng, cfg, quantize):
    w = init_weights(cfg, _seed(rng))
    n_prompt = int(rng.integers(12, 33))
    toks = _tokens(rng, n_prompt + 8)
    want = forward(cfg, w, toks, quantize=quantize)
    m = ReferenceModel(cfg, w, num_slots=3, max_len=48, quantize=quantize)
    slot = int(rng.integers(3))
    got = [m.forward(_prefill(toks[:n_prompt], slot=slot))]
    for i in range(n_prompt, len(toks)):
        got.append(m.forward(_decode([toks[i]], [i], [slot])))
    got = torch.cat(got)
    assert got.shape == (len(toks), cfg.vocab_size) and got.dtype == torch.float32
    if not quantize:
        _assert_exact(got, want, _exact_bound(cfg, w, toks))
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    else:                                       # a top-k swap at a near tie: a few positions
        per_pos = (got - want).abs().amax(-1) / want.abs().max()
        assert int((per_pos > QUANT_TOL).sum()) <= 3 and float(per_pos.max()) < 0.5, per_pos


def test_quantized_paths_agree_everywhere_without_selection(rng):
    """With top-k wider than every context (no selection), no near tie can swap a key: every
    position of the quantised prefill + decode run is within QUANT_TOL of the forward."""
    cfg = CFG.replace(index_topk=64)
    w = init_weights(cfg, _seed(rng))
    n_prompt = int(rng.integers(12, 33))
    toks = _tokens(rng, n_prompt + 8)
    want = forward(cfg, w, toks, quantize=True)
    m = ReferenceModel(cfg, w, num_slots=1, max_len=48, quantize=True)
    got = torch.cat([m.forward(_prefill(toks[:n_prompt]))] +
                    [m.forward(_decode([toks[i]], [i], [0])) for i in range(n_prompt, len(toks))])
    per_pos = (got - want).abs().amax(-1) / want.abs().max()
    assert float(per_pos.max()) <= QUANT_TOL, per_pos


def _state_of(m: ReferenceModel, slot: int, length: int):
    st = m.states
    out = [t[slot] for t in list(st.kda.values()) + list(st.conv.values())]
    return out + [t[slot, :length] for t in list(st.latent.values()) + list(st.rope.values()) + list(st.index.values())]


def _assert_states_close(a, b, tol=EXACT_TOL):
    for x, y in zip(a, b, strict=True):
        assert float((x - y).abs().max()) <= tol * max(1.0, float(y.abs().max()))


def test_prefill_in_two_chunks_equals_one(rng):
    w = init_weights(CFG, _seed(rng))
    n = int(rng.integers(20, 41))
    cut = int(rng.integers(1, n))
    toks = _tokens(rng, n)
    one = ReferenceModel(CFG, w, num_slots=1, max_len=n, quantize=False)
    want = one.forward(_prefill(toks))
    two = ReferenceModel(CFG, w, num_slots=1, max_len=n, quantize=False)
    got = torch.cat([two.forward(_prefill(toks[:cut])), two.forward(_prefill(toks[cut:], ctx=cut))])
    _assert_exact(got, want, _exact_bound(CFG, w, toks))
    _assert_states_close(_state_of(two, 0, n), _state_of(one, 0, n))


def test_verify_commit_equals_decoding_the_accepted_tokens(rng):
    w = init_weights(CFG, _seed(rng))
    prompts = [_tokens(rng, int(rng.integers(5, 30))) for _ in range(2)]
    drafts = [_tokens(rng, 4) for _ in range(2)]
    accepted = [int(rng.integers(1, 5)), 2]
    ctxs = [len(p) for p in prompts]

    def fresh():
        m = ReferenceModel(CFG, w, num_slots=4, max_len=48, quantize=False)
        for slot, p in zip((1, 3), prompts):
            m.forward(_prefill(p, slot=slot))
        return m
    ver = fresh()
    vstep = Step("verify", drafts, ctxs, [1, 3], [_pages(c + 4) for c in ctxs])
    vlogits = ver.forward(vstep).view(2, 4, -1)
    ver.commit(vstep, accepted)
    ref = fresh()
    bounds = [_exact_bound(CFG, w, p + d) for p, d in zip(prompts, drafts)]
    for j in range(4):                                     # the same 4 tokens one by one
        dl = ref.forward(_decode([d[j] for d in drafts], [c + j for c in ctxs], [1, 3]))
        for i in range(2):
            _assert_exact(vlogits[i, j], dl[i], bounds[i][ctxs[i] + j])
        for i, slot in enumerate((1, 3)):
            if j + 1 == accepted[i]:
                snapshot = [x.clone() for x in _state_of(ref, slot, ctxs[i] + j + 1)]
                _assert_states_close(_state_of(ver, slot, ctxs[i] + j + 1), snapshot)
    # after the commit, decoding continues from the accepted prefix: compare with a model that
    # decoded only the accepted tokens
    alone = fresh()
    for j in range(max(accepted)):
        live = [i for i in range(2) if j < accepted[i]]
        alone.forward(_decode([drafts[i][j] for i in live], [ctxs[i] + j for i in live], [(1, 3)[i] for i in live]))
    nxt = _tokens(rng, 2)
    after = [c + a for c, a in zip(ctxs, accepted)]
    got, want = ver.forward(_decode(nxt, after, [1, 3])), alone.forward(_decode(nxt, after, [1, 3]))
    for i in range(2):
        seq = prompts[i] + drafts[i][:accepted[i]] + [nxt[i]]
        _assert_exact(got[i], want[i], _exact_bound(CFG, w, seq)[-1])


def test_ragged_batch_equals_each_alone(rng):
    w = init_weights(CFG, _seed(rng))
    prompts = [_tokens(rng, int(rng.integers(1, 25))) for _ in range(3)]
    slots = [2, 0, 1]
    batch = ReferenceModel(CFG, w, num_slots=3, max_len=40, quantize=False)
    lg = batch.forward(Step("prefill", prompts, [0, 0, 0], slots, [_pages(len(p)) for p in prompts]))
    outs = list(torch.split(lg, [len(p) for p in prompts]))
    nxt = [_tokens(rng, 4) for _ in prompts]
    for j in range(4):
        d = batch.forward(_decode([n[j] for n in nxt], [len(p) + j for p in prompts], slots))
        for i in range(3):
            outs[i] = torch.cat([outs[i], d[i:i + 1]])
    for i, p in enumerate(prompts):
        seq = p + nxt[i]
        _assert_exact(outs[i], forward(CFG, w, seq, quantize=False), _exact_bound(CFG, w, seq))


def test_causal(rng):
    w = init_weights(CFG, _seed(rng))
    toks = _tokens(rng, 36)
    t = int(rng.integers(0, 35))
    changed = toks[:t + 1] + [(x + 1 + int(rng.integers(255))) % 256 for x in toks[t + 1:]]
    a, b = forward(CFG, w, toks), forward(CFG, w, changed)
    assert torch.equal(a[:t + 1], b[:t + 1])
    assert not torch.equal(a[t + 1:], b[t + 1:])


def test_greedy_tokens_vary(rng):
    """Random weights must not collapse greedy decoding onto one token (the engine tests need it)."""
    w = init_weights(TINY, _seed(rng))
    lg = forward(TINY, w, _tokens(rng, 40))
    assert len(set(lg.argmax(-1).tolist())) >= 10
    assert 1.0 < float(lg.std()) < 8.0


def test_states_save_load_and_reset(rng):
    w = init_weights(CFG, _seed(rng))
    m = ReferenceModel(CFG, w, num_slots=2, max_len=40)
    toks = _tokens(rng, 10)
    m.forward(_prefill(toks, slot=1))
    saved = m.save_states([1])
    before = m.forward(_decode([5], [10], [1]))
    m.load_states([1], saved)
    assert torch.equal(m.forward(_decode([5], [10], [1])), before)
    m.reset_slot(1)
    assert all(float(t[1].abs().max()) == 0 for t in list(m.states.kda.values()) + list(m.states.conv.values()))
    with pytest.raises(K31Error, match="slots"):
        m.load_states([0], saved)


def test_runner_refuses_misuse(rng):
    w = init_weights(CFG, _seed(rng))
    m = ReferenceModel(CFG, w, num_slots=2, max_len=16)
    with pytest.raises(K31Error, match="max_len"):
        m.forward(_prefill(_tokens(rng, 17)))
    with pytest.raises(K31Error, match="out of range"):
        m.forward(_prefill([1], slot=2))
    with pytest.raises(K31Error, match="token ids"):
        m.forward(_prefill([300]))
    step = Step("verify", [[1, 2]], [0], [0], [[0]])
    with pytest.raises(K31Error, match="no pending verify"):
        m.commit(step, [1])
    m.forward(step)
    with pytest.raises(K31Error, match="pending"):
        m.forward(_prefill([1], slot=1))
    with pytest.raises(K31Error, match="accepted"):
        m.commit(step, [3])
    m.commit(step, [2])


# ---------------------------------------------------------------- AttnRes, sparse attention, MoE

def test_attnres_block_convention_matches_oracle(rng):
    """Sublayers replaced by known functions (fp64): the stack's AttnRes == block_attnres_naive over
    the 2 L sublayers with a block of 2 * attnres_block sublayers (K3 counts decoder layers)."""
    for n_layers, block in ((int(rng.integers(1, 8)), int(rng.integers(1, 4))), (6, 2)):
        cfg = TINY.replace(n_layers=n_layers, attnres_block=block, d_model=16)
        w = {n: t.double() for n, t in init_weights(cfg, _seed(rng)).items()}
        T = 5
        mats = [torch.tensor(rng.standard_normal((16, 16)) / 4) for _ in range(2 * n_layers)]
        subs = [lambda h, m=m: torch.tanh(h @ m) for m in mats]
        emb = torch.tensor(rng.standard_normal((T, 16)))
        got = run_layers(cfg, w, emb, lambda l, kind, h: subs[2 * l](h), lambda l, h: subs[2 * l + 1](h))
        queries = []
        for l in range(n_layers):
            for s in ("attn_res", "mlp_res"):
                queries.append((w[f"layers.{l}.{s}.query"] * w[f"layers.{l}.{s}.norm"]).numpy())
        queries.append((w["final_res.query"] * w["final_res.norm"]).numpy())
        want, _ = attnres_oracle.block_attnres_naive(emb.numpy(), queries, [lambda h, f=f: f(torch.tensor(h)).numpy()
                                                                         for f in subs], 2 * block, cfg.attnres_eps)
        assert np.allclose(got.numpy(), want, rtol=1e-12, atol=1e-12), (n_layers, block)


def test_sparse_attention_transcription(rng):
    """Blocked top-k attention == a per-query loop over the definition (top-k of the indexer scores
    over s <= pos, all of them when fewer than k; softmax over the selected keys)."""
    N, L, H, HI, S, topk = 2, 7, 2, 4, 20, 6
    g = torch.Generator().manual_seed(_seed(rng))
    Q = torch.randn(N, L, H, 576, generator=g)
    qi, kidx = torch.randn(N, L, HI, 128, generator=g), torch.randn(N, S, 128, generator=g)
    wts, keys = torch.randn(N, L, HI, generator=g), torch.randn(N, S, 576, generator=g)
    qpos = torch.tensor([[0, 2, 5, 9, 13, 17, 19], [3, 4, 5, 6, 7, 8, 19]])
    got = sparse_attention(Q, qi, wts, qpos, keys, kidx, topk, 0.1)
    for n in range(N):
        for t in range(L):
            p = int(qpos[n, t])
            score = torch.stack([(wts[n, t] * torch.relu(qi[n, t] @ kidx[n, s])).sum() for s in range(p + 1)])
            sel = torch.sort(score, descending=True, stable=True).indices[:topk]   # ties: lower position
            z = torch.softmax(0.1 * Q[n, t] @ keys[n, sel].T, dim=-1)
            assert torch.allclose(got[n, t], z @ keys[n, sel, :512], atol=1e-5), (n, t)


def test_reference_topk_ties_go_to_the_lower_position(rng):
    """Scores with many exact ties (small integers, some masked to -inf, rows shorter than k):
    the selected set == the first k of a stable descending sort."""
    rows, width = int(rng.integers(3, 9)), int(rng.integers(5, 40))
    score = torch.tensor(rng.integers(-2, 3, (rows, width)), dtype=torch.float32)
    score[torch.tensor(rng.random((rows, width)) < 0.3)] = float("-inf")
    score[0, 1:] = float("-inf")                                           # a row with one valid position
    for kk in (1, int(rng.integers(2, width + 1)), width):
        top, idx = topk_lowest_index(score, kk)
        want = torch.sort(score, descending=True, stable=True).indices[:, :kk]
        assert torch.equal(idx.sort(-1).values, want.sort(-1).values), kk
        assert torch.equal(top, score.gather(-1, idx))


def test_moe_routing_and_grouping(rng):
    cfg = TINY.replace(n_experts=5, n_experts_per_tok=2)
    w = init_weights(cfg, _seed(rng))
    p = "layers.0.moe."
    x = torch.tensor(rng.standard_normal((23, cfg.d_model)), dtype=torch.float32)
    got = moe(x, w, p, 2)
    ids, wgt = route(x, w[p + "router"], 2)
    dense = swiglu(x, w[p + "shared_gate_up"], w[p + "shared_down"])
    for e in range(cfg.n_experts):                    # every expert on every token, weighted by its routing
        ye = swiglu(x, w[p + "gate_up"][e], w[p + "down"][e])
        dense = dense + ((ids == e) * wgt).sum(-1, keepdim=True) * ye
    assert torch.allclose(got, dense, atol=1e-5, rtol=1e-5)
    assert torch.allclose(wgt.sum(-1), torch.ones(23))
    tie = {p + "router": torch.zeros(5, cfg.d_model)}  # all probabilities equal: the lowest indices win
    ids, wgt = route(x[:3], tie[p + "router"], 2)
    assert ids.tolist() == [[0, 1]] * 3 and torch.allclose(wgt, torch.full((3, 2), 0.5))

"""The GPU forms of the model step's kernels (benchmarks/NOTES.md "K31 model step"): the tile and
split choices at the small preset's shapes, the split-K linear and flash-decoding attention wired
into a step graph (forced on here, where the interpreter runs them) against the reference, and
sm_90 compilation of the kernels at the tiles the step graphs pass."""
from __future__ import annotations

import pytest
import torch

from k31dsl.model import assembler
from k31dsl.model.layers import common, dsa as dsa_layer
from k31dsl.model.assembler import ModelRunner
from k31dsl.model.config import TINY
from k31dsl.ops import nn
from k31dsl.ops.dsa import attention as A
from k31dsl.ops.dsa import indexer as I
from k31dsl.ops.dsa import prolog as P
from k31dsl.ops.testing import device_for

from hopper import Specialised, assert_compiles_for_hopper
from model_draws import clear_draw

SMS = 132


@pytest.mark.parametrize("m", [1, 8, 16, 32, 64])
@pytest.mark.parametrize("n,kdim", [(2048, 2048), (4096, 768), (768, 2048), (576, 2048), (16, 2048), (256, 2048)])
def test_decode_linear_tiles_fill_the_gpu(m, n, kdim):
    t = nn.gpu_linear_tiles(m, n, kdim)
    programs = -(-n // t["BN"]) * -(-m // t["BM"]) * t["SPLIT"]
    steps = -(-kdim // t["BK"])
    assert t["BM"] >= min(m, 16) and t["BM"] in (16, 32, 64)
    assert steps >= 2 * t["SPLIT"] or t["SPLIT"] == 1                      # >= 2 K steps per chunk
    assert t["SPLIT"] * m * n * 4 <= n * kdim                               # partials <= half the weight
    if n * kdim >= 2048 * 2048 and m <= 16:
        assert programs >= 3 * SMS, (t, programs)                          # ~4 per SM (512 of 8 MB)
    # every tile set the graph passes is a config entry (its warps and stages come with it)
    assert any(all(c.get(k) == v for k, v in t.items() if k != "SPLIT") for c in nn.LINEAR_CONFIGS)


def test_prefill_linear_tiles():
    t = nn.gpu_linear_tiles(4096, 2048, 2048)
    assert t == {"BM": 128, "BN": 128, "BK": 64, "SPLIT": 1}
    cfg = next(c for c in nn.LINEAR_CONFIGS if c["BM"] == 128 and c["BN"] == 128 and c["BK"] == 64)
    assert cfg["num_warps"] == 8 and cfg["num_stages"] == 3


@pytest.mark.parametrize("t,h,bh,want", [(1, 16, 16, 64), (2, 16, 16, 64), (64, 16, 16, 8), (66, 16, 16, 8),
                                         (67, 16, 16, 1), (256, 16, 16, 1), (4096, 16, 16, 1), (64, 128, 64, 1),
                                         (32, 128, 64, 4), (300, 128, 64, 1)])
def test_sfa_split_choice(t, h, bh, want):
    """No split once the programs fill half the SMs (132); below that, segments so that the programs
    stay <= ~4 per SM, each >= one 32-index block, and the fp32 partials <= max(16 MB, the gathered
    records): the DSA benchmark's B = 32 decode step of 128 heads splits 4 ways although one
    query's partial is 256 KB, its B = 64 step (128 programs) not at all."""
    s = A.sfa_split(t, h, 2048, bh)
    assert s == want
    assert s == 1 or (2 * t * -(-h // bh) <= 132 and t * -(-h // bh) * s <= 4 * 132
                      and s * t * h * 512 * 4 <= max(16 << 20, t * 2048 * 656))


@pytest.mark.parametrize("sfa", ["split", "two_pass", "keys_major"])
def test_gpu_step_forms_match_reference(monkeypatch, rng, sfa):
    """The decode graph with the GPU tile choices, split-K linears (2 chunks) and split attention
    (2 segments), two-pass attention (2 score segments) or keys-major attention forced (the tiny
    preset is too small to choose them) on the Triton interpreter."""
    monkeypatch.setattr(assembler, "_PASSED", {})           # programs of this flavour stay here
    monkeypatch.setattr(assembler, "_EXECUTABLES", {})
    init = common.StepGraph.__init__

    def gpu_init(self, *a, **kw):
        init(self, *a, **kw)
        self.gpu = True
    monkeypatch.setattr(common.StepGraph, "__init__", gpu_init)

    def tiles(m, n, kdim):
        return {"BM": 16, "BN": 32, "BK": 16, "SPLIT": 2 if m <= 16 else 1}
    monkeypatch.setattr(common, "gpu_linear_tiles", tiles)
    monkeypatch.setattr(dsa_layer, "sfa_split", lambda t, h, topk, bh: 2 if t <= 16 else 1)
    monkeypatch.setattr(dsa_layer, "score_segments", lambda t, h, topk, bh: 2)
    monkeypatch.setattr(dsa_layer, "sfa_form", lambda t, h, topk, gpu: "one_pass" if sfa == "split" else sfa)
    seed, weights, prompt, plan, want = clear_draw(rng, TINY, 12, 1)     # the reference's greedy steps
    runner = ModelRunner(TINY, weights, "triton", num_pages=8, num_slots=4, graph_mode=False,
                         device=device_for("triton"))
    got = [runner.forward(st) for st in plan]
    prog = runner._after_passes(common.ShapeClass("decode", 1, 1, 1))
    text = str(prog)
    assert "linear_rows_splitk" in text and "indexer_k_chain_parts" in text
    assert {"split": "sparse_mla_attention_split", "two_pass": "sfa_values", "keys_major": "sfa_keys_major"}[sfa] in text
    errs = [float((a.cpu() - b.cpu()).abs().max() / b.abs().max()) for a, b in zip(got, want)]
    assert max(errs) <= 1e-2, f"seed {seed}: {errs}"


@pytest.mark.parametrize("target", ["numpy", "triton"])
def test_decode_indexer_key_and_weight_chains_split_k(target, rng):
    """The decode form of the indexer's k chain (split-K projection into fp32 partials, then
    indexer_k_chain_parts) and head weights (split-K + linear_splitk_reduce with the HI^-1/2
    scale) against the fp64 prolog oracle, as ops/dsa/indexer_checks.py checks the fused chains."""
    import numpy as np
    from k31dsl.ops.dsa import indexer_checks as C
    from k31dsl.ops.testing import load_oracle, max_rel_err, to_f64
    ref = load_oracle("dsa_indexer")
    g = torch.Generator().manual_seed(int(rng.integers(0, 2 ** 31)))
    t, dm, ql, h = 7, 160, 64, 16
    x, qr, wq, wk, lw, lb, wp, cos, sin, cache, slots = C.prolog_inputs(t, dm, ql, h, g)   # CPU: for the oracle
    dev = device_for(target)
    xd, wkd, lwd, lbd, wpd, cosd, sind, cached, slotsd = (
        a.to(dev) for a in (x, wk, lw, lb, wp, cos, sin, cache, slots))
    split = 3
    kpart = torch.empty((split, t, 128), dtype=torch.float32, device=dev)
    nn.linear_rows_splitk[target](xd, wkd, kpart, BM=16, BN=32, BK=32)
    P.indexer_k_chain_parts[target](kpart, lwd, lbd, cosd, sind, P.hadamard_matrix(dev), slotsd, cached.view(-1), 1e-6)
    wpart = torch.empty((split, t, h), dtype=torch.float32, device=dev)
    w = torch.empty((t, h), dtype=torch.float32, device=dev)
    nn.linear_rows_splitk[target](xd, wpd, wpart, BM=16, BN=32, BK=32)
    nn.linear_splitk_reduce[target](wpart, w, h ** -0.5)
    cache = cached.cpu()                                           # the indexer keys the chain wrote
    _, kk, ww = ref.prolog_values(*[to_f64(a) for a in (x, qr, wq, wk, lw, lb, wp, cos, sin)])
    keep = [i for i in range(t) if slots[i] >= 0]
    kc = np.stack([ref.cache_token(cache.numpy(), slots[i])[0] for i in keep])
    ksb = np.stack([ref.cache_token(cache.numpy(), slots[i])[1] for i in keep])
    assert ref.mx_roundtrip_ratio(ref.mx_values(kc, ksb), kk[keep], ksb) <= 1.0
    assert max_rel_err(to_f64(w), ww, floor=1e-3 * float(np.abs(ww).max())) <= 1e-4


def _score_inputs(g, t, n, h, pages, mp):
    """Random query codes/scales/weights, a random flat indexer cache (finite E4M3 codes, scales
    2^-3..2^3), a block table with an unmapped page, causal-like key ranges."""
    from k31dsl.ops.dsa.indexer import CODE_BYTES, PAGE_BYTES
    b = t // n
    codes = torch.randint(0, 126, (t, h, 128), generator=g, dtype=torch.uint8) | \
        (torch.randint(0, 2, (t, h, 128), generator=g, dtype=torch.uint8) << 7)
    q_scales = torch.randint(124, 131, (t, h, 4), generator=g, dtype=torch.uint8)
    weights = torch.randn(t, h, generator=g)
    cache = torch.randint(0, 126, (pages, PAGE_BYTES), generator=g, dtype=torch.uint8) | \
        (torch.randint(0, 2, (pages, PAGE_BYTES), generator=g, dtype=torch.uint8) << 7)
    cache[:, CODE_BYTES:] = torch.randint(124, 131, (pages, PAGE_BYTES - CODE_BYTES), generator=g, dtype=torch.uint8)
    bt = torch.stack([torch.randperm(pages, generator=g)[:mp] for _ in range(b)]).to(torch.int32)
    bt[0, 1] = -1
    ke = torch.randint(1, mp * 64 + 1, (t,), generator=g, dtype=torch.int32)
    ks = torch.minimum(torch.randint(0, 40, (t,), generator=g, dtype=torch.int32), ke - 1)
    ke[0], ks[0] = 30, 0                                    # pages past the first: not scored
    return codes, q_scales, weights, cache, bt, ks, ke


def _scores_oracle(codes, q_scales, weights, cache, bt, ks, ke, n):
    from k31dsl.ops.dsa.indexer import CODE_BYTES
    f8 = lambda c: c.view(torch.float8_e4m3fn).double()          # noqa: E731
    e8 = lambda s: torch.exp2(s.double() - 127)                   # noqa: E731
    q = (f8(codes).view(*codes.shape[:2], 4, 32) * e8(q_scales)[..., None]).view(*codes.shape)
    t, mp = codes.shape[0], bt.shape[1]
    out = torch.full((t, mp * 64), float("-inf"), dtype=torch.float64)
    for i in range(t):
        for j in range(mp):
            page = int(bt[i // n, j])
            if page >= 0:
                kc = f8(cache[page, :CODE_BYTES].view(64, 128).contiguous()).view(64, 4, 32)
                kk = (kc * e8(cache[page, CODE_BYTES:].view(64, 4))[..., None]).view(64, 128)
                sc = (torch.relu(q[i] @ kk.T) * weights[i].double()[:, None]).sum(0)
            else:
                sc = torch.zeros(64, dtype=torch.float64)
            pos = torch.arange(j * 64, j * 64 + 64)
            ok = (pos >= ks[i]) & (pos < ke[i])
            out[i, j * 64:(j + 1) * 64] = torch.where(ok, sc, out[i, j * 64:(j + 1) * 64])
    return out


@pytest.mark.parametrize("target", ["numpy", "triton"])
@pytest.mark.parametrize("form,nq,n", [("flat", 1, 4), ("flat", 2, 4), ("flat", 4, 4), ("gpu", None, 4),
                                       ("gpu", None, 1)])
def test_step_indexer_scoring_forms(target, form, nq, n, rng):
    """The step graph's indexer scoring (model/layers/dsa.py) against fp64 scores (8 tokens of
    8 / n sequences, 3 pages of 64): `indexer_scores_flat` on the byte cache with 1, 2 and 4 tokens
    per program, and the GPU form — lightning_indexer_paged at graph_config's constexprs and key
    splits (DECODE_BF16 for one token, PREFILL_F16 for more: f16 keys-major) over the cache's
    whole-page views, as the step graph passes them."""
    from k31dsl.ops.dsa import indexer as I
    g = torch.Generator().manual_seed(int(rng.integers(0, 2 ** 31)))
    t, h, mp = 8, 16, 3
    codes, qs, w, cache, bt, ks, ke = _score_inputs(g, t, n, h, 6, mp)
    dev = device_for(target)
    scores = torch.empty((t, mp * 64), dtype=torch.float32, device=dev)
    cd, qd, wd, kd, btd, ksd, ked = (a.to(dev) for a in (codes, qs, w, cache, bt, ks, ke))
    qcodes, qscales = cd.view(torch.float8_e4m3fn), qd.view(torch.float8_e8m0fnu)
    if form == "flat":
        dsa_layer.indexer_scores_flat._kdef[target](qcodes, qscales, wd, kd.view(-1), btd, ksd, ked, scores, n, H=h,
                                                    NQ=nq)
    else:
        cfg, nsplit = I.graph_config(t // n, n, mp * 64)
        assert cfg["F16"] and cfg["KEYS_MAJOR"] and cfg["NQ"] == min(n, 2) and nsplit > 1     # 3 pages: split
        I.lightning_indexer_paged[target](qcodes, qscales, wd, *I.indexer_page_views(kd), btd, ksd, ked, scores, n,
                                          nsplit, H=h, **cfg)
    scores = scores.cpu()
    want = _scores_oracle(codes, qs, w, cache, bt, ks, ke, n)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(scores), fin)
    err = float((scores.double()[fin] - want[fin]).abs().max() / want[fin].abs().max())
    assert err <= 1e-5, err


# ---------------------------------------------------------------- sm_90 at the step graphs' tiles

LINEAR_SPLITK_DECODE = Specialised(nn.linear_rows_splitk, BM=16, BN=32, BK=128)
LINEAR_SPLITK_B64 = Specialised(nn.linear_rows_splitk, BM=64, BN=32, BK=128)
LINEAR_REDUCE_SIGMOID = Specialised(nn.linear_splitk_reduce, BM=16, BN=128, ACT="sigmoid")
SFA_SPLIT_H16 = Specialised(A.sparse_mla_attention_split, BH=16, BK=32)
SFA_COMBINE_H16 = Specialised(A.sparse_mla_attention_combine, BH=16)
SFA_COMBINE_B1 = Specialised(A.sparse_mla_attention_combine, BH=16, **A.combine_tiles(1, 16, 16))
SFA_FWD_H16 = Specialised(A.sparse_mla_attention_fwd, BH=16, BK=32)
Q_CHAIN_PREFILL = Specialised(P.indexer_q_chain, BM=64)
K_CHAIN_PARTS = Specialised(P.indexer_k_chain_parts, BM=16)
SCORES_PREFILL = Specialised(I.lightning_indexer_paged, H=32, **I.graph_config(1, 4096, 4096)[0])
SCORES_DECODE = Specialised(I.lightning_indexer_paged, H=32, **I.graph_config(64, 1, 1024)[0])


def test_step_kernels_compile_for_hopper(tmp_path):
    names = ["LINEAR_SPLITK_DECODE", "LINEAR_SPLITK_B64", "LINEAR_REDUCE_SIGMOID", "SFA_SPLIT_H16",
             "SFA_COMBINE_H16", "SFA_COMBINE_B1", "SFA_FWD_H16", "Q_CHAIN_PREFILL", "K_CHAIN_PARTS",
             "SCORES_PREFILL", "SCORES_DECODE"]
    assert_compiles_for_hopper(__file__, names, tmp_path, index_types=("int32",))

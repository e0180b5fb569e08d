"""The model's dense layers (ops/nn.py) and MLA glue (ops/dsa/mla.py): the oracles against torch,
the kernels' tiling and edge shapes, the conv state carried across chunks and rolled back after a
verify, the MLA chain (kv row -> FP8 cache -> absorbed query -> sparse attention -> value
projection) against plain multi-head attention, a graph program of the kernels, input errors, and
sm_90 compilation. The registered checks run on every target in tests/test_ops.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import k31dsl as k
from k31dsl import K31Error
from k31dsl.ops import nn
from k31dsl.ops.dsa import attention as A
from k31dsl.ops.dsa import mla
from k31dsl.ops.testing import device_for, load_oracle, to_f64

from hopper import Specialised, assert_compiles_for_hopper

TARGETS = ["numpy", "triton"]
ref = load_oracle("nn")


def _gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(1 << 30)))


def _rel(got, want):
    return float(np.abs(to_f64(got) - want).max() / np.abs(want).max())


def _on(dev, *ts):
    """The tensors on `dev` (made on the CPU first, so the seeded draws do not depend on it)."""
    return [t.to(dev) for t in ts]


# ---------------------------------------------------------------- oracles vs torch

def test_oracles_match_torch(rng):
    g = _gen(rng)
    x, w = torch.randn(3, 7, 10, generator=g, dtype=torch.float64), torch.randn(10, 4, generator=g, dtype=torch.float64)
    state = torch.randn(5, 3, 10, generator=g, dtype=torch.float64)
    slots = np.array([2, -1, 0])
    y, st = ref.short_conv(x.numpy(), w.numpy(), state.numpy(), slots)
    for n in range(3):
        prev = state[slots[n]] if slots[n] >= 0 else torch.zeros(3, 10, dtype=torch.float64)
        xx = torch.cat([prev, x[n]]).T[None]                                # [1, C, 3 + T]
        want = F.silu(F.conv1d(xx, w[:, None, :], groups=10))[0].T          # cross-correlation = the causal conv
        np.testing.assert_allclose(y[n], want.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(st[2], x[0, -3:].numpy())
    np.testing.assert_allclose(st[[1, 3, 4]], state[[1, 3, 4]].numpy())     # untouched slots (and slot -1)

    pos = rng.integers(0, 3000, 9)
    c, s = ref.rope_table(pos, 10000.0)
    q = rng.standard_normal((9, 2, 64))
    z = torch.complex(torch.from_numpy(q[..., :32]), torch.from_numpy(q[..., 32:]))      # NeoX pairs (i, i+32)
    inv = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    turned = z * torch.polar(torch.ones(9, 32, dtype=torch.float64), torch.from_numpy(pos)[:, None].double() * inv)[:, None]
    np.testing.assert_allclose(ref.rope(q, c, s), torch.cat([turned.real, turned.imag], -1).numpy(), atol=1e-12)

    o, gate, wv = rng.standard_normal((4, 3, 8)), rng.standard_normal((4, 24)), rng.standard_normal(8)
    want = F.rms_norm(torch.from_numpy(o), (8,), torch.from_numpy(wv), eps=1e-6).reshape(4, 24) * torch.sigmoid(
        torch.from_numpy(gate))
    np.testing.assert_allclose(ref.head_norm_gate(o, wv, gate, 1e-6), want.numpy(), rtol=1e-10, atol=1e-12)

    qq, wuk, wuv = rng.standard_normal((3, 2, 5 + 64)), rng.standard_normal((2, 5, 512)), rng.standard_normal((2, 6, 512))
    got = ref.mla_absorb_q(qq, wuk, c[:3], s[:3])
    for h in range(2):
        np.testing.assert_allclose(got[:, h, :512], qq[:, h, :5] @ wuk[h], rtol=1e-10, atol=1e-12)
    lat = rng.standard_normal((3, 2, 512))
    np.testing.assert_allclose(ref.mla_out(lat, wuv)[:, 6:], lat[:, 1] @ wuv[1].T, rtol=1e-10, atol=1e-12)
    xs = rng.standard_normal((4, 10))
    np.testing.assert_allclose(ref.swiglu(xs), F.silu(torch.from_numpy(xs[:, :5])).numpy() * xs[:, 5:],
                               rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- linear

@pytest.mark.parametrize("target", TARGETS)
def test_linear_small_tiles_every_act(target, rng):
    """Many ragged tiles in each direction (M, N, K not multiples of 16), every activation."""
    g, dev = _gen(rng), device_for(target)
    x, w = _on(dev, torch.randn(37, 50, generator=g), torch.randn(40, 50, generator=g) * 0.2)
    for act in nn.ACTS:
        y = torch.full((37, 40), float("nan"), device=dev)
        nn.linear_rows[target](x, w, y, ACT=act, BM=16, BN=16, BK=16)
        assert _rel(y, ref.linear(to_f64(x), to_f64(w), act)) < 1e-5, act


def test_linear_edge_shapes():
    w = torch.randn(6, 0)
    assert torch.equal(nn.linear(torch.randn(4, 0), w, target="numpy"), torch.zeros(4, 6))
    assert torch.equal(nn.linear(torch.randn(4, 0), w, "sigmoid", target="numpy"), torch.full((4, 6), 0.5))
    assert nn.linear(torch.randn(0, 3), torch.randn(6, 3), target="numpy").shape == (0, 6)
    x = torch.randn(2, 3, 4, 8, dtype=torch.bfloat16)
    y = nn.linear(x, torch.randn(5, 8, dtype=torch.bfloat16), out_dtype=torch.float32, target="numpy")
    assert y.shape == (2, 3, 4, 5) and y.dtype == torch.float32


# ---------------------------------------------------------------- short conv: state across calls

@pytest.mark.parametrize("target", TARGETS)
def test_short_conv_chunks_equal_whole(target, rng):
    """A sequence fed as chunks of 4, 1, 1, 5 tokens (state carried in the pool) gives the outputs
    and final state of one call over all 11; the other slot is left alone."""
    g, dev = _gen(rng), device_for(target)
    c = 24
    x, w = _on(dev, torch.randn(1, 11, c, generator=g), torch.randn(c, 4, generator=g))
    pool, slots = _on(dev, torch.randn(3, 3, c, generator=g), torch.tensor([2], dtype=torch.int32))
    whole_pool = pool.clone()
    whole = nn.short_conv(x, w, whole_pool, slots, target=target)
    parts, t0 = [], 0
    for size in (4, 1, 1, 5):
        parts.append(nn.short_conv(x[:, t0:t0 + size], w, pool, slots, target=target))
        t0 += size
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pool, whole_pool, rtol=0, atol=0)
    torch.testing.assert_close(pool[2], x[0, -3:], rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_short_conv_every_tile_height(target, rng):
    """Every tile height, with and without the state update, and every config the GPU tuner may
    pick: with UPDATE, BT < 4 walks the tiles in one program (later tiles need the state being
    rewritten), BT >= 4 splits them over programs; without it every tile starting before row 3
    reads the state (BT 1 and 2 once got zeros there on an H200 where the tuner took BT 1:
    results/gpu_check_h200_dec3.md). All match the oracle, state included."""
    g = _gen(rng)
    x, w = torch.randn(2, 7, 20, generator=g), torch.randn(20, 4, generator=g)
    pool = torch.randn(3, 3, 20, generator=g)
    slots = torch.tensor([2, -1], dtype=torch.int32)
    x, w, pool, slots = _on(device_for(target), x, w, pool, slots)
    configs = [{"BT": bt, "BC": 16} for bt in (1, 2, 4)] + nn.CONV_CONFIGS
    for update in (True, False):
        want_y, want_s = ref.short_conv(to_f64(x), to_f64(w), to_f64(pool), slots.cpu().numpy(), update)
        for cfg in configs:
            st, y = pool.clone(), torch.full_like(x, float("nan"))
            nn.short_conv_rows[target](x, w, st, slots, y, UPDATE=update, **cfg)
            assert _rel(y, want_y) < 1e-5 and _rel(st, want_s) < 1e-6, (update, cfg)


@pytest.mark.parametrize("target", TARGETS)
def test_verify_then_commit_equals_accepted_tokens_only(target, rng):
    """Speculative rollback: a verify over 4 draft tokens (update=False) and a commit of the
    first a accepted ones leaves the state that running only those a tokens would leave, and the
    verify's first a outputs are theirs."""
    g, dev = _gen(rng), device_for(target)
    n, t, c = 4, 4, 20
    x, w = _on(dev, torch.randn(n, t, c, generator=g, dtype=torch.float32), torch.randn(c, 4, generator=g))
    pool = torch.randn(5, 3, c, generator=g).to(dev)
    slots = torch.tensor([3, 0, 4, 1], dtype=torch.int32, device=dev)
    accepted = torch.tensor([0, 1, 3, 4], dtype=torch.int32, device=dev)
    before = pool.clone()
    y = nn.short_conv(x, w, pool, slots, update=False, target=target)
    assert torch.equal(pool, before)                                    # a verify never writes state
    nn.short_conv_commit(x, pool, slots, accepted, target=target)
    for i in range(n):
        a = int(accepted[i])
        alone = before.clone()
        if a:
            y_a = nn.short_conv(x[i:i + 1, :a], w, alone, slots[i:i + 1], target=target)
            torch.testing.assert_close(y[i, :a], y_a[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(pool[slots[i]], alone[slots[i]], rtol=0, atol=0)
    assert torch.equal(pool[2], before[2])


# ---------------------------------------------------------------- the MLA chain vs multi-head attention

@pytest.mark.parametrize("target", TARGETS)
def test_mla_chain_equals_multi_head_attention(target, rng):
    """kv row -> FP8 paged cache -> absorbed query -> sparse attention over every earlier position
    -> value up-projection equals MHA written out in fp64 with explicit keys k_h = [c W_uk[h],
    k_pe] and values c W_uv[h]^T over the dequantized cache latents (docs/model.md, DSA)."""
    g, dev = _gen(rng), device_for(target)
    t, h, dn, dv = 6, 2, 32, 24
    scale = (dn + 64) ** -0.5
    pos = torch.arange(t, dtype=torch.int32) + 3
    cos, sin = mla.rope_table(pos.to(dev), 10000.0, target=target)
    kv = torch.randn(t, 576, generator=g)
    q = torch.randn(t, h, dn + 64, generator=g)
    w_uk, w_uv = torch.randn(h, dn, 512, generator=g) * dn ** -0.5, torch.randn(h, dv, 512, generator=g) * 0.05
    kv_norm = 1 + 0.1 * torch.randn(512, generator=g)
    lat, kr = mla.mla_kv(*_on(dev, kv, kv_norm), cos, sin, target=target)
    cache = A.new_mla_cache(1, device=dev)
    A.mla_cache_write(cache, lat, kr, torch.arange(t, dtype=torch.int32, device=dev), target=target)
    big_q = mla.mla_absorb_q(*_on(dev, q, w_uk), cos, sin, out_dtype=torch.bfloat16, target=target)
    idx = torch.where(torch.arange(8)[None, :] <= torch.arange(t)[:, None], torch.arange(8)[None, :], -1).int()
    o, _ = A.sparse_mla_attention(big_q, cache, idx.to(dev), scale, target=target)
    y = mla.mla_out(o, w_uv.to(dev, torch.bfloat16), out_dtype=torch.float32, target=target)

    c_s, kpe = load_oracle("dsa_attention").mla_cache_decode(cache.cpu().numpy())
    c_s, kpe = c_s[:t], kpe[:t]
    cd, sd = ref.rope_table(pos.numpy(), 10000.0)
    q64, wuk, wuv = to_f64(q), to_f64(w_uk), to_f64(w_uv.to(torch.bfloat16))
    want = np.zeros((t, h * dv))
    for hh in range(h):
        keys = np.concatenate([c_s @ wuk[hh].T, kpe], axis=1)                     # [t, dn + 64]
        qh = np.concatenate([q64[:, hh, :dn], ref.rope(q64[:, hh, dn:], cd, sd)], axis=1)
        s = qh @ keys.T * scale
        s = np.where(np.arange(t)[None, :] <= np.arange(t)[:, None], s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        want[:, hh * dv:(hh + 1) * dv] = (p / p.sum(1, keepdims=True)) @ (c_s @ wuv[hh].T)
    assert _rel(y, want) < 3e-2                                   # bf16 Q, bf16 probabilities and o


# ---------------------------------------------------------------- a graph program of the kernels

def test_graph_program_of_the_kernels(rng):
    """embedding -> linear (silu) -> swiglu as one graph program (how the model assembler calls
    the kernels), against the oracle."""
    from k31dsl.lowering.graph import Program, run
    g = _gen(rng)
    ids = torch.randint(0, 50, (7,), generator=g, dtype=torch.int32)
    table, w = torch.randn(50, 24, generator=g), torch.randn(40, 24, generator=g) * 0.2
    p = Program("dense")
    i = p.input("ids", (7,), k.i32)
    e = p.call(nn.embedding_rows, i, p.weight("table", (50, 24), k.f32), p.tensor("e", (7, 24), k.f32), BM=8, BD=32)
    hid = p.call(nn.linear_rows, e, p.weight("w", (40, 24), k.f32), p.tensor("h", (7, 40), k.f32), ACT="silu",
                 BM=16, BN=16, BK=16)
    y = p.call(nn.swiglu_rows, hid, p.tensor("y", (7, 20), k.f32), BM=4, BF=16)
    p.output(y)
    out = run(p, {"ids": ids, "table": table, "w": w}, target="numpy")
    want = ref.swiglu(ref.linear(ref.embedding(ids.numpy(), to_f64(table)), to_f64(w), "silu"))
    assert _rel(out["y"], want) < 1e-5


# ---------------------------------------------------------------- input errors

def _conv_call(**over):
    a = dict(x=torch.randn(2, 3, 8), w=torch.randn(8, 4), state=torch.zeros(4, 3, 8),
             slots=torch.tensor([0, 1], dtype=torch.int32))
    a.update(over)
    return lambda: nn.short_conv(a["x"], a["w"], a["state"], a["slots"])


@pytest.mark.parametrize("call, needle", [
    (lambda: nn.linear(torch.randn(4, 8), torch.randn(5, 7)), "[N, 8]"),
    (lambda: nn.linear(torch.randn(4, 8), torch.randn(5, 8), act="gelu"), "act"),
    (lambda: nn.linear(torch.randn(4, 8).int(), torch.randn(5, 8)), "dtype int32"),
    (lambda: nn.swiglu(torch.randn(4, 7)), "even"),
    (lambda: nn.embedding(torch.tensor([1, 5, 9]), torch.randn(9, 4)), "token id 9"),
    (lambda: nn.embedding(torch.tensor([-1]), torch.randn(9, 4)), "token id -1"),
    (lambda: nn.embedding(torch.tensor([1.0]), torch.randn(9, 4)), "int32/int64"),
    (_conv_call(x=torch.randn(3, 8)), "at least 3 dim"),
    (_conv_call(x=torch.randn(2, 3, 8, 1)), "[N, T, C]"),
    (_conv_call(w=torch.randn(8, 3)), "`w`"),
    (_conv_call(state=torch.zeros(4, 3, 8, dtype=torch.bfloat16)), "dtype bfloat16"),
    (_conv_call(state=torch.zeros(4, 2, 8)), "`state`"),
    (_conv_call(slots=torch.tensor([0, 4], dtype=torch.int32)), "slot 4"),
    (_conv_call(slots=torch.tensor([0], dtype=torch.int32)), "`slots`"),
    (lambda: nn.short_conv_commit(torch.randn(2, 3, 8), torch.zeros(4, 3, 8), torch.tensor([0, 1]),
                                  torch.tensor([1, 4])), "accepted"),
    (lambda: nn.head_norm_gate(torch.randn(4, 2, 8), torch.randn(8), torch.randn(4, 15)), "`gate`"),
    (lambda: nn.head_norm_gate(torch.randn(4, 2, 8), torch.randn(7), torch.randn(4, 16)), "`w`"),
    (lambda: nn.head_norm_gate(torch.randn(4, 2, 8), torch.randn(8), torch.randn(4, 16), eps=-1.0), "eps"),
    (lambda: mla.rope_table(torch.arange(4), theta=1.0), "theta"),
    (lambda: mla.rope_table(torch.arange(4.0)), "int32/int64"),
    (lambda: mla.mla_absorb_q(torch.randn(3, 2, 40), torch.randn(2, 40, 512), torch.zeros(3, 32),
                              torch.zeros(3, 32)), "DN + 64"),
    (lambda: mla.mla_absorb_q(torch.randn(3, 2, 80), torch.randn(2, 17, 512), torch.zeros(3, 32),
                              torch.zeros(3, 32)), "`w_uk`"),
    (lambda: mla.mla_absorb_q(torch.randn(3, 2, 80), torch.randn(2, 16, 512), torch.zeros(4, 32),
                              torch.zeros(3, 32)), "`cos`"),
    (lambda: mla.mla_kv(torch.randn(3, 512), torch.randn(512), torch.zeros(3, 32), torch.zeros(3, 32)), "`kv`"),
    (lambda: mla.mla_kv(torch.randn(3, 576), torch.randn(512), torch.zeros(3, 32),
                        torch.zeros(3, 32, dtype=torch.float64)), "`sin`"),
    (lambda: mla.mla_out(torch.randn(3, 2, 512), torch.randn(3, 8, 512)), "`w_uv`"),
    (lambda: mla.mla_out(torch.randn(3, 2, 500), torch.randn(2, 8, 512)), "`o`"),
])
def test_bad_inputs_raise_k31error(call, needle):
    with pytest.raises(K31Error) as e:
        call()
    assert needle in str(e.value)


# ---------------------------------------------------------------- sm_90

LINEAR_PREFILL = Specialised(nn.linear_rows, BM=128, BN=128, BK=64)           # M = 32768 bf16 config
LINEAR_DECODE_SILU = Specialised(nn.linear_rows, BM=16, BN=64, BK=128, ACT="silu")
CONV_VERIFY = Specialised(nn.short_conv_rows, UPDATE=False, BT=4, BC=256)
swiglu_rows, embedding_rows, short_conv_rows = nn.swiglu_rows, nn.embedding_rows, nn.short_conv_rows
short_conv_commit_rows, head_norm_gate_rows = nn.short_conv_commit_rows, nn.head_norm_gate_rows
rope_table_rows, mla_q_rows, mla_kv_rows, mla_out_rows = mla.rope_table_rows, mla.mla_q_rows, mla.mla_kv_rows, \
    mla.mla_out_rows


def test_kernels_compile_for_hopper(tmp_path):
    names = ["LINEAR_PREFILL", "LINEAR_DECODE_SILU", "swiglu_rows", "embedding_rows", "short_conv_rows", "CONV_VERIFY",
             "short_conv_commit_rows", "head_norm_gate_rows", "rope_table_rows", "mla_q_rows", "mla_kv_rows",
             "mla_out_rows"]
    assert_compiles_for_hopper(__file__, names, tmp_path, index_types=("int32",))

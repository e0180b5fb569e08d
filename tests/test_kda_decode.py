"""kda_decode / kda_rollback against the fp64 recurrent oracle (tests/oracles/kda.py): one token,
several tokens with the replay data, speculative verify + rollback == decoding the accepted
prefix, GVA, scattered slots, both gate forms, input errors, and the sm_90 compile."""

import numpy as np
import pytest
import torch

from k31dsl import K31Error
from k31dsl.ops.kda.decode import KDAReplay, kda_decode, kda_decode_step, kda_replay_prefix, kda_rollback
from k31dsl.ops.testing import load_oracle, to_f64
from hopper import Specialised

TARGETS = ["numpy", "triton"]
GATES = ["none", "softplus", "lower_bound"]


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def make_case(seed, n=3, t=1, h=2, hv=4, kdim=20, vdim=40, num_slots=7, dtype=torch.float32, gate="none"):
    """Random decode inputs: q/k/v of `dtype`, beta in (0, 1), a pool with random states, and
    distinct slots in a random order (not contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)          # noqa: E731
    case = dict(q=r(n, t, h, kdim).to(dtype), k=r(n, t, h, kdim).to(dtype), v=r(n, t, hv, vdim).to(dtype),
                beta=torch.sigmoid(r(n, t, hv)), gate={})
    if gate == "none":
        case["g"] = -torch.rand(n, t, hv, kdim, generator=gen) * 2            # natural-log decay
    elif gate == "softplus":
        case["g"] = (r(n, t, hv, kdim) * 3).to(dtype)
        case["gate"] = dict(A_log=torch.log(1 + 15 * torch.rand(hv, generator=gen)), dt_bias=r(hv * kdim) * 0.5)
    else:
        case["g"] = (r(n, t, hv, kdim) * 3).to(dtype)
        case["gate"] = dict(A_log=r(hv) * 0.5, dt_bias=r(hv * kdim), lower_bound=-5.0)
    case["pool"] = r(num_slots, hv, kdim, vdim) * 0.5
    case["slots"] = torch.randperm(num_slots, generator=gen)[:n].to(torch.int32)
    return case


def oracle(case, tokens=None):
    """fp64 (o [N, T, HV, V], final state [N, HV, K, V]) over the first `tokens` tokens."""
    ref = load_oracle("kda")
    sl = slice(None, tokens)
    c = case
    return ref.kda(c["q"][:, sl], c["k"][:, sl], c["v"][:, sl], c["g"][:, sl], c["beta"][:, sl],
                   initial_state=c["pool"][c["slots"].long()], **c["gate"])


def rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.abs(to_f64(got) - want).max() / max(np.abs(want).max(), 1e-30))


def decode(case, target, pool=None, tokens=None, **kw):
    sl = slice(None, tokens)
    c = case
    pool = c["pool"].clone() if pool is None else pool
    o, rep = kda_decode(c["q"][:, sl], c["k"][:, sl], c["v"][:, sl], c["g"][:, sl], c["beta"][:, sl], pool,
                        c["slots"], target=target, **c["gate"], **kw)
    return o, rep, pool


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_one_token_matches_recurrence(target, gate, dtype):
    seed = _seed()
    case = make_case(seed, dtype=dtype, gate=gate)
    o, rep, pool = decode(case, target)
    want_o, want_s = oracle(case)
    slots = case["slots"].long()
    assert rep is None and o.dtype == dtype and o.shape == (3, 1, 4, 40)
    tol_o = 1e-4 if dtype == torch.float32 else 1e-2          # bf16 output rounding
    assert rel(o, want_o) < tol_o, (seed, rel(o, want_o))
    assert rel(pool[slots], want_s) < 1e-4, (seed, rel(pool[slots], want_s))
    rest = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    assert torch.equal(pool[rest], case["pool"][rest])         # other slots untouched, bit for bit


@pytest.mark.parametrize("target", TARGETS)
def test_decode_tokens_and_replay_data_match_oracle(target):
    """T = 3 tokens (GVA, lower-bound gate): outputs, final state and the stored (k, u, g)."""
    ref = load_oracle("kda")
    seed = _seed()
    case = make_case(seed, t=3, gate="lower_bound")
    o, rep, pool = decode(case, target)
    want_o, want_s = oracle(case)
    assert rel(o, want_o) < 1e-4 and rel(pool[case["slots"].long()], want_s) < 1e-4, seed
    qn, kn, a = ref.prepare(case["q"], case["k"], case["g"], **case["gate"])
    assert isinstance(rep, KDAReplay)
    assert rel(rep.k, kn) < 1e-5 and rel(rep.g, a) < 1e-5, seed
    for n in range(3):
        for hv in range(4):
            *_, us = ref.recurrent_head(qn[n, :, hv // 2], kn[n, :, hv // 2], case["v"][n, :, hv], a[n, :, hv],
                                        case["beta"][n, :, hv], case["pool"][case["slots"][n], hv],
                                        return_states=True)
            assert rel(rep.u[n, :, hv], us) < 1e-4, (seed, n, hv)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("variant", [{"PREFETCH": False}, {"BV": 8}])
def test_decode_tuner_variants_match_oracle(target, t, variant, monkeypatch):
    """The tuner's other configs (PREFETCH=False: each token's inputs loaded in its own step;
    BV 8 tiles) give the oracle's outputs and states too, and the same bits as the first config."""
    import k31dsl.ops.kda.decode as dec
    seed = _seed()
    case = make_case(seed, t=t, gate="lower_bound")
    o_pre, _, pool_pre = decode(case, target)
    monkeypatch.setattr(dec, "_small_grid_config", lambda *a, **kw: dict(variant))
    o, _, pool = decode(case, target)
    want_o, want_s = oracle(case)
    assert rel(o, want_o) < 1e-4 and rel(pool[case["slots"].long()], want_s) < 1e-4, seed
    assert torch.equal(o, o_pre) and torch.equal(pool, pool_pre), seed


def test_small_grids_pin_one_decode_config():
    """On a GPU a small grid (N * HV programs at BV 64 below SMALL_GRID) gets one config, not the
    tuner's host-bound timings; the rollback kernel gets its BV and tunes its warps."""
    from types import SimpleNamespace
    import k31dsl.ops.kda.decode as dec
    from k31dsl.targets.triton.runtime import TritonKernel
    gpu = SimpleNamespace(type="cuda")
    pinned = dec._small_grid_config(16 * 96, 128, gpu, tokens=1)
    assert pinned == {"BV": 16, "num_warps": 1, "PREFETCH": False}
    assert dec._small_grid_config(16 * 96, 128, gpu, tokens=4)["PREFETCH"] is True
    assert dec._small_grid_config(32 * 96, 128, gpu, tokens=1) == {"BV": 32, "num_warps": 4, "PREFETCH": False}
    assert dec._small_grid_config(64 * 96, 128, gpu, tokens=1) == {} == dec._small_grid_config(16, 128, torch.device("cpu"))
    assert dec._small_grid_config(16 * 96, 128, gpu) == {"BV": 16}
    kern = TritonKernel(dec.kda_decode_step, mode="interpret")
    assert not kern._tunable(pinned) and len(kern._candidates(pinned)) == 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["in_pool", "engine_copy"])
def test_spec_verify_then_rollback_equals_decoding_accepted(target, mode):
    """Verify T=4 draft tokens, roll back to the accepted prefix: the state equals decoding just
    those tokens (bit for bit: the replay repeats the kernel's operations), the verify outputs of
    the prefix equal that decode's outputs, and both match the oracle. accepted = 2 for every
    sequence, then a mix including 0 and T."""
    seed = _seed()
    case = make_case(seed, n=4, t=4, h=1, hv=2, kdim=16, vdim=24, gate="softplus", num_slots=9)
    slots = case["slots"].long()
    for accepted in ([2, 2, 2, 2], [2, 0, 4, 1]):
        pool = case["pool"].clone()
        if mode == "in_pool":
            o, rep, _ = decode(case, target, pool=pool, save_replay=True, update_state=False)
            assert torch.equal(pool, case["pool"])               # the verify only read the state
            kda_rollback(pool, case["slots"], None, rep, torch.tensor(accepted, dtype=torch.int32), target=target)
        else:
            ckpt = pool[slots].clone()
            o, rep, _ = decode(case, target, pool=pool)
            kda_rollback(pool, case["slots"], ckpt, rep, torch.tensor(accepted, dtype=torch.int32), target=target)
        for acc in sorted(set(accepted)):
            rows = [n for n, a in enumerate(accepted) if a == acc]
            sub = {key: (val[rows] if key in ("q", "k", "v", "g", "beta", "slots") else val)
                   for key, val in case.items()}
            want_o, want_s = oracle(sub, acc)
            assert rel(pool[slots[rows]], want_s) < 1e-4, (seed, accepted, rows)
            if acc == 0:
                assert torch.equal(pool[slots[rows]], case["pool"][slots[rows]])
                continue
            o_acc, _, pool_acc = decode(sub, target, tokens=acc)     # decode only the accepted tokens
            assert torch.equal(pool[slots[rows]], pool_acc[slots[rows]]), (seed, accepted, rows)
            assert torch.equal(o[rows, :acc], o_acc), (seed, accepted, rows)
            assert rel(o[rows, :acc], want_o) < 1e-4, (seed, accepted, rows)
        rest = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
        assert torch.equal(pool[rest], case["pool"][rest])


@pytest.mark.parametrize("target", TARGETS)
def test_state_v_first_layout(target):
    """Pool [num_slots, HV, V, K]: a decode step and a verify + commit match the oracle (states
    transposed), and the commit equals decoding the accepted tokens bit for bit."""
    seed = _seed()
    case = make_case(seed, n=3, t=3, h=1, hv=2, kdim=16, vdim=24, gate="lower_bound", num_slots=5)
    slots = case["slots"].long()
    pool_vk = case["pool"].transpose(2, 3).contiguous()
    o, rep, _ = decode(case, target, pool=pool_vk, save_replay=True, update_state=False, state_v_first=True)
    want_o, _ = oracle(case)
    assert rel(o, want_o) < 1e-4, seed
    accepted = [1, 3, 0]
    kda_rollback(pool_vk, case["slots"], None, rep, torch.tensor(accepted, dtype=torch.int32),
                 state_v_first=True, target=target)
    for n, acc in enumerate(accepted):
        one = {key: (val[n:n + 1] if key in ("q", "k", "v", "g", "beta", "slots") else val)
               for key, val in case.items()}
        _, want_s = oracle(one, acc)
        assert rel(pool_vk[slots[n]].transpose(1, 2), want_s[0]) < 1e-4, (seed, n)
        if acc:
            fresh = case["pool"].transpose(2, 3).contiguous()
            decode(one, target, pool=fresh, tokens=acc, state_v_first=True)
            assert torch.equal(pool_vk[slots[n]], fresh[slots[n]]), (seed, n)


def test_replay_buffers_and_flags():
    """A preallocated KDAReplay is filled in place; save_replay=False; no L2 norm; a custom scale."""
    ref = load_oracle("kda")
    case = make_case(_seed(), t=2)
    bufs = KDAReplay(torch.zeros(3, 2, 2, 20), torch.zeros(3, 2, 4, 40), torch.zeros(3, 2, 4, 20))
    o1, rep, _ = decode(case, "numpy", save_replay=bufs)
    assert rep is bufs and bufs.u.abs().sum() > 0
    o2, rep2, _ = decode(case, "numpy", save_replay=False)
    assert rep2 is None and torch.equal(o1, o2)
    o3, _, pool = decode(case, "numpy", use_qk_l2norm=False, scale=0.3)
    c = case
    want_o, want_s = ref.kda(c["q"], c["k"], c["v"], c["g"], c["beta"], scale=0.3, use_qk_l2norm=False,
                             initial_state=c["pool"][c["slots"].long()])
    assert rel(o3, want_o) < 1e-4 and rel(pool[c["slots"].long()], want_s) < 1e-4


def test_decode_matches_chunk_kda():
    """One decode step after a prefill == chunk_kda over the prompt plus that token."""
    chunk = pytest.importorskip("k31dsl.ops.kda.chunk")
    gen = torch.Generator().manual_seed(_seed())
    T, H, HV, K, V = 19, 1, 2, 16, 32
    q, k = torch.randn(1, T + 1, H, K, generator=gen), torch.randn(1, T + 1, H, K, generator=gen)
    v, beta = torch.randn(1, T + 1, HV, V, generator=gen), torch.rand(1, T + 1, HV, generator=gen)
    g = torch.randn(1, T + 1, HV, K, generator=gen)
    gate = dict(A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * K), lower_bound=-5.0)
    o_all, s_all = chunk.chunk_kda(q, k, v, g, beta, output_final_state=True, target="numpy", **gate)
    _, s_pre = chunk.chunk_kda(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], output_final_state=True,
                               target="numpy", **gate)
    pool = torch.zeros(3, HV, K, V)
    pool[2] = s_pre[0]
    o1, _ = kda_decode(q[:, T:], k[:, T:], v[:, T:], g[:, T:], beta[:, T:], pool, torch.tensor([2], dtype=torch.int32),
                       target="numpy", **gate)
    assert rel(o1[0, 0], to_f64(o_all[0, T])) < 1e-4 and rel(pool[2], to_f64(s_all[0])) < 1e-4


# ---------------------------------------------------------------- input errors

def _args(**over):
    c = make_case(0)
    a = dict(q=c["q"], k=c["k"], v=c["v"], g=c["g"], beta=c["beta"], state_pool=c["pool"], slots=c["slots"])
    a.update(over)
    return a


def _rollback_args(**over):
    rep = KDAReplay(torch.zeros(3, 4, 2, 20), torch.zeros(3, 4, 4, 40), torch.zeros(3, 4, 4, 20))
    a = dict(state_pool=torch.zeros(7, 4, 20, 40), slots=torch.tensor([0, 4, 2], dtype=torch.int32),
             checkpoint=None, replay=rep, accepted=torch.tensor([1, 2, 3], dtype=torch.int32))
    a.update(over)
    return a


@pytest.mark.parametrize("over, needle", [
    (dict(slots=torch.tensor([0, 7, 1], dtype=torch.int32)), "slots`[1] = 7"),
    (dict(slots=torch.tensor([0, -1, 1], dtype=torch.int32)), "outside [0, 6]"),
    (dict(slots=torch.tensor([3, 1, 3], dtype=torch.int32)), "repeats a slot"),
    (dict(slots=torch.tensor([0, 1], dtype=torch.int32)), "shape [3]"),
    (dict(slots=torch.tensor([0.0, 1.0, 2.0])), "int32"),
    (dict(v=torch.randn(3, 1, 2, 40)), "`v` must have shape [3, 1, 4, 40]"),
    (dict(g=torch.randn(3, 1, 4, 16)), "`g` must have shape"),
    (dict(beta=torch.rand(3, 1, 2)), "`beta` must have shape"),
    (dict(k=torch.randn(3, 1, 2, 16)), "`k` must have shape"),
    (dict(q=torch.randn(3, 2, 20)), "[N, T, H, K]"),
    (dict(q=torch.randint(0, 3, (3, 1, 2, 20))), "dtype int64"),
    (dict(v=torch.randn(3, 1, 4, 40, dtype=torch.float64)), "dtype float64"),
    (dict(state_pool=torch.zeros(7, 4, 20, 40, dtype=torch.bfloat16)), "`state_pool` has dtype bfloat16"),
    (dict(state_pool=torch.zeros(7, 4, 40, 20).transpose(2, 3)), "contiguous"),
    (dict(state_pool=torch.zeros(7, 3, 20, 40), v=torch.randn(3, 1, 3, 40)), "not a multiple of H=2"),
    (dict(v=torch.randn(3, 1, 4, 40).to(torch.bfloat16)), "share one dtype"),
    (dict(lower_bound=-9.0), "lower_bound"),
    (dict(A_log=torch.zeros(3)), "A_log"),
    (dict(save_replay="yes"), "save_replay"),
    (dict(state_v_first=True), "`state_pool` has K=40 but q has K=20"),
    (dict(save_replay=KDAReplay(torch.zeros(3, 1, 2, 20), torch.zeros(3, 1, 4, 40), torch.zeros(3, 1, 4, 16))),
     "save_replay.g"),
])
def test_decode_bad_inputs_raise_k31error(over, needle):
    with pytest.raises(K31Error) as e:
        kda_decode(**_args(**over), target="numpy")
    assert needle in str(e.value)


@pytest.mark.parametrize("over, needle", [
    (dict(accepted=torch.tensor([1, 5, 0], dtype=torch.int32)), "accepted`[1] = 5"),
    (dict(accepted=torch.tensor([1, -1, 0], dtype=torch.int32)), "accepted`[1] = -1"),
    (dict(slots=torch.tensor([0, 9, 2], dtype=torch.int32)), "slots`[1] = 9"),
    (dict(replay=(1, 2, 3)), "KDAReplay"),
    (dict(checkpoint=torch.zeros(3, 4, 20, 20)), "`checkpoint` must have shape [3, 4, 20, 40]"),
    (dict(state_pool=torch.zeros(7, 4, 16, 40)), "do not match the state pool"),
])
def test_rollback_bad_inputs_raise_k31error(over, needle):
    with pytest.raises(K31Error) as e:
        kda_rollback(**_rollback_args(**over), target="numpy")
    assert needle in str(e.value)


# ---------------------------------------------------------------- sm_90 compile at K = V = 128

decode_plain = Specialised(kda_decode_step)
decode_lb_replay = Specialised(kda_decode_step, GATE=2, REPLAY=True, GT=__import__("k31dsl").bf16)
decode_verify = Specialised(kda_decode_step, GATE=1, REPLAY=True, UPDATE=False, BV=64)
decode_v_first = Specialised(kda_decode_step, GATE=2, VFIRST=True)
decode_no_prefetch = Specialised(kda_decode_step, GATE=2, PREFETCH=False, BV=64)
rollback = Specialised(kda_replay_prefix)
rollback_v_first = Specialised(kda_replay_prefix, VFIRST=True)


def test_kernels_compile_for_hopper(tmp_path):
    from hopper import assert_compiles_for_hopper
    assert_compiles_for_hopper(__file__, ["decode_plain", "decode_lb_replay", "decode_verify", "decode_v_first", "decode_no_prefetch",
                                          "rollback", "rollback_v_first"], tmp_path)

"""The Triton target (interpreter) against the numpy reference target, op family by op family:
bit-exact for integer, fp8 and e8m0 results, within float tolerance elsewhere; fp8/e8m0 casts also
against the fp64 bit-field oracles. Shapes are ragged against the tiles; inputs are fresh random
draws each run (the seed is printed on failure)."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.ops.testing import load_oracle

import target_check
from target_check import compare

pytest.importorskip("triton")
from k31dsl.targets.triton.emit import detect_mode  # noqa: E402

NAN, INF = float("nan"), float("inf")
MODE = detect_mode()                          # "interpret" here; "gpu" with TRITON_INTERPRET=0 on a GPU
DEVICE = "cuda" if MODE == "gpu" else "cpu"


def run_both(kern, inputs: dict, outputs: dict, *scalars, **cx):
    return target_check.run_both("triton", kern, inputs, outputs, *scalars, **cx)


# Arithmetic, integer and cast semantics shared with the other targets: test_target_semantics.py

# ---------------------------------------------------------------- fp8 and e8m0 conversions

@k.kernel
def fp8_encode(x: k.Tensor[k.f32, "N"], q4: k.Tensor[k.f8e4m3, "N"], q5: k.Tensor[k.f8e5m2, "N"],
               qb: k.Tensor[k.f8e4m3, "N"], BLOCK: k.constexpr = 256):
    for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
        v = x[k.span(i * BLOCK, BLOCK, other=0.0)]
        q4[k.span(i * BLOCK, BLOCK)] = v.to(k.f8e4m3)
        q5[k.span(i * BLOCK, BLOCK)] = v.to(k.f8e5m2)
        qb[k.span(i * BLOCK, BLOCK)] = v.to(k.bf16).to(k.f8e4m3)


def _fp8_inputs(rng, n_random: int) -> np.ndarray:
    """Every fp8 boundary class: saturation edges and ties, subnormal ties, specials, plus random
    bit patterns (all exponents, NaN payloads)."""
    q = [448.0, 449.0, 464.0, 464.01, 480.0, 57344.0, 61440.0, 61439.0, 1e6, 3e38, INF, NAN,
         1.0625, 1.1875, 1.0624, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -6 - 2.0 ** -10,
         7 * 2.0 ** -9, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -17, 2.0 ** -14 - 2.0 ** -17, 1e-40, 0.0]
    bits = rng.integers(0, 2 ** 32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        mags = np.concatenate([q, rng.uniform(-500, 500, 200), bits.astype(np.float64)])
    return np.concatenate([mags, -mags]).astype(np.float32)


def test_fp8_casts_bit_exact_over_special_values(rng):
    x = _fp8_inputs(rng, 900)
    n = len(x)
    outs = {"q4": torch.zeros(n, dtype=torch.float8_e4m3fn), "q5": torch.zeros(n, dtype=torch.float8_e5m2),
            "qb": torch.zeros(n, dtype=torch.float8_e4m3fn)}
    got = run_both(fp8_encode, {"x": torch.from_numpy(x)}, outs)
    compare(got)
    # and against the bit-field oracle, independent of ml_dtypes and of both targets
    fp = load_oracle("fp")
    want = fp.e4m3_encode(fp.round_to(x.astype(np.float64), fp.E4M3))
    assert (got["triton"]["q4"].view(torch.uint8).numpy() == want).all()
    e5m2 = fp.Format(2, -14, 57344.0, True)
    r = fp.round_to(x.astype(np.float64), e5m2)
    want5 = np.where(np.isnan(r), 0x7F, r.astype(ml_dtypes.float8_e5m2).view(np.uint8))
    assert (got["triton"]["q5"].view(torch.uint8).numpy() == want5).all()


@k.kernel
def fp8_decode(c4: k.Tensor[k.f8e4m3, "N"], c5: k.Tensor[k.f8e5m2, "N"], s: k.Tensor[k.e8m0, "N"],
               o: k.Tensor[k.f32, "F", "N"], ob: k.Tensor[k.bf16, "N"], bits: k.Tensor[k.u8, "B", "N"],
               BLOCK: k.constexpr = 64):
    for i in k.grid(k.cdiv(c4.shape[0], BLOCK)):
        a = c4[k.span(i * BLOCK, BLOCK)]
        b = c5[k.span(i * BLOCK, BLOCK)]
        e = s[k.span(i * BLOCK, BLOCK)]
        o[0, k.span(i * BLOCK, BLOCK)] = a.to(k.f32)
        o[1, k.span(i * BLOCK, BLOCK)] = b.to(k.f32)
        o[2, k.span(i * BLOCK, BLOCK)] = e.to(k.f32)
        o[3, k.span(i * BLOCK, BLOCK)] = e.to(k.f32).to(k.e8m0).to(k.f32)
        ob[k.span(i * BLOCK, BLOCK)] = a.to(k.bf16)
        bits[0, k.span(i * BLOCK, BLOCK)] = a.bitcast(k.u8)
        bits[1, k.span(i * BLOCK, BLOCK)] = (b.bitcast(k.i8) + 1).bitcast(k.u8)
        bits[2, k.span(i * BLOCK, BLOCK)] = (e.bitcast(k.u8) + 1).bitcast(k.e8m0).bitcast(k.u8)


def test_fp8_and_e8m0_decode_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ins = {"c4": codes.view(torch.float8_e4m3fn), "c5": codes.view(torch.float8_e5m2),
           "s": codes.view(torch.float8_e8m0fnu)}
    outs = {"o": torch.zeros(4, 256), "ob": torch.zeros(256, dtype=torch.bfloat16),
            "bits": torch.zeros(3, 256, dtype=torch.uint8)}
    got = run_both(fp8_decode, ins, outs)
    compare(got, exact=("o", "ob"))
    o = got["triton"]["o"].numpy()
    fp = load_oracle("fp")
    np.testing.assert_array_equal(o[0], fp.e4m3_decode(np.arange(256)).astype(np.float32))
    np.testing.assert_array_equal(o[2], fp.e8m0_decode(np.arange(256)).astype(np.float32))
    assert o[2].view(np.uint32)[0] == 0x00400000                           # 2^-127, subnormal
    np.testing.assert_array_equal(o[3][:255], o[2][:255])                 # exact round trip
    assert np.isnan(o[3][255])


@k.kernel
def e8m0_encode(x: k.Tensor[k.f32, "N"], s: k.Tensor[k.e8m0, "N"], BLOCK: k.constexpr = 128):
    for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
        s[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=1.0)].to(k.e8m0)


def test_e8m0_encode_edges(rng):
    edges = [0.0, -0.0, -1.0, NAN, INF, -INF, 2.0 ** -127, 2.0 ** -127 * 1.5, 2.0 ** -128, 1e-45,
             2.0 ** -126, 2.0 ** -126 * 1.0000001, 1.0, 1.0000001, 0.75, 2.0 ** 127, 2.0 ** 127 * 1.5,
             3.4e38, 2.0 ** -149, 5.9e-39]
    bits = rng.integers(0, 2 ** 32, 300, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([np.asarray(edges, np.float32), bits])
    got = run_both(e8m0_encode, {"x": torch.from_numpy(x)}, {"s": torch.zeros(len(x), dtype=torch.float8_e8m0fnu)})
    compare(got)
    b = got["triton"]["s"].view(torch.uint8).numpy().astype(np.int64)
    with np.errstate(invalid="ignore"):
        x64 = x.astype(np.float64)
    pos = np.isfinite(x64) & (x64 > 0)
    want = np.clip(np.ceil(np.log2(np.where(pos, x64, 1.0))), -127, 127) + 127   # exact in fp64
    assert (b[pos] == want[pos]).all()
    assert (b[~np.isfinite(x64)] == 255).all() and (b[np.isfinite(x64) & (x64 <= 0)] == 0).all()


# ---------------------------------------------------------------- reductions and scans

# reductions: test_target_semantics.py

@k.kernel
def scans(x: k.Tensor[k.f32, "R", "C"], xi: k.Tensor[k.i32, "R", "C"], o: k.Tensor[k.f32, "F", "R", "C"],
          oi: k.Tensor[k.i32, "F", "R", "C"], BR: k.constexpr = 16, BC: k.constexpr = 16):
    for i, j in k.grid(k.cdiv(x.shape[0], BR), k.cdiv(x.shape[1], BC)):
        t = x[k.span(i * BR, BR, other=0.0), k.span(j * BC, BC, other=0.0)]
        ti = xi[k.span(i * BR, BR, other=0), k.span(j * BC, BC, other=0)]
        o[0, k.span(i * BR, BR), k.span(j * BC, BC)] = k.cumsum(t, axis=0)
        o[1, k.span(i * BR, BR), k.span(j * BC, BC)] = k.cumsum(t, axis=1, reverse=True)
        oi[0, k.span(i * BR, BR), k.span(j * BC, BC)] = k.cumsum(ti, axis=1)
        oi[1, k.span(i * BR, BR), k.span(j * BC, BC)] = k.cumsum(ti, axis=0, reverse=True)


def test_cumsum_forward_and_reverse(rng):
    r, c = 21, 19
    x = rng.standard_normal((r, c)).astype(np.float32)
    xi = rng.integers(-50, 50, (r, c)).astype(np.int32)
    outs = {"o": torch.zeros(2, r, c), "oi": torch.zeros(2, r, c, dtype=torch.int32)}
    got = run_both(scans, {"x": torch.from_numpy(x), "xi": torch.from_numpy(xi)}, outs)
    compare(got, rtol=1e-5, atol=1e-5)
    oi = got["triton"]["oi"].numpy()
    block = xi[:16, :16].astype(np.int64)
    assert (oi[1, :16, :16] == np.cumsum(block[::-1], axis=0)[::-1]).all()


# ---------------------------------------------------------------- dot

@k.kernel
def matmul(a: k.Tensor[k.f32, "M", "K"], b: k.Tensor[k.f32, "K", "N"], c: k.Tensor[k.f32, "M", "N"],
           cb: k.Tensor[k.f32, "M", "N"], BM: k.constexpr = 16, BN: k.constexpr = 16,
           BK: k.constexpr = 16):
    for i, j in k.grid(k.cdiv(a.shape[0], BM), k.cdiv(b.shape[1], BN)):
        acc = k.zeros((BM, BN), k.f32)
        accb = k.zeros((BM, BN), k.f32)
        for kk in range(k.cdiv(a.shape[1], BK)):
            ta = a[k.span(i * BM, BM, other=0.0), k.span(kk * BK, BK, other=0.0)]
            tb = b[k.span(kk * BK, BK, other=0.0), k.span(j * BN, BN, other=0.0)]
            acc += k.dot(ta, tb)
            accb += k.dot(ta.to(k.bf16), tb.T.to(k.bf16).T, precision="tf32")
        c[k.span(i * BM, BM), k.span(j * BN, BN)] = acc
        cb[k.span(i * BM, BM), k.span(j * BN, BN)] = accb


def test_dot_with_odd_sizes_masked_to_tiles(rng):
    m, kk, n = 20, 37, 18
    a = rng.standard_normal((m, kk)).astype(np.float32)
    b = rng.standard_normal((kk, n)).astype(np.float32)
    outs = {"c": torch.full((m, n), NAN), "cb": torch.full((m, n), NAN)}
    got = run_both(matmul, {"a": torch.from_numpy(a), "b": torch.from_numpy(b)}, outs)
    compare(got, rtol=1e-5, atol=1e-4)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got["triton"]["c"].numpy(), ref, rtol=1e-5, atol=1e-4)
    ab = torch.from_numpy(a).bfloat16().double().numpy() @ torch.from_numpy(b).bfloat16().double().numpy()
    np.testing.assert_allclose(got["triton"]["cb"].numpy(), ab, rtol=1e-5, atol=1e-4)


@k.kernel
def fp8_matmul(a: k.Tensor[k.f8e4m3, "M", "K"], b: k.Tensor[k.f8e5m2, "K", "N"], c: k.Tensor[k.f32, "M", "N"],
               BM: k.constexpr = 16, BN: k.constexpr = 16, BK: k.constexpr = 32):
    for i, j in k.grid(k.cdiv(a.shape[0], BM), k.cdiv(b.shape[1], BN)):
        acc = k.zeros((BM, BN), k.f32)
        for kk in range(k.cdiv(a.shape[1], BK)):
            ta = a[k.span(i * BM, BM, other=0.0), k.span(kk * BK, BK, other=0.0)]
            tb = b[k.span(kk * BK, BK, other=0.0), k.span(j * BN, BN, other=0.0)]
            acc += k.dot(ta, tb.to(k.f32).to(k.f8e4m3))
        c[k.span(i * BM, BM), k.span(j * BN, BN)] = acc


def test_fp8_dot(rng):
    m, kk, n = 20, 45, 18
    a = torch.from_numpy(rng.standard_normal((m, kk)).astype(np.float32) * 8).to(torch.float8_e4m3fn)
    b = torch.from_numpy(rng.standard_normal((kk, n)).astype(np.float32)).to(torch.float8_e5m2)
    got = run_both(fp8_matmul, {"a": a, "b": b}, {"c": torch.full((m, n), NAN)})
    compare(got, rtol=1e-5, atol=1e-4)
    ref = a.double().numpy() @ b.to(torch.float8_e4m3fn).double().numpy()
    np.testing.assert_allclose(got["triton"]["c"].numpy(), ref, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- topk, take, cat, shapes

@k.kernel
def topk_kernel(x: k.Tensor[k.f32, "R", "N"], xi: k.Tensor[k.i32, "R", "N"], v4: k.Tensor[k.f32, "R", "F"],
                p4: k.Tensor[k.i32, "R", "F"], v1: k.Tensor[k.f32, "R", "G"], p1: k.Tensor[k.i32, "R", "G"],
                vall: k.Tensor[k.i32, "R", "LP"], pall: k.Tensor[k.i32, "R", "LP"],
                v1d: k.Tensor[k.f32, "H"], p1d: k.Tensor[k.i32, "H"], BR: k.constexpr = 4,
                L: k.constexpr = 32):
    for i in k.grid(k.cdiv(x.shape[0], BR)):
        t = x[k.span(i * BR, BR, other=0.0), k.span(0, L, other=-INF)]
        ti = xi[k.span(i * BR, BR, other=0), k.span(0, L, other=-(2 ** 31))]
        a, b = k.topk(t, 4)
        v4[k.span(i * BR, BR), k.span(0, 4)] = a
        p4[k.span(i * BR, BR), k.span(0, 4)] = b
        c, d = k.topk(t, 1)
        v1[k.span(i * BR, BR), k.span(0, 1)] = c
        p1[k.span(i * BR, BR), k.span(0, 1)] = d
        e, f = k.topk(ti, L)
        vall[k.span(i * BR, BR), k.span(0, L)] = e
        pall[k.span(i * BR, BR), k.span(0, L)] = f
        g, h = k.topk(x[0, k.span(0, L, other=-INF)], 8)
        v1d[k.span(0, 8)] = g
        p1d[k.span(0, 8)] = h


def test_topk_descending_ties_to_lower_index(rng):
    r, n = 6, 29
    x = rng.integers(-3, 4, (r, n)).astype(np.float32)            # many ties
    x[0, 3], x[0, 7] = NAN, -0.0
    x[1] = -np.abs(x[1]) - 1.0
    x[1, [2, 6]], x[1, [4, 9]] = -0.0, 0.0                        # -0 ties +0: index order
    xi = rng.integers(-2, 3, (r, n)).astype(np.int32)
    outs = {"v4": torch.zeros(r, 4), "p4": torch.zeros(r, 4, dtype=torch.int32), "v1": torch.zeros(r, 1),
            "p1": torch.zeros(r, 1, dtype=torch.int32), "vall": torch.zeros(r, 32, dtype=torch.int32),
            "pall": torch.zeros(r, 32, dtype=torch.int32), "v1d": torch.zeros(8),
            "p1d": torch.zeros(8, dtype=torch.int32)}
    got = run_both(topk_kernel, {"x": torch.from_numpy(x), "xi": torch.from_numpy(xi)}, outs)
    compare(got, exact=tuple(outs))
    p4 = got["triton"]["p4"].numpy()
    for row in range(r):                         # NaN ranks last, then descending, ties by index
        v = list(x[row]) + [-INF] * (32 - n)
        want = sorted(range(32), key=lambda j: (bool(np.isnan(v[j])), 0.0 if np.isnan(v[j]) else -v[j], j))
        assert list(p4[row]) == want[:4]
    assert (got["triton"]["pall"].numpy()[:, :n].max() < 32)


@k.kernel
def take_cat_shapes(x: k.Tensor[k.f32, "R", "L"], idx: k.Tensor[k.i32, "R", "M"], ot: k.Tensor[k.f32, "R", "M"],
                    oc: k.Tensor[k.f32, "C"], otr: k.Tensor[k.f32, "L", "R"], ob: k.Tensor[k.f32, "R", "L"],
                    orr: k.Tensor[k.f32, "C"], BR: k.constexpr = 4, L: k.constexpr = 16,
                    M: k.constexpr = 8):
    for _ in k.grid(1):
        t = x[k.span(0, BR, other=0.0), k.span(0, L, other=0.0)]
        ix = idx[k.span(0, BR, other=0), k.span(0, M, other=0)]
        ot[k.span(0, BR), k.span(0, M)] = k.take(t, ix)
        row0 = x[0, k.span(0, L, other=0.0)]
        row1 = x[1, k.span(0, L, other=0.0)]
        oc[k.span(0, 2 * L)] = k.cat(row0, row1 * 2.0)
        otr[k.span(0, L), k.span(0, BR)] = t.T
        ob[k.span(0, BR), k.span(0, L)] = k.broadcast_to(row0[None, :], (BR, L)) + k.sum(t, axis=1)[:, None]
        orr[k.span(0, BR * L)] = k.reshape(t + k.arange(L).to(k.f32)[None, :], (BR * L,))


def test_take_cat_trans_broadcast_reshape(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    idx = rng.integers(-5, 21, (4, 8)).astype(np.int32)           # out-of-range entries clamp
    outs = {"ot": torch.zeros(4, 8), "oc": torch.zeros(64), "otr": torch.zeros(16, 4), "ob": torch.zeros(4, 16),
            "orr": torch.zeros(64)}
    got = run_both(take_cat_shapes, {"x": torch.from_numpy(x), "idx": torch.from_numpy(idx)}, outs)
    compare(got, exact=("ot", "oc", "otr", "orr"))
    g = got["triton"]
    np.testing.assert_array_equal(g["ot"].numpy(), np.take_along_axis(x, np.clip(idx, 0, 15), axis=1))
    np.testing.assert_array_equal(g["oc"].numpy()[:32], np.concatenate([x[0], x[1] * 2]))


# ---------------------------------------------------------------- memory: gathers, masks, scalars

@k.kernel
def gather_rows(kv: k.Tensor[k.f32, "N", "D"], ids: k.Tensor[k.i32, "T", "K"], flag: k.Tensor[k.i32, "T"],
                o: k.Tensor[k.f32, "T", "K", "D"], dst: k.Tensor[k.f32, "N", "D"], cnt: k.Tensor[k.i32, "T"],
                BK: k.constexpr = 8, BD: k.constexpr = 16):
    for t in k.grid(ids.shape[0]):
        r = ids[t, k.span(0, BK, other=-1)]
        rows = kv[r, k.span(0, BD, other=-1.0)]              # out-of-range rows read `other`
        o[t, k.span(0, BK), k.span(0, BD)] = rows
        on = flag[t] > 0
        keep = k.load(kv, (r, k.span(0, BD)), mask=(r % 2 == 0)[:, None] & on, other=5.0)
        k.store(dst, (r, k.span(0, BD)), keep * 2.0, mask=(r % 2 == 0)[:, None])
        cnt[t] = k.sum(k.where((r >= 0) & (r < kv.shape[0]), 1, 0))


def test_gathers_with_out_of_range_indices_and_masks(rng):
    n, d, t, kk = 10, 13, 5, 6
    kv = torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))
    ids = torch.from_numpy(rng.integers(-3, n + 3, (t, kk)).astype(np.int32))
    flag = torch.from_numpy(rng.integers(0, 2, t).astype(np.int32))
    ids[0, :] = torch.arange(0, 2 * kk, 2)[:kk]                   # distinct even rows: stores race-free
    for row in range(1, t):
        ids[row] = torch.where(ids[row] % 2 == 0, torch.tensor(-1, dtype=torch.int32), ids[row])
    outs = {"o": torch.full((t, kk, d), NAN), "dst": torch.zeros(n, d), "cnt": torch.zeros(t, dtype=torch.int32)}
    got = run_both(gather_rows, {"kv": kv, "ids": ids, "flag": flag}, outs)
    compare(got, exact=("o", "dst"))
    o = got["triton"]["o"].numpy()
    i = ids.numpy()
    ok = (i >= 0) & (i < n)
    np.testing.assert_array_equal(o[ok], kv.numpy()[i[ok]])
    assert (o[~ok] == -1.0).all()


# ---------------------------------------------------------------- loops with carried state

@k.kernel
def running_stats(x: k.Tensor[k.f32, "R", "C"], o: k.Tensor[k.f32, "R", "F"], BC: k.constexpr = 16):
    chunks = k.cdiv(x.shape[1], BC)                    # computed on the host, read in the body
    rows = x.shape[0]
    for r in k.grid(rows):
        m = k.full((BC,), -INF, k.f32)
        s = k.zeros((BC,), k.f32)
        count = 0
        last = 0.0
        for c in range(chunks):
            t = x[r, k.span(c * BC, BC, other=-INF)]
            m_new = k.maximum(m, t)
            alpha = k.where(m_new == -INF, 0.0, k.exp(m - m_new))
            s = s * alpha + k.where(t == -INF, 0.0, k.exp(t - m_new))
            m = m_new
            count += 1
            last = k.max(t)
        o[r, 0] = k.max(m)
        o[r, 1] = k.sum(s * k.exp(m - k.max(m)))
        o[r, 2] = count.to(k.f32)
        o[r, 3] = last + (r <= rows - 2).to(k.f32) * 100.0


def test_loop_carried_tiles_and_scalars(rng):
    r, c = 3, 53
    x = rng.standard_normal((r, c)).astype(np.float32) * 4
    got = run_both(running_stats, {"x": torch.from_numpy(x)}, {"o": torch.zeros(r, 4)})
    compare(got, rtol=1e-5)
    o = got["triton"]["o"].numpy()
    np.testing.assert_allclose(o[:, 1], np.exp(x - x.max(1, keepdims=True)).sum(1), rtol=1e-5)
    assert (o[:, 2] == 4).all()


@k.kernel
def bf16_extrema(x: k.Tensor[k.bf16, "R", "N"], y: k.Tensor[k.bf16, "R", "N"], o: k.Tensor[k.bf16, "R", "3"],
                 BN: k.constexpr = 64):
    for r in k.grid(x.shape[0]):
        v = x[r, k.span(0, BN, other=float("-inf"))]
        y[r, k.span(0, BN)] = k.maximum(k.minimum(v, 0.75), k.maximum(-0.5, v * 0.5))
        top = k.max(v)
        o[r, 0] = top
        o[r, 1] = k.min(k.where(v == float("-inf"), float("inf"), v))
        o[r, 2] = k.minimum(top, k.max(k.abs(v)) * 0.5)


def test_bf16_extrema_keep_their_dtype(rng):
    """bf16 maximum / minimum, elementwise (against constants) and as reductions. Triton 3.6
    computes a bf16 maximum in f32, which a reduction's combine function may not return (a
    compile error on the GPU only): the generated code reduces and compares in f32 and rounds back
    (exact for extrema)."""
    x = torch.from_numpy(rng.standard_normal((3, 50)).astype(np.float32) * 3).bfloat16()
    got = run_both(bf16_extrema, {"x": x}, {"y": torch.zeros(3, 50, dtype=torch.bfloat16),
                                           "o": torch.zeros(3, 3, dtype=torch.bfloat16)})
    compare(got, exact=("y", "o"))
    o = got["triton"]["o"].float()
    xf = x.float()
    assert torch.equal(o[:, 0], xf.max(1).values) and torch.equal(o[:, 1], xf.min(1).values)
    src = k.compile(bf16_extrema, target="triton", mode="gpu").source()
    assert "tl.reduce(v.to(tl.float32), None, _fmax)" in src and "tl.reduce(v, " not in src


# ---------------------------------------------------------------- configs, generated code, errors

@k.kernel(configs=[{"BLOCK": 32, "num_warps": 2}, {"BLOCK": 64, "num_warps": 4}])
def scale(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], a: k.f32, BLOCK: k.constexpr):
    for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
        y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)] * a


def test_configs_use_the_first_without_a_gpu_and_code_reads_cleanly(rng):
    x = torch.from_numpy(rng.standard_normal(70).astype(np.float32)).to(DEVICE)
    y = torch.zeros(70, device=DEVICE)
    comp = k.compile(scale, target="triton")
    comp(x, y, 1.5)
    np.testing.assert_array_equal(y.cpu().numpy(), (x * 1.5).cpu().numpy())
    src = comp.source()
    assert "constexprs: BLOCK=32" in src and f"# mode: {MODE}" in src and "ir-hash:" in src
    assert "# src: test_triton_target.py:" in src and "@triton.jit" in src
    for banned in ("libdevice", "inline_asm", "make_block_ptr"):
        assert banned not in src
    gpu = k.compile(scale, target="triton", mode="gpu").source(BLOCK=64)
    assert "num_warps=4" in gpu and "enable_fp_fusion=False" in gpu and "BLOCK=64" in gpu
    y2 = torch.zeros(70, device=DEVICE)
    comp(x, y2, 2.0, BLOCK=64)
    np.testing.assert_array_equal(y2.cpu().numpy(), (x * 2.0).cpu().numpy())


@k.kernel(configs=[{"BLOCK": 64, "num_warps": 2}, {"BLOCK": 64, "num_warps": 8}])
def scale_warps(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], a: k.f32, BLOCK: k.constexpr = 64):
    for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
        y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)] * a


def test_configs_differing_only_in_num_warps_are_separate_builds(rng):
    """The autotuner times every config: two configs with the same constexprs but different
    num_warps must build two launchers (one module each), not share the first one's."""
    comp = k.compile(scale_warps, target="triton", mode="gpu")
    x, y = torch.zeros(70), torch.zeros(70)
    srcs = [comp._checked_launcher((x, y, 1.0), dict(cfg)).source for cfg in scale_warps.configs]
    assert "num_warps=2" in srcs[0] and "num_warps=8" in srcs[1]
    assert comp.ir(**scale_warps.configs[1]).constexprs == {"BLOCK": 64}     # the IR never sees launch keys
    interp = k.compile(scale_warps, target="triton")
    interp(x.to(DEVICE), y.to(DEVICE), 1.0, num_warps=8)                      # accepted by keyword too


@k.kernel
def bad_tile(x: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 24):
    for i in k.grid(1):
        x[k.span(0, BLOCK)] = x[k.span(0, BLOCK)] * 2.0


@k.kernel
def small_dot(a: k.Tensor[k.f32, "M", "K"], c: k.Tensor[k.f32, "M", "M"]):
    for i in k.grid(1):
        t = a[k.span(0, 8), k.span(0, 16)]
        c[k.span(0, 8), k.span(0, 8)] = k.dot(t, t.T)


def test_user_errors_name_the_source_line():
    with pytest.raises(K31Error, match=r"test_triton_target.py:\d+.*power.of.two"):
        k.compile(bad_tile, target="triton")(torch.zeros(24))
    with pytest.raises(K31Error, match=r"test_triton_target.py:\d+.*(at least 16|>= 16)"):
        k.compile(small_dot, target="triton")(torch.zeros(8, 16), torch.zeros(8, 8))
    with pytest.raises(K31Error, match=r"test_triton_target.py:\d+.*fp8 needs K of at least 32"):
        k.compile(fp8_matmul, target="triton")(*(torch.zeros(16, 16, dtype=dt) for dt in (
            torch.float8_e4m3fn, torch.float8_e5m2)), torch.zeros(16, 16), BK=16)
    with pytest.raises(K31Error, match="must be a torch tensor"):
        k.compile(scale, target="triton")(np.zeros(4, np.float32), torch.zeros(4), 1.0)
    with pytest.raises(K31Error, match="needs cuda tensors"):
        k.compile(scale, target="triton", mode="gpu")(torch.zeros(4), torch.zeros(4), 1.0)
    if MODE == "interpret":
        with pytest.raises(K31Error, match="needs cpu tensors"):
            k.compile(scale, target="triton", mode="interpret")(torch.zeros(4, device="meta"),
                                                               torch.zeros(4), 1.0)


# ---------------------------------------------------------------- GPU code through Triton's compiler

HOPPER_CHECKED = ["fp8_encode", "fp8_decode", "matmul", "fp8_matmul", "topk_kernel", "take_cat_shapes",
                  "running_stats", "gather_rows", "bf16_extrema"]     # casts, int_math, reductions: test_target_semantics.py


@pytest.mark.skipif(MODE != "interpret", reason="on a GPU the tests above run the GPU code itself")
def test_gpu_mode_code_compiles_for_hopper(tmp_path):
    """The gpu-mode modules (native bf16, hardware fp8 casts, tl.dot on bf16) through Triton's
    compiler for sm_90 (int32 and int64 offsets)."""
    from hopper import assert_compiles_for_hopper
    assert_compiles_for_hopper(__file__, HOPPER_CHECKED, tmp_path)


def test_jit_like_marks_what_the_jit_and_launcher_would():
    """aot.jit_like, the CPU build's stand-in for the GPU's JIT specialisation: sizes, strides and
    addresses that are multiples of 16 are divisible, the rest are not (a row view with an odd
    stride, a pointer 4 bytes into a buffer), and offsets turn int64 exactly when some tensor spans
    2^30 elements or more, for the whole kernel (meta tensors: no memory)."""
    from k31dsl.targets.triton.aot import jit_like
    kern = gather_rows.ir()
    base = torch.empty(4096 * 52, device="meta")
    kv = base.as_strided((4096, 48), (52, 1))                  # stride 52: not a multiple of 16
    ids, flag, cnt = (torch.empty(s, dtype=torch.int32, device="meta") for s in ((7, 32), (7,), (7,)))
    o, dst = torch.empty((7, 32, 48), device="meta"), torch.empty((4096, 48), device="meta")
    like = jit_like(kern, kv=kv, ids=ids, flag=flag, o=o, dst=dst, cnt=cnt)
    div = like["divisible"]
    assert like["index_type"] == "int32"
    assert div("kv") and div("kv_size_0") and div("kv_size_1") and not div("kv_stride_0")
    assert div("ids_size_1") and not div("ids_size_0") and div("o_stride_0") and div("o_stride_1")
    assert not div("flag_size_0") and not div("no_such_argument")
    cpu = torch.zeros(64, dtype=torch.float32)
    assert not jit_like(kern, kv=cpu[1:].view(9, 7))["divisible"]("kv")          # 4 bytes off alignment
    big = base.as_strided((2, 48), (1 << 30, 1))               # two rows 2^30 elements apart
    assert jit_like(kern, kv=big, ids=ids)["index_type"] == "int64"          # one wide tensor: all offsets
    assert jit_like(kern, kv=base.as_strided((2, 48), ((1 << 30) - 48, 1)))["index_type"] == "int32"
    one = jit_like(kern, flag=torch.empty((1,), dtype=torch.int32, device="meta"), ids=ids)["ones"]
    assert "flag_size_0" in one and "ids_size_0" not in one       # the JIT compiles a 1 as a constant


@pytest.mark.skipif(MODE != "interpret", reason="on a GPU the kernels run as the JIT builds them")
def test_jit_like_options_compile_for_hopper(tmp_path):
    """compile_for_gpu with jit_like's options (divisible facts, a size of 1 as a constant, int64
    offsets) builds for sm_90, and the facts reach the code: the build with them differs from the
    build without."""
    from hopper import run_compiler_script
    script = (
        "import pathlib, sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_triton_target as m\n"
        "from k31dsl.targets.triton.aot import compile_for_gpu, jit_like\n"
        "kern = m.gather_rows.ir()\n"
        "t = dict(kv=torch.empty((1 << 25, 48), device='meta'), ids=torch.empty((1, 32), dtype=torch.int32, device='meta'),\n"
        "         flag=torch.empty((1,), dtype=torch.int32, device='meta'), o=torch.empty((1, 32, 48), device='meta'),\n"
        "         dst=torch.empty((1 << 25, 48), device='meta'), cnt=torch.empty((1,), dtype=torch.int32, device='meta'))\n"
        "like = jit_like(kern, **t)\n"
        f"folder = pathlib.Path({str(tmp_path)!r})\n"
        "a = compile_for_gpu(kern, folder, arch=90, **like).asm['cubin']\n"
        "b = compile_for_gpu(kern, folder, arch=90).asm['cubin']\n"
        "print(like['index_type'], 'flag_size_0' in like['ones'], bool(a) and bool(b), a != b)\n")
    assert run_compiler_script(script, TRITON_DEFAULT_FP_FUSION="0").split() == ["int64", "True", "True", "True"]


def test_gpu_code_works_around_triton_36_miscompiles():
    # what the H200 got wrong from Triton 3.6 (tests/program_fuzz.py seeds in NOTES, 3 Dec), as the
    # gpu-mode source must avoid it: a narrow integer load's nonzero fill is selected after the load
    # (3.6 filled vectorised i8 lanes with the fill's 32-bit pattern); integer min / max operands pass
    # an identity PRMT (ptxas dropped a negation folded into VIMNMX3); integer abs is shift-xor-sub;
    # a float's bits narrowed to 8 bits pass the same PRMT
    from k31dsl.targets.triton.emit import emit
    from test_target_semantics import narrow_fills, narrow_transposes, negated_extremes, reread_stores, wrapping_abs
    fills = emit(narrow_fills.ir(), mode="gpu")
    loads = [line.strip().split(" = ", 1)[1] for line in fills.splitlines() if "tl.load(" in line]
    assert len(loads) == 4, loads         # where Triton may vectorise (a stride it made 1): load, then select
    assert all(text.startswith("(tl.where(") and " if _may_vectorise(" in text for text in loads), loads
    assert all(text.split(" else ")[0].count("other=") == 0 for text in loads), loads
    extremes = emit(negated_extremes.ir(), mode="gpu")
    reductions = [line for line in extremes.splitlines() if "tl.max(" in line or "tl.min(" in line]
    assert len(reductions) == 4 and all("prmt.b32" in line for line in reductions), reductions
    assert "abs.s32" not in emit(wrapping_abs.ir(), mode="gpu")
    # a float's bits narrowed to a byte pass an identity PRMT (ptxas converted the float, seed 312814)
    narrows = [line for line in emit(narrow_transposes.ir(), mode="gpu").splitlines() if ".to(tl.int8)" in line]
    assert len(narrows) == 2 and sum("prmt.b32" in line for line in narrows) == 1, narrows
    assert "prmt" not in emit(negated_extremes.ir(), mode="interpret")      # the interpreter needs none
    # a min / max operand that holds no negation keeps ptxas's fused form: no PRMT
    plain = [line for line in emit(split_scale_maxima.ir(), mode="gpu").splitlines()
             if "tl.max(" in line or "tl.maximum(" in line]
    assert len(plain) == 4 and sum("prmt.b32" in line for line in plain) == 2, plain
    assert "prmt.b32" in [line for line in plain if "tl.max(" in line][-1], plain    # a sum of negations
    # a store of a value an earlier op reads stores a copy (Triton 3.6's layout pass, seed 400748)
    stores = [line for line in emit(reread_stores.ir(), mode="gpu").splitlines() if "tl.store(" in line]
    copied = [line.split("tl.store(")[1].split(",")[0] for line in stores if "mov.b" in line]
    assert copied == ["oi + oi_off_1", "oh + oh_off", "ob + ob_off_1"], stores
    assert '"=h,h"' in stores[3] and "tl.int32" in stores[5], stores
    assert "mov.b" not in emit(reread_stores.ir(), mode="interpret")


@k.kernel
def split_scale_maxima(s: k.Tensor[k.u8, "R", "G"], o: k.Tensor[k.i32, "R", "G"], BR: k.constexpr = 32):
    # the paged indexer's scale split: maxima of loaded bytes and of a value less a constant need no
    # PRMT; the maximum of a difference of two values, or of a sum of negations (LLVM may make
    # either a negation), keeps it
    for i in k.grid(k.cdiv(s.shape[0], BR)):
        eb = s[k.span(i * BR, BR), k.span(0, 4)].to(k.i32)
        top = k.max(eb, axis=1)
        o[k.span(i * BR, BR), k.span(0, 4)] = (k.maximum(eb, top[:, None] - 126) + k.maximum(eb - top[:, None], -3)
                                               + k.max(k.sum(-eb, axis=1))[None, None])

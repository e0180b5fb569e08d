"""Language coverage: small kernels written the way an op author would write them, each run on
the numpy target and on the triton target (interpreter) and compared with an fp64 NumPy
reference written from the math. Shapes are ragged on purpose (not multiples of the tiles)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

import k31dsl as k

NEG_INF = float("-inf")


TARGETS = ["numpy", "triton"]


def close(got, want, rtol=1e-4):
    """fp32 results against an fp64 reference: relative to the output's magnitude."""
    got = np.asarray(got, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


# ---------------------------------------------------------------- (a) chunked scan with a state

@k.kernel
def chunk_retention(q: k.Tensor[k.f32, "B", "T", "K"], kk: k.Tensor[k.f32, "B", "T", "K"],
                    v: k.Tensor[k.f32, "B", "T", "V"], o: k.Tensor[k.f32, "B", "T", "V"],
                    state: k.Tensor[k.f32, "B", "K", "V"], log2g: k.f32,
                    BT: k.constexpr = 16, BK: k.constexpr = 32, BV: k.constexpr = 16):
    """o_t = sum_{s<=t} g^(t-s) (q_t . k_s) v_s, computed chunk by chunk with the state
    S = sum_s g^(t0-1-s) k_s^T v_s carried across chunks; the final S is stored."""
    for b, iv in k.grid(q.shape[0], k.cdiv(v.shape[2], BV)):
        B, T, K = q.shape
        i = k.arange(BT)
        causal = i[:, None] >= i[None, :]
        within = k.exp2((i[:, None] - i[None, :]).to(k.f32) * log2g)
        S = k.zeros((BK, BV), k.f32)
        for c in range(k.cdiv(T, BT)):
            t0 = c * BT
            n = k.minimum(T - t0, BT)                      # rows of this chunk
            qc = q[b, k.span(t0, BT, other=0.0), k.span(0, BK, other=0.0)]
            kc = kk[b, k.span(t0, BT, other=0.0), k.span(0, BK, other=0.0)]
            vc = v[b, k.span(t0, BT, other=0.0), k.span(iv * BV, BV, other=0.0)]
            att = k.where(causal, k.dot(qc, kc.T) * within, 0.0)
            q_decay = k.exp2((i + 1).to(k.f32) * log2g)
            oc = k.dot(qc * q_decay[:, None], S) + k.dot(att, vc)
            o[b, k.span(t0, BT), k.span(iv * BV, BV)] = oc
            k_decay = k.exp2((n - 1 - i).to(k.f32) * log2g)
            S = S * k.exp2(n * log2g) + k.dot((kc * k_decay[:, None]).T, vc)
        state[b, k.span(0, BK), k.span(iv * BV, BV)] = S


def retention_ref(q, kk, v, g):
    B, T, K = q.shape
    o = np.zeros((B, T, v.shape[2]))
    S = np.zeros((B, K, v.shape[2]))
    for t in range(T):
        S = g * S + kk[:, t, :, None] * v[:, t, None, :]
        o[:, t] = np.einsum("bk,bkv->bv", q[:, t], S)
    return o, S


@pytest.mark.parametrize("target", TARGETS)
def test_chunked_scan_with_carried_state(target):
    rng = np.random.default_rng()
    B, T, K, V = 2, 37, 20, 24           # T, K, V ragged against BT=16, BK=32, BV=16
    q, kk = rng.standard_normal((2, B, T, K)).astype(np.float32)
    v = rng.standard_normal((B, T, V)).astype(np.float32)
    g = float(rng.uniform(0.8, 0.97))
    o = torch.full((B, T, V), float("nan"))
    st = torch.full((B, K, V), float("nan"))
    chunk_retention[target](torch.from_numpy(q), torch.from_numpy(kk), torch.from_numpy(v), o, st,
                            float(np.log2(g)))
    o_ref, s_ref = retention_ref(q.astype(np.float64), kk.astype(np.float64), v.astype(np.float64), g)
    close(o.numpy(), o_ref)
    close(st.numpy(), s_ref)


# ---------------------------------------------------------------- (b) causal tile matmul

def make_causal_matmul(dt):
    """One kernel per input dtype (the dtype is a closure variable of the annotations)."""
    @k.kernel
    def causal_matmul(q: k.Tensor[dt, "M", "D"], kk: k.Tensor[dt, "N", "D"],
                      v: k.Tensor[dt, "N", "E"], o: k.Tensor[k.f32, "M", "E"],
                      BM: k.constexpr = 32, BN: k.constexpr = 16, BD: k.constexpr = 32,
                      BE: k.constexpr = 32):
        """o[m] = sum_{n <= m} (q[m] . k[n]) v[n]: key blocks stop at the diagonal, the diagonal
        blocks are masked with a row >= column comparison."""
        for i in k.grid(k.cdiv(q.shape[0], BM)):
            rows = i * BM + k.arange(BM)
            qi = q[k.span(i * BM, BM, other=0.0), k.span(0, BD, other=0.0)]
            acc = k.zeros((BM, BE), k.f32)
            last = k.minimum((i + 1) * BM, kk.shape[0])
            for j in range(k.cdiv(last, BN)):
                cols = j * BN + k.arange(BN)
                kj = kk[k.span(j * BN, BN, other=0.0), k.span(0, BD, other=0.0)]
                vj = v[k.span(j * BN, BN, other=0.0), k.span(0, BE, other=0.0)]
                s = k.where(rows[:, None] >= cols[None, :], k.dot(qi, kj.T), 0.0)
                acc += k.dot(s.to(vj.dtype), vj)
            o[k.span(i * BM, BM), k.span(0, BE)] = acc
    return causal_matmul


CAUSAL = {"f32": (make_causal_matmul(k.f32), torch.float32, 1e-4),
          "bf16": (make_causal_matmul(k.bf16), torch.bfloat16, 2e-2)}


@pytest.mark.parametrize("dtype", sorted(CAUSAL))
@pytest.mark.parametrize("target", TARGETS)
def test_causal_masked_tile_matmul(target, dtype):
    kern, tdt, tol = CAUSAL[dtype]
    rng = np.random.default_rng()
    M, N, D, E = 45, 41, 24, 20
    q, kk, v = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)).to(tdt)
                for s in ((M, D), (N, D), (N, E)))
    o = torch.full((M, E), float("nan"))
    kern[target](q, kk, v, o)
    s = q.double().numpy() @ kk.double().numpy().T
    s *= np.arange(M)[:, None] >= np.arange(N)[None, :]
    close(o.numpy(), s @ v.double().numpy(), rtol=tol)


# ---------------------------------------------------------------- (c) cumsum feeding exp2

@k.kernel
def cumulative_decay(g: k.Tensor[k.f32, "T", "D"], fwd: k.Tensor[k.f32, "T", "D"],
                     bwd: k.Tensor[k.f32, "T", "D"], BT: k.constexpr = 16, BD: k.constexpr = 16):
    """fwd = 2^(prefix sums of g along T); bwd = 2^(suffix sums of g within each chunk of BT)."""
    for d in k.grid(k.cdiv(g.shape[1], BD)):
        carry = k.zeros((BD,), k.f32)
        for c in range(k.cdiv(g.shape[0], BT)):
            gc = g[k.span(c * BT, BT, other=0.0), k.span(d * BD, BD, other=0.0)]
            fwd[k.span(c * BT, BT), k.span(d * BD, BD)] = k.exp2(k.cumsum(gc, axis=0) + carry[None, :])
            bwd[k.span(c * BT, BT), k.span(d * BD, BD)] = k.exp2(k.cumsum(gc, axis=0, reverse=True))
            carry += k.sum(gc, axis=0)


@pytest.mark.parametrize("target", TARGETS)
def test_cumsum_feeds_exp2(target):
    rng = np.random.default_rng()
    T, D, BT = 45, 23, 16
    g = rng.uniform(-0.3, 0.05, (T, D)).astype(np.float32)
    fwd, bwd = torch.full((T, D), float("nan")), torch.full((T, D), float("nan"))
    cumulative_decay[target](torch.from_numpy(g), fwd, bwd)
    g64 = g.astype(np.float64)
    close(fwd.numpy(), np.exp2(np.cumsum(g64, axis=0)))
    want = np.empty_like(g64)
    for c0 in range(0, T, BT):
        part = g64[c0:c0 + BT]
        want[c0:c0 + BT] = np.exp2(np.cumsum(part[::-1], axis=0)[::-1])
    close(bwd.numpy(), want)


# ---------------------------------------------------------------- (d) gather + online softmax

@k.kernel
def sparse_attention(q: k.Tensor[k.f32, "T", "H", "D"], kv: k.Tensor[k.f32, "N", "D"],
                     idx: k.Tensor[k.i32, "T", "TOPK"], o: k.Tensor[k.f32, "T", "H", "D"],
                     lse: k.Tensor[k.f32, "T", "H"], scale: k.f32,
                     BH: k.constexpr = 16, BD: k.constexpr = 64, BK: k.constexpr = 16):
    """Each token attends (all heads, one shared KV row set) to the rows `idx[t]` names; -1 and
    out-of-range entries are skipped. Softmax is computed online over blocks of BK indices."""
    for t in k.grid(q.shape[0]):
        qt = q[t, k.span(0, BH, other=0.0), k.span(0, BD, other=0.0)]
        m = k.full((BH,), NEG_INF, k.f32)
        l = k.zeros((BH,), k.f32)
        acc = k.zeros((BH, BD), k.f32)
        for j in range(k.cdiv(idx.shape[1], BK)):
            ids = idx[t, k.span(j * BK, BK, other=-1)]
            ok = (ids >= 0) & (ids < kv.shape[0])
            rows = kv[ids, k.span(0, BD, other=0.0)]            # gathered [BK, BD]
            s = k.where(ok[None, :], k.dot(qt, rows.T) * scale, NEG_INF)
            m_new = k.maximum(m, k.max(s, axis=1))
            m_use = k.where(m_new == NEG_INF, 0.0, m_new)       # rows with nothing seen yet
            p = k.exp(s - m_use[:, None])
            alpha = k.exp(m - m_use)
            l = l * alpha + k.sum(p, axis=1)
            acc = acc * alpha[:, None] + k.dot(p, rows)
            m = m_new
        o[t, k.span(0, BH), k.span(0, BD)] = k.where(l[:, None] > 0.0, acc / l[:, None], 0.0)
        lse[t, k.span(0, BH)] = m + k.log(l)


def sparse_attention_ref(q, kv, idx, scale):
    T, H, D = q.shape
    o, lse = np.zeros((T, H, D)), np.full((T, H), -np.inf)
    for t in range(T):
        sel = [int(i) for i in idx[t] if 0 <= i < kv.shape[0]]
        if not sel:
            continue
        rows = kv[sel]
        s = q[t] @ rows.T * scale
        mx = s.max(axis=1, keepdims=True)
        e = np.exp(s - mx)
        o[t] = e @ rows / e.sum(axis=1, keepdims=True)
        lse[t] = mx[:, 0] + np.log(e.sum(axis=1))
    return o, lse


@pytest.mark.parametrize("target", TARGETS)
def test_gather_with_online_softmax(target):
    rng = np.random.default_rng()
    T, H, D, N, TOPK = 5, 12, 40, 50, 37
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    kv = rng.standard_normal((N, D)).astype(np.float32)
    idx = np.stack([rng.permutation(N)[:TOPK] for _ in range(T)]).astype(np.int32)
    idx[rng.random((T, TOPK)) < 0.2] = -1
    idx[1, 3] = N + 4                     # out of range: must be skipped, not clamped
    idx[2, :] = -1                        # a token with no valid row: o = 0, lse = -inf
    o = torch.full((T, H, D), float("nan"))
    lse = torch.full((T, H), float("nan"))
    scale = float(D ** -0.5)
    sparse_attention[target](*map(torch.from_numpy, (q, kv, idx)), o, lse, scale)
    o_ref, lse_ref = sparse_attention_ref(q.astype(np.float64), kv.astype(np.float64), idx, scale)
    close(o.numpy(), o_ref)
    assert np.all(np.isneginf(lse.numpy()[2]))
    close(lse.numpy(), lse_ref)


# ---------------------------------------------------------------- (e) streamed running top-k

@k.kernel
def streaming_topk(x: k.Tensor[k.f32, "R", "L"], vals: k.Tensor[k.f32, "R", "K"],
                   pos: k.Tensor[k.i32, "R", "K"], K: k.constexpr = 16, BL: k.constexpr = 32):
    """Per row: the K largest values (descending) and their positions, keeping a running top-K
    and merging each block's own top-K into it."""
    for r in k.grid(x.shape[0]):
        best = k.full((K,), NEG_INF, k.f32)
        best_pos = k.full((K,), -1, k.i32)
        for j in range(k.cdiv(x.shape[1], BL)):
            cols = j * BL + k.arange(BL)
            block = x[r, k.span(j * BL, BL, other=NEG_INF)]
            bv, bi = k.topk(block, K)
            cand_v = k.cat(best, bv)
            cand_p = k.cat(best_pos, k.take(cols, bi))
            best, sel = k.topk(cand_v, K)
            best_pos = k.take(cand_p, sel)
        vals[r, k.span(0, K)] = best
        pos[r, k.span(0, K)] = best_pos


@pytest.mark.parametrize("target", TARGETS)
def test_streamed_running_topk(target):
    rng = np.random.default_rng()
    R, L, K = 6, 83, 16
    x = rng.standard_normal((R, L)).astype(np.float32)
    vals = torch.full((R, K), float("nan"))
    pos = torch.full((R, K), -7, dtype=torch.int32)
    streaming_topk[target](torch.from_numpy(x), vals, pos)
    order = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :K]
    np.testing.assert_array_equal(pos.numpy(), order)
    np.testing.assert_array_equal(vals.numpy(), np.take_along_axis(x, order, axis=1))


# ---------------------------------------------------------------- (f) a tuple of tiles carried by a range loop

@k.kernel
def row_sums_and_squares(x: k.Tensor[k.f32, "R", "L"], out: k.Tensor[k.f32, "R", "2"], R: k.constexpr = 3,
                         BL: k.constexpr = 16):
    """Per row r < R (rows unrolled): sum and sum of squares, each row's two accumulators one
    element of a tuple that the range() loop carries (one loop value per element)."""
    for _ in k.grid(1):
        acc = ()
        for r in k.static_range(R):
            acc = acc + (k.zeros((BL,), k.f32), k.zeros((BL,), k.f32))
        for j in range(k.cdiv(x.shape[1], BL)):
            nxt = ()
            for r in k.static_range(R):
                xr = x[r, k.span(j * BL, BL, other=0.0)]
                nxt = nxt + (acc[2 * r] + xr, acc[2 * r + 1] + xr * xr)
            acc = nxt
        for r in k.static_range(R):
            out[r, 0] = k.sum(acc[2 * r])
            out[r, 1] = k.sum(acc[2 * r + 1])


@pytest.mark.parametrize("target", TARGETS)
def test_tuple_of_tiles_carried_by_a_range_loop(target):
    x = np.random.default_rng().standard_normal((3, 45)).astype(np.float32)
    out = torch.full((3, 2), float("nan"))
    row_sums_and_squares[target](torch.from_numpy(x), out)
    xd = x.astype(np.float64)
    close(out.numpy(), np.stack([xd.sum(1), (xd * xd).sum(1)], axis=1))

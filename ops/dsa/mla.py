"""MLA glue around sparse_mla_attention (docs/model.md, DSA sublayer): the RoPE table, the
absorbed query, the latent KV row (RMSNorm + rope) and the per-head output projection.

Latent width 512, rope 64 dims with the NeoX half split: pair (i, i + 32) turns by angle
pos * theta^(-2i/64), with the tables cos/sin fp32 [T, 32] gathered per token (the same tables
the indexer prolog takes, ops/dsa/prolog.py).

The kernels have no sin/cos op to call: `sincos` reduces the fp32 angle by pi/2 in three
Cody-Waite parts (each product exact for quadrant counts below 2^12) and evaluates Taylor
polynomials on [-pi/4, pi/4] (truncation error < 1e-9). The angle itself is an fp32 product, so
at position p the table is off by about p * 2^-24 radians, as any fp32 RoPE table is.
"""
from __future__ import annotations

import math

import numpy as np

import k31dsl as k
from k31dsl.ops.common import FLOAT_INPUTS, int32_tensor
from k31dsl.ops.dsa.prolog import dot_mixed

LATENT = 512
ROPE = 64
HALF = 32


def _split_pio2() -> tuple[float, float, float]:
    """pi/2 as hi + mid + lo fp32 values, hi and mid with 12 significant bits."""
    def top12(v):
        m, e = math.frexp(v)
        return math.ldexp(math.floor(m * 4096) / 4096, e)
    hi = top12(math.pi / 2)
    mid = top12(math.pi / 2 - hi)
    lo = float(np.float32(math.pi / 2 - hi - mid))
    return hi, mid, lo


PIO2_HI, PIO2_MID, PIO2_LO = _split_pio2()
TWO_OVER_PI = 2 / math.pi


@k.func
def sincos(a):
    """(sin a, cos a) of an fp32 tile."""
    q = k.floor(a * TWO_OVER_PI + 0.5)
    r = a - q * PIO2_HI
    r = r - q * PIO2_MID
    r = r - q * PIO2_LO
    quad = q.to(k.i32) & 3
    r2 = r * r
    s = r * (1.0 + r2 * (-1 / 6 + r2 * (1 / 120 + r2 * (-1 / 5040 + r2 * (1 / 362880 + r2 * (-1 / 39916800))))))
    c = 1.0 + r2 * (-0.5 + r2 * (1 / 24 + r2 * (-1 / 720 + r2 * (1 / 40320 + r2 * (-1 / 3628800
                                                                                    + r2 * (1 / 479001600))))))
    sin = k.where(quad == 0, s, k.where(quad == 1, c, k.where(quad == 2, -s, -c)))
    cos = k.where(quad == 0, c, k.where(quad == 1, -s, k.where(quad == 2, -c, s)))
    return sin, cos


@k.func
def rope_halves(x1, x2, cos, sin, t0, BT):
    """NeoX rope of the halves x1 = x[:32], x2 = x[32:] (fp32 [BT, 32]) for tokens [t0, t0 + BT)."""
    c = cos[k.span(t0, BT), k.span(0, HALF, other=1.0)]
    s = sin[k.span(t0, BT), k.span(0, HALF, other=0.0)]
    return x1 * c - x2 * s, x2 * c + x1 * s


# ---------------------------------------------------------------- kernels

@k.kernel(configs=[{"BT": 64}, {"BT": 128}, {"BT": 16}])
def rope_table_rows(pos: k.Tensor[k.i32, "T"], cos: k.Tensor[k.f32, "T", "32"], sin: k.Tensor[k.f32, "T", "32"],
                    theta: k.f32, BT: k.constexpr = 64):
    for pt in k.grid(k.cdiv(pos.shape[0], BT)):
        p = pos[k.span(pt * BT, BT, other=0)].to(k.f32)
        freq = k.exp2(k.arange(0, HALF).to(k.f32) * (k.log2(theta) * (-1.0 / HALF)))
        s, c = sincos(p[:, None] * freq[None, :])
        cos[k.span(pt * BT, BT), k.span(0, HALF)] = c
        sin[k.span(pt * BT, BT), k.span(0, HALF)] = s


# BT tokens x BL latent columns of one head per program; DN in steps of BK.
MLA_Q_CONFIGS = [{"BT": 32, "BL": 128, "BK": 64, "num_warps": 4}, {"BT": 64, "BL": 128, "BK": 64, "num_warps": 4},
                 {"BT": 128, "BL": 128, "BK": 64, "num_warps": 8}, {"BT": 16, "BL": 256, "BK": 64, "num_warps": 4},
                 {"BT": 64, "BL": 256, "BK": 32, "num_warps": 8}]


@k.kernel(configs=MLA_Q_CONFIGS)
def mla_q_rows(q: k.Tensor["QT", "T", "H", "DQ"], w_uk: k.Tensor["WT", "H", "DN", "512"],
               cos: k.Tensor[k.f32, "T", "32"], sin: k.Tensor[k.f32, "T", "32"], out: k.Tensor["OT", "T", "H", "576"],
               QT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
               OT: k.constexpr[FLOAT_INPUTS] = k.bf16, BT: k.constexpr = 32, BL: k.constexpr = 128,
               BK: k.constexpr = 64):
    # out[:, h, :512] = q[:, h, :DN] @ w_uk[h]; out[:, h, 512:] = rope(q[:, h, DN:]) (stored by
    # the programs of the first latent block).
    for pt, h, pl in k.grid(k.cdiv(q.shape[0], BT), q.shape[1], LATENT // BL):
        t0 = pt * BT
        l0 = pl * BL
        dn = w_uk.shape[1]
        acc = k.zeros((BT, BL), k.f32)
        for kk in range(k.cdiv(dn, BK)):
            lanes = (kk * BK + k.arange(0, BK) < dn)[None, :]
            qt = k.load(q, (k.span(t0, BT), h, k.span(kk * BK, BK)), mask=lanes, other=0.0)
            wt = w_uk[h, k.span(kk * BK, BK, other=0.0), k.span(l0, BL)]
            acc += dot_mixed(qt, wt, QT, WT)
        out[k.span(t0, BT), h, k.span(l0, BL)] = acc.to(OT)
        x1 = q[k.span(t0, BT), h, k.span(dn, HALF, other=0.0)].to(k.f32)
        x2 = q[k.span(t0, BT), h, k.span(dn + HALF, HALF, other=0.0)].to(k.f32)
        r1, r2 = rope_halves(x1, x2, cos, sin, t0, BT)
        first = pl == 0
        k.store(out, (k.span(t0, BT), h, k.span(LATENT, HALF)), r1.to(OT), mask=first)
        k.store(out, (k.span(t0, BT), h, k.span(LATENT + HALF, HALF)), r2.to(OT), mask=first)


@k.kernel(configs=[{"BT": 8}, {"BT": 16}, {"BT": 4}, {"BT": 32}])
def mla_kv_rows(kv: k.Tensor["XT", "T", "576"], norm_w: k.Tensor["WT", "512"], cos: k.Tensor[k.f32, "T", "32"],
                sin: k.Tensor[k.f32, "T", "32"], latent: k.Tensor["LT", "T", "512"], k_rope: k.Tensor["RT", "T", "64"],
                eps: k.f32, XT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                LT: k.constexpr[FLOAT_INPUTS] = k.bf16, RT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                BT: k.constexpr = 8):
    # latent = rmsnorm(kv[:, :512]) * norm_w; k_rope = rope(kv[:, 512:]).
    for pt in k.grid(k.cdiv(kv.shape[0], BT)):
        t0 = pt * BT
        c = kv[k.span(t0, BT), k.span(0, LATENT, other=0.0)].to(k.f32)
        r = k.rsqrt(k.sum(c * c, axis=1) * (1.0 / LATENT) + eps)
        wt = norm_w[k.span(0, LATENT)].to(k.f32)
        latent[k.span(t0, BT), k.span(0, LATENT)] = (c * r[:, None] * wt[None, :]).to(LT)
        x1 = kv[k.span(t0, BT), k.span(LATENT, HALF, other=0.0)].to(k.f32)
        x2 = kv[k.span(t0, BT), k.span(LATENT + HALF, HALF, other=0.0)].to(k.f32)
        r1, r2 = rope_halves(x1, x2, cos, sin, t0, BT)
        k_rope[k.span(t0, BT), k.span(0, HALF)] = r1.to(RT)
        k_rope[k.span(t0, BT), k.span(HALF, HALF)] = r2.to(RT)


# BT tokens x BD value columns of one head per program; the 512 latent dims in steps of BK.
MLA_OUT_CONFIGS = [{"BT": 32, "BD": 64, "BK": 128, "num_warps": 4}, {"BT": 64, "BD": 128, "BK": 64, "num_warps": 4},
                   {"BT": 128, "BD": 128, "BK": 64, "num_warps": 8}, {"BT": 16, "BD": 64, "BK": 128, "num_warps": 4},
                   {"BT": 64, "BD": 64, "BK": 128, "num_warps": 4}]


@k.kernel(configs=MLA_OUT_CONFIGS)
def mla_out_rows(o: k.Tensor["OT", "T", "H", "512"], w_uv: k.Tensor["WT", "H", "DV", "512"],
                 y: k.Tensor["YT", "T", "H * DV"], OT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                 WT: k.constexpr[FLOAT_INPUTS] = k.bf16, YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                 BT: k.constexpr = 32, BD: k.constexpr = 64, BK: k.constexpr = 128):
    # y[:, h*DV + d] = o[:, h] . w_uv[h, d]; columns past DV are masked (they belong to head h+1).
    for pt, h, pd in k.grid(k.cdiv(o.shape[0], BT), o.shape[1], k.cdiv(w_uv.shape[1], BD)):
        t0 = pt * BT
        d0 = pd * BD
        dv = w_uv.shape[1]
        acc = k.zeros((BT, BD), k.f32)
        for kk in range(LATENT // BK):
            ot = o[k.span(t0, BT, other=0.0), h, k.span(kk * BK, BK)]
            wt = w_uv[h, k.span(d0, BD, other=0.0), k.span(kk * BK, BK)]
            acc += dot_mixed(ot, wt.T, OT, WT)
        lanes = (d0 + k.arange(0, BD) < dv)[None, :]
        k.store(y, (k.span(t0, BT), k.span(h * dv + d0, BD)), acc.to(YT), mask=lanes)


# ---------------------------------------------------------------- public functions

def _shape(op: str, name: str, t, want):
    from k31dsl.dsl.errors import K31Error
    if tuple(t.shape) != tuple(want):
        raise K31Error(f"{op}: `{name}` must have shape {list(want)}, got {list(t.shape)}")


def _tables(op: str, cos, sin, t: int):
    from k31dsl.ops.common import require_tensor
    for name, tab in (("cos", cos), ("sin", sin)):
        require_tensor(op, name, tab, (k.f32,))
        _shape(op, name, tab, (t, HALF))
    return cos.contiguous(), sin.contiguous()


def rope_table(positions, theta: float = 10000.0, *, target: str | None = None):
    """(cos, sin) fp32 [T, 32] of positions [T] (int32/int64): angle pos * theta^(-2i/64)."""
    import torch
    from k31dsl.dsl.errors import K31Error
    from k31dsl.ops.common import resolve_target
    op = "rope_table"
    target = resolve_target(target)
    pos = int32_tensor(op, "positions", positions, 1)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 1:
        raise K31Error(f"{op}: theta must be a finite number > 1, got {theta!r}")
    cos = torch.empty((pos.shape[0], HALF), dtype=torch.float32, device=pos.device)
    sin = torch.empty_like(cos)
    if pos.numel():
        rope_table_rows[target](pos, cos, sin, float(theta))
    return cos, sin


def mla_absorb_q(q, w_uk, cos, sin, out_dtype=None, *, target: str | None = None):
    """The absorbed MLA query: q [T, H, DN + 64], w_uk [H, DN, 512] -> [T, H, 576] with
    [:, h, :512] = q[:, h, :DN] @ w_uk[h] and [:, h, 512:] = rope(q[:, h, DN:]) (cos/sin [T, 32]).
    out_dtype defaults to q.dtype (sparse_mla_attention takes bf16 or fp32)."""
    import torch
    from k31dsl.dsl.errors import K31Error
    from k31dsl.ops.common import require_tensor, resolve_target
    from k31dsl.ops.nn import _out_dtype
    op = "mla_absorb_q"
    target = resolve_target(target)
    require_tensor(op, "q", q, FLOAT_INPUTS, 3)
    require_tensor(op, "w_uk", w_uk, FLOAT_INPUTS, 3)
    if q.dim() != 3 or q.shape[2] <= ROPE:
        raise K31Error(f"{op}: `q` must be [T, H, DN + {ROPE}] with DN >= 1, got {list(q.shape)}")
    t, h, dq = q.shape
    _shape(op, "w_uk", w_uk, (h, dq - ROPE, LATENT))
    cos, sin = _tables(op, cos, sin, t)
    out = torch.empty((t, h, LATENT + ROPE), dtype=_out_dtype(op, out_dtype, q.dtype), device=q.device)
    if out.numel():
        mla_q_rows[target](q.contiguous(), w_uk.contiguous(), cos, sin, out)
    return out


def mla_kv(kv, norm_w, cos, sin, eps: float = 1e-6, out_dtype=None, *, target: str | None = None):
    """The MLA key row: kv [T, 576] -> (latent [T, 512] = rmsnorm(kv[:, :512]) * norm_w,
    k_rope [T, 64] = rope(kv[:, 512:])), both in out_dtype (default kv.dtype)."""
    import torch
    from k31dsl.ops.common import require_tensor, resolve_target
    from k31dsl.ops.nn import _eps, _out_dtype
    op = "mla_kv"
    target = resolve_target(target)
    require_tensor(op, "kv", kv, FLOAT_INPUTS, 2)
    require_tensor(op, "norm_w", norm_w, FLOAT_INPUTS)
    t = kv.shape[0]
    _shape(op, "kv", kv, (t, LATENT + ROPE))
    _shape(op, "norm_w", norm_w, (LATENT,))
    cos, sin = _tables(op, cos, sin, t)
    eps = _eps(op, eps)
    dt = _out_dtype(op, out_dtype, kv.dtype)
    latent = torch.empty((t, LATENT), dtype=dt, device=kv.device)
    k_rope = torch.empty((t, ROPE), dtype=dt, device=kv.device)
    if t:
        mla_kv_rows[target](kv.contiguous(), norm_w.contiguous(), cos, sin, latent, k_rope, eps)
    return latent, k_rope


def mla_out(o, w_uv, out_dtype=None, *, target: str | None = None):
    """Per-head value up-projection: o [T, H, 512], w_uv [H, DV, 512] -> y [T, H * DV] with
    y[:, h*DV:(h+1)*DV] = o[:, h] @ w_uv[h]^T, in out_dtype (default o.dtype)."""
    import torch
    from k31dsl.dsl.errors import K31Error
    from k31dsl.ops.common import require_tensor, resolve_target
    from k31dsl.ops.nn import _out_dtype
    op = "mla_out"
    target = resolve_target(target)
    require_tensor(op, "o", o, FLOAT_INPUTS, 3)
    require_tensor(op, "w_uv", w_uv, FLOAT_INPUTS, 3)
    if o.dim() != 3 or o.shape[2] != LATENT:
        raise K31Error(f"{op}: `o` must be [T, H, {LATENT}], got {list(o.shape)}")
    t, h, _ = o.shape
    if w_uv.dim() != 3 or w_uv.shape[0] != h or w_uv.shape[2] != LATENT:
        raise K31Error(f"{op}: `w_uv` must be [{h}, DV, {LATENT}], got {list(w_uv.shape)}")
    dv = w_uv.shape[1]
    y = torch.empty((t, h * dv), dtype=_out_dtype(op, out_dtype, o.dtype), device=o.device)
    if y.numel():
        mla_out_rows[target](o.contiguous(), w_uv.contiguous(), y)
    return y


# ---------------------------------------------------------------- checks against the oracle

def rope_table_tol(max_pos: int) -> float:
    """Absolute error bound of an fp32 table: the fp32 angle (and frequency) roundings grow with
    the position (~pos * 2^-25 measured, bound 2^-23), plus the polynomial's ~1e-7."""
    return 1e-6 + max_pos * 2.0 ** -23


def _check_rope_table(target: str, seed: int = 0):
    import numpy as np
    import torch
    from k31dsl.ops.registry import CaseResult
    from k31dsl.ops.testing import device_for, load_oracle
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    for t, hi, theta in ((37, 5000, 10000.0), (5, 41, 50000.0), (70, 1 << 17, 10000.0)):
        pos = torch.randint(0, hi, (t,), generator=g, dtype=torch.int32)
        pos[0] = 0
        cos, sin = rope_table(pos.to(dev), theta, target=target)
        wc, ws = ref.rope_table(pos.numpy(), theta)
        err = max(float(np.abs(cos.cpu().double().numpy() - wc).max()), float(np.abs(sin.cpu().double().numpy() - ws).max()))
        tol = rope_table_tol(int(pos.max()))
        out.append(CaseResult(f"T={t} positions < {hi} theta={theta:g}", err, tol, bool(err <= tol),
                              "max abs err of cos and sin (fp32 angle)"))
    return out


def _tables_for(ref, t: int, g):
    """fp32 cos/sin tables of random positions, from the oracle (the kernels' rope input)."""
    import torch
    pos = torch.randint(0, 4096, (t,), generator=g)
    c, s = ref.rope_table(pos.numpy(), 10000.0)
    return torch.from_numpy(c).float(), torch.from_numpy(s).float()


def _check_absorb_q(target: str, seed: int = 0):
    import torch
    from k31dsl.ops.testing import device_for, dtype_names, for_target, load_oracle, rand, result, to_f64
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    cases = ((5, 3, 40, torch.bfloat16, None), (37, 2, 100, torch.float32, None), (3, 1, 16, torch.bfloat16, torch.float32))
    for t, h, dn, dt, odt in for_target(target, cases):
        q, w_uk = rand((t, h, dn + ROPE), g, dt), rand((h, dn, LATENT), g, dt, dn ** -0.5)
        cos, sin = _tables_for(ref, t, g)
        o = mla_absorb_q(q.to(dev), w_uk.to(dev), cos.to(dev), sin.to(dev), odt, target=target)
        want = ref.mla_absorb_q(to_f64(q), to_f64(w_uk), cos.double().numpy(), sin.double().numpy())
        name = f"q=[{t}, {h}, {dn}+64] {dtype_names(dt, o.dtype)}"
        out.append(result(name + ": latent", o[..., :LATENT], want[..., :LATENT], o.dtype))
        out.append(result(name + ": rope", o[..., LATENT:], want[..., LATENT:], o.dtype))
    return out


def _check_mla_kv(target: str, seed: int = 0):
    import torch
    from k31dsl.ops.testing import device_for, dtype_names, for_target, load_oracle, rand, result, to_f64
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    for t, dt, odt in for_target(target, ((7, torch.bfloat16, None), (20, torch.float32, None),
                                          (1, torch.float16, torch.float32))):
        kv = rand((t, LATENT + ROPE), g, dt, 2.0)
        w = (1 + 0.5 * torch.randn(LATENT, generator=g)).to(dt)
        cos, sin = _tables_for(ref, t, g)
        lat, kr = mla_kv(kv.to(dev), w.to(dev), cos.to(dev), sin.to(dev), 1e-6, odt, target=target)
        want_l, want_r = ref.mla_kv(to_f64(kv), to_f64(w), cos.double().numpy(), sin.double().numpy(), 1e-6)
        name = f"kv=[{t}, 576] {dtype_names(dt, lat.dtype)}"
        out += [result(name + ": latent", lat, want_l, lat.dtype), result(name + ": k_rope", kr, want_r, kr.dtype)]
    return out


def _check_mla_out(target: str, seed: int = 0):
    import torch
    from k31dsl.ops.testing import device_for, dtype_names, for_target, load_oracle, rand, result, to_f64
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    cases = ((5, 3, 24, torch.bfloat16, torch.bfloat16), (37, 2, 100, torch.float32, torch.float32),
             (2, 2, 16, torch.bfloat16, torch.float32))
    for t, h, dv, dt, wdt in for_target(target, cases):
        o, w_uv = rand((t, h, LATENT), g, dt), rand((h, dv, LATENT), g, wdt, LATENT ** -0.5)
        y = mla_out(o.to(dev), w_uv.to(dev), target=target)
        out.append(result(f"o=[{t}, {h}, 512] w_uv=[{h}, {dv}, 512] {dtype_names(dt, wdt, y.dtype)}", y,
                          ref.mla_out(to_f64(o), to_f64(w_uv)), y.dtype))
    return out


def _register():
    from k31dsl.ops.registry import OpSpec, register
    register(OpSpec("rope_table", "dsa", rope_table, [rope_table_rows],
                    "RoPE cos/sin tables [T, 32] fp32 of positions (NeoX, 64 rope dims)", _check_rope_table,
                    tags=["dsa", "rope"]))
    register(OpSpec("mla_absorb_q", "dsa", mla_absorb_q, [mla_q_rows],
                    "absorbed MLA query [T, H, 576]: q_nope @ w_uk per head, rope(q_pe)", _check_absorb_q,
                    tags=["dsa", "mla"]))
    register(OpSpec("mla_kv", "dsa", mla_kv, [mla_kv_rows],
                    "MLA key row: rmsnorm(latent 512) * w, rope(64)", _check_mla_kv, tags=["dsa", "mla"]))
    register(OpSpec("mla_out", "dsa", mla_out, [mla_out_rows],
                    "MLA value up-projection per head: o_h @ w_uv_h^T -> [T, H * DV]", _check_mla_out,
                    tags=["dsa", "mla"]))


_register()

"""Dense layers of the K31 model (docs/model.md): linear (+ activation), SwiGLU, token embedding,
the KDA short convolution with its conv state, and the KDA output norm + gate.

Every kernel works on rows (leading dims flattened), is generic over its tensors' dtypes (dtype
constexprs bound at each call) and computes in fp32. Layouts are the model's: weights are torch
Linear `[out, in]`, so `linear_rows` computes x @ w^T; the conv state is fp32
`[slots, 3, C]` (the last 3 pre-conv inputs, oldest first), one slot per sequence.
"""
from __future__ import annotations

import math

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, int32_tensor, next_pow2, require_dtype_arg, require_tensor, resolve_target, \
    rows
from k31dsl.ops.dsa.prolog import dot_mixed

ACTS = ("none", "sigmoid", "silu")
CONV = 4            # short-conv kernel; the state keeps CONV - 1 = 3 inputs

# ---------------------------------------------------------------- linear

# BM x BN output tile per program, K in steps of BK. The first config is the default (CPU,
# interpreter, graph calls without tuning). The large ones are the usual Hopper bf16 GEMM tiles
# for M = 32768, K = N = 2048 (128 x 128 / 128 x 256, 3-4 stages, 8 warps); the BM = 16 / 32
# ones serve decode (M = 1..64), where the weight read dominates and more programs along N
# keep all 132 SMs streaming.
LINEAR_CONFIGS = [
    {"BM": 64, "BN": 64, "BK": 64, "num_warps": 4, "num_stages": 3},
    {"BM": 128, "BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3},
    {"BM": 128, "BN": 256, "BK": 64, "num_warps": 8, "num_stages": 3},
    {"BM": 128, "BN": 128, "BK": 64, "num_warps": 4, "num_stages": 4},
    {"BM": 256, "BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3},
    {"BM": 64, "BN": 128, "BK": 64, "num_warps": 4, "num_stages": 4},
    {"BM": 16, "BN": 64, "BK": 128, "num_warps": 4, "num_stages": 4},
    {"BM": 16, "BN": 32, "BK": 256, "num_warps": 4, "num_stages": 3},
    {"BM": 32, "BN": 64, "BK": 128, "num_warps": 4, "num_stages": 4},
    {"BM": 64, "BN": 32, "BK": 128, "num_warps": 4, "num_stages": 4},
    {"BM": 16, "BN": 32, "BK": 128, "num_warps": 4, "num_stages": 4},
    {"BM": 32, "BN": 32, "BK": 128, "num_warps": 4, "num_stages": 4},
    {"BM": 128, "BN": 64, "BK": 64, "num_warps": 4, "num_stages": 3},
]
SM_COUNT = 132              # H200


def gpu_linear_tiles(m: int, n: int = 2048, kdim: int = 2048) -> dict:
    """Tiles of linear_rows for a graph call on a GPU (graph programs are not autotuned), by the
    problem's rows, features and reduction length; each tile set is a LINEAR_CONFIGS entry, so
    its warps and stages come with it. SPLIT > 1 means the split-K form (linear_rows_splitk
    into fp32 partials [SPLIT, M, N], then linear_splitk_reduce).

    Decode (m <= 16) is a weight stream: 32-wide N blocks and enough K splits that >= ~4 programs
    per SM each keep a few 8 KB weight tiles in flight (one 2048 x 2048 bf16 weight = 64 N blocks
    x 8 splits = 512 programs of 2 K steps). The split is capped so the fp32 partials stay under
    half the weight's bytes. Prefill uses 128 x 128 x 64 (8 warps, 3 stages)."""
    if m > 64:
        bn = 128 if n > 64 else 64
        return {"BM": 128, "BN": bn, "BK": 64, "SPLIT": 1}
    tiles = {"BM": 16, "BN": 32, "BK": 128}
    if m > 16:
        # H200 run of 13:00 UTC, M = 64: the split form cost 6.3 µs + 18.7 µs in the reduce per
        # 2048 x 2048 weight (1.96 ms of a 5.5 ms step). Without a split, 16-row blocks give
        # m/16 x n/32 programs (256 here) and the weight's re-reads hit L2.
        return {**tiles, "SPLIT": 1}
    bm = 16
    programs = -(-n // 32) * -(-m // bm)
    k_steps = -(-kdim // 128)
    split = 1
    while split * 2 <= k_steps // 2 and programs * split < 4 * SM_COUNT \
            and (split * 2) * m * n * 4 <= n * kdim:            # partials <= half the bf16 weight
        split *= 2
    return {**tiles, "SPLIT": split}


@k.func
def activate(v, ACT):
    """The fp32 result with the linear layer's activation."""
    if ACT == "sigmoid":
        return k.sigmoid(v)
    if ACT == "silu":
        return v * k.sigmoid(v)
    return v


@k.kernel(configs=LINEAR_CONFIGS)
def linear_rows(x: k.Tensor["XT", "M", "K"], w: k.Tensor["WT", "N", "K"], y: k.Tensor["YT", "M", "N"],
                XT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                YT: k.constexpr[FLOAT_INPUTS] = k.bf16, ACT: k.constexpr[ACTS] = "none",
                BM: k.constexpr = 64, BN: k.constexpr = 64, BK: k.constexpr = 64):
    # One program: rows [m0, m0 + BM) x output features [n0, n0 + BN), fp32 accumulator. The
    # N blocks are the fastest grid axis: the programs resident at once share a few row blocks
    # of x and sweep the whole weight, so both stay in L2 (prefill, M = 32768: x is read from
    # HBM once instead of once per N block).
    for pn, pm in k.grid(k.cdiv(w.shape[0], BN), k.cdiv(x.shape[0], BM)):
        m0 = pm * BM
        n0 = pn * BN
        acc = k.zeros((BM, BN), k.f32)
        for kk in range(k.cdiv(x.shape[1], BK)):
            a = x[k.span(m0, BM), k.span(kk * BK, BK, other=0.0)]
            b = w[k.span(n0, BN), k.span(kk * BK, BK, other=0.0)]
            acc += dot_mixed(a, b.T, XT, WT)
        y[k.span(m0, BM), k.span(n0, BN)] = activate(acc, ACT).to(YT)


@k.kernel(configs=LINEAR_CONFIGS)
def linear_rows_splitk(x: k.Tensor["XT", "M", "K"], w: k.Tensor["WT", "N", "K"], part: k.Tensor[k.f32, "S", "M", "N"],
                       XT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                       BM: k.constexpr = 64, BN: k.constexpr = 64, BK: k.constexpr = 64):
    # Split-K for few rows (decode): program (pn, pm, s) sums K chunk s (a whole number of BK
    # steps; the last chunks may be short or empty) into part[s]; linear_splitk_reduce adds
    # the S partials. More programs than N blocks alone give: the weight streams at bandwidth.
    for pn, pm, s in k.grid(k.cdiv(w.shape[0], BN), k.cdiv(x.shape[0], BM), part.shape[0]):
        m0 = pm * BM
        n0 = pn * BN
        steps = k.cdiv(k.cdiv(x.shape[1], BK), part.shape[0])     # BK steps per chunk
        acc = k.zeros((BM, BN), k.f32)
        for kk in range(steps):
            k0 = (s * steps + kk) * BK
            a = x[k.span(m0, BM), k.span(k0, BK, other=0.0)]
            b = w[k.span(n0, BN), k.span(k0, BK, other=0.0)]
            acc += dot_mixed(a, b.T, XT, WT)
        part[s, k.span(m0, BM), k.span(n0, BN)] = acc


@k.kernel(configs=[{"BM": 16, "BN": 128}, {"BM": 64, "BN": 128}])
def linear_splitk_reduce(part: k.Tensor[k.f32, "S", "M", "N"], y: k.Tensor["YT", "M", "N"], scale: k.f32,
                         YT: k.constexpr[FLOAT_INPUTS] = k.bf16, ACT: k.constexpr[ACTS] = "none",
                         BM: k.constexpr = 16, BN: k.constexpr = 128):
    # y = act(sum_s part[s] * scale) in YT (scale 1: a plain linear; the indexer's head
    # weights pass HI^-1/2).
    for pn, pm in k.grid(k.cdiv(y.shape[1], BN), k.cdiv(y.shape[0], BM)):
        acc = k.zeros((BM, BN), k.f32)
        for s in range(part.shape[0]):
            acc += part[s, k.span(pm * BM, BM, other=0.0), k.span(pn * BN, BN, other=0.0)]
        y[k.span(pm * BM, BM), k.span(pn * BN, BN)] = activate(acc * scale, ACT).to(YT)


# ---------------------------------------------------------------- swiglu

SWIGLU_CONFIGS = [{"BM": 4, "BF": 256}, {"BM": 8, "BF": 512}, {"BM": 2, "BF": 1024}, {"BM": 16, "BF": 128}]


@k.kernel(configs=SWIGLU_CONFIGS)
def swiglu_rows(x: k.Tensor["XT", "M", "2 * F"], y: k.Tensor["YT", "M", "F"],
                XT: k.constexpr[FLOAT_INPUTS] = k.bf16, YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                BM: k.constexpr = 4, BF: k.constexpr = 256):
    # y = silu(gate) * up, gate = x[:, :F], up = x[:, F:]. Gate lanes past F read up values;
    # their results fall outside y and are not stored.
    for pm, pf in k.grid(k.cdiv(x.shape[0], BM), k.cdiv(y.shape[1], BF)):
        f = y.shape[1]
        g = x[k.span(pm * BM, BM), k.span(pf * BF, BF, other=0.0)].to(k.f32)
        u = x[k.span(pm * BM, BM), k.span(f + pf * BF, BF, other=0.0)].to(k.f32)
        y[k.span(pm * BM, BM), k.span(pf * BF, BF)] = (g * k.sigmoid(g) * u).to(YT)


# ---------------------------------------------------------------- embedding

EMBED_CONFIGS = [{"BM": 4, "BD": 256}, {"BM": 8, "BD": 512}, {"BM": 16, "BD": 256}, {"BM": 2, "BD": 1024}]


@k.kernel(configs=EMBED_CONFIGS)
def embedding_rows(ids: k.Tensor[k.i32, "M"], table: k.Tensor["TT", "V", "D"], y: k.Tensor["YT", "M", "D"],
                   TT: k.constexpr[FLOAT_INPUTS] = k.bf16, YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                   BM: k.constexpr = 4, BD: k.constexpr = 256):
    # y[m] = table[ids[m]]; an id outside the table gives a zero row (the public function
    # refuses such ids before launching).
    for pm, pd in k.grid(k.cdiv(ids.shape[0], BM), k.cdiv(table.shape[1], BD)):
        idx = ids[k.span(pm * BM, BM, other=-1)]
        y[k.span(pm * BM, BM), k.span(pd * BD, BD)] = table[idx, k.span(pd * BD, BD, other=0.0)].to(YT)


# ---------------------------------------------------------------- short convolution (KDA)

# BT tokens x BC channels per program. The state rows are 1-D [BC] tiles loaded and stored with
# one layout, so each element of a slot's state is read and rewritten by the same thread.
CONV_CONFIGS = [{"BT": 16, "BC": 64}, {"BT": 32, "BC": 128}, {"BT": 64, "BC": 64}, {"BT": 16, "BC": 256},
                {"BT": 1, "BC": 128}, {"BT": 4, "BC": 256}]


@k.func
def conv_state_rows(state, slot, c0, BC, live=True):
    """The three stored inputs of a slot's channels [c0, c0 + BC) as fp32 [BC]; 0 for slot < 0,
    and not read at all where `live` is false."""
    s0 = k.load(state, (slot, 0, k.span(c0, BC)), mask=live, other=0.0)
    s1 = k.load(state, (slot, 1, k.span(c0, BC)), mask=live, other=0.0)
    s2 = k.load(state, (slot, 2, k.span(c0, BC)), mask=live, other=0.0)
    return s0, s1, s2


@k.func
def conv_input_row(x, n, r, c0, s0, s1, s2, BC):
    """Row r of concat(state, x[n]) (r in [-3, T)) as fp32 [BC]: the state for r < 0."""
    xr = x[n, r, k.span(c0, BC, other=0.0)].to(k.f32)          # r < 0 is out of bounds: 0
    return k.where(r >= 0, xr, k.where(r == -3, s0, k.where(r == -2, s1, s2)))


@k.func
def conv_tile(x, w, y, n, t0, c0, s0, s1, s2, BT, BC, YT):
    """y[n, t0:t0+BT, c0:c0+BC] = silu(sum_j w[:, j] * xx[t - 3 + j])."""
    acc = k.zeros((BT, BC), k.f32)
    r = t0 + k.arange(0, BT)
    for j in k.static_range(4):
        rj = r - 3 + j
        xv = x[n, k.span(t0 - 3 + j, BT, other=0.0), k.span(c0, BC, other=0.0)].to(k.f32)
        xv = xv + k.where((rj == -3)[:, None], s0[None, :], 0.0) + k.where((rj == -2)[:, None], s1[None, :], 0.0) \
            + k.where((rj == -1)[:, None], s2[None, :], 0.0)
        wj = w[k.span(c0, BC, other=0.0), j].to(k.f32)
        acc += wj[None, :] * xv
    y[n, k.span(t0, BT), k.span(c0, BC)] = (acc * k.sigmoid(acc)).to(YT)


@k.kernel(configs=CONV_CONFIGS)
def short_conv_rows(x: k.Tensor["XT", "N", "T", "C"], w: k.Tensor["WT", "C", "4"], state: k.Tensor[k.f32, "S", "3", "C"],
                    slots: k.Tensor[k.i32, "N"], y: k.Tensor["YT", "N", "T", "C"],
                    XT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                    YT: k.constexpr[FLOAT_INPUTS] = k.bf16, UPDATE: k.constexpr = True,
                    BT: k.constexpr = 16, BC: k.constexpr = 64):
    # Sequence n's rows are x[n] (T new inputs) after the 3 inputs held in state[slots[n]]; a
    # slot < 0 starts from zeros and keeps nothing. Programs split tokens (tiles of BT) and
    # channels. A tile starting before row 3 reads the state (the first tile only, unless BT < 3);
    # with UPDATE the first tile's program rewrites it, so when BT < 4 a later tile could read it
    # after the rewrite: then one program walks all tiles of its channel block in order (SEQ).
    SEQ = UPDATE and BT < 4
    n_tiles = 1 if SEQ else k.cdiv(x.shape[1], BT)
    for n, tb, cb in k.grid(x.shape[0], n_tiles, k.cdiv(x.shape[2], BC)):
        c0 = cb * BC
        slot = slots[n]
        first = tb == 0
        s0, s1, s2 = conv_state_rows(state, slot, c0, BC, tb * BT < 3)
        if SEQ:
            for tt in range(k.cdiv(x.shape[1], BT)):
                conv_tile(x, w, y, n, tt * BT, c0, s0, s1, s2, BT, BC, YT)
        else:
            conv_tile(x, w, y, n, tb * BT, c0, s0, s1, s2, BT, BC, YT)
        if UPDATE:
            t = x.shape[1]
            n0 = conv_input_row(x, n, t - 3, c0, s0, s1, s2, BC)
            n1 = conv_input_row(x, n, t - 2, c0, s0, s1, s2, BC)
            n2 = conv_input_row(x, n, t - 1, c0, s0, s1, s2, BC)
            k.store(state, (slot, 0, k.span(c0, BC)), n0, mask=first)
            k.store(state, (slot, 1, k.span(c0, BC)), n1, mask=first)
            k.store(state, (slot, 2, k.span(c0, BC)), n2, mask=first)


@k.kernel(configs=[{"BC": 256}, {"BC": 512}, {"BC": 128}])
def short_conv_commit_rows(x: k.Tensor["XT", "N", "T", "C"], state: k.Tensor[k.f32, "S", "3", "C"],
                           slots: k.Tensor[k.i32, "N"], accepted: k.Tensor[k.i32, "N"],
                           XT: k.constexpr[FLOAT_INPUTS] = k.bf16, BC: k.constexpr = 256):
    # state[slots[n]] = the last 3 rows of concat(state[slots[n]], x[n, :accepted[n]]).
    for n, cb in k.grid(x.shape[0], k.cdiv(x.shape[2], BC)):
        c0 = cb * BC
        slot = slots[n]
        a = accepted[n]
        s0, s1, s2 = conv_state_rows(state, slot, c0, BC)
        n0 = conv_input_row(x, n, a - 3, c0, s0, s1, s2, BC)
        n1 = conv_input_row(x, n, a - 2, c0, s0, s1, s2, BC)
        n2 = conv_input_row(x, n, a - 1, c0, s0, s1, s2, BC)
        state[slot, 0, k.span(c0, BC)] = n0
        state[slot, 1, k.span(c0, BC)] = n1
        state[slot, 2, k.span(c0, BC)] = n2


# ---------------------------------------------------------------- KDA output norm + gate

HEAD_NORM_CONFIGS = [{"BM": 8}, {"BM": 16}, {"BM": 4}, {"BM": 32}]


@k.kernel(configs=HEAD_NORM_CONFIGS)
def head_norm_gate_rows(o: k.Tensor["OT", "M", "HV", "V"], w: k.Tensor["WT", "V"], gate: k.Tensor["GT", "M", "HV * V"],
                        y: k.Tensor["YT", "M", "HV * V"], eps: k.f32,
                        OT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                        GT: k.constexpr[FLOAT_INPUTS] = k.bf16, YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                        BM: k.constexpr = 8, BV: k.constexpr = 128):
    # One program: BM rows of head h (needs BV >= V). Gate and output columns of head h are
    # [h * V, h * V + V); lanes past V are masked so they never touch the next head.
    for pm, h in k.grid(k.cdiv(o.shape[0], BM), o.shape[1]):
        v = o.shape[2]
        m0 = pm * BM
        lanes = (k.arange(0, BV) < v)[None, :]
        ot = o[k.span(m0, BM), h, k.span(0, BV, other=0.0)].to(k.f32)
        r = k.rsqrt(k.sum(ot * ot, axis=1) / v.to(k.f32) + eps)
        wt = w[k.span(0, BV, other=0.0)].to(k.f32)
        g = k.load(gate, (k.span(m0, BM), k.span(h * v, BV)), mask=lanes, other=0.0).to(k.f32)
        k.store(y, (k.span(m0, BM), k.span(h * v, BV)), (ot * r[:, None] * wt[None, :] * k.sigmoid(g)).to(YT),
                mask=lanes)


# ---------------------------------------------------------------- public functions

def _shape(op: str, name: str, t, want):
    if tuple(t.shape) != tuple(want):
        raise K31Error(f"{op}: `{name}` must have shape {list(want)}, got {list(t.shape)}")


def _out_dtype(op: str, out_dtype, like):
    from k31dsl.dsl import dtypes as D
    return D.torch_dtype(require_dtype_arg(op, "out_dtype", like if out_dtype is None else out_dtype))


def _eps(op: str, eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise K31Error(f"{op}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def linear(x, w, act: str = "none", out_dtype=None, *, split_k: int = 1, target: str | None = None):
    """y = act(x @ w^T) with an fp32 accumulator: x [..., K], w [N, K] (torch Linear layout),
    act "none" | "sigmoid" | "silu"; returns [..., N] in out_dtype (default x.dtype).
    split_k > 1: the K range in that many chunks summed through fp32 partials (the decode form
    of the model's step graphs; same result up to fp32 summation order)."""
    import torch
    op = "linear"
    target = resolve_target(target)
    if isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise K31Error(f"{op}: split_k must be an int >= 1, got {split_k!r}")
    require_tensor(op, "x", x)
    require_tensor(op, "w", w, min_rank=2)
    if w.dim() != 2 or w.shape[1] != x.shape[-1]:
        raise K31Error(f"{op}: `w` must be [N, {x.shape[-1]}] (torch Linear layout [out, in]), got {list(w.shape)}")
    if act not in ACTS:
        raise K31Error(f"{op}: act must be one of {', '.join(map(repr, ACTS))}, got {act!r}")
    y = torch.empty(tuple(x.shape[:-1]) + (w.shape[0],), dtype=_out_dtype(op, out_dtype, x.dtype), device=x.device)
    if y.numel() == 0:
        return y
    if x.shape[-1] == 0:
        return y.zero_() if act == "none" else y.fill_(0.5 if act == "sigmoid" else 0.0)
    kw = {} if act == "none" else {"ACT": act}
    if split_k > 1:
        xr = rows(x)
        part = torch.empty((split_k, xr.shape[0], w.shape[0]), dtype=torch.float32, device=x.device)
        linear_rows_splitk[target](xr, w.contiguous(), part)
        linear_splitk_reduce[target](part, y.view(-1, w.shape[0]), 1.0, **kw)
        return y
    linear_rows[target](rows(x), w.contiguous(), y.view(-1, w.shape[0]), **kw)
    return y


def swiglu(x, out_dtype=None, *, target: str | None = None):
    """silu(x[..., :F]) * x[..., F:] for x [..., 2F]; returns [..., F]."""
    import torch
    op = "swiglu"
    target = resolve_target(target)
    require_tensor(op, "x", x)
    if x.shape[-1] % 2:
        raise K31Error(f"{op}: the last dim of `x` must be even (gate and up halves), got {x.shape[-1]}")
    f = x.shape[-1] // 2
    y = torch.empty(tuple(x.shape[:-1]) + (f,), dtype=_out_dtype(op, out_dtype, x.dtype), device=x.device)
    if y.numel():
        swiglu_rows[target](rows(x), y.view(-1, f))
    return y


def embedding(ids, table, out_dtype=None, *, target: str | None = None):
    """table[ids]: ids int32/int64 [...], table [V, D]; returns [..., D]. An id outside [0, V)
    is a K31Error."""
    import torch
    op = "embedding"
    target = resolve_target(target)
    require_tensor(op, "table", table, min_rank=2)
    if table.dim() != 2:
        raise K31Error(f"{op}: `table` must be [V, D], got {list(table.shape)}")
    flat = int32_tensor(op, "ids", ids).view(-1)
    v, d = table.shape
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= v):
        bad = flat[(flat < 0) | (flat >= v)][0]
        raise K31Error(f"{op}: token id {int(bad)} is outside the table's {v} rows",
                       hint="ids must be in [0, vocab_size)")
    y = torch.empty(tuple(ids.shape) + (d,), dtype=_out_dtype(op, out_dtype, table.dtype), device=table.device)
    if y.numel():
        embedding_rows[target](flat, table.contiguous(), y.view(-1, d))
    return y


def _conv_args(op, x, state, slots):
    require_tensor(op, "x", x, min_rank=3)
    if x.dim() != 3:
        raise K31Error(f"{op}: `x` must be [N, T, C] (sequences, tokens, channels), got {list(x.shape)}")
    require_tensor(op, "state", state, (k.f32,), 3)
    n, _, c = x.shape
    if state.dim() != 3 or tuple(state.shape[1:]) != (CONV - 1, c):
        raise K31Error(f"{op}: `state` must be fp32 [slots, {CONV - 1}, {c}] (the last {CONV - 1} inputs per "
                       f"slot), got {list(state.shape)}")
    if not state.is_contiguous():
        raise K31Error(f"{op}: `state` must be contiguous (it is updated in place)")
    sl = int32_tensor(op, "slots", slots, 1)
    if sl.shape[0] != n:
        raise K31Error(f"{op}: `slots` must have {n} entries (one per sequence), got {sl.shape[0]}")
    if sl.numel() and int(sl.max()) >= state.shape[0]:
        raise K31Error(f"{op}: slot {int(sl.max())} is past the state pool ({state.shape[0]} slots)",
                       hint="a negative slot means: no state (zeros in, nothing kept)")
    return sl


def short_conv(x, w, state, slots, update: bool = True, out_dtype=None, *, target: str | None = None):
    """KDA short convolution + SiLU: x [N, T, C] (N sequences of T new tokens), w [C, 4],
    state fp32 [S, 3, C] holding each slot's last 3 inputs (oldest first), slots [N] (< 0: no
    state). y[n, t] = silu(sum_j w[:, j] * xx[t + j]), xx = concat(state[slots[n]], x[n]).
    With update the last 3 rows of xx are written back to state[slots[n]] (in place).
    Returns y [N, T, C] in out_dtype (default x.dtype)."""
    import torch
    op = "short_conv"
    target = resolve_target(target)
    sl = _conv_args(op, x, state, slots)
    require_tensor(op, "w", w, min_rank=2)
    _shape(op, "w", w, (x.shape[2], CONV))
    y = torch.empty(x.shape, dtype=_out_dtype(op, out_dtype, x.dtype), device=x.device)
    n, t, c = x.shape
    if n == 0 or c == 0:
        return y
    kw = {} if update else {"UPDATE": False}
    short_conv_rows[target](x.contiguous(), w.contiguous(), state, sl, y, **kw)
    return y


def short_conv_commit(x, state, slots, accepted, *, target: str | None = None):
    """Set state[slots[n]] to the last 3 rows of concat(state[slots[n]], x[n, :accepted[n]]):
    after a verify step ran short_conv(update=False) on T draft tokens, keep the accepted ones.
    x [N, T, C], accepted [N] in [0, T]. Returns state (updated in place)."""
    op = "short_conv_commit"
    target = resolve_target(target)
    sl = _conv_args(op, x, state, slots)
    acc = int32_tensor(op, "accepted", accepted, 1)
    n, t, c = x.shape
    if acc.shape[0] != n:
        raise K31Error(f"{op}: `accepted` must have {n} entries (one per sequence), got {acc.shape[0]}")
    if acc.numel() and (int(acc.min()) < 0 or int(acc.max()) > t):
        raise K31Error(f"{op}: accepted counts must be in [0, {t}] (tokens per sequence), got "
                       f"{int(acc.min())} .. {int(acc.max())}")
    if n and c:
        short_conv_commit_rows[target](x.contiguous(), state, sl, acc)
    return state


def head_norm_gate(o, w, gate, eps: float = 1e-6, out_dtype=None, *, target: str | None = None):
    """KDA output norm + gate: y[..., h*V:(h+1)*V] = rmsnorm(o[..., h, :]) * w * sigmoid(gate[..., h*V:(h+1)*V]).
    o [..., HV, V], w [V], gate [..., HV*V]; returns [..., HV*V] in out_dtype (default gate.dtype)."""
    import torch
    op = "head_norm_gate"
    target = resolve_target(target)
    require_tensor(op, "o", o, min_rank=2)
    require_tensor(op, "w", w)
    require_tensor(op, "gate", gate)
    hv, v = o.shape[-2], o.shape[-1]
    _shape(op, "w", w, (v,))
    _shape(op, "gate", gate, tuple(o.shape[:-2]) + (hv * v,))
    eps = _eps(op, eps)
    y = torch.empty(gate.shape, dtype=_out_dtype(op, out_dtype, gate.dtype), device=gate.device)
    if y.numel() == 0:
        return y
    if v > 1024:
        raise K31Error(f"{op}: head dim {v} is above the kernel's one-tile limit of 1024")
    o3 = o.contiguous().view(-1, hv, v)
    head_norm_gate_rows[target](o3, w.contiguous(), rows(gate), y.view(-1, hv * v), eps, BV=max(16, next_pow2(v)))
    return y

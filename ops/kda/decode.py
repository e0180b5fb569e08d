"""KDA decode over an fp32 state pool: one fused kernel per step (L2 norm, gate, delta-rule
recurrence, output), T >= 1 tokens per sequence for speculative verification, and the replay
data plus a `kda_rollback` kernel that rebuilds the state at the accepted position.

Math (research/kda.md 1.1), per token t and value head, state S [K, V]:
    S' = Diag(exp(a_t)) S;  u_t = beta_t (v_t - S'^T k_t);  S = S' + k_t u_t^T;  o_t = S^T (scale q_t)
The kernel computes o_t = S'^T (scale q_t) + u_t (k_t . scale q_t) (the same value): both
reductions over K read S' and run side by side instead of one after the other.

Layout and work split (designed for bandwidth; decode moves 8 K V bytes of state per token-head
and does ~7 K V FLOPs): one program owns a (sequence, value head, V-tile) of the state, [BK, BV]
fp32 with BK = next_pow2(K) (the whole K axis: both reductions stay in the program), reads it once
from `state_pool[slots[n], hv]`, applies the T tokens in registers and writes it once.
`state_v_first=True` takes a [num_slots, HV, V, K] pool (K contiguous; the tile is [BV, BK]).

Rollback protocol (ReplaySSM-style, research 4.2). The checkpoint is the state *before* the
verify step. Recommended: verify with `kda_decode(..., save_replay=True, update_state=False)`, so
the pool rows keep the pre-step state (the checkpoint costs nothing and the verify only reads the
state), then `kda_rollback(pool, slots, None, replay, accepted)` replays the accepted prefix onto
the pool rows in place (one read + one write of the state). With `update_state=True` the pool
holds the state after all T tokens and the engine must have kept a copy of the pre-step rows
(`checkpoint` [N, HV, K, V], e.g. `state_pool[slots].clone()` before the verify).
The replay applies, for j < accepted[n], S = Diag(exp(g_j)) S + k_j u_j^T with the (k, u, g) the
verify kernel stored and the same operations in the same order, so the rebuilt state is the state
a decode of just the accepted tokens would have produced (bit-identical on the numpy target and
the Triton interpreter; the generated Triton launches without fp fusion by default, so on a GPU too
unless the compiler orders the ops differently). accepted[n] = 0 restores the checkpoint.
"""

from typing import NamedTuple

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, next_pow2, require_tensor, resolve_target
from k31dsl.ops.kda.gate import GATE_NONE, check_gate_params, gate_value
from k31dsl.ops.registry import CaseResult, OpSpec, register

L2_EPS = 1e-6          # x / sqrt(sum x^2 + eps), as fla's l2norm

# BV x num_warps per program. The first is the one used without autotuning (CPU, interpreter).
# Measured on an H200 (benchmarks/NOTES.md, KDA decode): at N >= 64 the tuner picks BV 64 / 4 warps
# for [K,V] and one-warp BV 8-16 tiles for [V,K] (in-warp K reductions, 4 barriers instead of 22,
# 11-12 programs per SM); the T = 4 verify picks BV 32 / 1 warp (run 29: 0.259 vs 0.314 ms at N = 64).
# PREFETCH=False: at T = 1 the prefetch only reloads the same token.
# Tried and taken out: BV 64 at 8 warps (run 16, N = 64 0.243 vs 0.229 ms), evict-first L2 hints
# on the state (KDA run 23: 1-6 % slower at every N).
# Graph-program calls are not tuned: they take the first entry their constexprs match, so the
# one-warp BV 16 entry without prefetch comes before the two-warp one (the model's decode at
# BV 16 / PREFETCH off: 41.9 -> ~38 us per layer, small preset N = 64; its verify, PREFETCH on,
# still gets the two-warp entry).
DECODE_CONFIGS = [{"BV": 32, "num_warps": 4}, {"BV": 16, "num_warps": 1, "PREFETCH": False},
                  {"BV": 16, "num_warps": 2}, {"BV": 64, "num_warps": 4},
                  {"BV": 128, "num_warps": 8}, {"BV": 64, "num_warps": 4, "PREFETCH": False},
                  {"BV": 32, "num_warps": 4, "PREFETCH": False},
                  {"BV": 16, "num_warps": 1}, {"BV": 8, "num_warps": 1}, {"BV": 32, "num_warps": 2},
                  {"BV": 32, "num_warps": 1}]
ROLLBACK_CONFIGS = [{"BV": 32, "num_warps": 4}, {"BV": 16, "num_warps": 2}, {"BV": 64, "num_warps": 4}]
SMALL_GRID = 8192       # programs at BV=64 below which the config is picked, not tuned (132 SMs x ~62)


def _small_grid_config(rows: int, vdim: int, device, tokens: int = 0) -> dict:
    """The pinned config on a GPU when rows (N * HV) x V-tiles of 64 is a small grid, {} elsewhere
    (the tuner, or the first config on a CPU). There the tuner's do_bench timings are host-bound
    noise (it once picked BV 128 at N = 16, 1.8 TB/s; KDA run 27 two warps, 70 vs 58 µs), so the
    grid gets the largest BV that still gives SMALL_GRID programs, else 16 (more programs in flight
    for a latency-bound step). tokens > 0 (the decode kernel): also the warps (one at BV 16) and
    PREFETCH (only when there is a next token); the rollback kernel tunes its warps."""
    if getattr(device, "type", "cpu") != "cuda" or rows * -(-vdim // 64) >= SMALL_GRID:
        return {}
    bv = 32 if rows * -(-vdim // 32) >= SMALL_GRID else 16
    if not tokens:
        return {"BV": bv}
    return {"BV": bv, "num_warps": 1 if bv == 16 else 4, "PREFETCH": tokens > 1}


class KDAReplay(NamedTuple):
    """Per-token replay data of a verify step (fp32): k [N, T, H, K] (after the L2 norm),
    u [N, T, HV, V] (the delta-rule update vector), g [N, T, HV, K] (natural-log decay)."""
    k: object
    u: object
    g: object


# ---------------------------------------------------------------- device helpers

@k.func
def l2_normalize(x, ON):
    if ON:
        return x * k.rsqrt(k.sum(x * x) + 1e-6)
    return x


@k.func
def log_decay(x, a_log, dt_bias, lower_bound, GATE):
    """Natural-log decay from the raw gate x (5a's gate_value); GATE_NONE: x already is the decay."""
    if GATE == GATE_NONE:
        return x
    return gate_value(x, a_log, dt_bias, lower_bound, GATE)


@k.func
def token_inputs(q, kk, g, v, beta, n, t, h, hv, pv, BK, BV):
    """One token's q, k, raw gate (f32 [BK]), v (f32 [BV], this V-tile) and beta (f32)."""
    return (q[n, t, h, k.span(0, BK, other=0.0)].to(k.f32), kk[n, t, h, k.span(0, BK, other=0.0)].to(k.f32),
            g[n, t, hv, k.span(0, BK, other=0.0)].to(k.f32), v[n, t, hv, k.span(pv * BV, BV, other=0.0)].to(k.f32),
            beta[n, t, hv].to(k.f32))


# ---------------------------------------------------------------- kernels

@k.kernel(configs=DECODE_CONFIGS)
def kda_decode_step(q: k.Tensor["XT", "N", "T", "H", "K"], kk: k.Tensor["XT", "N", "T", "H", "K"],
                    v: k.Tensor["XT", "N", "T", "HV", "V"], g: k.Tensor["GT", "N", "T", "HV", "K"],
                    beta: k.Tensor["BT", "N", "T", "HV"], pool: k.Tensor[k.f32, "S", "HV", "P2", "P3"],
                    slots: k.Tensor[k.i32, "N"], o: k.Tensor["XT", "N", "T", "HV", "V"],
                    a_log: k.Tensor[k.f32, "HV"], dt_bias: k.Tensor[k.f32, "HV", "K"],
                    rk: k.Tensor[k.f32, "RN", "RT", "RH", "RK"], ru: k.Tensor[k.f32, "RN", "RT", "RHV", "RV"],
                    rg: k.Tensor[k.f32, "RN", "RT", "RHV", "RK"], scale: k.f32, lower_bound: k.f32,
                    XT: k.constexpr[FLOAT_INPUTS] = k.bf16, GT: k.constexpr[FLOAT_INPUTS] = k.f32,
                    BT: k.constexpr[FLOAT_INPUTS] = k.f32, GATE: k.constexpr = 0, L2NORM: k.constexpr = True,
                    REPLAY: k.constexpr = False, UPDATE: k.constexpr = True, VFIRST: k.constexpr = False,
                    PREFETCH: k.constexpr = True, BK: k.constexpr = 128, BV: k.constexpr = 32):
    # one flat grid, V-tile fastest: the programs of one (sequence, head) run side by side and share
    # its q/k/g loads in L2 (a 2-D grid with the V-tile on axis 1 ran them ~4 waves apart and fetched
    # the inputs from DRAM once per V-tile: ncu, N = 64 [V,K], 443 MB of reads against 409 now)
    for pid in k.grid(q.shape[0] * v.shape[2] * k.cdiv(v.shape[3], BV)):
        nh = pid // k.cdiv(v.shape[3], BV)
        pv = pid % k.cdiv(v.shape[3], BV)
        nhv = v.shape[2]
        n = nh // nhv
        hv = nh % nhv
        group = nhv // q.shape[2]
        h = hv // group
        slot = slots[n]
        if VFIRST:          # pool [S, HV, V, K]: the tile is [BV, BK], K contiguous
            s = pool[slot, hv, k.span(pv * BV, BV, other=0.0), k.span(0, BK, other=0.0)]
        else:
            s = pool[slot, hv, k.span(0, BK, other=0.0), k.span(pv * BV, BV, other=0.0)]
        alog = 0.0
        dtb = k.zeros((BK,), k.f32)
        if GATE != 0:
            alog = a_log[hv]
            dtb = dt_bias[hv, k.span(0, BK, other=0.0)]
        last = q.shape[1] - 1
        if PREFETCH:
            qn, kn, gn, vn, bn = token_inputs(q, kk, g, v, beta, n, 0, h, hv, pv, BK, BV)
        for t in range(q.shape[1]):
            # the next token's inputs are loaded before this token's math (they do not depend on
            # the state), so their latency hides behind it; the last token reloads itself
            if PREFETCH:
                qr, kr, gr, vt, b = qn, kn, gn, vn, bn
                qn, kn, gn, vn, bn = token_inputs(q, kk, g, v, beta, n, k.minimum(t + 1, last), h, hv, pv, BK, BV)
            else:
                qr, kr, gr, vt, b = token_inputs(q, kk, g, v, beta, n, t, h, hv, pv, BK, BV)
            qt = l2_normalize(qr, L2NORM) * scale
            kt = l2_normalize(kr, L2NORM)
            a = log_decay(gr, alog, dtb, lower_bound, GATE)
            if VFIRST:
                s = s * k.exp(a)[None, :]
                u = b * (vt - k.sum(s * kt[None, :], axis=1))
                ot = k.sum(s * qt[None, :], axis=1) + u * k.sum(kt * qt)
                s = s + u[:, None] * kt[None, :]
            else:
                s = s * k.exp(a)[:, None]
                u = b * (vt - k.sum(s * kt[:, None], axis=0))
                ot = k.sum(s * qt[:, None], axis=0) + u * k.sum(kt * qt)
                s = s + kt[:, None] * u[None, :]
            o[n, t, hv, k.span(pv * BV, BV)] = ot.to(XT)
            if REPLAY:
                ru[n, t, hv, k.span(pv * BV, BV)] = u
                k.store(rg, (n, t, hv, k.span(0, BK)), a, mask=pv == 0)
                k.store(rk, (n, t, h, k.span(0, BK)), kt, mask=(pv == 0) & (hv % group == 0))
        if UPDATE and VFIRST:
            pool[slot, hv, k.span(pv * BV, BV), k.span(0, BK)] = s
        if UPDATE and not VFIRST:
            pool[slot, hv, k.span(0, BK), k.span(pv * BV, BV)] = s


@k.kernel(configs=ROLLBACK_CONFIGS)
def kda_replay_prefix(pool: k.Tensor[k.f32, "S", "HV", "P2", "P3"], slots: k.Tensor[k.i32, "N"],
                      ckpt: k.Tensor[k.f32, "C", "HV", "P2", "P3"], ckpt_rows: k.Tensor[k.i32, "N"],
                      rk: k.Tensor[k.f32, "N", "T", "H", "K"], ru: k.Tensor[k.f32, "N", "T", "HV", "V"],
                      rg: k.Tensor[k.f32, "N", "T", "HV", "K"], accepted: k.Tensor[k.i32, "N"],
                      VFIRST: k.constexpr = False, BK: k.constexpr = 128, BV: k.constexpr = 32):
    for pid in k.grid(rk.shape[0] * ru.shape[2] * k.cdiv(ru.shape[3], BV)):     # V-tile fastest, as the decode
        nh = pid // k.cdiv(ru.shape[3], BV)
        pv = pid % k.cdiv(ru.shape[3], BV)
        nhv = ru.shape[2]
        n = nh // nhv
        hv = nh % nhv
        h = hv // (nhv // rk.shape[2])
        if VFIRST:
            s = ckpt[ckpt_rows[n], hv, k.span(pv * BV, BV, other=0.0), k.span(0, BK, other=0.0)]
        else:
            s = ckpt[ckpt_rows[n], hv, k.span(0, BK, other=0.0), k.span(pv * BV, BV, other=0.0)]
        last = rk.shape[1] - 1
        an = rg[n, 0, hv, k.span(0, BK, other=0.0)]
        kn = rk[n, 0, h, k.span(0, BK, other=0.0)]
        un = ru[n, 0, hv, k.span(pv * BV, BV, other=0.0)]
        for t in range(k.minimum(accepted[n], rk.shape[1])):
            a, kt, u = an, kn, un                     # prefetch the next token, as the decode kernel
            an = rg[n, k.minimum(t + 1, last), hv, k.span(0, BK, other=0.0)]
            kn = rk[n, k.minimum(t + 1, last), h, k.span(0, BK, other=0.0)]
            un = ru[n, k.minimum(t + 1, last), hv, k.span(pv * BV, BV, other=0.0)]
            if VFIRST:                               # the decode kernel's operations, in its order
                s = s * k.exp(a)[None, :]
                s = s + u[:, None] * kt[None, :]
            else:
                s = s * k.exp(a)[:, None]
                s = s + kt[:, None] * u[None, :]
        if VFIRST:
            pool[slots[n], hv, k.span(pv * BV, BV), k.span(0, BK)] = s
        else:
            pool[slots[n], hv, k.span(0, BK), k.span(pv * BV, BV)] = s


# ---------------------------------------------------------------- host-side checks

# Multiply-add contraction for the decode and rollback kernels on Triton (the target's default
# rounds products and sums separately). sm_90a: the [K,V] kernel goes from 1344 to 1264 SASS per
# warp, but KDA run 22 (H200, same process order, tuner per setting) measured it slower: [K,V]
# N = 64 / 256 275 / 1076 µs with it against 234 / 910 without ([V,K] 227 / 882 either way);
# only the verify T = 4 + commit gained (501 against 521 µs at N = 64). So off; the switch stays for
# `benchmarks/kda_decode.py --fp-fusion on`.
FP_FUSION = False


def _fused(kernel, target: str):
    """The decode/rollback kernel for `target`, with multiply-add contraction on Triton when
    FP_FUSION is set (both kernels alike, so the replay's state update contracts as the decode's)."""
    return kernel.compile(target, fp_fusion=True) if target == "triton" and FP_FUSION else kernel[target]


def _shape_error(op, name, t, want, why=""):
    raise K31Error(f"{op}: `{name}` must have shape {want}{why}, got {list(t.shape)}")


def _require_f32_state(op, state_pool, v_first=False):
    """(HV, K, V) of an fp32 pool [num_slots, HV, K, V] ([num_slots, HV, V, K] when v_first)."""
    require_tensor(op, "state_pool", state_pool, (k.f32,))
    if state_pool.dim() != 4:
        layout = "[num_slots, HV, V, K]" if v_first else "[num_slots, HV, K, V]"
        raise K31Error(f"{op}: `state_pool` must be {layout} fp32, got shape {list(state_pool.shape)}")
    if not state_pool.is_contiguous():
        raise K31Error(f"{op}: `state_pool` must be contiguous (it is updated in place)",
                       hint="allocate the pool with torch.zeros(num_slots, HV, K, V, dtype=torch.float32)")
    _, hv, a, b = state_pool.shape
    return (hv, b, a) if v_first else (hv, a, b)


def _capturing() -> bool:
    import torch
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_index_vector(op, name, t, n, lo, hi, distinct=False):
    """An int32 [n] vector of values in [lo, hi) (checked on the host unless a CUDA graph is
    being captured: the check reads the data)."""
    import torch
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
        raise K31Error(f"{op}: `{name}` must be an int32 tensor of shape [{n}], got "
                       f"{getattr(t, 'dtype', type(t).__name__)}", hint=f"{name}.to(torch.int32)")
    if tuple(t.shape) != (n,):
        _shape_error(op, name, t, [n], " (one per sequence)")
    if n == 0 or _capturing():
        return
    vals = t.detach().to("cpu", torch.int64)
    bad = (vals < lo) | (vals >= hi)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise K31Error(f"{op}: `{name}`[{i}] = {int(vals[i])} is outside [{lo}, {hi - 1}]",
                       hint="slots index the state pool's first dim" if "slot" in name else
                       f"{name} counts accepted tokens, 0 .. T")
    if distinct and vals.unique().numel() != n:
        raise K31Error(f"{op}: `{name}` repeats a slot; two sequences would update the same state in place",
                       hint="give every sequence of the batch its own slot")


def _int32(t):
    import torch
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def _gate_mode(op, A_log, dt_bias, lower_bound, hv, kdim, device):
    """(GATE constexpr, a_log [HV] f32, dt_bias [HV, K] f32, lower bound) from the gate arguments:
    none of them -> g is the log decay; otherwise ops/kda/gate.py's rules (lower_bound in [-5, 0),
    A_log None -> exp(A_log) = 1, dt_bias None -> 0)."""
    import torch
    if A_log is None and dt_bias is None and lower_bound is None:
        z = torch.zeros(hv, dtype=torch.float32, device=device)
        return GATE_NONE, z, torch.zeros(hv, kdim, dtype=torch.float32, device=device), 0.0
    a, b, mode, lb = check_gate_params(op, hv, kdim, A_log, dt_bias, lower_bound)
    return mode, a.to(device), b.to(device), lb


def _check_decode_inputs(q, k_, v, g, beta, state_pool, slots, v_first):
    op = "kda_decode"
    for name, t in (("q", q), ("k", k_), ("v", v), ("g", g), ("beta", beta)):
        require_tensor(op, name, t)
    if q.dim() != 4:
        raise K31Error(f"{op}: `q` must be [N, T, H, K] (T >= 1 tokens per sequence), got shape {list(q.shape)}",
                       hint="for one token per sequence use q[:, None]")
    n, t, h, kdim = q.shape
    hv, ks, vdim = _require_f32_state(op, state_pool, v_first)
    if tuple(k_.shape) != tuple(q.shape):
        _shape_error(op, "k", k_, list(q.shape), " (like q)")
    if hv % h != 0:
        raise K31Error(f"{op}: the state pool has HV={hv} value heads, not a multiple of H={h} q/k heads")
    if ks != kdim:
        raise K31Error(f"{op}: `state_pool` has K={ks} but q has K={kdim}")
    if tuple(v.shape) != (n, t, hv, vdim):
        _shape_error(op, "v", v, [n, t, hv, vdim], " ([N, T, HV, V], HV and V from the state pool)")
    if tuple(g.shape) != (n, t, hv, kdim):
        _shape_error(op, "g", g, [n, t, hv, kdim], " ([N, T, HV, K], per value head and key channel)")
    if tuple(beta.shape) != (n, t, hv):
        _shape_error(op, "beta", beta, [n, t, hv])
    if not (q.dtype == k_.dtype == v.dtype):
        raise K31Error(f"{op}: q, k and v must share one dtype, got {q.dtype}, {k_.dtype}, {v.dtype}",
                       hint="convert them, e.g. v.to(q.dtype)")
    if t < 1:
        raise K31Error(f"{op}: T must be at least 1, got q of shape {list(q.shape)}")
    if kdim > 256 or vdim > 1024:
        raise K31Error(f"{op}: K={kdim}, V={vdim} too large (K <= 256 and V <= 1024: a program holds "
                       "the whole K axis of its state tile)")
    devs = {x.device for x in (q, k_, v, g, beta, state_pool, slots) if hasattr(x, "device")}
    if len(devs) > 1:
        raise K31Error(f"{op}: all tensors must be on one device, got {sorted(map(str, devs))}")
    _check_index_vector(op, "slots", slots, n, 0, state_pool.shape[0], distinct=True)
    return n, t, h, hv, kdim, vdim


# ---------------------------------------------------------------- public functions

def kda_decode(q, k, v, g, beta, state_pool, slots, *, scale=None, use_qk_l2norm=True, A_log=None,
               dt_bias=None, lower_bound=None, save_replay=None, update_state=True, state_v_first=False,
               target=None):
    """One fused KDA decode step over an fp32 state pool, updated in place.

    q, k: [N, T, H, K]; v: [N, T, HV, V]; g: [N, T, HV, K]; beta: [N, T, HV] (already sigmoid);
    state_pool: fp32 [num_slots, HV, K, V]; slots: int32 [N], distinct, the pool row of each
    sequence. T >= 1 tokens per sequence (T > 1: speculative verification). HV is a multiple of H
    (GVA: value head hv reads q/k head hv // (HV / H)).
    Gate: with none of A_log / dt_bias / lower_bound, g is the natural-log decay; otherwise g is
    the raw gate (ops/kda/gate.py): a = -exp(A_log[hv]) * softplus(g + dt_bias) (Kimi Linear), or
    with lower_bound in [-5, 0) a = lower_bound * sigmoid(exp(A_log[hv]) * (g + dt_bias)) (K3);
    A_log None means exp(A_log) = 1, dt_bias None means 0.
    dt_bias is [HV * K] or [HV, K]. scale defaults to K ** -0.5; q and k are L2-normalised in the kernel
    unless use_qk_l2norm=False.
    save_replay: None -> T > 1; True/False; or a KDAReplay of preallocated fp32 buffers to write
    (fixed addresses for CUDA graphs). update_state=False leaves the pool rows untouched (they
    then are the checkpoint of the rollback protocol; see the module docstring). state_v_first:
    the pool is [num_slots, HV, V, K] (K contiguous, the layout engines use for decode).
    slots (and kda_rollback's accepted) are range-checked on the host, a device sync, except while
    a CUDA graph is being captured (engines capture the step once, then replay it).
    Returns (o [N, T, HV, V] in q's dtype, KDAReplay or None)."""
    import torch
    target = resolve_target(target)
    n, t, h, hv, kdim, vdim = _check_decode_inputs(q, k, v, g, beta, state_pool, slots, state_v_first)
    gate, a_log, dtb, lb = _gate_mode("kda_decode", A_log, dt_bias, lower_bound, hv, kdim, q.device)
    scale = kdim ** -0.5 if scale is None else float(scale)
    replay = None
    if isinstance(save_replay, KDAReplay):
        replay = save_replay
        want = {"k": (n, t, h, kdim), "u": (n, t, hv, vdim), "g": (n, t, hv, kdim)}
        for name, shape in want.items():
            buf = getattr(replay, name)
            require_tensor("kda_decode", f"save_replay.{name}", buf, (D.f32,))
            if tuple(buf.shape) != shape or not buf.is_contiguous():
                _shape_error("kda_decode", f"save_replay.{name}", buf, list(shape), " (contiguous fp32)")
    elif not (save_replay is None or isinstance(save_replay, bool)):
        raise K31Error(f"kda_decode: save_replay must be None, a bool or a KDAReplay, got {type(save_replay).__name__}")
    elif save_replay or (save_replay is None and t > 1):
        f32 = dict(dtype=torch.float32, device=q.device)
        replay = KDAReplay(torch.empty(n, t, h, kdim, **f32), torch.empty(n, t, hv, vdim, **f32),
                           torch.empty(n, t, hv, kdim, **f32))
    o = torch.empty(n, t, hv, vdim, dtype=q.dtype, device=q.device)
    if n == 0:
        return o, replay
    dummy = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=q.device)
    rk, ru, rg = replay if replay is not None else (dummy, dummy, dummy)
    cx = {"BK": max(16, next_pow2(kdim))}
    if gate:
        cx["GATE"] = gate
    if not use_qk_l2norm:
        cx["L2NORM"] = False
    if replay is not None:
        cx["REPLAY"] = True
    if not update_state:
        cx["UPDATE"] = False
    if state_v_first:
        cx["VFIRST"] = True
    cx.update(_small_grid_config(n * hv, vdim, q.device, tokens=t))
    _fused(kda_decode_step, target)(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
                            state_pool, _int32(slots), o, a_log, dtb, rk, ru, rg, scale, lb, **cx)
    return o, replay


def kda_rollback(state_pool, slots, checkpoint, replay, accepted, *, state_v_first=False, target=None):
    """Rebuild each sequence's state at its accepted position: state_pool[slots[n]] = the
    checkpoint with the first accepted[n] tokens of `replay` applied (accepted[n] in 0..T).

    checkpoint: None -> the pool rows themselves hold the pre-verify state (the verify ran with
    update_state=False; recommended: the commit reads and writes the state once); or an fp32
    [N, HV, K, V] tensor with each sequence's pre-verify state (kept by the engine when the verify
    updated the pool). replay: the KDAReplay the verify returned. state_v_first: as in kda_decode.
    Updates state_pool in place and returns it."""
    import torch
    op = "kda_rollback"
    target = resolve_target(target)
    hv, ks, vdim = _require_f32_state(op, state_pool, state_v_first)
    if not isinstance(replay, KDAReplay):
        raise K31Error(f"{op}: `replay` must be the KDAReplay returned by kda_decode(..., save_replay=True), "
                       f"got {type(replay).__name__}")
    for name in ("k", "u", "g"):
        require_tensor(op, f"replay.{name}", getattr(replay, name), (k.f32,), min_rank=4)
    n, t, h, kdim = replay.k.shape
    if ks != kdim or tuple(replay.u.shape) != (n, t, hv, vdim) or tuple(replay.g.shape) != (n, t, hv, kdim):
        raise K31Error(f"{op}: replay shapes k {list(replay.k.shape)}, u {list(replay.u.shape)}, g "
                       f"{list(replay.g.shape)} do not match the state pool [.., {hv}, {ks}, {vdim}]",
                       hint="pass the replay of the verify step over this pool")
    _check_index_vector(op, "slots", slots, n, 0, state_pool.shape[0], distinct=True)
    _check_index_vector(op, "accepted", accepted, n, 0, t + 1)
    if checkpoint is None:
        ckpt, rows = state_pool, _int32(slots)
    else:
        require_tensor(op, "checkpoint", checkpoint, (k.f32,))
        want = (n, hv, vdim, kdim) if state_v_first else (n, hv, kdim, vdim)
        if tuple(checkpoint.shape) != want:
            _shape_error(op, "checkpoint", checkpoint, list(want), " (the pre-verify state of each sequence, "
                         "laid out like the pool)")
        ckpt, rows = checkpoint.contiguous(), torch.arange(n, dtype=torch.int32, device=state_pool.device)
    if n:
        _fused(kda_replay_prefix, target)(state_pool, _int32(slots), ckpt, rows, replay.k.contiguous(),
                                  replay.u.contiguous(), replay.g.contiguous(), _int32(accepted),
                                  BK=max(16, next_pow2(kdim)), **({"VFIRST": True} if state_v_first else {}),
                                  **_small_grid_config(n * hv, vdim, state_pool.device))
    return state_pool


# ---------------------------------------------------------------- checks against the oracle

def _rel(got, want) -> float:
    import numpy as np
    from k31dsl.ops.testing import to_f64
    want = np.asarray(want, np.float64)
    return float(np.abs(to_f64(got) - want).max() / max(float(np.abs(want).max()), 1e-30))


def _decode_case(g, dev, n, t, h, hv, kdim, vdim, num_slots, dtype, lb):
    import torch
    r = lambda *s: torch.randn(*s, generator=g)          # noqa: E731
    c = dict(q=r(n, t, h, kdim).to(dtype), k=r(n, t, h, kdim).to(dtype), v=r(n, t, hv, vdim).to(dtype),
             g=(r(n, t, hv, kdim) * 3).to(dtype), beta=torch.sigmoid(r(n, t, hv)))
    gate = dict(A_log=(r(hv) * 0.5).to(dev), dt_bias=r(hv * kdim).to(dev), lower_bound=lb)
    pool = r(num_slots, hv, kdim, vdim) * 0.5
    slots = torch.randperm(num_slots, generator=g)[:n].to(torch.int32)
    return {key: val.to(dev) for key, val in c.items()}, gate, pool, slots


def _check_decode(target: str, seed: int = 0) -> list:
    """T=1 (bf16, lower-bound gate, GVA) and T=3 (f32, softplus gate) against the recurrence."""
    import torch
    from k31dsl.ops.testing import device_for, load_oracle
    ref = load_oracle("kda")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, t, h, hv, kdim, vdim, dtype, lb in ((3, 1, 1, 2, 20, 40, torch.bfloat16, -5.0),
                                               (2, 3, 2, 2, 16, 24, torch.float32, None)):
        c, gate, pool, slots = _decode_case(g, dev, n, t, h, hv, kdim, vdim, 5, dtype, lb)
        new = pool.clone().to(dev)
        o, _ = kda_decode(c["q"], c["k"], c["v"], c["g"], c["beta"], new, slots.to(dev), target=target, **gate)
        want_o, want_s = ref.kda(c["q"], c["k"], c["v"], c["g"], c["beta"], initial_state=pool[slots.long()], **gate)
        name = f"N={n} T={t} H={h} HV={hv} K={kdim} V={vdim} {str(dtype)[6:]}, lower_bound={lb}"
        tol = 1e-4 if dtype == torch.float32 else 1e-2
        err_o, err_s = _rel(o, want_o), _rel(new.cpu()[slots.long()], want_s)
        out += [CaseResult(f"{name}: o", err_o, tol, err_o <= tol, "max |err| / max |o|"),
                CaseResult(f"{name}: state", err_s, 1e-4, err_s <= 1e-4, "max |err| / max |S|")]
    return out


def _check_rollback(target: str, seed: int = 0) -> list:
    """Verify T=3 with the pool as checkpoint, commit accepted = [2, 0, 3]: state == recurrence
    over the accepted prefix."""
    import torch
    from k31dsl.ops.testing import device_for, load_oracle
    ref = load_oracle("kda")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    c, gate, pool, slots = _decode_case(g, dev, 3, 3, 1, 2, 16, 24, 6, torch.float32, -5.0)
    new = pool.clone().to(dev)
    _, rep = kda_decode(c["q"], c["k"], c["v"], c["g"], c["beta"], new, slots.to(dev), save_replay=True,
                        update_state=False, target=target, **gate)
    accepted = [2, 0, 3]
    kda_rollback(new, slots.to(dev), None, rep, torch.tensor(accepted, dtype=torch.int32, device=dev), target=target)
    out = []
    for i, acc in enumerate(accepted):
        one = {key: val[i:i + 1, :acc] for key, val in c.items()}
        _, want_s = ref.kda(one["q"], one["k"], one["v"], one["g"], one["beta"],
                            initial_state=pool[slots[i:i + 1].long()], **gate)
        err = _rel(new.cpu()[slots[i].long()], want_s[0])
        out.append(CaseResult(f"T=3 verify, accepted={acc}: state", err, 1e-4, err <= 1e-4))
    return out


register(OpSpec(name="kda_decode", module="kda", fn=kda_decode, kernels=[kda_decode_step],
                summary="KDA decode: fused L2 norm + gate + delta rule + output over an fp32 state pool "
                        "(in place, T>=1 tokens, replay data for speculative verification)",
                check=_check_decode, tags=["kda"]))
register(OpSpec(name="kda_rollback", module="kda", fn=kda_rollback, kernels=[kda_replay_prefix],
                summary="KDA spec-decode rollback: replay the accepted prefix (k, u, g) onto the checkpoint",
                check=_check_rollback, tags=["kda"]))

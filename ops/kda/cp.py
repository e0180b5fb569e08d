"""Context-parallel building blocks for KDA (research/kda.md 3.1): a token range's affine summary
S_out = M S_in + E (fp32; M [K, K] = the product of the per-token transitions
(I - b_t k_t k_t^T) Diag(exp(a_t)), latest on the left; E = the state reached from S_in = 0), and
the in-order composition of the shards' summaries into every shard's initial state.

Summary kernel: the recurrence is linear in S, so M and E are one delta-rule recurrence over the
augmented state X = [M | E] ([K, K + V]) started from [I | 0] with "values" [0 | v_t]:
    X <- Diag(exp(a_t)) X;  u = b_t ([0 | v_t] - X^T k_t);  X <- X + k_t u^T
One program owns a (sequence, value head, column tile) of X; column c < K is a column of M,
c >= K the column c - K of E. The E columns read v with a span starting at c0 - K: lanes before
column K fall outside v and read 0, which is exactly the zero "value" of the M columns, and the
same masking splits the final store between M and E. Serial over the range's tokens: per token
and head 2 K (K + V) multiply-adds, the cost of one extra recurrent pass (research 3.3); a chunked
(WY) summary is the faster form for long shards.

Merge: S_0 = initial state, S_{r+1} = M_r S_r + E_r in fp32, one launch per shard (R launches,
stream-ordered), each a blocked [K, K] x [K, V] product per lead index.
"""

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, next_pow2, require_tensor, resolve_target
from k31dsl.ops.kda.decode import _gate_mode, _shape_error, l2_normalize, log_decay
from k31dsl.ops.registry import CaseResult, OpSpec, register


@k.func
def range_inputs(kk, g, v, beta, t, h, hv, v0, BK, BC):
    """Token t's k and raw gate (f32 [BK]), v on columns v0 .. v0 + BC (0 outside v) and beta."""
    return (kk[t, h, k.span(0, BK, other=0.0)].to(k.f32), g[t, hv, k.span(0, BK, other=0.0)].to(k.f32),
            v[t, hv, k.span(v0, BC, other=0.0)].to(k.f32), beta[t, hv].to(k.f32))


@k.kernel(configs=[{"BC": 32, "num_warps": 4}, {"BC": 64, "num_warps": 4}, {"BC": 16, "num_warps": 2}])
def kda_range_summary(kk: k.Tensor["XT", "TT", "H", "K"], v: k.Tensor["XT", "TT", "HV", "V"],
                      g: k.Tensor["GT", "TT", "HV", "K"], beta: k.Tensor["BT", "TT", "HV"],
                      bounds: k.Tensor[k.i32, "NB"], m: k.Tensor[k.f32, "NS", "HV", "K", "K"],
                      e: k.Tensor[k.f32, "NS", "HV", "K", "V"], a_log: k.Tensor[k.f32, "HV"],
                      dt_bias: k.Tensor[k.f32, "HV", "K"], lower_bound: k.f32,
                      XT: k.constexpr[FLOAT_INPUTS] = k.bf16, GT: k.constexpr[FLOAT_INPUTS] = k.f32,
                      BT: k.constexpr[FLOAT_INPUTS] = k.f32, GATE: k.constexpr = 0,
                      L2NORM: k.constexpr = True, BK: k.constexpr = 128, BC: k.constexpr = 32):
    for bh, pc in k.grid(m.shape[0] * v.shape[1], k.cdiv(kk.shape[2] + v.shape[2], BC)):
        nhv = v.shape[1]
        dk = kk.shape[2]
        b = bh // nhv
        hv = bh % nhv
        h = hv // (nhv // kk.shape[1])
        c0 = pc * BC
        rows = k.arange(BK)
        cols = c0 + k.arange(BC)
        x = k.where((rows[:, None] == cols[None, :]) & (cols[None, :] < dk), 1.0, 0.0)    # [I | 0]
        alog = 0.0
        dtb = k.zeros((BK,), k.f32)
        if GATE != 0:
            alog = a_log[hv]
            dtb = dt_bias[hv, k.span(0, BK, other=0.0)]
        t0 = bounds[b]
        t1 = bounds[b + 1]
        last = k.maximum(t1 - 1, 0)
        kn, gn, vn, bn = range_inputs(kk, g, v, beta, k.minimum(t0, last), h, hv, c0 - dk, BK, BC)
        for t in range(t0, t1):
            # prefetch the next token (its loads do not depend on x); the last one reloads itself
            kr, gr, vt, bt = kn, gn, vn, bn                              # vt: 0 on the M columns
            kn, gn, vn, bn = range_inputs(kk, g, v, beta, k.minimum(t + 1, last), h, hv, c0 - dk, BK, BC)
            kt = l2_normalize(kr, L2NORM)
            a = log_decay(gr, alog, dtb, lower_bound, GATE)
            x = x * k.exp(a)[:, None]
            u = bt * (vt - k.sum(x * kt[:, None], axis=0))
            x = x + kt[:, None] * u[None, :]
        m[b, hv, k.span(0, BK), k.span(c0, BC)] = x           # lanes c >= K fall outside m
        e[b, hv, k.span(0, BK), k.span(c0 - dk, BC)] = x      # lanes c < K fall outside e


# GPU run 1 (H200, HV=96, K=V=128, R=8): a single kernel carrying S in registers across the R steps
# with one [128, 128] x [128, BV] fp32 dot per step took 11.4 ms (the [K, K] operand does not fit
# a program's registers). Now: one launch per shard step, each program a [BI, BV] block of
# S_{r+1} = M_r S_r + E_r with the K reduction split in BJ-wide dots.
@k.kernel(configs=[{"BI": 32, "BV": 128, "num_warps": 4}, {"BI": 16, "BV": 128, "num_warps": 4},
                   {"BI": 64, "BV": 64, "num_warps": 4}, {"BI": 32, "BV": 64, "num_warps": 2}])
def kda_merge_step(m: k.Tensor[k.f32, "L", "K", "K"], e: k.Tensor[k.f32, "L", "K", "V"],
                   s_in: k.Tensor[k.f32, "L", "K", "V"], s_out: k.Tensor[k.f32, "L", "K", "V"],
                   BI: k.constexpr = 32, BJ: k.constexpr = 32, BV: k.constexpr = 128):
    for lead, pi, pv in k.grid(m.shape[0], k.cdiv(m.shape[1], BI), k.cdiv(e.shape[2], BV)):
        acc = e[lead, k.span(pi * BI, BI, other=0.0), k.span(pv * BV, BV, other=0.0)]
        for j in range(k.cdiv(m.shape[1], BJ)):
            mt = m[lead, k.span(pi * BI, BI, other=0.0), k.span(j * BJ, BJ, other=0.0)]
            st = s_in[lead, k.span(j * BJ, BJ, other=0.0), k.span(pv * BV, BV, other=0.0)]
            acc = acc + k.dot(mt, st)
        s_out[lead, k.span(pi * BI, BI), k.span(pv * BV, BV)] = acc


def _bounds(op, b, t, cu_seqlens, device):
    import torch
    if cu_seqlens is None:
        return torch.arange(b + 1, dtype=torch.int32, device=device) * t, b
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64) \
            or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise K31Error(f"{op}: `cu_seqlens` must be an int32 tensor [N + 1] of token offsets",
                       hint="e.g. torch.tensor([0, 5, 12], dtype=torch.int32) for two sequences")
    if b != 1:
        raise K31Error(f"{op}: with cu_seqlens the batch dim must be 1, got B={b}",
                       hint="concatenate the sequences along T: k.view(1, -1, H, K)")
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != t or bool((cu[1:] < cu[:-1]).any()):
        raise K31Error(f"{op}: cu_seqlens must start at 0, end at T={t} and never decrease, got {cu.tolist()}")
    return cu_seqlens.to(torch.int32).contiguous(), cu.numel() - 1


def kda_cp_summary(k, v, g, beta, *, cu_seqlens=None, use_qk_l2norm=True, A_log=None, dt_bias=None,
                   lower_bound=None, method="recurrent", target=None):
    """The affine summary of each sequence's token range: S_out = M S_in + E.

    k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K] (log decay, or the raw gate with A_log /
    dt_bias / lower_bound as in kda_decode); beta: [B, T, HV]; cu_seqlens (B == 1): int32 [N + 1]
    token offsets. Returns (M fp32 [N, HV, K, K], E fp32 [N, HV, K, V]), N = B or the number of
    sequences; an empty range gives (I, 0).
    method: "recurrent" (default) — one fp32 pass of the augmented recurrence (serial in the
    range's tokens); "chunk" — chunk_kda over the values [v | 0] from the state [0 | I] (one pass
    giving [E | M] when V + K is a head size it takes, else two), parallel within chunks and
    carrying chunk_kda's own precision (its per-chunk factors are bf16 for bf16 inputs), with the
    outputs computed and discarded."""
    import torch
    op = "kda_cp_summary"
    target = resolve_target(target)
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        require_tensor(op, name, t)
    if k.dim() != 4 or v.dim() != 4:
        raise K31Error(f"{op}: `k` must be [B, T, H, K] and `v` [B, T, HV, V], got {list(k.shape)} and {list(v.shape)}")
    b, t, h, kdim = k.shape
    hv, vdim = v.shape[2], v.shape[3]
    if tuple(v.shape[:2]) != (b, t):
        _shape_error(op, "v", v, [b, t, hv, vdim], " (B and T of k)")
    if hv % h:
        raise K31Error(f"{op}: v has HV={hv} value heads, not a multiple of H={h} key heads")
    if tuple(g.shape) != (b, t, hv, kdim):
        _shape_error(op, "g", g, [b, t, hv, kdim])
    if tuple(beta.shape) != (b, t, hv):
        _shape_error(op, "beta", beta, [b, t, hv])
    if k.dtype != v.dtype:
        raise K31Error(f"{op}: k and v must share one dtype, got {k.dtype} and {v.dtype}")
    if kdim > 256:
        raise K31Error(f"{op}: K={kdim} > 256 is not supported (a program holds the whole K axis)")
    if method not in ("recurrent", "chunk"):
        raise K31Error(f"{op}: method={method!r} is not supported", hint='use "recurrent" or "chunk"')
    bounds, n = _bounds(op, b, t, cu_seqlens, k.device)
    if method == "chunk":
        return _summary_by_chunks(k, v, g, beta, cu_seqlens, n, use_qk_l2norm, A_log, dt_bias, lower_bound,
                                  target)
    gate, a_log, dtb, lb = _gate_mode(op, A_log, dt_bias, lower_bound, hv, kdim, k.device)
    m = torch.empty(n, hv, kdim, kdim, dtype=torch.float32, device=k.device)
    e = torch.empty(n, hv, kdim, vdim, dtype=torch.float32, device=k.device)
    if n == 0:
        return m, e
    cx = {"BK": max(16, next_pow2(kdim))}
    if gate:
        cx["GATE"] = gate
    if not use_qk_l2norm:
        cx["L2NORM"] = False
    flat = lambda x: x.contiguous().view(b * t, *x.shape[2:])      # noqa: E731
    kda_range_summary[target](flat(k), flat(v), flat(g), flat(beta), bounds, m, e, a_log, dtb, lb, **cx)
    return m, e


def _summary_by_chunks(k, v, g, beta, cu_seqlens, n, use_qk_l2norm, A_log, dt_bias, lower_bound, target):
    """(M, E) from chunk_kda: the recurrence is linear in S and acts on each value column alone,
    so one pass over the values [v | 0] (V + K columns) from the state [0 | I] ends in [E | M].
    When V + K is not a head size chunk_kda takes, two passes: E from S = 0, M from S = I with
    all values zero."""
    import torch
    from k31dsl.ops.kda.chunk import HEAD_DIMS, chunk_kda
    hv, kdim, vdim = v.shape[2], k.shape[3], v.shape[3]
    kw = dict(cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, A_log=A_log, dt_bias=dt_bias,
              lower_bound=lower_bound, output_final_state=True, target=target)
    eye = torch.eye(kdim, dtype=torch.float32, device=k.device).expand(n, hv, kdim, kdim)
    zeros = torch.zeros(*v.shape[:3], kdim, dtype=v.dtype, device=v.device)
    if vdim + kdim in HEAD_DIMS:
        h0 = torch.cat([torch.zeros(n, hv, kdim, vdim, dtype=torch.float32, device=k.device), eye], dim=-1)
        _, st = chunk_kda(k, k, torch.cat([v, zeros], dim=-1), g, beta, initial_state=h0.contiguous(), **kw)
        return st[..., vdim:].contiguous(), st[..., :vdim].contiguous()
    _, e = chunk_kda(k, k, v, g, beta, **kw)
    _, m = chunk_kda(k, k, zeros, g, beta, initial_state=eye.contiguous(), **kw)
    return m, e


def kda_cp_merge(summaries, initial_state=None, *, target=None):
    """Compose the shards' summaries in order: shard r starts from S_r, S_0 = initial_state (zero
    when None), S_{r+1} = M_r S_r + E_r.

    summaries: a sequence of (M [*lead, K, K], E [*lead, K, V]) fp32 pairs, one per shard in
    sequence order (e.g. kda_cp_summary of each shard); initial_state: fp32 [*lead, K, V] or None.
    Returns (initial_states fp32 [R, *lead, K, V] (entry r: shard r's initial state), final_state
    fp32 [*lead, K, V])."""
    import torch
    op = "kda_cp_merge"
    target = resolve_target(target)
    if not isinstance(summaries, (list, tuple)) or not summaries:
        raise K31Error(f"{op}: `summaries` must be a non-empty list of (M, E) pairs, one per shard")
    ms, es = [], []
    for i, pair in enumerate(summaries):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise K31Error(f"{op}: summaries[{i}] must be an (M, E) pair, got {type(pair).__name__}")
        mm, ee = pair
        require_tensor(op, f"summaries[{i}].M", mm, (k.f32,), min_rank=2)
        require_tensor(op, f"summaries[{i}].E", ee, (k.f32,), min_rank=2)
        ms.append(mm)
        es.append(ee)
    lead, kdim = tuple(ms[0].shape[:-2]), ms[0].shape[-1]
    vdim = es[0].shape[-1]
    for i, (mm, ee) in enumerate(zip(ms, es)):
        if tuple(mm.shape) != lead + (kdim, kdim):
            _shape_error(op, f"summaries[{i}].M", mm, list(lead + (kdim, kdim)), " (like summaries[0].M)")
        if tuple(ee.shape) != lead + (kdim, vdim):
            _shape_error(op, f"summaries[{i}].E", ee, list(lead + (kdim, vdim)), " ([*lead, K, V] of M)")
    if kdim > 256:
        raise K31Error(f"{op}: K={kdim} > 256 is not supported")
    r, nlead = len(ms), 1
    for d in lead:
        nlead *= d
    dev = ms[0].device
    m = torch.stack(ms).reshape(r, nlead, kdim, kdim)
    e = torch.stack(es).reshape(r, nlead, kdim, vdim)
    states = torch.empty(r + 1, nlead, kdim, vdim, dtype=torch.float32, device=dev)
    if initial_state is None:
        states[0].zero_()
    else:
        require_tensor(op, "initial_state", initial_state, (k.f32,))
        if tuple(initial_state.shape) != lead + (kdim, vdim):
            _shape_error(op, "initial_state", initial_state, list(lead + (kdim, vdim)))
        states[0].copy_(initial_state.reshape(nlead, kdim, vdim))
    if nlead and vdim:
        for i in range(r):               # S_{i+1} = M_i S_i + E_i, in stream order
            kda_merge_step[target](m[i], e[i], states[i], states[i + 1])
    h0, fin = states[:r], states[r]
    return h0.reshape((r,) + lead + (kdim, vdim)), fin.reshape(lead + (kdim, vdim))


# ---------------------------------------------------------------- checks against the oracle

def _check_summary(target: str, seed: int = 0) -> list:
    """Varlen summaries (an empty range included, lower-bound gate, GVA) vs the oracle's
    per-token transition product and zero-state run."""
    import numpy as np
    import torch
    from k31dsl.ops.kda.decode import _rel
    from k31dsl.ops.testing import device_for, load_oracle
    ref = load_oracle("kda")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cu = [0, 6, 6, 17]
    hv, kdim, vdim = 2, 20, 24
    kk, v = torch.randn(1, 17, 1, kdim, generator=g), torch.randn(1, 17, hv, vdim, generator=g)
    gr, beta = torch.randn(1, 17, hv, kdim, generator=g) * 3, torch.rand(1, 17, hv, generator=g)
    gate = dict(A_log=torch.randn(hv, generator=g) * 0.5, dt_bias=torch.randn(hv * kdim, generator=g), lower_bound=-5.0)
    m, e = kda_cp_summary(kk.to(dev), v.to(dev), gr.to(dev), beta.to(dev),
                          cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=dev), target=target,
                          **{key: (val.to(dev) if hasattr(val, "to") else val) for key, val in gate.items()})
    _, kn, a = ref.prepare(kk, kk, gr, **gate)
    out = []
    for i in range(3):
        s, t = cu[i], cu[i + 1]
        want = [ref.summary_head(kn[0, s:t, 0], v[0, s:t, j], a[0, s:t, j], beta[0, s:t, j]) for j in range(hv)]
        err_m = _rel(m[i], np.stack([w[0] for w in want]))
        err_e = _rel(e[i], np.stack([w[1] for w in want])) if t > s else float(e[i].abs().max())
        out += [CaseResult(f"range {s}..{t}: M", err_m, 1e-4, err_m <= 1e-4, "max |err| / max |M|"),
                CaseResult(f"range {s}..{t}: E", err_e, 1e-4, err_e <= 1e-4, "max |err| / max |E|")]
    return out


def _check_merge(target: str, seed: int = 0) -> list:
    """Three shards of one sequence: summaries composed from a random initial state == the
    recurrence's states at the shard starts and at the end."""
    import numpy as np
    import torch
    from k31dsl.ops.kda.decode import _rel
    from k31dsl.ops.testing import device_for, load_oracle
    ref = load_oracle("kda")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cuts, hv, kdim, vdim = [0, 5, 13, 20], 2, 16, 24
    kk, v = torch.randn(1, 20, 1, kdim, generator=g), torch.randn(1, 20, hv, vdim, generator=g)
    a, beta = -torch.rand(1, 20, hv, kdim, generator=g) * 2, torch.rand(1, 20, hv, generator=g)
    s0 = torch.randn(hv, kdim, vdim, generator=g)
    m, e = kda_cp_summary(kk.to(dev), v.to(dev), a.to(dev), beta.to(dev),
                          cu_seqlens=torch.tensor(cuts, dtype=torch.int32, device=dev), target=target)
    h0, fin = kda_cp_merge([(m[i], e[i]) for i in range(3)], s0.to(dev), target=target)
    _, kn, _ = ref.prepare(kk, kk, a)
    want = [s0.double().numpy()]
    for i in range(3):
        s, t = cuts[i], cuts[i + 1]
        want.append(np.stack([ref.recurrent_head(kn[0, s:t, 0], kn[0, s:t, 0], v[0, s:t, j], a[0, s:t, j],
                                                 beta[0, s:t, j], want[-1][j])[1] for j in range(hv)]))
    out = []
    for i in range(3):
        err = _rel(h0[i], want[i])
        out.append(CaseResult(f"shard {i} initial state", err, 1e-4, err <= 1e-4))
    err = _rel(fin, want[3])
    return out + [CaseResult("final state", err, 1e-4, err <= 1e-4)]


register(OpSpec(name="kda_cp_summary", module="kda", fn=kda_cp_summary, kernels=[kda_range_summary],
                summary="KDA context parallel: a token range's affine summary S_out = M S_in + E (fp32)",
                check=_check_summary, tags=["kda", "cp"]))
register(OpSpec(name="kda_cp_merge", module="kda", fn=kda_cp_merge, kernels=[kda_merge_step],
                summary="KDA context parallel: in-order composition of shard summaries into initial states",
                check=_check_merge, tags=["kda", "cp"]))

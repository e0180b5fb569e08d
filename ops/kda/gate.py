"""KDA gate: the natural-log per-channel decay from the raw gate input (research/kda.md §1.2).

  GATE_SOFTPLUS (Kimi Linear): a = -exp(A_log[h]) * softplus(x + dt_bias[h])     in (-inf, 0)
  GATE_LOWER    (K3 "safe"):   a = lb * sigmoid(exp(A_log[h]) * (x + dt_bias[h]))  in (lb, 0)

`gate_value` is a @k.func so the chunk kernel applies it in-kernel to the raw gate (fla's
use_gate_in_kernel); `kda_gate` is the standalone op over torch tensors. Missing A_log means
exp(A_log) = 1 and missing dt_bias means 0 (passed to the kernels as zeros)."""

import math

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, require_tensor, resolve_target
from k31dsl.ops.registry import CaseResult, OpSpec, register

GATE_NONE, GATE_SOFTPLUS, GATE_LOWER = 0, 1, 2
LB_MIN = -5.0                       # the lower-bound gate's range, as fla's safe gate: -5 <= lb < 0


@k.func
def gate_value(x, a_log, bias, lb, MODE):
    """Log decay of raw gate tile x (f32) with a_log a scalar and bias broadcastable to x."""
    if MODE == GATE_SOFTPLUS:
        return -k.exp(a_log) * k.softplus(x + bias)
    return lb * k.sigmoid(k.exp(a_log) * (x + bias))


@k.kernel(configs=[{"BM": 16, "num_warps": 4}, {"BM": 64, "num_warps": 4}])
def kda_gate_rows(x: k.Tensor["XT", "M", "HV", "K"], a_log: k.Tensor[k.f32, "HV"],
                  dt_bias: k.Tensor[k.f32, "HV", "K"], y: k.Tensor[k.f32, "M", "HV", "K"], lb: k.f32,
                  XT: k.constexpr[FLOAT_INPUTS] = k.bf16, MODE: k.constexpr[GATE_SOFTPLUS, GATE_LOWER] = GATE_LOWER,
                  BM: k.constexpr = 16, BK: k.constexpr = 128):
    for pm, hv in k.grid(k.cdiv(x.shape[0], BM), x.shape[1]):
        t = x[k.span(pm * BM, BM), hv, k.span(0, BK, other=0.0)].to(k.f32)
        bias = dt_bias[hv, k.span(0, BK, other=0.0)]
        y[k.span(pm * BM, BM), hv, k.span(0, BK)] = gate_value(t, a_log[hv], bias[None, :], lb, MODE)


def check_gate_params(op: str, hv: int, kdim: int, A_log, dt_bias, lower_bound):
    """The gate parameters as fp32 [HV] / [HV, K] torch tensors (zeros when absent) and the mode;
    K31Error on bad shapes or an out-of-range lower bound."""
    import torch
    if lower_bound is not None:
        if not (isinstance(lower_bound, (int, float)) and math.isfinite(lower_bound) and LB_MIN <= lower_bound < 0):
            raise K31Error(f"{op}: lower_bound={lower_bound!r} must be a number in [{LB_MIN:g}, 0)",
                           hint="the K3 safe gate uses -5; pass None for the Kimi Linear softplus gate")
    out = []
    for name, t, shapes in (("A_log", A_log, [(hv,)]), ("dt_bias", dt_bias, [(hv * kdim,), (hv, kdim)])):
        if t is None:
            out.append(None)
            continue
        require_tensor(op, name, t)
        if tuple(t.shape) not in shapes:
            want = " or ".join(str(list(s)) for s in shapes)
            raise K31Error(f"{op}: `{name}` must have shape {want} (per value head), got {list(t.shape)}")
        out.append(t.to(torch.float32))
    dev = (A_log if A_log is not None else dt_bias).device if (A_log is not None or dt_bias is not None) else None
    a = out[0] if out[0] is not None else torch.zeros(hv, dtype=torch.float32, device=dev)
    b = out[1].reshape(hv, kdim).contiguous() if out[1] is not None else torch.zeros(hv, kdim, dtype=torch.float32,
                                                                                      device=dev)
    mode = GATE_SOFTPLUS if lower_bound is None else GATE_LOWER
    return a.contiguous(), b, mode, float(lower_bound or 0.0)


def kda_gate(x, A_log, dt_bias, lower_bound=None, *, target: str | None = None):
    """Natural-log KDA decay from the raw gate input x [..., HV, K] (bf16/f16/f32) -> fp32 like x.
    A_log [HV] (or None: exp(A_log) = 1), dt_bias [HV*K] or [HV, K] (or None). lower_bound None:
    Kimi Linear's -exp(A_log) * softplus(x + dt_bias); lb in [-5, 0): K3's
    lb * sigmoid(exp(A_log) * (x + dt_bias))."""
    import torch
    target = resolve_target(target)
    require_tensor("kda_gate", "x", x, min_rank=2)
    hv, kdim = x.shape[-2], x.shape[-1]
    a, b, mode, lb = check_gate_params("kda_gate", hv, kdim, A_log, dt_bias, lower_bound)
    a, b = a.to(x.device), b.to(x.device)
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if x.numel():
        bk = max(16, 1 << (kdim - 1).bit_length())
        x3 = x.contiguous().view(-1, hv, kdim)
        kda_gate_rows[target](x3, a, b, y.view(-1, hv, kdim), lb, MODE=mode, BK=bk)
    return y


# ---------------------------------------------------------------- check against the oracle

def _check_gate(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, dtype_name, load_oracle, max_rel_err, to_f64
    ref = load_oracle("kda")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    cases = [((3, 7, 4, 16), torch.bfloat16, -5.0, True), ((37, 2, 32), torch.float32, None, True),
             ((5, 3, 20), torch.float32, -1.0, False), ((2, 19, 2, 16), torch.float16, None, False)]
    for shape, dt, lb, params in cases:
        hv, kd = shape[-2], shape[-1]
        x = (torch.randn(shape, generator=g) * 4).to(dt)
        x.view(-1)[:4] = torch.tensor([60.0, -60.0, 0.0, 15.0]).to(dt)    # saturated softplus / sigmoid
        a_log = torch.randn(hv, generator=g) if params else None
        bias = torch.randn(hv * kd, generator=g) if params else None
        y = kda_gate(x.to(dev), None if a_log is None else a_log.to(dev), None if bias is None else bias.to(dev),
                     lb, target=target)
        want = ref.kda_gate(to_f64(x), a_log, bias, lb)
        err = max_rel_err(to_f64(y), want, floor=1e-3 * max(1.0, float(np.abs(want).max())))
        out.append(CaseResult(f"x={list(shape)} {dtype_name(dt)}, lower_bound={lb}, params={params}",
                              err, 1e-5, bool(err <= 1e-5)))
    return out


register(OpSpec(name="kda_gate", module="kda", fn=kda_gate, kernels=[kda_gate_rows],
                summary="KDA log decay: Kimi Linear softplus gate or the K3 lower-bound gate (fp32 out)",
                check=_check_gate, tags=["kda"]))

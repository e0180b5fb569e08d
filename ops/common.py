"""Common layers (rmsnorm) and the small helpers every op's public function shares: choosing the
target, validating torch inputs with K31Errors, flattening leading dims into rows."""

import math

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.registry import CaseResult, OpSpec, register

FLOAT_INPUTS = (k.bf16, k.f16, k.f32)


# ---------------------------------------------------------------- shared public-API helpers

def resolve_target(target: str | None) -> str:
    """`None` -> "triton" when CUDA is available, else "numpy"."""
    from k31dsl.targets import TARGETS, default_target
    if target in TARGETS:
        return target
    if target is None:
        return default_target()
    raise K31Error(f"unknown target {target!r}", hint=f"choose one of {', '.join(TARGETS)}")


_DTYPE_OF: dict = {}     # torch dtype -> DSL dtype, filled on first use (ops run per call: keep it cheap)


def config_for(target: str, config: dict) -> dict:
    """A kernel config as a call on `target` takes it: Triton also gets the launch options
    (num_warps, num_stages, maxnreg); the other targets only the constexprs."""
    from k31dsl.targets.triton.emit import LAUNCH_KEYS
    return dict(config) if target == "triton" else {n: v for n, v in config.items() if n not in LAUNCH_KEYS}


def int32_tensor(op: str, name: str, t, rank: int | None = None, n: int | None = None):
    """An int32/int64 tensor (of the rank, with n rows, when given) as contiguous int32,
    its values checked to fit."""
    import torch
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or \
            (rank is not None and t.dim() != rank):
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        want = f" of rank {rank}" if rank is not None else ""
        raise K31Error(f"{op}: `{name}` must be an int32/int64 tensor{want}, got {got}")
    if n is not None and t.shape[0] != n:
        raise K31Error(f"{op}: `{name}` must have {n} entries (one per token), got {t.shape[0]}")
    if t.dtype == torch.int64 and t.numel() and (int(t.max()) >= 2 ** 31 or int(t.min()) < -2 ** 31):
        raise K31Error(f"{op}: `{name}` holds values outside int32")
    return t.to(torch.int32).contiguous()


def cache_slots(op: str, slot_mapping, n: int, pages: int, page: int = 64):
    """slot_mapping as int32 [n] for a paged cache of `pages` pages: each slot < 0 (skipped) or
    page * 64 + row inside it (a store's bounds mask would drop a slot past the cache without a
    word)."""
    slots = int32_tensor(op, "slot_mapping", slot_mapping, 1, n)
    if slots.numel() and int(slots.max()) >= pages * page:
        raise K31Error(f"{op}: slot {int(slots.max())} is past the cache ({pages} pages x {page} slots)",
                       hint=f"slots are page * {page} + row; allocate more pages")
    return slots


def require_same_device(op: str, **tensors) -> None:
    """Every given tensor (None skipped) on one device, else a K31Error naming each one's."""
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise K31Error(f"{op}: tensors are on different devices: "
                       + ", ".join(f"{n} on {d}" for n, d in devs.items()), hint="move them to one device")


def require_target_device(op: str, target: str, device) -> None:
    """Tensors on the device the target runs on: Triton on a GPU needs CUDA tensors, its
    interpreter CPU ones (for ops that launch graph programs, whose kernels are not checked one
    by one)."""
    if target != "triton":
        return
    from k31dsl.targets.triton.emit import detect_mode
    want = "cpu" if detect_mode() == "interpret" else "cuda"
    if device.type != want:
        raise K31Error(f"{op}: the inputs are on {device}, the Triton target here runs on {want} tensors",
                       hint="x.cuda() for the GPU, or TRITON_INTERPRET=1 / target='numpy' for CPU tensors")


def require_tensor(op: str, name: str, t, dtypes=FLOAT_INPUTS, min_rank: int = 1):
    """The input's DSL dtype, or a K31Error that says what was expected."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise K31Error(f"{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    dt = _DTYPE_OF.get(t.dtype)
    if dt is None:
        dt = _DTYPE_OF.setdefault(t.dtype, D.from_torch(t.dtype))
    if dt not in dtypes:
        want = ", ".join(str(D.torch_dtype(d)).replace("torch.", "") for d in dtypes)
        raise K31Error(f"{op}: `{name}` has dtype {str(t.dtype).replace('torch.', '')}, expected one of {want}",
                       hint=f"convert it first, e.g. {name}.to(torch.bfloat16)")
    if t.dim() < min_rank:
        raise K31Error(f"{op}: `{name}` must have at least {min_rank} dim(s), got shape {list(t.shape)}")
    return dt


def require_dtype_arg(op: str, name: str, dtype, allowed=FLOAT_INPUTS):
    """A torch dtype argument (e.g. the output dtype) that must be one of `allowed`."""
    dt = D.from_torch(dtype) if not isinstance(dtype, D.DType) else dtype
    if dt not in allowed:
        want = ", ".join(str(D.torch_dtype(d)).replace("torch.", "") for d in allowed)
        raise K31Error(f"{op}: `{name}`={dtype} is not supported, expected one of {want}")
    return dt


def rows(t):
    """A contiguous [M, D] view of `t` (leading dims flattened; copies only if non-contiguous)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t if t.dim() == 2 else t.view(-1, t.shape[-1])


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


# ---------------------------------------------------------------- rmsnorm

RMSNORM_CONFIGS = [{"BM": 4, "BD": 128}, {"BM": 1, "BD": 1024}, {"BM": 2, "BD": 1024},
                   {"BM": 4, "BD": 2048}, {"BM": 8, "BD": 512}]


@k.kernel(configs=RMSNORM_CONFIGS)
def rmsnorm_rows(x: k.Tensor["XT", "M", "D"], w: k.Tensor["WT", "D"], y: k.Tensor["YT", "M", "D"], eps: k.f32,
                 XT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                 YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                 BM: k.constexpr = 4, BD: k.constexpr = 128, ONE_TILE: k.constexpr = False):
    # One program normalises BM rows. When a whole row fits one BD tile (ONE_TILE) it is read
    # once and kept; otherwise a first sweep sums squares and a second one scales. The three
    # dtypes are bound from the tensors at each call.
    for pm in k.grid(k.cdiv(x.shape[0], BM)):
        d = x.shape[1]
        if ONE_TILE:
            t = x[k.span(pm * BM, BM), k.span(0, BD, other=0.0)].to(k.f32)
            r = k.rsqrt(k.sum(t * t, axis=1) / d.to(k.f32) + eps)
            wt = w[k.span(0, BD, other=0.0)].to(k.f32)
            y[k.span(pm * BM, BM), k.span(0, BD)] = (t * r[:, None] * wt[None, :]).to(YT)
        else:
            acc = k.zeros((BM, BD), k.f32)
            for j in range(k.cdiv(d, BD)):
                t = x[k.span(pm * BM, BM), k.span(j * BD, BD, other=0.0)].to(k.f32)
                acc += t * t
            r = k.rsqrt(k.sum(acc, axis=1) / d.to(k.f32) + eps)
            for j in range(k.cdiv(d, BD)):
                t = x[k.span(pm * BM, BM), k.span(j * BD, BD, other=0.0)].to(k.f32)
                wt = w[k.span(j * BD, BD, other=0.0)].to(k.f32)
                y[k.span(pm * BM, BM), k.span(j * BD, BD)] = (t * r[:, None] * wt[None, :]).to(YT)


def rmsnorm(x, weight, eps: float = 1e-6, out_dtype=None, *, target: str | None = None):
    """y = x / sqrt(mean(x^2 over the last dim) + eps) * weight, accumulated in fp32.

    x: [..., D] bf16/f16/f32; weight: [D] bf16/f16/f32; returns [..., D] in `out_dtype`
    (default x.dtype)."""
    import torch
    target = resolve_target(target)
    require_tensor("rmsnorm", "x", x)
    require_tensor("rmsnorm", "weight", weight)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise K31Error(f"rmsnorm: `weight` must have shape [{x.shape[-1]}] (the last dim of x), "
                       f"got {list(weight.shape)}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise K31Error(f"rmsnorm: eps must be a finite number >= 0, got {eps!r}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    y_dt = require_dtype_arg("rmsnorm", "out_dtype", out_dtype)
    y = torch.empty(x.shape, dtype=D.torch_dtype(y_dt), device=x.device)
    if x.numel() == 0:
        return y
    x2, y2 = rows(x), rows(y)
    kern = rmsnorm_rows[target]
    d = x.shape[-1]
    if d <= 2048:
        bd = max(16, next_pow2(d))
        bm = max(1, min(16, 2048 // bd))
        kern(x2, weight.contiguous(), y2, float(eps), BM=bm, BD=bd, ONE_TILE=True)
    else:
        kern(x2, weight.contiguous(), y2, float(eps), BM=2, BD=1024, ONE_TILE=False)
    return y


# ---------------------------------------------------------------- checks against the oracle

def _check_rmsnorm(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, dtype_name, load_oracle, max_rel_err, to_f64
    ref = load_oracle("norm")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cases = [((7, 200), torch.bfloat16, torch.bfloat16, None, 1e-6),
             ((2, 3, 96), torch.float32, torch.float32, None, 1e-5),
             ((1, 1), torch.float16, torch.float32, torch.float32, 1e-6),
             ((5, 2500), torch.bfloat16, torch.float32, torch.float32, 1e-6),   # two-sweep path
             ((3, 37), torch.float32, torch.bfloat16, torch.bfloat16, 1e-6)]
    tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
    out = []
    for shape, x_dt, w_dt, y_dt, eps in cases:
        x = (torch.randn(shape, generator=g) * 3).to(x_dt)
        if shape[-1] > 4:
            x.view(-1, shape[-1])[0, :3] = torch.tensor([0.0, 1e-3, -250.0]).to(x_dt)
        w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(w_dt)
        y = rmsnorm(x.to(dev), w.to(dev), eps, out_dtype=y_dt, target=target)
        want = ref.rmsnorm(to_f64(x), to_f64(w), eps)
        err = max_rel_err(to_f64(y), want, floor=1e-3 * float(np.abs(want).max()))
        t = tol[y.dtype]
        out.append(CaseResult(f"x={list(shape)} {dtype_name(x_dt)}, w {dtype_name(w_dt)} -> {dtype_name(y.dtype)}, eps={eps}",
                              err, t, bool(err <= t)))
    return out


register(OpSpec(name="rmsnorm", module="common", fn=rmsnorm, kernels=[rmsnorm_rows],
                summary="RMSNorm over the last dim (fp32 accumulate, any leading dims, ragged D)",
                check=_check_rmsnorm, tags=["norm"]))

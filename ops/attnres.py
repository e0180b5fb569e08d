"""Attention Residuals (Kimi, arXiv:2603.15031), K3 convention: each layer's input is a softmax
over depth of earlier sources v_i with logits q . v_i / sqrt(mean(v_i^2) + eps) (no 1/sqrt(d)),
q an input-independent pseudo-query into which the key-RMSNorm gain is folded (q_eff = w * g).

- `attnres`: full AttnRes over sources [n, T, D] in one kernel.
- `attnres_prepare` (phase 1, once per block): all S queries of a block against the committed
  blocks [n, T, D]; returns the unnormalised numerator O [S, T, D], logit max M [S, T] and
  exp-sum L [S, T] in fp32 (the CANN BlockAttnResPrepare contract).
- `attnres_update` (phase 2, per layer): partial += delta (in place, fp32), the partial's logit
  merged with (O, M, L) by online softmax -> h (bf16), then the next layer's RMSNorm -> y (bf16).
  It is two kernels (update, then a row RMSNorm) that the graph's superkernel pass fuses into one.

Layout: one program per token row t. The prepare kernel sweeps the row's n
sources twice in BD-column chunks: the first sweep accumulates every source's sum of squares and
the S x n dot products; the second runs over the chunks in reverse order, so that it starts on
the chunks the first sweep read last (still in L2 on a GPU), and writes O. One read of the blocks
(an online softmax over the sources) would need O for all S queries on chip (172 KB per token at
S = 6, D = 7168) or a grid-wide exchange, neither of which the DSL has (benchmarks/NOTES.md,
AttnRes); instead the second sweep is served partly from L2 (L2 hints ask to keep the rows sweep 1
read and to drop what sweep 2 and the O stores touch). Configs choose the chunk width, the warps,
the reductions, prefetching and the hints. A caller that keeps each block's logits (the model
does) reads the blocks once: `attnres_prepare_cached` (ops/attnres_cached.py).
The update and RMSNorm kernels hold a whole row as one BD = next_pow2(D) tile, so the RMSNorm
program reads exactly the h row that the same update program wrote: the condition for the
superkernel pass to fuse them (h stays in registers).
"""

import math

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, next_pow2, require_dtype_arg, require_same_device, require_tensor, \
    resolve_target
from k31dsl.ops.registry import CaseResult, OpSpec, register

# the prepare kernel and its configs live in ops/attnres_prepare.py (re-exported here)
from k31dsl.ops.attnres_prepare import PREPARE_CONFIGS, attnres_prepare_rows  # noqa: F401

ROW_CONFIGS = [{"WARPS": w, "num_warps": w} for w in (4, 8, 16, 32)]
MAX_ROW = 1 << 16               # whole-row tiles: D up to 65536
ACC_BUDGET = 8192               # SB * NB * BD elements of the prepare accumulator when BD is forced


@k.func
def merge_partial(p, qv, num, m_old, l_old, d, eps):
    """Phase 2's online-softmax merge for one row: the partial sum p's logit (its RMS-normalised dot
    with the query qv) joins the prepared statistics (numerator num, max m_old, exp-sum l_old)
    -> h in fp32. Shared by attnres_update_rows and the model's slot-indexed update."""
    score = k.sum(p * qv) * k.rsqrt(k.sum(p * p) / d + eps)
    m_new = k.maximum(m_old, score)
    a = k.exp(m_old - m_new)
    b = k.exp(score - m_new)
    inv = 1.0 / (l_old * a + b)
    return (num * a + p * b) * inv


@k.kernel(configs=ROW_CONFIGS)
def attnres_update_rows(partial: k.Tensor[k.f32, "T", "D"], delta: k.Tensor["DT", "T", "D"],
                        q: k.Tensor[k.f32, "D"], o: k.Tensor[k.f32, "T", "D"], m: k.Tensor[k.f32, "T"],
                        l: k.Tensor[k.f32, "T"], h: k.Tensor["HT", "T", "D"], eps: k.f32,
                        DT: k.constexpr[FLOAT_INPUTS] = k.bf16, HT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                        BD: k.constexpr = 128, WARPS: k.constexpr = 4):
    for t in k.grid(partial.shape[0]):
        # every load first (one round trip to memory per row), then the two row reductions
        p = partial[t, k.span(0, BD, other=0.0)] + delta[t, k.span(0, BD, other=0.0)].to(k.f32)
        num = o[t, k.span(0, BD, other=0.0)]
        m_old = m[t]
        l_old = l[t]
        partial[t, k.span(0, BD)] = p
        hv = merge_partial(p, q[k.span(0, BD, other=0.0)], num, m_old, l_old, partial.shape[1].to(k.f32), eps)
        h[t, k.span(0, BD)] = hv.to(HT)


@k.kernel(configs=ROW_CONFIGS)
def rmsnorm_row(x: k.Tensor["XT", "T", "D"], w: k.Tensor["WT", "D"], y: k.Tensor["YT", "T", "D"], eps: k.f32,
                XT: k.constexpr[FLOAT_INPUTS] = k.bf16, WT: k.constexpr[FLOAT_INPUTS] = k.f32,
                YT: k.constexpr[FLOAT_INPUTS] = k.bf16, BD: k.constexpr = 128, WARPS: k.constexpr = 4):
    # The whole row is one tile (BD >= D): the load below is exactly the producer's row store.
    # Lanes past D are left undefined by the load and zeroed here, by the row's own length, so a
    # fused copy of this kernel needs no bounds of the forwarded tile (it serves any T).
    for t in k.grid(x.shape[0]):
        xv = k.where(k.arange(BD) < x.shape[1], x[t, k.span(0, BD)].to(k.f32), 0.0)
        r = k.rsqrt(k.sum(xv * xv) / x.shape[1].to(k.f32) + eps)
        y[t, k.span(0, BD)] = (xv * r * w[k.span(0, BD, other=0.0)].to(k.f32)).to(YT)


# ---------------------------------------------------------------- argument checks

def _eps(op: str, name: str, eps) -> float:
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0):
        raise K31Error(f"{op}: {name} must be a finite number > 0, got {eps!r}",
                       hint="it keeps 1/sqrt(mean(x^2) + eps) finite for all-zero rows; 1e-6 is usual")
    return float(eps)


def _shape(op: str, name: str, t, want: tuple, what: str):
    if tuple(t.shape) != tuple(want):
        raise K31Error(f"{op}: `{name}` must have shape {list(want)} ({what}), got {list(t.shape)}")


def _rank(op: str, name: str, t, rank: int, dims: str):
    if t.dim() != rank:
        raise K31Error(f"{op}: `{name}` must be {dims} (rank {rank}), got shape {list(t.shape)}")


def _fold(op: str, query, gain, shape: tuple):
    """The effective query in fp32: query * gain (the key-RMSNorm gain), when a gain is given."""
    import torch
    require_tensor(op, "query" if len(shape) == 1 else "queries", query)
    _shape(op, "query" if len(shape) == 1 else "queries", query, shape, "one pseudo-query per row, D wide")
    q = query.to(torch.float32)
    if gain is not None:
        require_tensor(op, "norm_weight", gain)
        require_same_device(op, **{"query" if len(shape) == 1 else "queries": query, "norm_weight": gain})
        if tuple(gain.shape) not in (shape, shape[-1:]):
            raise K31Error(f"{op}: `norm_weight` (the key-RMSNorm gain folded into the query) must have shape "
                           f"{list(shape)} or [{shape[-1]}], got {list(gain.shape)}")
        q = q * gain.to(torch.float32)
    return q.contiguous()


def source_tiles(n: int, s: int, **plain) -> dict:
    """NB / SB covering n sources and s queries. The prepare kernels' configs (autotuned on a GPU)
    are sized for block counts (n <= 16, S * n <= 64); beyond that (full AttnRes over many layers)
    the call fixes a plain variant (`plain`: the kernel's constexprs that turn its options off)
    with BD sized so that the accumulator holds ACC_BUDGET elements (no autotuning, and no configs
    that unroll over 17..64 sources)."""
    nb, sb = max(2, next_pow2(n)), max(1, next_pow2(s))
    kw = {"NB": nb, "SB": sb}
    if sb * nb > 64 or nb > 16:
        kw.update(BD=max(16, min(128, ACC_BUDGET // (sb * nb))), **plain)
    return kw


def prepare_constexprs(n: int, s: int) -> dict:
    """attnres_prepare_rows' constexprs for n sources and s queries (source_tiles). The attnres
    and attnres_prepare ops launch with these."""
    return source_tiles(n, s, PREFETCH=False, ROWS3D=False, STAGES=None, KEEP=None, DROP=None)


def _prepare_launch(target, v, q, o, m, l, eps, final: bool):
    """One prepare launch (prepare_constexprs; FINAL for full AttnRes)."""
    kw = prepare_constexprs(v.shape[0], q.shape[0])
    if final:
        kw["FINAL"] = True
    prepare_kernel(target)(v, q, o, m, l, eps, **kw)


def madd_kernel(kdef, target: str):
    """kdef compiled for `target`, on Triton with multiply-add contraction (the target's default
    keeps products and sums separately rounded, to track the reference op by op): the prepare
    kernels' arithmetic is mostly multiply-adds, and their fp32 checks are tolerance-based."""
    return kdef.compile(target, fp_fusion=True) if target == "triton" else kdef[target]


def prepare_kernel(target: str):
    """attnres_prepare_rows compiled for `target` (madd_kernel)."""
    return madd_kernel(attnres_prepare_rows, target)


def prepare_outputs(s: int, t: int, d: int, device):
    """A prepare's fp32 results for s queries: O [s, t, d], M and L [s, t] (uninitialised)."""
    import torch
    return (torch.empty((s, t, d), dtype=torch.float32, device=device),
            torch.empty((s, t), dtype=torch.float32, device=device),
            torch.empty((s, t), dtype=torch.float32, device=device))


def _check_sources(op: str, name: str, v):
    require_tensor(op, name, v)
    _rank(op, name, v, 3, "[n, T, D]")
    if v.shape[0] < 1:
        raise K31Error(f"{op}: `{name}` needs at least one source (shape {list(v.shape)})",
                       hint="the embedding is always the first source")
    if v.shape[2] < 1 or v.shape[2] > MAX_ROW:
        raise K31Error(f"{op}: D = {v.shape[2]} is outside 1..{MAX_ROW}")


# ---------------------------------------------------------------- public functions

def attnres(sources, query, eps: float = 1e-6, *, norm_weight=None, out_dtype=None, target: str | None = None):
    """Full AttnRes: h[t] = sum_i softmax_i(q . v_i[t] / rms(v_i[t])) v_i[t].

    sources: [n, T, D] (bf16/f16/f32); query: [D] pseudo-query; norm_weight: optional [D]
    key-RMSNorm gain, folded into the query. Returns h [T, D] in out_dtype (default sources')."""
    import torch
    op = "attnres"
    target = resolve_target(target)
    _check_sources(op, "sources", sources)
    n, t, d = sources.shape
    q = _fold(op, query, norm_weight, (d,))[None]
    require_same_device(op, sources=sources, query=q)
    eps = _eps(op, "eps", eps)
    h_dt = require_dtype_arg(op, "out_dtype", sources.dtype if out_dtype is None else out_dtype)
    h = torch.empty((1, t, d), dtype=D.torch_dtype(h_dt), device=sources.device)
    if t:
        stats = torch.empty((1, t), dtype=torch.float32, device=sources.device)
        _prepare_launch(target, sources.contiguous(), q, h, stats, stats, eps, final=True)
    return h[0]


def attnres_prepare(blocks, queries, eps: float = 1e-6, *, norm_weights=None, target: str | None = None):
    """Phase 1 of Block AttnRes, once per block: all S pseudo-queries against the n committed
    blocks, reading the blocks once. blocks: [n, T, D] (fp32; bf16/f16 accepted); queries:
    [S, D]; norm_weights: optional key-RMSNorm gains [S, D] (or one [D]), folded into the queries.
    Returns fp32 (O [S, T, D], M [S, T], L [S, T]): z = q_s . v_i / rms(v_i), M = max_i z,
    L = sum_i exp(z - M), O = sum_i exp(z - M) v_i."""
    op = "attnres_prepare"
    target = resolve_target(target)
    _check_sources(op, "blocks", blocks)
    n, t, d = blocks.shape
    require_tensor(op, "queries", queries)
    _rank(op, "queries", queries, 2, "[S, D]")
    s = queries.shape[0]
    if s < 1:
        raise K31Error(f"{op}: `queries` must hold at least one pseudo-query, got shape {list(queries.shape)}")
    q = _fold(op, queries, norm_weights, (s, d))
    require_same_device(op, blocks=blocks, queries=q)
    eps = _eps(op, "eps", eps)
    o, m, l = prepare_outputs(s, t, d, blocks.device)
    if t:
        _prepare_launch(target, blocks.contiguous(), q, o, m, l, eps, final=False)
    return o, m, l


def row_block(d: int) -> int:
    """The whole-row tile of the row kernels."""
    return max(16, next_pow2(d))


def check_update_args(partial, delta, query, o, m, l, norm_weight, eps, norm_eps, out_dtype):
    """Validate attnres_update's arguments; returns (eps, norm_eps, h/y dtype)."""
    op = "attnres_update"
    require_tensor(op, "partial", partial, (k.f32,))
    _rank(op, "partial", partial, 2, "[T, D]")
    t, d = partial.shape
    if not partial.is_contiguous():
        raise K31Error(f"{op}: `partial` is updated in place and must be contiguous",
                       hint="keep the running partial sum in its own contiguous fp32 buffer")
    if d < 1 or d > MAX_ROW:
        raise K31Error(f"{op}: D = {d} is outside 1..{MAX_ROW}")
    require_tensor(op, "delta", delta)
    _shape(op, "delta", delta, (t, d), "like partial")
    require_tensor(op, "query", query)
    _shape(op, "query", query, (d,), "the layer's effective pseudo-query")
    require_tensor(op, "O", o, (k.f32,))
    _shape(op, "O", o, (t, d), "this layer's slot of attnres_prepare's numerator")
    for name, x in (("M", m), ("L", l)):
        require_tensor(op, name, x, (k.f32,))
        _shape(op, name, x, (t,), "this layer's slot of attnres_prepare's statistics")
    require_tensor(op, "norm_weight", norm_weight)
    _shape(op, "norm_weight", norm_weight, (d,), "the next RMSNorm's gain")
    require_same_device(op, partial=partial, delta=delta, query=query, O=o, M=m, L=l, norm_weight=norm_weight)
    y_dt = require_dtype_arg(op, "out_dtype", out_dtype)
    return _eps(op, "eps", eps), _eps(op, "norm_eps", norm_eps), y_dt


def attnres_update(partial, delta, query, O, M, L, norm_weight, eps: float = 1e-6, norm_eps: float = 1e-6, *,
                   out_dtype=None, return_h: bool = True, fused: bool | None = None, target: str | None = None):
    """Phase 2 of Block AttnRes, per layer, fused with the next RMSNorm:
    partial += delta (in place, fp32); score = p . q / rms(p); online-softmax merge with the
    block statistics: m' = max(M, score), h = (O e^(M-m') + p e^(score-m')) / (L e^(M-m') + e^(score-m'));
    y = rmsnorm(h as stored, norm_weight, norm_eps).

    partial: [T, D] fp32 contiguous; delta: [T, D] (bf16); query: [D] effective pseudo-query;
    O [T, D], M [T], L [T]: this layer's slot of attnres_prepare; norm_weight: [D].
    Returns (h, y) [T, D] in out_dtype (default bf16), or y alone when return_h=False (then h is
    an intermediate that the fused program never writes to memory). `fused` picks the superkernel
    program (True) or the two kernels in sequence (False); None: fused where the graph passes exist."""
    import torch
    target = resolve_target(target)
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    eps, norm_eps, y_dt = check_update_args(partial, delta, query, O, M, L, norm_weight, eps, norm_eps, out_dtype)
    t, d = partial.shape
    if t == 0:
        y = torch.empty((t, d), dtype=D.torch_dtype(y_dt), device=partial.device)
        return (torch.empty_like(y), y) if return_h else y
    args = (delta.contiguous(), query.to(torch.float32).contiguous(), O.contiguous(), M.contiguous(),
            L.contiguous(), norm_weight.contiguous())
    if fused is False:
        h = torch.empty((t, d), dtype=D.torch_dtype(y_dt), device=partial.device)
        y = torch.empty_like(h)
        update_unfused(target, partial, *args, h, y, eps, norm_eps, row_block(d))
        return (h, y) if return_h else y
    dts = (D.from_torch(delta.dtype), D.from_torch(norm_weight.dtype), y_dt)
    inputs = dict(zip(("partial", "delta", "query", "O", "M", "L", "norm_weight"), (partial,) + args))
    launch = fused_launcher(target, t, d, *dts, eps, norm_eps, return_h)
    if launch is None:
        exe = update_executable(target, t, d, *dts, eps, norm_eps, return_h)
        if fused:
            raise K31Error("attnres_update: the superkernel pass did not fuse the update and RMSNorm kernels: "
                           + "; ".join(exe.p.report or ["no report"]), hint="pass fused=False for the two-kernel path")
        out = exe(inputs)
        return (out["h"], out["y"]) if return_h else out["y"]
    inputs["y"] = torch.empty((t, d), dtype=D.torch_dtype(y_dt), device=partial.device)
    if return_h:
        inputs["h"] = torch.empty_like(inputs["y"])
    launch(inputs)
    return (inputs["h"], inputs["y"]) if return_h else inputs["y"]


def row_warps(bd: int) -> int:
    """Warps for a whole-row program where no autotuner runs (graph programs): ~16 elements per thread."""
    return max(1, min(16, bd // 512))


def update_program(t: int, d: int, delta_dt, w_dt, out_dt, eps: float, norm_eps: float, return_h: bool = True):
    """attnres_update as a graph program of two calls: the update kernel writes h (and partial in
    place), the row RMSNorm reads h. The superkernel pass inlines the second into the first."""
    from k31dsl.lowering.graph import Program
    bd = row_block(d)
    p = Program("attnres_update")
    partial = p.input("partial", (t, d), k.f32)
    delta = p.input("delta", (t, d), delta_dt)
    q = p.weight("query", (d,), k.f32)
    o = p.input("O", (t, d), k.f32)
    m = p.input("M", (t,), k.f32)
    l = p.input("L", (t,), k.f32)
    w = p.weight("norm_weight", (d,), w_dt)
    h = p.tensor("h", (t, d), out_dt)
    y = p.tensor("y", (t, d), out_dt)
    _, h = p.call(attnres_update_rows, partial, delta, q, o, m, l, h, eps, BD=bd, WARPS=row_warps(bd))
    y = p.call(rmsnorm_row, h, w, y, norm_eps, BD=bd, WARPS=row_warps(bd))
    p.output(*((h, y) if return_h else (y,)))
    return p


_EXECUTABLES: dict = {}


def update_executable(target: str, t: int, d: int, delta_dt, w_dt, out_dt, eps: float, norm_eps: float,
                      return_h: bool = True, passes=None):
    """The compiled program (the target's graph pipeline, or `passes`), cached per shape/dtypes/eps."""
    from k31dsl.lowering.graph import compile_program
    key = (target, t, d, delta_dt, w_dt, out_dt, eps, norm_eps, return_h, None if passes is None else tuple(passes))
    exe = _EXECUTABLES.get(key)
    if exe is None:
        prog = update_program(t, d, delta_dt, w_dt, out_dt, eps, norm_eps, return_h)
        exe = _EXECUTABLES[key] = compile_program(prog, target, passes=passes)
        for nid in exe.p.calls():
            kern = exe.p.node(nid).kernel
            if not kern.configs and "WARPS" in kern.constexprs:
                # a fused kernel comes without configs; keep the warp count its parts were given
                w = kern.constexprs["WARPS"]
                kern.configs = [{"WARPS": w, "num_warps": w}]
    return exe


_FUSED: dict = {}


def fused_launcher(target: str, t: int, d: int, delta_dt, w_dt, out_dt, eps: float, norm_eps: float,
                   return_h: bool = True):
    """When the target's graph pipeline leaves attnres_update's program as one kernel (the
    superkernel pass fused it), a function {tensor name: tensor} -> None that launches it directly
    (no per-call buffer planning: the host path stays short at decode sizes). None when the
    program was not fused. Programs have static shapes; when the fused kernel built for T and for
    T + 1 is the same IR (nothing of T baked in), one launcher serves every T."""
    from k31dsl.dsl.text import print_kernel
    any_t = (target, None, d, delta_dt, w_dt, out_dt, eps, norm_eps, return_h)
    key = any_t if any_t in _FUSED else (target, t, d, delta_dt, w_dt, out_dt, eps, norm_eps, return_h)
    if key not in _FUSED:
        exe = update_executable(target, t, d, delta_dt, w_dt, out_dt, eps, norm_eps, return_h)
        ops = exe.p.ops()
        if len(ops) != 1 or exe.p.node(ops[0]).kind != "call":
            _FUSED[key] = None
            return None
        node = exe.p.node(ops[0])
        launch = exe.launcher(ops[0])
        binding = [(True, exe.p.tensor_node(v).storage) if isinstance(v, str) else (False, v)
                   for v in (node.args[prm.name] for prm in node.kernel.params)]
        _FUSED[key] = lambda tensors: launch(*[tensors[b] if is_t else b for is_t, b in binding])
        other = update_executable(target, t + 1, d, delta_dt, w_dt, out_dt, eps, norm_eps, return_h)
        if [print_kernel(other.p.node(n).kernel) for n in other.p.ops()] == [print_kernel(node.kernel)]:
            _FUSED[any_t] = _FUSED[key]
    return _FUSED[key]


def update_unfused(target, partial, delta, q, o, m, l, w, h, y, eps, norm_eps, bd):
    """The two kernels in sequence (h goes through global memory)."""
    attnres_update_rows[target](partial, delta, q, o, m, l, h, eps, BD=bd)
    rmsnorm_row[target](h, w, y, norm_eps, BD=bd)


# ---------------------------------------------------------------- checks against the oracle

F32_TOL, BF16_TOL = 1e-4, 2e-2


def _tol(dtype) -> float:
    import torch
    return F32_TOL if dtype == torch.float32 else BF16_TOL


def _sources(shape, dtype, gen, zero_row: bool = True):
    """Random sources whose rows differ in scale by up to e^+-3 (the RMS normalisation matters),
    one all-zero row (its key is 0 / sqrt(eps)) and one large row."""
    import torch
    v = torch.randn(shape, generator=gen) * torch.exp(1.5 * torch.randn(shape[:-1] + (1,), generator=gen))
    if zero_row and shape[0] > 1 and shape[1] > 1:
        v[1, 0] = 0.0
        v[0, -1] *= 300.0
    return v.to(dtype)


def _queries(shape, gen, scale: float = 2.0):
    """Pseudo-queries with logits of standard deviation ~scale."""
    import torch
    return torch.randn(shape, generator=gen) * (scale / shape[-1] ** 0.5)


def _rel(got, want, normwise: bool | None = None) -> float:
    """Elementwise relative error (floored at 1e-3 of the largest value) for bf16/f16 results,
    whose error is their own rounding; normwise (max error / largest value) for fp32 vectors
    (O, h, y): their error comes from the logits, |dz| ~ |z| * 2^-24 * sqrt(D), and scales with the
    sources mixed into a row, not with the (possibly cancelling) element itself."""
    import numpy as np
    import torch
    from k31dsl.ops.testing import max_rel_err, to_f64
    want = np.asarray(want, np.float64)
    if normwise is None:
        normwise = got.dtype == torch.float32
    top = float(np.abs(want).max()) if want.size else 0.0
    return max_rel_err(to_f64(got), want, floor=top if normwise else 1e-3 * top)


def _check_attnres(target: str, seed: int = 0) -> list[CaseResult]:
    import torch
    from k31dsl.ops.testing import device_for, dtype_name, load_oracle, to_f64
    ref = load_oracle("attnres")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cases = [((3, 5, 200), torch.bfloat16, True, None, 2.0), ((1, 4, 37), torch.float32, False, None, 2.0),
             ((9, 3, 96), torch.float32, True, torch.float32, 20.0), ((17, 2, 50), torch.bfloat16, False,
                                                                       torch.float32, 2.0),
             ((2, 1, 1), torch.float32, False, None, 2.0)]
    out = []
    for shape, dt, gain, out_dt, scale in cases:
        v = _sources(shape, dt, g)
        q = _queries((shape[2],), g, scale)
        w = (1 + 0.3 * torch.randn(shape[2], generator=g)) if gain else None
        h = attnres(v.to(dev), q.to(dev), 1e-6, norm_weight=None if w is None else w.to(dev), out_dtype=out_dt,
                    target=target)
        q_eff = to_f64(q) * (1.0 if w is None else to_f64(w))
        err = _rel(h, ref.attnres(to_f64(v), q_eff, 1e-6))
        t = _tol(h.dtype)
        out.append(CaseResult(f"sources={list(shape)} {dtype_name(dt)}, gain={gain}, logit scale {scale} -> "
                              f"{dtype_name(h.dtype)}", err, t, err <= t))
    return out


def _check_prepare(target: str, seed: int = 0) -> list[CaseResult]:
    import torch
    from k31dsl.ops.testing import device_for, dtype_name, load_oracle, to_f64
    ref = load_oracle("attnres")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cases = [((5, 7, 200), 3, torch.float32, 2.0), ((8, 3, 130), 6, torch.float32, 20.0),
             ((1, 2, 64), 2, torch.float32, 2.0), ((3, 4, 45), 9, torch.float32, 2.0),
             ((4, 3, 100), 2, torch.bfloat16, 2.0), ((33, 2, 24), 3, torch.float32, 2.0)]
    out = []
    for shape, s, dt, scale in cases:
        v = _sources(shape, dt, g)
        q = _queries((s, shape[2]), g, scale)
        o, m, l = attnres_prepare(v.to(dev), q.to(dev), 1e-6, target=target)
        want = ref.prepare(to_f64(v), to_f64(q), 1e-6)
        name = f"blocks={list(shape)} {dtype_name(dt)}, S={s}, logit scale {scale}"
        for what, got, w in zip("OML", (o, m, l), want):
            err = _rel(got, w, normwise=what != "L")      # L >= 1: elementwise
            out.append(CaseResult(f"{name}: {what}", err, F32_TOL, err <= F32_TOL))
    return out


def _check_update(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, dtype_name, f32_mismatches, load_oracle, to_f64
    ref, fp = load_oracle("attnres"), load_oracle("fp")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cases = [(7, 200, torch.bfloat16, None, 2.0), (2, 7168, torch.bfloat16, None, 2.0),
             (5, 45, torch.float32, torch.float32, 20.0), (1, 1, torch.bfloat16, None, 2.0),
             (3, 96, torch.float16, torch.bfloat16, 2.0)]
    out = []
    for t, d, delta_dt, out_dt, scale in cases:
        blocks = _sources((3, t, d), torch.float32, g)
        o, m, l = (x.astype(np.float32).astype(np.float64)
                   for x in ref.prepare(to_f64(blocks), to_f64(_queries((1, d), g, scale)), 1e-6))
        o, m, l = o[0], m[0], l[0]
        partial = _sources((1, t, d), torch.float32, g, zero_row=False)[0]
        delta = torch.randn(t, d, generator=g).to(delta_dt)
        q = _queries((d,), g, scale)
        w = 1 + 0.3 * torch.randn(d, generator=g)
        p_dev = partial.clone().to(dev)          # updated in place; `partial` keeps the old values
        as_t = (lambda a: torch.from_numpy(a.astype(np.float32)).to(dev))
        h, y = attnres_update(p_dev, delta.to(dev), q.to(dev), as_t(o), as_t(m), as_t(l), w.to(dev), 1e-6, 1e-5,
                              out_dtype=out_dt, target=target)
        rnd = (lambda a: fp.round_to(a, fp.BF16)) if h.dtype == torch.bfloat16 else None
        p_want, h_want, y_want = ref.update_rmsnorm(to_f64(partial), to_f64(delta), to_f64(q), o, m, l, to_f64(w),
                                                    1e-6, 1e-5, round_h=rnd)
        name = f"T={t}, D={d}, delta {dtype_name(delta_dt)}, logit scale {scale} -> {dtype_name(h.dtype)}"
        bad = f32_mismatches(p_dev.cpu().numpy(), fp.round_to(p_want, fp.F32))
        out.append(CaseResult(f"{name}: partial += delta (in place)", bad, 0, bad == 0, "fp32 values != f32(p + d)"))
        for what, got, want in (("h", h, h_want), ("y", y, y_want)):
            err = _rel(got, want)
            out.append(CaseResult(f"{name}: {what}", err, _tol(got.dtype), err <= _tol(got.dtype)))
    return out


register(OpSpec("attnres", "attnres", attnres, [attnres_prepare_rows],
                "full Attention Residuals: softmax over depth of RMS-normalised sources (K3, gain folded into q)",
                _check_attnres, tags=["attnres"]))
register(OpSpec("attnres_prepare", "attnres", attnres_prepare, [attnres_prepare_rows],
                "Block AttnRes phase 1: S queries vs n blocks read once -> O, M, L (fp32)",
                _check_prepare, tags=["attnres"]))
register(OpSpec("attnres_update", "attnres", attnres_update, [attnres_update_rows, rmsnorm_row],
                "Block AttnRes phase 2: partial += delta, online-softmax merge, next RMSNorm (bf16 h, y)",
                _check_update, tags=["attnres", "norm"]))

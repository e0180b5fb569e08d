"""chunk_kda: KDA chunked prefill over torch tensors, fla's shapes and options (research/kda.md
§2). The kernels are in chunk_kernels.py; this module checks inputs, builds the chunk map for
varlen, launches the two kernels and registers the op with its check against the fp64 oracle."""

import contextlib
import itertools

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import require_tensor, resolve_target
from k31dsl.ops.kda.chunk_kernels import kda_chunk_prep, kda_chunk_state
from k31dsl.ops.kda.chunk_pair import kda_chunk_pair_merge
from k31dsl.ops.kda.chunk_prep_wide import kda_chunk_prep_wide
from k31dsl.ops.kda.gate import GATE_LOWER, GATE_NONE, check_gate_params
from k31dsl.ops.registry import CaseResult, OpSpec, register

CHUNK_SIZES = (16, 32, 64)
SUB_CHUNK = 16
HEAD_DIMS = (16, 32, 64, 128, 256)
PREP_VARIANTS = {  # name: (score-block dots, solve dots, dtype of the tiles kept across sub-chunks)
    "tf32": ("tf32", "tf32", k.f32), "tf32-keep16": ("tf32", "tf32", k.bf16), "bf16": ("bf16", "bf16", k.bf16),
    "mixed": ("bf16", "tf32", k.f32), "mixed-keep16": ("bf16", "tf32", k.bf16)}
# "mixed": bf16 score blocks (Aqk, Akk) + tf32 solve: as accurate as all-tf32 on the numpy emulation
# (bf16 solve dots raise the state error 2.2e-2 -> 3.3e-2) and ptxas (sm_90a, 8 warps) spills 128 B
# per thread instead of 1000 B with tf32 score blocks
DEFAULT_VARIANT = "mixed"
_MAPS: dict = {}            # (cu_seqlens, chunk) -> (chunk_info, seq_chunks, cu) on a device
# benchmarks/kda.py sets this to a callable(phase name) -> context manager that brackets each kernel
# launch ("prep", "state") with CUDA events, so one run tells where the time goes; None otherwise
_PHASE_HOOK = None


def _phase(name: str):
    return _PHASE_HOOK(name) if _PHASE_HOOK is not None else contextlib.nullcontext()


def _pow2_dim(op: str, name: str, d: int):
    if d not in HEAD_DIMS:
        raise K31Error(f"{op}: {name}={d} is not supported", hint=f"head dims must be one of {HEAD_DIMS}")


def chunk_map(cu: list[int], bt: int, device):
    """Per chunk (first token, end of its sequence) and per sequence its first chunk, int32."""
    import torch
    key = (tuple(cu), bt, str(device))
    hit = _MAPS.get(key)
    if hit is not None:
        return hit
    info, seq_chunks = [], [0]
    for s in range(len(cu) - 1):
        info += [(t, cu[s + 1]) for t in range(cu[s], cu[s + 1], bt)]
        seq_chunks.append(len(info))
    info_t = torch.tensor(info or [(0, 0)], dtype=torch.int32).reshape(-1, 2)[:max(1, len(info))]
    out = (info_t.to(device), torch.tensor(seq_chunks, dtype=torch.int32, device=device),
           torch.tensor(cu, dtype=torch.int32, device=device), len(info))
    if len(_MAPS) > 64:
        _MAPS.clear()
    _MAPS[key] = out
    return out


_HOST: dict = {}            # id -> (tensor, version, list): cu_seqlens read back once, not per call


def _host_list(t) -> list[int]:
    """cu_seqlens as a Python list; a device tensor is copied to the host only the first time it
    is seen (unchanged), so repeated calls (and CUDA-graph capture after a warm-up) do not sync."""
    hit = _HOST.get(id(t))
    if hit is not None and hit[0] is t and hit[1] == t._version:
        return hit[2]
    out = [int(c) for c in t.tolist()]
    if len(_HOST) > 64:
        _HOST.clear()
    _HOST[id(t)] = (t, t._version, out)
    return out


def _check_inputs(q, kk, v, g, beta, initial_state, cu_seqlens, chunk_size, v_first=False):
    op = "chunk_kda"
    for name, t, rank in (("q", q, 4), ("k", kk, 4), ("v", v, 4), ("g", g, 4), ("beta", beta, 3)):
        require_tensor(op, name, t)
        if t.dim() != rank:
            raise K31Error(f"{op}: `{name}` must have rank {rank}, got shape {list(t.shape)}",
                           hint="fla shapes: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]")
    if q.dtype != kk.dtype or q.dtype != v.dtype:
        raise K31Error(f"{op}: q, k and v must share a dtype, got {q.dtype}, {kk.dtype}, {v.dtype}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if tuple(kk.shape) != (B, T, H, K):
        raise K31Error(f"{op}: `k` must have the shape of q {list(q.shape)}, got {list(kk.shape)}")
    if tuple(v.shape[:2]) != (B, T) or HV % H:
        raise K31Error(f"{op}: `v` must be [B, T, HV, V] with HV a multiple of H={H}, got {list(v.shape)}")
    if tuple(g.shape) != (B, T, HV, K):
        raise K31Error(f"{op}: `g` must have shape {[B, T, HV, K]} (per value head, per key channel), "
                       f"got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, HV):
        raise K31Error(f"{op}: `beta` must have shape {[B, T, HV]}, got {list(beta.shape)}")
    _pow2_dim(op, "K", K)
    _pow2_dim(op, "V", V)
    if chunk_size not in CHUNK_SIZES:
        raise K31Error(f"{op}: chunk_size={chunk_size!r} is not supported", hint=f"use one of {CHUNK_SIZES}")
    if cu_seqlens is not None:
        require_tensor(op, "cu_seqlens", cu_seqlens, (k.i32, k.i64))
        if B != 1 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise K31Error(f"{op}: varlen needs B == 1 and cu_seqlens [N + 1], got q {list(q.shape)}, "
                           f"cu_seqlens {list(cu_seqlens.shape)}")
        cu = _host_list(cu_seqlens)
        if cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
            raise K31Error(f"{op}: cu_seqlens must rise from 0 to T={T}, got {cu[:8]}{'...' if len(cu) > 8 else ''}")
    else:
        cu = [b * T for b in range(B + 1)]
    n = len(cu) - 1
    if initial_state is not None:
        require_tensor(op, "initial_state", initial_state, (k.f32,))
        want = (n, HV, V, K) if v_first else (n, HV, K, V)
        if tuple(initial_state.shape) != want:
            raise K31Error(f"{op}: `initial_state` must be fp32 [N, HV, {'V, K' if v_first else 'K, V'}] = "
                           f"{list(want)}, got {list(initial_state.shape)}")
    return B, T, H, K, HV, V, cu


# Pairing (chunk_pair.py): two whole-chunk prep halves merged into one chunk. With few (head,
# sequence) pairs the state kernel's chain of dependent steps is the critical path, so halves of 32
# make chunk 64 (half the steps); otherwise halves of 16 make chunk 32 (the chunk-16 prep fits
# three programs per SM). At or below this many pairs chunk 64 is the default.
PAIR_MAX_HEADS = 16
PREPS = ("sub", "wide", "pair")


def default_tiling(lower_bound_gate: bool, chunk_size=None, prep=None, head_seqs=None) -> tuple:
    """(chunk size, prep kernel) for what a call leaves open; head_seqs = HV x sequences. Measured
    on an H200 (benchmarks/NOTES.md, KDA runs 13-21, bf16, K = V = 128, lower-bound gate). Many
    heads: the whole-chunk prep at chunk 16 (one block per program, five per SM) with the state
    kernel at chunk 16: T=8192 H=96 1.476 ms (run 20) against 1.515 for halves of 16 paired into chunk 32
    (the merge costs 0.27 ms, the longer state chain 0.23) and 1.98 at chunk 32; varlen 8 x 8192
    10.21 against 10.89. Few heads: the state kernel's chain of dependent steps is the critical
    path, so halves of 32 paired into chunk 64: T=32768 H=12 1.81 ms (whole-chunk prep at chunk 32
    2.09, sub-chunk prep at 64 2.18), T=131072 H=12 7.09 (8.31, 8.56). The whole-chunk prep spills
    at chunk 64 (4.27 ms of prep). An explicit chunk size keeps the
    unpaired kernels (wide at 16 and 32, sub at 64: what the model's graph programs call). Other
    gates pair the sub-chunk prep's halves (the whole-chunk one relies on a bounded per-row decay):
    softplus gate at T=8192 H=96, KDA run 18: 9.65 ms paired into chunk 32 against 20.4 at sub 64
    (exact diagonal blocks); with the diagonal blocks factorised where the decay allows (run 31)
    2.98 ms paired into chunk 32 (prep 2.10, merge 0.26, state 0.59) against fla's 2.91; the
    sub-chunk prep at chunk 16 (no merge) 2.64 ms (prep 1.82, state 0.82) against fla's 2.89 in the
    same run (1 Dec, run 8 of the 11:35 session; pair 64 4.88, sub 32 4.54, sub 64 5.25), so many
    heads under these gates take it."""
    few = head_seqs is not None and head_seqs <= PAIR_MAX_HEADS
    if prep is None and chunk_size is None and not lower_bound_gate and not few:
        prep, chunk_size = "sub", 16
    if prep is None:
        if chunk_size is None:
            prep = "wide" if lower_bound_gate and not few else "pair"
        elif lower_bound_gate:
            prep = "wide" if chunk_size in (16, 32) else "sub"
        else:
            prep = "sub"
    if chunk_size is None:
        chunk_size = {"wide": 32 if few else 16, "pair": 64 if few else 32}.get(prep, 64)   # unknown: checked later
    return chunk_size, prep


def chunk_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              use_qk_l2norm=True, chunk_size=None, A_log=None, dt_bias=None, lower_bound=None, state_v_first=False,
              target=None, _variant: str | None = None, _prep: str | None = None):
    """KDA forward, chunked -> (o [B, T, HV, V] like v, final_state fp32 [N, HV, K, V] or None).

    q, k [B, T, H, K]; v [B, T, HV, V] (HV a multiple of H); g [B, T, HV, K] the natural-log decay,
    or the raw gate when any of A_log [HV], dt_bias [HV*K], lower_bound is given (then the gate of
    kda_gate is applied in-kernel); beta [B, T, HV]; initial_state fp32 [N, HV, K, V]; varlen by
    cu_seqlens [N + 1] with B == 1. scale defaults to K^-0.5; q and k are L2-normalised in-kernel
    unless use_qk_l2norm=False. state_v_first=True: initial and final states are [N, HV, V, K]
    (K contiguous, the layout kda_decode's state_v_first pool uses). chunk_size 16/32/64, by
    default `default_tiling`'s choice. `_prep` ("sub" | "wide" | "pair", for measurements; default
    the same function's) picks the prep kernel: sub-chunk steps, whole-chunk tiles
    (chunk_prep_wide.py; lower-bound gate, chunk 16, 32 or 64), or halves paired into one chunk
    (chunk_pair.py; chunk 32 or 64 from halves of 16 or 32, made by the whole-chunk prep under
    the lower-bound gate and by the sub-chunk one otherwise)."""
    import torch
    op = "chunk_kda"
    target = resolve_target(target)
    gate_in = A_log is not None or dt_bias is not None or lower_bound is not None
    B, T, H, K, HV, V, cu = _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens,
                                          64 if chunk_size is None else chunk_size, state_v_first)
    if chunk_size is None or _prep is None:
        chunk_size, _prep = default_tiling(lower_bound is not None, chunk_size, _prep, HV * (len(cu) - 1))
    a_log, bias, mode, lb = check_gate_params(op, HV, K, A_log, dt_bias, lower_bound)
    mode = mode if gate_in else GATE_NONE
    scale = K ** -0.5 if scale is None else float(scale)
    if _prep not in PREPS:
        raise K31Error(f"{op}: _prep={_prep!r} is not a prep kernel", hint=f"one of {PREPS}")
    if _prep == "wide" and mode != GATE_LOWER:
        raise K31Error(f"{op}: the wide prep kernel needs the lower-bound gate (a bounded decay per row), got "
                       f"no lower_bound", hint="pass lower_bound (with A_log / dt_bias), or use _prep='sub'")
    if _prep == "pair" and chunk_size not in (32, 64):
        raise K31Error(f"{op}: the paired prep makes chunks of 32 or 64 rows out of halves of 16 or 32, got "
                       f"chunk_size={chunk_size}", hint="chunk_size=32 or 64, or _prep='sub'")
    dev = q.device
    n = len(cu) - 1
    bt = chunk_size
    info, seq_chunks, cu_t, nt = chunk_map(cu, bt, dev)
    mt = torch.bfloat16 if q.dtype != torch.float32 else torch.float32
    nt1 = max(nt, 1)
    w = torch.empty(nt1, HV, bt, K, dtype=mt, device=dev)
    qg, kb = torch.empty_like(w), torch.empty_like(w)
    u = torch.empty(nt1, HV, bt, V, dtype=mt, device=dev)
    aqk = torch.empty(nt1, HV, bt, bt, dtype=mt, device=dev)
    gam = torch.empty(nt1, HV, K, dtype=torch.float32, device=dev)
    # pair: the prep writes half-chunks straight into the chunk tensors, seen as [NT, 2 HV, bt / 2, *]
    gam_half = torch.empty(nt1, HV * 2, K, dtype=torch.float32, device=dev) if _prep == "pair" else None
    halves = [t.view(nt1, HV * 2, bt // 2, t.shape[-1]) for t in (w, u, qg, kb, aqk)] if _prep == "pair" else None
    o = torch.empty(B * T, HV, V, dtype=v.dtype, device=dev)
    ht_shape = (n, HV, V, K) if state_v_first else (n, HV, K, V)
    ht = torch.empty(ht_shape, dtype=torch.float32, device=dev) if output_final_state else \
        torch.empty(1, 1, 1, 1, dtype=torch.float32, device=dev)
    h0 = initial_state.contiguous() if initial_state is not None else torch.empty(1, 1, 1, 1, dtype=torch.float32,
                                                                                   device=dev)
    prec = "ieee" if mt == torch.float32 else "tf32"
    # prep-kernel numerics for 16-bit inputs: (dot operands, dtype of the tiles kept across
    # sub-chunks); `_variant` picks another for measurements (benchmarks/kda.py)
    prep_prec, solve, keep = PREP_VARIANTS[_variant or DEFAULT_VARIANT] if mt != torch.float32 else \
        ("ieee", "ieee", D.f32)
    # On a GPU the state kernel's BV and launch options are autotuned per shape over its configs of
    # this chunk size; elsewhere (interpreter, numpy) passed.
    tuned = target == "triton" and dev.type == "cuda" and V >= 64
    tiles_state = {"BT": bt} if tuned else {"BT": bt, "BV": min(32, V)}
    if nt:
        flat = [t.contiguous().reshape(B * T, *t.shape[2:]) for t in (q, k, v, g, beta)]
        with _phase("prep"):
            # pair: halves of bt / 2 rows into the [NT, 2 HV, bt / 2, *] views; the prep's configs of
            # its tile size are tuned where there are two. The whole-chunk prep needs the lower-bound
            # gate, the sub-chunk one takes any.
            pair = _prep == "pair"
            outs = [*halves, gam_half] if pair else [w, u, qg, kb, aqk, gam]
            tiles = {"PAIR": True, "BT": bt // 2} if pair else {"BT": bt}
            if _prep == "wide" or (pair and mode == GATE_LOWER):
                kda_chunk_prep_wide[target](*flat, a_log.to(dev), bias.to(dev), info, *outs, scale, lb,
                                            L2=bool(use_qk_l2norm), PREC=prep_prec, SOLVE=solve, BK=K, BVV=V, **tiles)
            else:
                kda_chunk_prep[target](*flat, a_log.to(dev), bias.to(dev), info, *outs, scale, lb, GATE=mode,
                                       SAFE=(mode == GATE_LOWER), L2=bool(use_qk_l2norm), PREC=prep_prec, SOLVE=solve,
                                       KEEP=keep, BC=min(SUB_CHUNK, tiles["BT"]), BK=K, BVV=V, **tiles)
    if nt and _prep == "pair":
        with _phase("merge"):
            kda_chunk_pair_merge[target](*halves, gam_half, gam, PREC=prec, BT=bt // 2, BK=K, BVV=V)
    if nt or output_final_state:
        with _phase("state"):
            kda_chunk_state[target](w, u, qg, kb, aqk, gam, seq_chunks, cu_t, h0, ht, o,
                                    HAS_H0=initial_state is not None, STORE_HT=bool(output_final_state), PREC=prec,
                                    VFIRST=bool(state_v_first), BK=K, **tiles_state)
    return o.view(B, T, HV, V), (ht if output_final_state else None)


# ---------------------------------------------------------------- check against the oracle

def make_inputs(gen, B, T, H, HV, K, V, dtype, gate: str, n_seqs: int = 0, h0: bool = False):
    """Random KDA inputs (torch, CPU) for one case; gate is "lb" (raw gate, lower bound -5 with
    A_log/dt_bias), "softplus" (raw gate, large inputs), or "logdecay" (g is the decay itself)."""
    import torch
    q = torch.randn(B, T, H, K, generator=gen).to(dtype)
    kk = torch.randn(B, T, H, K, generator=gen).to(dtype)
    v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    beta = torch.rand(B, T, HV, generator=gen).to(dtype)
    kw = {}
    if gate == "logdecay":
        g = (-torch.rand(B, T, HV, K, generator=gen) * 2).to(dtype)
    else:
        g = (torch.randn(B, T, HV, K, generator=gen) * (8 if gate == "softplus" else 3)).to(dtype)
        kw = {"A_log": torch.randn(HV, generator=gen) * 0.5, "dt_bias": torch.randn(HV * K, generator=gen)}
        if gate == "lb":
            kw["lower_bound"] = -5.0
    if n_seqs:          # odd lengths when the parity of T allows it (ragged against every chunk size)
        if (T - n_seqs) % 2 == 0 and T >= 3 * n_seqs:
            lens = [2 * int(torch.randint(0, T // (2 * n_seqs) + 1, (1,), generator=gen)) + 1 for _ in range(n_seqs - 1)]
            lens.append(T - sum(lens))
        else:
            cuts = torch.randperm(T - 1, generator=gen)[:n_seqs - 1].add(1).sort().values.tolist()
            lens = [b - a for a, b in zip([0] + cuts, cuts + [T])]
        kw["cu_seqlens"] = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    n = n_seqs or B
    if h0:
        kw["initial_state"] = torch.randn(n, HV, K, V, generator=gen) * 0.5
    return (q, kk, v, g, beta), kw


CHECK_CASES = [  # B, T, H, HV, K, V, dtype, gate, chunk, varlen seqs, initial state, prep kernel
    (1, 37, 1, 2, 16, 16, "f32", "lb", 16, 0, True, "sub"),
    (2, 9, 2, 2, 16, 32, "f32", "softplus", 16, 0, False, "sub"),
    (1, 45, 1, 1, 16, 16, "f32", "logdecay", 32, 3, True, "sub"),
    (1, 40, 1, 2, 32, 16, "bf16", "lb", 32, 0, False, "sub"),
    (1, 83, 1, 2, 16, 16, "f32", "lb", 64, 2, True, "wide"),
    (1, 40, 1, 2, 32, 16, "bf16", "lb", 32, 0, False, "wide"),
    (1, 99, 1, 2, 16, 16, "f32", "lb", 64, 2, True, "pair"),
    (1, 77, 1, 2, 16, 16, "f32", "softplus", 32, 2, True, "pair"),
]


def _check_chunk(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, load_oracle, max_rel_err, to_f64
    ref = load_oracle("kda")
    dev = device_for(target)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for B, T, H, HV, K, V, dt, gate, bt, ns, h0, prep in CHECK_CASES:
        dtype = D.torch_dtype(D.from_name(dt))
        args, kw = make_inputs(gen, B, T, H, HV, K, V, dtype, gate, ns, h0)
        o, ht = chunk_kda(*(a.to(dev) for a in args), **{n: t.to(dev) if hasattr(t, "to") else t
                                                          for n, t in kw.items()},
                          output_final_state=True, chunk_size=bt, target=target, _prep=prep)
        want_o, want_s = ref.kda(*args, **kw)
        # f32: element-wise down to 0.1 max|want|; bf16 (operands kept in bf16 like fla): normwise
        tol, floor = (2e-4, 0.1) if dt == "f32" else (2e-2, 1.0)
        name = f"B={B} T={T} H={H} HV={HV} K={K} V={V} {dt} gate={gate} chunk={bt} seqs={ns or B} h0={h0} prep={prep}"
        for what, got, want in (("o", o, want_o), ("final state", ht, want_s)):
            err = max_rel_err(to_f64(got), want, floor=floor * max(1e-3, float(np.abs(want).max())))
            out.append(CaseResult(f"{name}: {what}", err, tol, bool(err <= tol)))
    return out


register(OpSpec(name="chunk_kda", module="kda", fn=chunk_kda, kernels=[kda_chunk_prep, kda_chunk_state, kda_chunk_prep_wide,
                                                                  kda_chunk_pair_merge],
                summary="KDA chunked prefill (gate + L2 norm in-kernel, anchored UT solve on chip, fp32 state; varlen, GVA)",
                check=_check_chunk, tags=["kda"]))

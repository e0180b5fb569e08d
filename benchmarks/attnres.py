"""Attention Residuals on a GPU: the generated kernels vs torch eager and torch.compile of the same
math, with the copy ceiling measured in this run.

  1. prepare: blocks [n=8, T=8192, D=7168] fp32, S=6 queries -> O [S, T, D], M, L (fp32)
  1b. the cached prepare (ops/attnres_cached.py): the same O, M, L with the older blocks' logits
     from the logit cache and the newest block scored against this and --later later queries, so
     the blocks are read once; anchors: the same cached math in torch
  2. update + RMSNorm at T=8192, D=7168: partial (fp32, in place) += delta (bf16), online-softmax
     merge with (O, M, L), next RMSNorm -> h, y (bf16); with h returned and y only
  3. the superkernel's effect at decode sizes (T = 1, 4, 16, 64): the two-kernel path vs the graph
     program (fused by the superkernel pass), per-call and graph-replay time, launches per step

    python benchmarks/attnres.py            # GPU; writes benchmarks/results/attnres.{json,md}
    python benchmarks/attnres.py --smoke    # tiny shapes on the CPU (Triton interpreter), no anchors timed

Correctness is checked before timing (against torch eager, which computes in fp32)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

EPS, NORM_EPS = 1e-6, 1e-6


# ---------------------------------------------------------------- anchors: the same math in torch

def torch_prepare(v, q, eps: float = EPS):
    import torch
    r = (v.square().mean(-1) + eps).rsqrt()                 # [n, T]
    z = torch.einsum("sd,ntd->snt", q, v) * r               # [S, n, T]
    m = z.amax(1)
    e = (z - m[:, None]).exp()
    return torch.einsum("snt,ntd->std", e, v), m, e.sum(1)


def torch_block_logits(block, q, eps: float = EPS):
    """Logits of one block [T, D] against queries [Q, D]: [Q, T]."""
    return (q @ block.T) * (block.square().mean(-1) + eps).rsqrt()


def torch_prepare_cached(v, q, z, first: int, count: int, eps: float = EPS):
    """The cached prepare's math: the newest block scored against queries[first:] into the cache z,
    then the softmax-weighted sum of the blocks for queries[first : first + count]."""
    import torch
    n = v.shape[0]
    z[n - 1, first:] = torch_block_logits(v[n - 1], q[first:], eps)
    zz = z[:n, first:first + count]                          # [n, S, T]
    m = zz.amax(0)
    e = (zz - m).exp()
    return torch.einsum("nst,ntd->std", e, v), m, e.sum(0)


def torch_update(partial, delta, q, o, m, l, w, eps: float = EPS, norm_eps: float = NORM_EPS, return_h: bool = True):
    import torch
    p = partial + delta.float()
    partial.copy_(p)
    score = (p @ q) * (p.square().mean(-1) + eps).rsqrt()
    mx = torch.maximum(m, score)
    a, b = (m - mx).exp(), (score - mx).exp()
    h = ((o * a[:, None] + p * b[:, None]) / (l * a + b)[:, None]).to(torch.bfloat16)
    hf = h.float()
    y = (hf * (hf.square().mean(-1, keepdim=True) + norm_eps).rsqrt() * w.float()).to(torch.bfloat16)
    return (h, y) if return_h else y


def torch_update_y(*args):
    return torch_update(*args, return_h=False)


# ---------------------------------------------------------------- timing

class Timer:
    """GPU: triton.testing medians (per call with host overhead, and CUDA-graph replay).
    Smoke: wall-clock medians on the CPU, no graph replay."""

    def __init__(self, smoke: bool):
        self.smoke = smoke

    def call_ms(self, fn) -> float:
        if not self.smoke:
            return harness.median_ms(fn)
        fn()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[1]

    def graph_ms(self, fn) -> float:
        return float("nan") if self.smoke else harness.graph_median_ms(fn)


def count_kernels(fn, smoke: bool):
    """CUDA kernels one call of fn launches (torch profiler); None on the CPU."""
    if smoke:
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile
    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:  # noqa: BLE001 - a count is a nicety, not a result
        print(f"kernel count failed: {type(e).__name__}: {e}")
        return None


def rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


# ---------------------------------------------------------------- sections

def bench_prepare(timer, dev, target, n, t, d, s, compile_fn, rows, results):
    import torch
    from k31dsl.ops import attnres as ar
    g = torch.Generator(device=dev).manual_seed(0)
    v = torch.randn(n, t, d, device=dev, generator=g) * torch.randn(n, t, 1, device=dev, generator=g).mul(0.5).exp()
    q = torch.randn(s, d, device=dev, generator=g) * (2.0 / d ** 0.5)
    nbytes = n * t * d * 4 + s * t * d * 4 + 2 * s * t * 4 + s * d * 4
    fns = {"k31dsl": lambda: ar.attnres_prepare(v, q, EPS, target=target), "eager": lambda: torch_prepare(v, q)}
    if compile_fn is not None:
        cp = compile_fn(torch_prepare)
        fns["torch.compile"] = lambda: cp(v, q)
    want = torch_prepare(v, q)
    got = fns["k31dsl"]()
    errs = {w: rel_err(a, b) for w, a, b in zip("OML", got, want)}
    times = {k_: timer.call_ms(f) for k_, f in fns.items()}
    graph = {k_: timer.graph_ms(f) for k_, f in fns.items()}
    for name in fns:
        rows.append(_row(f"prepare n={n} T={t} D={d} S={s}", name, times, graph, nbytes, results.get("ceiling"),
                         err=errs if name == "k31dsl" else None))
    results["prepare"] = {"shape": [n, t, d, s], "bytes": nbytes, "times_ms": times, "graph_ms": graph,
                          "rel_err_vs_eager": errs,
                          "tuned": [str(c) for c in getattr(ar.prepare_kernel(target), "_tuned", {}).values()]}


def bench_prepare_cached(timer, dev, target, n, t, d, s, later, compile_fn, rows, results):
    """The cached prepare at block n - 1 of a model whose later blocks add `later` queries: the
    cache's older rows hold the logits of blocks 0 .. n - 2 (from the earlier calls)."""
    import torch
    from k31dsl.ops import attnres_cached as ac
    g = torch.Generator(device=dev).manual_seed(0)
    v = torch.randn(n, t, d, device=dev, generator=g) * torch.randn(n, t, 1, device=dev, generator=g).mul(0.5).exp()
    q = torch.randn(s + later, d, device=dev, generator=g) * (2.0 / d ** 0.5)
    z = torch.empty(n, s + later, t, device=dev)
    for i in range(n - 1):
        z[i] = torch_block_logits(v[i], q)
    # the blocks once, the newest again for its logits, O / M / L, the queries, the cache's entries
    nbytes = (n + 1) * t * d * 4 + s * t * d * 4 + 2 * s * t * 4 + (s + later) * (d + t) * 4 + n * s * t * 4
    fns = {"k31dsl": lambda: ac.attnres_prepare_cached(v, q, z, 0, s, EPS, target=target),
           "eager": lambda: torch_prepare_cached(v, q, z, 0, s)}
    if compile_fn is not None:
        cp = compile_fn(torch_prepare_cached)
        fns["torch.compile"] = lambda: cp(v, q, z, 0, s)
    want = torch_prepare(v, q[:s])
    errs = {w: rel_err(a, b) for w, a, b in zip("OML", fns["k31dsl"](), want)}
    errs["cache row"] = rel_err(z[n - 1], torch_block_logits(v[n - 1], q))
    times = {k_: timer.call_ms(f) for k_, f in fns.items()}
    graph = {k_: timer.graph_ms(f) for k_, f in fns.items()}
    case = f"prepare cached n={n} T={t} D={d} S={s} +{later} later"
    for name in fns:
        rows.append(_row(case, name, times, graph, nbytes, results.get("ceiling"),
                         err=errs if name == "k31dsl" else None))
    results.setdefault("prepare_cached", []).append(
        {"shape": [n, t, d, s, later], "bytes": nbytes, "times_ms": times, "graph_ms": graph,
         "rel_err_vs_eager": errs, "tuned": [str(c) for kd in ac.kernels(target) for c in getattr(kd, "_tuned", {}).values()]})


def _update_inputs(dev, t, d, seed=1):
    import torch
    g = torch.Generator(device=dev).manual_seed(seed)
    partial = torch.randn(t, d, device=dev, generator=g)
    delta = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
    q = torch.randn(d, device=dev, generator=g) * (2.0 / d ** 0.5)
    o = torch.randn(t, d, device=dev, generator=g) * 3
    m = torch.randn(t, device=dev, generator=g)
    l = torch.rand(t, device=dev, generator=g) * 3 + 1
    w = (1 + 0.2 * torch.randn(d, device=dev, generator=g)).to(torch.bfloat16)
    return partial, delta, q, o, m, l, w


def _k31_update(target, args, fused, return_h=True):
    from k31dsl.ops import attnres as ar
    return lambda: ar.attnres_update(*args, EPS, NORM_EPS, return_h=return_h, fused=fused, target=target)


def _program_kernels(target, t, d, return_h=True) -> int:
    """Kernels in the graph program after the target's pipeline (1 when the superkernel fused)."""
    from k31dsl.dsl import dtypes as D
    from k31dsl.ops import attnres as ar
    exe = ar.update_executable(target, t, d, D.bf16, D.bf16, D.bf16, EPS, NORM_EPS, return_h)
    return len(exe.p.calls())


def bench_update(timer, dev, target, t, d, compile_fn, rows, results):
    args = _update_inputs(dev, t, d)
    fused_kernels = _program_kernels(target, t, d)
    fns = {"k31dsl 2 kernels": _k31_update(target, args, False),
           f"k31dsl graph program ({fused_kernels} kernel)": _k31_update(target, args, None),
           "k31dsl graph program, y only": _k31_update(target, args, None, return_h=False),
           "eager": lambda: torch_update(*args)}
    if compile_fn is not None:
        cu, cy = compile_fn(torch_update), compile_fn(torch_update_y)
        fns["torch.compile"] = lambda: cu(*args)
        fns["torch.compile, y only"] = lambda: cy(*args)
    errs = {}
    ref_args = [a.clone() for a in args]
    want_h, want_y = torch_update(*ref_args)
    for name, fn in fns.items():
        if name.startswith("k31dsl"):
            saved = args[0].clone()
            out = fn()
            h, y = out if isinstance(out, tuple) else (None, out)
            errs[name] = {"y": rel_err(y, want_y), "partial": rel_err(args[0], ref_args[0])}
            if h is not None:
                errs[name]["h"] = rel_err(h, want_h)
            args[0].copy_(saved)
    times = {k_: timer.call_ms(f) for k_, f in fns.items()}
    graph = {k_: timer.graph_ms(f) for k_, f in fns.items()}
    elems = t * d
    for name in fns:
        y_only = "y only" in name
        moved = elems * (16 if y_only else 18) + (elems * 2 if "2 kernels" in name else 0)
        r = _row(f"update+rmsnorm T={t} D={d}", name, times, graph, moved, results.get("ceiling"), err=errs.get(name))
        r["effective TB/s (16 B/elt, graph)"] = elems * 16 / (graph[name] * 1e-3) / 1e12
        rows.append(r)
    results["update"] = {"shape": [t, d], "times_ms": times, "graph_ms": graph, "rel_err_vs_eager": errs,
                         "program_kernels": fused_kernels, "tuned": _tuned_rows(target)}


def bench_decode(timer, dev, target, sizes, d, compile_fn, rows, results, smoke):
    out = {}
    cu = compile_fn(torch_update) if compile_fn is not None else None
    for t in sizes:
        args = _update_inputs(dev, t, d, seed=2 + t)
        fns = {"k31dsl 2 kernels": _k31_update(target, args, False),
               "k31dsl graph program": _k31_update(target, args, None), "eager": lambda: torch_update(*args)}
        if cu is not None:
            fns["torch.compile"] = lambda: cu(*args)
        launches = {"k31dsl 2 kernels": 2, "k31dsl graph program": _program_kernels(target, t, d)}
        for name in ("eager", "torch.compile"):
            if name in fns:
                launches[name] = count_kernels(fns[name], smoke)
        times = {k_: timer.call_ms(f) for k_, f in fns.items()}
        graph = {k_: timer.graph_ms(f) for k_, f in fns.items()}
        for name in fns:
            rows.append({"case": f"decode step T={t} D={d}", "impl": name, "median ms": times[name],
                         "graph ms": graph[name], "launches": launches.get(name),
                         "vs 2 kernels (graph)": graph["k31dsl 2 kernels"] / graph[name]})
        out[t] = {"times_ms": times, "graph_ms": graph, "launches": launches}
    results["decode"] = out


def _row(case, name, times, graph, nbytes, ceiling, err=None) -> dict:
    r = {"case": case, "impl": name, "median ms": times[name], "graph ms": graph[name],
         "TB/s (graph)": nbytes / (graph[name] * 1e-3) / 1e12, "bytes moved": nbytes,
         "vs torch.compile (graph)": graph.get("torch.compile", float("nan")) / graph[name]}
    if ceiling:
        r["% copy ceiling (graph)"] = 100 * r["TB/s (graph)"] / ceiling
    if err:
        r["max rel err vs eager"] = max(err.values())
    return r


def _tuned(kdef, target):
    try:
        return [str(v) for v in kdef[target]._tuned.values()]
    except AttributeError:
        return []


def _tuned_rows(target):
    from k31dsl.ops import attnres as ar
    return {"update": _tuned(ar.attnres_update_rows, target), "rmsnorm": _tuned(ar.rmsnorm_row, target)}


def sm90_stats(configs=None) -> list[str]:
    """No GPU: compile attnres_prepare_rows for sm_90 at n = 8, S = 6 (NB = SB = 8) in each config
    (default: every autotune config), specialised as the GPU JIT would (pointers, sizes and
    strides multiples of 16), and report registers, spill stack and shared memory
    (cuobjdump -res-usage) and the barriers in the code.
    Compiled with fp fusion, as `prepare_kernel("triton")` is. Needs a process without TRITON_INTERPRET."""
    import tempfile
    from k31dsl.ops import attnres as ar
    from k31dsl.targets.triton.aot import compile_for_gpu
    from k31dsl.targets.triton.resources import register_usage
    folder, out = Path(tempfile.mkdtemp()), []
    for i, cfg in enumerate(configs or ar.PREPARE_CONFIGS):
        cx = {key: val for key, val in cfg.items() if key != "num_warps"}
        c = compile_for_gpu(ar.attnres_prepare_rows.ir(NB=8, SB=8, **cx), folder, arch=90,
                            divisible=lambda name: True, num_warps=cfg["num_warps"], fp_fusion=True)
        cubin = folder / f"{i}.cubin"
        cubin.write_bytes(c.asm["cubin"])
        res = register_usage(cubin)
        ptx = c.asm["ptx"]
        out.append(f"{cfg}: {res} smem {c.metadata.shared} B, bar.sync {ptx.count('bar.sync')} (in the code, "
                   f"loops once)")
        print(out[-1], flush=True)
    return out


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--t", type=int, default=8192)
    ap.add_argument("--d", type=int, default=7168)
    ap.add_argument("--s", type=int, default=6)
    ap.add_argument("--later", default="6,42",
                    help="cached prepare: queries of the later blocks the newest block is also scored against "
                         "(comma list, one row each; 42 = the first block of an 8-block model at S = 6)")
    ap.add_argument("--decode", default="1,4,16,64")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile anchors")
    ap.add_argument("--parts", default="prepare,cached,update,decode",
                    help="comma (or +) list of the sections to run (prepare, cached, update, decode); results are written "
                         "after each")
    ap.add_argument("--sm90-stats", action="store_true",
                    help="no GPU: registers/spills/shared memory of every prepare config compiled for sm_90, then exit")
    args = ap.parse_args(argv)
    if args.sm90_stats:
        from k31dsl.ops import attnres as ar
        sm90_stats(ar.PREPARE_CONFIGS)
        return 0
    if args.smoke:
        args.n, args.t, args.d, args.s, args.decode, args.no_compile, args.later = 3, 4, 96, 2, "1,2", True, "0,3"
    dev = "cpu" if args.smoke else "cuda"
    target = "triton"
    timer = Timer(args.smoke)
    compile_fn = None if args.no_compile else torch.compile
    results = {"env": harness.environment(), "smoke": args.smoke}
    if not args.smoke:
        results["ceiling"] = harness.copy_ceiling_tbs()
    rows, decode_rows = [], []
    cols = ["case", "impl", "median ms", "graph ms", "TB/s (graph)", "% copy ceiling (graph)",
            "effective TB/s (16 B/elt, graph)", "vs torch.compile (graph)", "max rel err vs eager", "bytes moved"]
    dcols = ["case", "impl", "median ms", "graph ms", "launches", "vs 2 kernels (graph)"]

    def save(section: str):
        """Print the rows so far and (on a GPU) write the results: a time limit keeps what is done."""
        print(f"--- after {section} ({time.strftime('%H:%M:%S')})", flush=True)
        harness.print_table(cols, rows)
        if decode_rows:
            print()
            harness.print_table(dcols, decode_rows)
        if args.smoke:
            return
        from k31dsl.ops import attnres as ar
        from k31dsl.ops import attnres_cached as ac
        tuning = (harness.tuning_rows("attnres_prepare_rows", ar.prepare_kernel(target))
                  + harness.tuning_rows("attnres_block_logits", ac.kernels(target)[0])
                  + harness.tuning_rows("attnres_prepare_cached_rows", ac.kernels(target)[1])
                  + harness.tuning_rows("attnres_update_rows", ar.attnres_update_rows[target])
                  + harness.tuning_rows("rmsnorm_row", ar.rmsnorm_row[target]))
        results["rows"], results["decode_rows"], results["tuning"] = rows, decode_rows, tuning
        notes = (f"copy ceiling {results['ceiling']:.3f} TB/s (bytes read + written, this run). `median ms`: "
                 "do_bench median, host launch path included; `graph ms`: CUDA-graph replay. update bytes: partial "
                 "read+write 8, delta 2, O 4, h 2, y 2 B/elt (y only: 16; two kernels: +2 for re-reading h); "
                 "'effective' uses 16 B/elt for every row (the issue's convention). decode rows: per-layer "
                 "AttnRes update + RMSNorm step, launches per step.")
        harness.write("attnres", results, cols + dcols[4:], rows + decode_rows, notes=notes,
                      extra=harness.tuning_section(tuning))
        harness.print_table(harness.TUNING_COLUMNS, tuning)

    parts = set(args.parts.replace("+", ",").split(","))
    if "prepare" in parts:
        bench_prepare(timer, dev, target, args.n, args.t, args.d, args.s, compile_fn, rows, results)
        save("prepare")
    if "cached" in parts:
        for later in [int(x) for x in args.later.replace("+", ",").split(",") if x]:
            bench_prepare_cached(timer, dev, target, args.n, args.t, args.d, args.s, later, compile_fn, rows, results)
        save("cached")
    if "update" in parts:
        bench_update(timer, dev, target, args.t, args.d, compile_fn, rows, results)
        save("update")
    if "decode" in parts:
        sizes = [int(x) for x in args.decode.split(",") if x]
        dyn = None if compile_fn is None else (lambda f: torch.compile(f, dynamic=True))
        bench_decode(timer, dev, target, sizes, args.d, dyn, decode_rows, results, args.smoke)
        save("decode")
    if args.smoke:
        print("smoke run: tiny shapes in the Triton interpreter; nothing written")
        return 0
    print(f"copy ceiling: {results['ceiling']:.3f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

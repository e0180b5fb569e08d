"""The MoE FFN (ops/moe.py) on a GPU at the `small` preset's sizes (D 2048, 8 experts of F 1024,
top-2, one shared expert of 1024, bf16): prefill M = 4096 and 32768 tokens, decode M = 1 and 64.

  k31dsl graph   the add_moe program through the Triton graph pipeline (how the model runs it;
                 fixed tiles per regime, no autotuning), replayed as a CUDA graph
  k31dsl moe()   the public function (autotunes BN/BK/warps per shape on the first call)
  torch eager    the usual loop over experts (nonzero + index_add; host syncs)
  torch.compile  of the same function

    python benchmarks/moe.py            # GPU; writes benchmarks/results/moe.{json,md}
    python benchmarks/moe.py --smoke    # tiny shapes on the CPU (Triton interpreter), no anchors

Correctness is checked before timing: every implementation against torch eager in fp32 within
bf16 tolerance. Floors: FLOP = 2 M D (3 F k + 3 Fs) + 2 M D E (the router); bytes = the weights of
the experts touched (all of them once M k >= E) + x read + out written."""
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

NAMES = ("router", "gate_up", "down", "shared_gate_up", "shared_down")


def torch_moe(x, router, gate_up, down, shared_gate_up, shared_down, top_k: int):
    """docs/model.md's MoE in torch, computing in the weights' dtype with fp32 routing."""
    import torch

    def swiglu(h, gu, dn):
        f = gu.shape[0] // 2
        return (torch.nn.functional.silu(h @ gu[:f].T) * (h @ gu[f:].T)) @ dn.T

    p = (x.float() @ router.float().T).softmax(-1)
    w, ids = p.topk(top_k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    out = swiglu(x, shared_gate_up, shared_down).float()
    for e in range(gate_up.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel():
            out.index_add_(0, tok, w[tok, slot, None] * swiglu(x[tok], gate_up[e], down[e]).float())
    return out.to(x.dtype)


def weights(d, f, fs, e, dtype, dev, gen):
    import torch

    def r(*shape, scale):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(dev)
    return {"router": r(e, d, scale=d ** -0.5), "gate_up": r(e, 2 * f, d, scale=d ** -0.5),
            "down": r(e, d, f, scale=f ** -0.5), "shared_gate_up": r(2 * fs, d, scale=d ** -0.5),
            "shared_down": r(d, fs, scale=fs ** -0.5)}


def graph_fn(m, w, top_k, x):
    """The add_moe program compiled for triton; returns a zero-argument runner."""
    import k31dsl as k
    from k31dsl.dsl import dtypes as D
    from k31dsl.lowering.graph import Program, compile_program
    from k31dsl.ops.moe import add_moe
    dt = D.from_torch(x.dtype)
    p = Program("moe_bench")
    xr = p.input("x", tuple(x.shape), dt)
    refs = {n: p.weight(n, tuple(t.shape), dt) for n, t in w.items()}
    out = p.input("out", tuple(x.shape), dt)
    p.output(add_moe(p, xr, refs, top_k, out=out))
    exe = compile_program(p, "triton")
    res = x.new_empty(x.shape)
    inputs = {"x": x, "out": res, **w}
    return lambda: exe(inputs)["out"], exe


def main(argv=None) -> int:
    import torch
    from k31dsl.ops.moe import MoEPlan, moe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tokens", default="1,64,4096,32768")
    args = ap.parse_args(argv)
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    d, f, fs, e, top_k = (64, 32, 32, 4, 2) if smoke else (2048, 1024, 1024, 8, 2)
    sizes = [1, 5, 40] if smoke else [int(s) for s in args.tokens.split(",")]
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    w = weights(d, f, fs, e, dtype, dev, gen)
    ceiling = float("nan") if smoke else harness.copy_ceiling_tbs()
    compiled = None if smoke else torch.compile(torch_moe)
    rows, results = [], {}

    def timed(fn):
        if smoke:
            fn()
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3, float("nan")
        return harness.median_ms(fn), harness.graph_median_ms(fn)

    for m in sizes:
        x = torch.randn(m, d, generator=gen).to(dtype).to(dev)
        plan = MoEPlan(m, d, e, f, fs, top_k)
        touched = min(e, m * top_k)
        nbytes = (touched * 3 * f * d + 3 * fs * d + e * d) * x.element_size() + 2 * m * d * x.element_size()
        flops = 2 * m * d * (3 * f * top_k + 3 * fs) + 2 * m * d * e
        ref = torch_moe(x.float(), *(w[n].float() for n in NAMES), top_k)
        run_graph, _ = graph_fn(m, w, top_k, x)
        fns = {"k31dsl graph": run_graph, "k31dsl moe()": lambda: moe(x, *(w[n] for n in NAMES), top_k, target="triton")}
        if not smoke:
            fns["torch eager"] = lambda: torch_moe(x, *(w[n] for n in NAMES), top_k)
            fns["torch.compile"] = lambda: compiled(x, *(w[n] for n in NAMES), top_k)
        errs, times = {}, {}
        for name, fn in fns.items():
            got = fn().float()
            errs[name] = float((got - ref).abs().max() / ref.abs().max())
            times[name] = timed(fn) if errs[name] < 3e-2 else (float("nan"), float("nan"))
        base = times.get("torch.compile", (float("nan"),) * 2)
        for name in fns:
            ms, gms = times[name]
            best = min(v for v in (ms, gms) if v == v) if (ms == ms or gms == gms) else float("nan")
            rows.append({"M": m, "impl": name, "BM": plan.bm, "median ms": ms, "graph ms": gms,
                         "TFLOP/s": flops / (best * 1e-3) / 1e12, "TB/s": nbytes / (best * 1e-3) / 1e12,
                         "vs torch.compile": base[0] / ms, "vs torch.compile (graph)": base[1] / gms,
                         "rel err": errs[name]})
        results[m] = {"times_ms": times, "errors": errs, "flops": flops, "bytes": nbytes}
    cols = ["M", "impl", "BM", "median ms", "graph ms", "TFLOP/s", "TB/s", "vs torch.compile",
            "vs torch.compile (graph)", "rel err"]
    payload = {"env": harness.environment(), "shape": {"D": d, "F": f, "Fs": fs, "E": e, "top_k": top_k},
               "copy_ceiling_tbs": ceiling, "results": results, "rows": rows}
    if not smoke:
        harness.write("moe", payload, cols, rows,
                      notes=f"MoE FFN D={d} E={e} F={f} Fs={fs} top-{top_k} bf16; copy ceiling {ceiling:.3f} TB/s. "
                            "TFLOP/s and TB/s from the better of the two times; bytes = touched expert weights "
                            "+ x + out. `graph ms`: CUDA-graph replay (triton.testing.do_bench_cudagraph).")
    harness.print_table(cols, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

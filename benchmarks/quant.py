"""fp8_tile and mxfp8 quantization of bf16 [16384, 7168] on a GPU: the generated Triton kernels
vs torch eager and torch.compile of the same math, with the copy ceiling measured in this run.

    python benchmarks/quant.py [--m 16384 --n 7168]

Writes benchmarks/results/quant.json and quant.md. Correctness is checked before timing: the
generated kernels' codes and scales must equal the torch anchor's bit for bit."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402


def torch_fp8_tile(x, tile: int = 128, eps: float = 1e-4):
    """Same math as k31dsl's fp8_tile_quantize: s = max(amax, eps) / 448 (a true division: torch
    turns `t / 448.0` into a multiply by fp32(1/448) on CUDA), codes = e4m3(x * fp32(1/s))."""
    import torch
    m, n = x.shape
    xt = x.float().view(m, n // tile, tile)
    amax = xt.abs().amax(-1, keepdim=True).clamp_min(eps)
    s = amax / torch.full_like(amax, 448.0)
    q = (xt * torch.reciprocal(s)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(m, n), s.squeeze(-1)


def torch_mxfp8(x):
    """Same math as k31dsl's mxfp8_quantize (RCEIL): e = ceil(log2(amax / 448)) read off the bits of
    amax (one more than the biased exponent - 135 when the mantissa exceeds 1.75), codes =
    e4m3(x * 2^-e) with 2^-e built from bits."""
    import torch
    m, n = x.shape
    xt = x.float().view(m, n // 32, 32)
    bits = (xt.view(torch.int32) & 0x7FFFFFFF).amax(-1, keepdim=True)
    e = (bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    e = e.clamp_min(-127)
    inv = ((127 - e) << 23).view(torch.float32)
    q = (xt * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(m, n), (e + 127).to(torch.uint8).squeeze(-1)


def _tuned(op: str):
    """The config the Triton runtime's autotuner picked for the bf16 variant of `op`."""
    from k31dsl.ops import quant
    kdef = quant.mxfp8_quantize_rows if op == "mxfp8" else quant.fp8_tile_quantize_rows
    return [str(v) for v in kdef["triton"]._tuned.values()]


def main(argv=None) -> int:
    import torch
    from k31dsl.ops import quant

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--n", type=int, default=7168)
    args = ap.parse_args(argv)
    m, n = args.m, args.n
    torch.manual_seed(0)
    x = (torch.randn(m, n, device="cuda") * 3).to(torch.bfloat16)
    ceiling = harness.copy_ceiling_tbs()
    nbytes = {"fp8_tile": m * n * 2 + m * n + m * (n // 128) * 4,
              "mxfp8": m * n * 2 + m * n + m * (n // 32)}
    impls = {
        "fp8_tile": {"k31dsl": lambda: quant.fp8_tile_quantize(x, target="triton"),
                     "eager": lambda: torch_fp8_tile(x),
                     "compile": torch.compile(torch_fp8_tile)},
        "mxfp8": {"k31dsl": lambda: quant.mxfp8_quantize(x, target="triton"),
                  "eager": lambda: torch_mxfp8(x),
                  "compile": torch.compile(torch_mxfp8)},
    }
    rows, results = [], {}
    for op, fns in impls.items():
        fns["compile"] = (lambda f: (lambda: f(x)))(fns["compile"])
        ref_q, ref_s = fns["eager"]()
        got_q, got_s = fns["k31dsl"]()
        code_mismatch = int((got_q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
        gs = got_s.view(torch.uint8) if got_s.dtype != torch.float32 else got_s
        rs = ref_s.view(torch.uint8) if ref_s.dtype != torch.float32 else ref_s
        scale_mismatch = int((gs.reshape(rs.shape) != rs).sum())
        times = {name: harness.median_ms(fn) for name, fn in fns.items()}
        graph = {name: harness.graph_median_ms(fn) for name, fn in fns.items()}
        for name in fns:
            rows.append({"op": op, "impl": name, "median ms": times[name], "graph ms": graph[name],
                         "TB/s (graph)": nbytes[op] / (graph[name] * 1e-3) / 1e12,
                         "% copy ceiling (graph)": 100 * nbytes[op] / (graph[name] * 1e-3) / 1e12 / ceiling,
                         "% copy ceiling": 100 * nbytes[op] / (times[name] * 1e-3) / 1e12 / ceiling,
                         "vs torch.compile": times["compile"] / times[name],
                         "vs torch.compile (graph)": graph["compile"] / graph[name],
                         "code mismatches": code_mismatch if name == "k31dsl" else "",
                         "scale mismatches": scale_mismatch if name == "k31dsl" else ""})
        results[op] = {"times_ms": times, "graph_ms": graph, "bytes": nbytes[op],
                       "code_mismatches": code_mismatch, "scale_mismatches": scale_mismatch,
                       "tuned_config": _tuned(op)}
    cols = ["op", "impl", "median ms", "% copy ceiling", "vs torch.compile", "graph ms", "TB/s (graph)",
            "% copy ceiling (graph)", "vs torch.compile (graph)", "code mismatches", "scale mismatches"]
    payload = {"env": harness.environment(), "shape": [m, n], "copy_ceiling_tbs": ceiling,
               "results": results, "rows": rows}
    harness.write("quant", payload, cols, rows,
                  notes=f"bf16 [{m}, {n}] -> e4m3 codes + scales; copy ceiling {ceiling:.3f} TB/s "
                        "(bytes read + written, measured in this run). `median ms`: triton.testing.do_bench "
                        "median with a Python launch per call (host overhead included); `graph ms`: "
                        "triton.testing.do_bench_cudagraph median (each call captured in a CUDA graph and "
                        "replayed: the kernels alone, as the model engine runs them).")
    harness.print_table(cols, rows)
    print(f"copy ceiling: {ceiling:.3f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Host time per call of a generated op, layer by layer, on a tiny input (the GPU idles, so the
wall time per call is the host path): the public op, the compiled kernel's call (argument
fast path), the generated launcher, and Triton's own `kernel[grid](...)`; torch.compile of the
same math for comparison. Writes benchmarks/results/launch_overhead.{json,md}.

    python benchmarks/launch_overhead.py"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402


def per_call_us(fn, n: int = 3000) -> float:
    import torch
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def main() -> int:
    import torch

    import quant as qbench
    from k31dsl.ops import quant

    x = torch.randn(8, 1024, device="cuda").to(torch.bfloat16)
    codes = torch.empty(8, 1024, device="cuda", dtype=torch.float8_e4m3fn)
    scales = torch.empty(8, 32, device="cuda", dtype=torch.float8_e8m0fnu)
    quant.mxfp8_quantize(x, target="triton")
    ck = quant.mxfp8_quantize_rows["triton"]
    ck(x, codes, scales)
    launcher = next(f for f in ck._fast.values() if f.__module__.startswith("k31gen"))
    mod = sys.modules[launcher.__module__]
    kern = getattr(mod, launcher.__name__ + "_kernel")
    cx = dict(next(iter(ck._tuned.values()))) if ck._tuned else {}
    import triton.language as tl
    bm, bn = cx.get("BM", 8), cx.get("BN", 128)
    grid = (-(-8 // bm), -(-1024 // bn))
    cb, sb = codes.view(torch.uint8), scales.view(torch.uint8)

    pdl = {"K31_PDL_EARLY": False} if "K31_PDL_EARLY" in kern.arg_names else {}   # PDL "auto"

    def raw():
        kern[grid](x, 8, 1024, 1024, 1, cb, 8, 1024, 1024, 1, sb, 8, 32, 32, 1,
                   BM=bm, BN=bn, FLOOR=False, K31_IDX=tl.int32, **pdl)

    compiled = torch.compile(qbench.torch_mxfp8)
    layers = {"public op (mxfp8_quantize)": lambda: quant.mxfp8_quantize(x, target="triton"),
              "compiled kernel call": lambda: ck(x, codes, scales),
              "generated launcher": lambda: launcher(x, codes, scales),
              "triton kernel[grid](...)": raw,
              "torch.compile (same math)": lambda: compiled(x)}
    rows = [{"layer": name, "us per call": per_call_us(fn)} for name, fn in layers.items()]
    harness.write("launch_overhead", {"env": harness.environment(), "rows": rows, "config": cx},
                  ["layer", "us per call"], rows,
                  notes="bf16 [8, 1024] MXFP8 quantize: the GPU work is ~3 us, so these are host times.")
    harness.print_table(["layer", "us per call"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

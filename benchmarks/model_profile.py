"""Where a K31 step's time goes: torch.profiler over the generated-op runner (ModelRunner, target
triton, graph mode for decode) on a GPU, kernels grouped by name, next to the step's wall time.

    python benchmarks/model_profile.py                     # small preset: decode B=1, 64; prefill 4096
    python benchmarks/model_profile.py --prefill 0 --batches 64 --top 30

Prints per section: wall ms per step (host included), GPU kernel ms per step (sum of kernel
durations), and the top kernels by total time with their count per step and mean µs. Writes
results/model_profile.json. (The timed figures of record are benchmarks/model.py's; this one
explains them.)"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from model import _prompt  # noqa: E402
from k31dsl.model.config import pages_for  # noqa: E402  (same prompts and page counts as the benchmark)


def kernel_table(prof, steps: int) -> tuple[float, list[dict]]:
    """(GPU ms per step, rows by total time) from a profiler's CUDA kernel events."""
    agg = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        dt = getattr(ev, "device_type", None)
        if dt is None or "CUDA" not in str(dt):
            continue
        a = agg[ev.name]
        a[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        a[1] += 1
    total_us = sum(v[0] for v in agg.values())
    rows = [{"kernel": name[:70], "ms/step": us / steps / 1e3, "calls/step": n / steps, "mean_us": us / max(n, 1),
             "share": us / max(total_us, 1e-9)} for name, (us, n) in agg.items()]
    rows.sort(key=lambda r: -r["ms/step"])
    return total_us / steps / 1e3, rows


def profile(fn, steps: int):
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    fn()
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) * 1e3 / steps
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    gpu, rows = kernel_table(prof, steps)
    return wall, gpu, rows


def show(title: str, wall: float, gpu: float, rows: list[dict], top: int) -> None:
    print(f"\n== {title}: wall {wall:.3f} ms/step, GPU kernels {gpu:.3f} ms/step "
          f"(host/launch gap {max(wall - gpu, 0):.3f} ms)")
    print(f"{'kernel':70s} {'ms/step':>8s} {'calls':>6s} {'mean µs':>8s} {'share':>6s}")
    for r in rows[:top]:
        print(f"{r['kernel']:70s} {r['ms/step']:8.3f} {r['calls/step']:6.1f} {r['mean_us']:8.1f} {r['share']:6.1%}")


def main(argv=None) -> int:
    from k31dsl.model.assembler import ModelRunner
    from k31dsl.model.config import K31Config
    from k31dsl.model.step import Step
    from k31dsl.model.weights import cast_weights, init_weights

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prefill", type=int, default=4096, help="prefill length to profile (0: none)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--sfa-prefetch", choices=["on", "off"], default="on",
                    help="sparse attention's next-block gather prefetch in the step graph (model/layers/dsa.py "
                         "SFA_PREFETCH); 'off' writes results/model_profile_sfa-prefetch-off.json")
    ap.add_argument("--kda-prep", choices=["auto", "sub", "wide", "pair"], default="auto",
                    help="the KDA prefill's prep kernel (model/layers/kda.py KDA_PREP; auto: paired halves under "
                         "the lower-bound gate); 'sub', 'wide' or 'pair' write results/model_profile_kda-prep-<it>.json")
    args = ap.parse_args(argv)
    from k31dsl.model.layers import dsa as dsa_layer, kda as kda_layer
    dsa_layer.SFA_PREFETCH = args.sfa_prefetch == "on"
    kda_layer.KDA_PREP = args.kda_prep
    cfg = K31Config.load(args.config)
    weights = {n: w.cuda() for n, w in cast_weights(init_weights(cfg, 0), cfg.dtype).items()}
    batches = [int(b) for b in args.batches.split(",") if b]
    per = pages_for(args.context + 4 * args.steps + 8)
    num_pages = max([b * per for b in batches] + [pages_for(args.prefill)])
    runner = ModelRunner(cfg, weights, "triton", num_pages=num_pages, num_slots=max(batches))
    out = {}
    if args.prefill:
        step = Step("prefill", [_prompt(args.prefill, 1)], [0], [0], [list(range(pages_for(args.prefill)))])

        def pre():
            runner.reset_slot(0)
            runner.forward(step)
        wall, gpu, rows = profile(pre, 2)
        show(f"prefill T={args.prefill}", wall, gpu, rows, args.top)
        out[f"prefill_{args.prefill}"] = {"wall_ms": wall, "gpu_ms": gpu, "kernels": rows[:40]}
    for b in batches:
        tables = [list(range(i * per, (i + 1) * per)) for i in range(b)]
        for i in range(b):
            runner.reset_slot(i)
        runner.forward(Step("prefill", [_prompt(args.context, 100 + i) for i in range(b)], [0] * b,
                            list(range(b)), tables))
        ctx = [args.context]

        def dec():
            runner.forward(Step("decode", [[65]] * b, [ctx[0]] * b, list(range(b)), tables))
            ctx[0] += 1
        wall, gpu, rows = profile(dec, args.steps)
        show(f"decode B={b} L={args.context}", wall, gpu, rows, args.top)
        out[f"decode_{b}"] = {"wall_ms": wall, "gpu_ms": gpu, "kernels": rows[:40]}
    res = Path(__file__).parent / "results"
    res.mkdir(exist_ok=True)
    tag = ("" if args.sfa_prefetch == "on" else "_sfa-prefetch-off") + ("" if args.kda_prep == "auto" else f"_kda-prep-{args.kda_prep}")
    (res / f"model_profile{tag}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Context-parallel prefill (issues 8 and 9): the `small` preset's prefill of ONE sequence of random
tokens at T = 131072 (and 524288) on 1 GPU and on P GPUs with NCCL, all in one run.

  per (T, P):  prefill wall time (median over repeats after a warm-up), speedup vs the 1-GPU
               baseline, all-gather bytes and seconds per layer (Communicator.stats), the peak
               memory per rank, the per-rank indexer work balance (zigzag max/min, and what a
               contiguous split would give), and the last token's logits vs the 1-GPU run
  1 GPU:       both `cp_prefill` with one rank and the single-runner chunked prefill
               (ModelRunner.forward of Step("prefill") over `--chunk`-token chunks, each chunk's
               context the chunks before it); the faster one is the speedup baseline

Timing (multi-process, so no do_bench): every case runs in its own launch (model/cp_launch.py,
one process per rank) so a CUDA OOM or a failed rank costs that case only (recorded as "OOM" /
"failed"). In a case, each rank builds the same weights (init_weights seed 0) and a ModelRunner on
its GPU, runs `--warmup` untimed prefills (compile, allocate), then each repeat: a barrier (an
all-reduce of one element + torch.cuda.synchronize), time.perf_counter, the prefill,
torch.cuda.synchronize, and the elapsed time all-reduced with MAX, so rank 0 records the slowest
rank. Median over the repeats; repeats stop early when they would pass `--case-budget` seconds
(at least one is always timed).

    python benchmarks/cp.py                                    # T=131072, ranks 1,2 (issue 8)
    python benchmarks/cp.py --tokens 131072,524288 --ranks 1,2,4,8   # issue 9 (counts above the
                                                               # GPUs present are skipped, listed)
    python benchmarks/cp.py --smoke      # CPU, gloo, tiny preset, numpy target, T=288, ranks 1,2
                                         # (results to a temp dir, not benchmarks/results)
Results: benchmarks/results/cp.{json,md}, saved after every case.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

# Single-GPU prefill fit to run 7b (NOTES, "The K31 model end to end": 4K 64.3 ms, 32K 979 ms):
# t(T) = A*T + B*T^2 ms. The T^2 term is the indexer, its top-k and the score buffers.
FIT_A_MS, FIT_B_MS = 1.367e-2, 4.94e-7
ALLGATHER_GBS = 300.0        # assumed NCCL all-gather bus bandwidth on H200 NVLink (GB/s per rank)
ALLGATHER_LAT_MS = 0.03      # assumed per-call latency


# ---------------------------------------------------------------- the model of one rank's work

def cp_model(cfg, T: int, P: int) -> dict:
    """Per-rank FLOP and bytes of a zigzag CP prefill (NOTES.md, "Context-parallel prefill")."""
    from k31dsl.model.config import INDEX_DIM, KV_LORA, ROPE_DIM
    n_kda, n_dsa = len(cfg.kda_layers), len(cfg.dsa_layers)
    hv, K, V = cfg.kda_value_heads, cfg.kda_head_dim, cfg.kda_value_dim
    summary_bytes = hv * K * (K + V) * 4                 # (M, E) fp32 per CP chunk and layer
    idx_b, lat_b = INDEX_DIM + INDEX_DIM // 32, KV_LORA + 4 * 4 + ROPE_DIM * 2     # 132, 656
    gathered_dsa = T * (idx_b + lat_b)                   # every rank ends with all T tokens' entries
    gathered_kda = 2 * P * summary_bytes
    # the extra state pass per local token-head: S_ext (4 K V) + Kb^T W (2 K^2) + M chain (2 K^3 / 64)
    summary_flop = n_kda * (T / P) * hv * (4 * K * V + 2 * K * K + 2 * K ** 3 / 64)
    compose_flop = n_kda * 2 * hv * (2 * P - 1) * 2 * K * K * (K + V)
    single = FIT_A_MS * T + FIT_B_MS * T * T
    comm_ms = (n_dsa * (gathered_dsa * (P - 1) / P / (ALLGATHER_GBS * 1e9) * 1e3 + 2 * ALLGATHER_LAT_MS)
               + n_kda * (gathered_kda * (P - 1) / P / (ALLGATHER_GBS * 1e9) * 1e3 + ALLGATHER_LAT_MS)) if P > 1 else 0.0
    extra_ms = (summary_flop + compose_flop) / 150e12 * 1e3 if P > 1 else 0.0   # KDA state pass ~150 TFLOP/s
    per_rank = single / P + comm_ms + extra_ms
    return {"gather_bytes_per_dsa_layer": gathered_dsa, "gather_bytes_per_kda_layer": gathered_kda,
            "summary_bytes_per_chunk_layer": summary_bytes, "summary_flop_per_rank": summary_flop,
            "compose_flop_per_rank": compose_flop, "fit_single_ms": single, "comm_ms": comm_ms,
            "extra_ms": extra_ms, "predicted_ms": per_rank, "predicted_speedup": single / per_rank}


def work_balance(T: int, P: int) -> dict:
    """Indexer work per rank (causal (query, key) pairs) for the zigzag layout and a contiguous split."""
    from k31dsl.model.distributed import contiguous_work, zigzag_layout
    lay = zigzag_layout(T, P)
    zig = [float(lay.indexer_work(r)) for r in range(P)]
    con = [float(w) for w in contiguous_work(T, P)]
    return {"zigzag": zig, "contiguous": con,
            "zigzag_max_min": max(zig) / max(min(zig), 1e-30), "contiguous_max_min": max(con) / max(min(con), 1e-30)}


# ---------------------------------------------------------------- in each rank

def _prompt(n: int, seed: int = 1, vocab: int = 256) -> list[int]:
    import numpy as np
    return [int(x) for x in np.random.default_rng(seed).integers(0, vocab, n)]


def _sync(dev) -> None:
    import torch
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


def _build_runner(ctx, spec: dict):
    import torch
    from k31dsl.model.assembler import ModelRunner
    from k31dsl.model.config import K31Config, pages_for
    from k31dsl.model.weights import cast_weights, init_weights
    if spec["smoke"]:
        torch.set_num_threads(1)
    if torch.device(ctx.device).type == "cuda":
        torch.cuda.set_device(ctx.device)
    cfg = K31Config.load(spec["config"])
    weights = {n: w.to(ctx.device) for n, w in cast_weights(init_weights(cfg, 0), cfg.dtype).items()}
    return ModelRunner(cfg, weights, spec["target"], num_pages=pages_for(spec["T"]), num_slots=1, device=ctx.device)


def _timed(ctx, fn, spec: dict):
    """(last output, per-repeat seconds (max over ranks), warm-up seconds): see the module docstring."""
    import torch
    import torch.distributed as dist
    dev = ctx.device

    def barrier():
        if ctx.world > 1:
            dist.all_reduce(torch.zeros(1, device=dev), group=ctx.group)
        _sync(dev)

    def slowest(seconds: float) -> float:
        if ctx.world == 1:
            return seconds
        x = torch.tensor([seconds], dtype=torch.float64, device=dev)
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=ctx.group)
        return float(x.item())

    out, warm = None, []
    for _ in range(spec["warmup"]):
        barrier()
        t = time.perf_counter()
        out = fn()
        _sync(dev)
        warm.append(slowest(time.perf_counter() - t))
    times = []
    while len(times) < spec["repeats"]:
        barrier()
        t = time.perf_counter()
        out = fn()
        _sync(dev)
        times.append(slowest(time.perf_counter() - t))
        # identical on every rank (the times are all-reduced), so every rank stops together
        if sum(times) + times[-1] > spec["case_budget_s"]:
            break
    return out, times, warm


def _peak_gb(ctx) -> float:
    import torch
    import torch.distributed as dist
    if torch.device(ctx.device).type != "cuda":
        return float("nan")
    x = torch.tensor([torch.cuda.max_memory_allocated(ctx.device) / 1e9], dtype=torch.float64, device=ctx.device)
    if ctx.world > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(x.item())


def _plain(x):
    """JSON-safe copy of stats (tensors to lists, unknown objects to str)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def _gathers(records) -> dict:
    """Communicator.stats records of one prefill, summed per name: {name: {calls, bytes, seconds}}."""
    out: dict = {}
    for rec in records:
        name, nbytes, seconds = (rec if isinstance(rec, (tuple, list))
                                 else (rec["name"], rec["bytes"], rec["seconds"]) if isinstance(rec, dict)
                                 else (rec.name, rec.bytes, rec.seconds))
        e = out.setdefault(str(name), {"calls": 0, "bytes": 0, "seconds": 0.0})
        e["calls"] += 1
        e["bytes"] += int(nbytes)
        e["seconds"] += float(seconds)
    return out


def cp_worker(ctx, spec: dict) -> dict:
    """One rank of a cp_prefill case; rank 0's dict is the case's result."""
    import torch
    from k31dsl.model.distributed import Communicator, cp_prefill
    runner = _build_runner(ctx, spec)
    comm = Communicator(ctx.group)
    tokens = _prompt(spec["T"])
    marks = []

    def fn():
        marks.append(len(comm.stats))
        return cp_prefill(runner, tokens, comm, logits=spec["logits"])

    try:
        res, times, warm = _timed(ctx, fn, spec)
    except torch.cuda.OutOfMemoryError as e:
        if ctx.world > 1:
            raise                      # the other ranks are inside a collective: the core's fault path ends them
        return {"status": "OOM", "detail": str(e)[:300]}
    gathers = _gathers(comm.stats[marks[-1]:])
    logits = torch.as_tensor(res.logits)
    return {"status": "ok", "times_s": times, "warmup_s": warm, "gathers": gathers,
            "stats": _plain(getattr(res, "stats", {})), "peak_gb": _peak_gb(ctx),
            "last_logits": logits[-1].float().cpu().tolist(), "logits_rows": int(logits.shape[0])}


def single_worker(ctx, spec: dict) -> dict:
    """The single-runner chunked prefill on one device (no communicator)."""
    import torch
    from k31dsl.model.config import pages_for
    from k31dsl.model.step import Step
    runner = _build_runner(ctx, spec)
    tokens, T, chunk = _prompt(spec["T"]), spec["T"], spec["chunk"]

    def fn():
        runner.reset_slot(0)
        last = None
        for c0 in range(0, T, chunk):
            part = tokens[c0:c0 + chunk]
            last = runner.forward(Step("prefill", [part], [c0], [0], [list(range(pages_for(c0 + len(part))))]))
        return last

    try:
        last, times, warm = _timed(ctx, fn, spec)
    except torch.cuda.OutOfMemoryError as e:
        return {"status": "OOM", "detail": str(e)[:300]}
    return {"status": "ok", "times_s": times, "warmup_s": warm, "peak_gb": _peak_gb(ctx),
            "last_logits": torch.as_tensor(last)[-1].float().cpu().tolist()}


# ---------------------------------------------------------------- the parent

def run_case(worker, P: int, spec: dict, backend: str, timeout_s: float) -> dict:
    from k31dsl.model.cp_launch import launch
    t = time.perf_counter()
    try:
        out = launch(worker, P, backend=backend, timeout_s=timeout_s, args=(spec,))
    except Exception as e:  # noqa: BLE001 - a failed case is a row, not the end of the run
        msg = f"{type(e).__name__}: {e}"
        oom = "out of memory" in msg.lower() or "outofmemory" in msg.lower()
        out = {"status": "OOM" if oom else "failed", "detail": msg[:500]}
    out["launch_s"] = time.perf_counter() - t
    if out.get("status") == "ok":
        out["ms"] = statistics.median(out["times_s"]) * 1e3
    print(f"  T={spec['T']} P={P} {worker.__name__}: {out['status']}"
          + (f" {out['ms']:.1f} ms (repeats {[round(s * 1e3, 1) for s in out['times_s']]}, "
             f"warm-up {[round(s, 1) for s in out['warmup_s']]} s, peak {out['peak_gb']:.1f} GB)"
             if out["status"] == "ok" else f" ({out.get('detail', '')[:300]})")
          + f" [launch {out['launch_s']:.0f} s]", flush=True)
    return out


def _max_rel(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _per_layer(gathers: dict) -> tuple[str, str]:
    """Compact 'name: MB / ms' over the gather names (one prefill, rank 0's view)."""
    mb = "; ".join(f"{n} {g['bytes'] / 1e6:.3g} MB" for n, g in gathers.items())
    ms = "; ".join(f"{n} {g['seconds'] * 1e3:.3g} ms" for n, g in gathers.items())
    return mb, ms


def main(argv=None) -> int:
    import torch
    from k31dsl.model.config import K31Config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny preset, numpy target, T=288")
    ap.add_argument("--config", default="small")
    ap.add_argument("--tokens", default="131072", help="sequence lengths, comma-separated")
    ap.add_argument("--ranks", default="1,2", help="rank counts, comma-separated")
    ap.add_argument("--chunk", type=int, default=16384, help="chunk of the single-runner 1-GPU prefill")
    ap.add_argument("--one-gpu", default="single,cp", help="1-GPU figures to measure: single, cp")
    ap.add_argument("--logits", default="all", choices=["all", "last"])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case-budget", type=float, default=120.0, help="seconds of timed repeats per case")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per launch (a hang fails the case)")
    ap.add_argument("--target", default="triton")
    ap.add_argument("--backend", default=None, help="nccl (GPU) / gloo (CPU); default by --smoke")
    args = ap.parse_args(argv)
    if args.smoke:
        args.config, args.tokens, args.chunk, args.target = "tiny", args.tokens if "--tokens" in sys.argv else "288", 160, "numpy"
        args.warmup, args.repeats, args.timeout = 0, 1, 300.0
        harness.RESULTS = Path(tempfile.mkdtemp(prefix="k31_cp_smoke_"))
    backend = args.backend or ("gloo" if args.smoke else "nccl")
    devices = 10 ** 6 if backend == "gloo" else torch.cuda.device_count()
    cfg = K31Config.load(args.config)
    lengths = [int(t) for t in args.tokens.split(",") if t]
    ranks = sorted({int(p) for p in args.ranks.split(",") if p})
    one_gpu = set(args.one_gpu.split(","))
    results = {"env": harness.environment(), "smoke": args.smoke, "config": cfg.name, "backend": backend,
               "devices": devices if backend != "gloo" else "cpu", "args": vars(args), "cases": {}}
    rows: list[dict] = []
    cols = ["T", "GPUs", "impl", "ms", "speedup vs 1 GPU", "predicted", "gather MB per layer", "gather ms per layer",
            "peak GB/rank", "indexer work max/min (zigzag)", "contiguous max/min", "last-token logits rel diff",
            "status"]
    print(f"{cfg.name}: {backend}, devices {results['devices']}, T {lengths}, ranks {ranks}", flush=True)

    def save():
        results["rows"] = rows
        harness.write("cp", _plain(results), cols, rows, notes=_notes(results))

    for T in lengths:
        base_spec = {"smoke": args.smoke, "config": args.config, "target": args.target, "T": T, "chunk": args.chunk,
                     "logits": args.logits, "warmup": args.warmup, "repeats": args.repeats,
                     "case_budget_s": args.case_budget}
        case, ref_logits = results["cases"].setdefault(str(T), {}), None
        one = []
        for P in ranks:
            m = cp_model(cfg, T, P)
            row = {"T": T, "GPUs": P, "impl": "cp_prefill zigzag" if P > 1 else "cp_prefill (1 rank)",
                   "predicted": f"{m['predicted_speedup']:.2f}x" if P > 1 else ""}
            try:
                bal = work_balance(T, P)
                row["indexer work max/min (zigzag)"], row["contiguous max/min"] = bal["zigzag_max_min"], bal["contiguous_max_min"]
            except Exception as e:  # noqa: BLE001
                bal = {"error": f"{type(e).__name__}: {e}"}
            if P > devices:
                row["status"] = f"skipped: {devices} GPUs here"
                case[f"cp{P}"] = {"status": row["status"], "model": m, "balance": bal}
                rows.append(row)
                save()
                continue
            if P == 1 and "single" in one_gpu:
                out = run_case(single_worker, 1, base_spec, backend, args.timeout)
                case["single"] = out
                srow = {"T": T, "GPUs": 1, "impl": f"single runner, {args.chunk}-token chunks",
                        "status": out["status"], "ms": out.get("ms", float("nan")), "peak GB/rank": out.get("peak_gb")}
                rows.append(srow)
                one.append(srow)
                ref_logits = out.get("last_logits")
                save()
            if P == 1 and "cp" not in one_gpu:
                continue
            out = run_case(cp_worker, P, base_spec, backend, args.timeout)
            out["model"], out["balance"] = m, bal
            case[f"cp{P}"] = out
            row.update(status=out["status"], ms=out.get("ms", float("nan")), **{"peak GB/rank": out.get("peak_gb")})
            if out["status"] == "ok":
                row["gather MB per layer"], row["gather ms per layer"] = _per_layer(out["gathers"])
                if ref_logits is not None:
                    row["last-token logits rel diff"] = _max_rel(out["last_logits"], ref_logits)
                elif P == 1:
                    ref_logits = out["last_logits"]
            if P == 1:
                one.append(row)
            rows.append(row)
            # the baseline is the faster 1-GPU figure measured so far in this T
            base = min((r["ms"] for r in one if r.get("status") == "ok"), default=float("nan"))
            case["baseline_ms"] = base
            for r in rows:
                if r["T"] == T and r.get("status") == "ok":
                    r["speedup vs 1 GPU"] = base / r["ms"]
            save()
    harness.print_table(cols, rows)
    print(f"results: {harness.RESULTS / 'cp.md'}")
    return 0


def _notes(results) -> str:
    a = results["args"]
    return (f"{results['config']} preset, {results['backend']}, one sequence of random tokens. Wall time per prefill: "
            f"median of up to {a['repeats']} repeats after {a['warmup']} warm-up(s), each after a barrier, "
            "the slowest rank's time (all-reduce MAX). Speedup vs the faster 1-GPU figure (single runner in "
            f"{a['chunk']}-token chunks, or cp_prefill with one rank). Gathers: rank 0's Communicator.stats over one "
            "prefill, summed per name. Indexer work: causal (query, key) pairs per rank, max/min over ranks "
            "(zigzag as run; contiguous split for comparison). Logits diff: the last token's logits vs the first "
            "1-GPU figure (max abs diff / max abs). 'predicted': NOTES.md's model (T^2 fit to run 7b + gathers + "
            "KDA summary passes).")


if __name__ == "__main__":
    raise SystemExit(main())

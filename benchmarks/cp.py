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
    python benchmarks/cp.py --tokens 131072,524288 --ranks 1,2,4,8   # issue 9 ('+' works too; counts above the
                                                               # GPUs present are skipped, listed)
    python benchmarks/cp.py --smoke      # CPU, gloo, tiny preset, numpy target, T=256, ranks 1,2
                                         # (results to a temp dir, not benchmarks/results)
Results: benchmarks/results/cp.{json,md}, saved after every case.
"""
from __future__ import annotations

import argparse
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

# Prefill cost model (NOTES.md, "Context-parallel prefill"), its constants from the `small`
# preset's H200 runs (run 7b / model_profile): per token of the linear part (GEMMs, MoE, KDA, norms)
# LINEAR_MS; per causal (query, key) pair of indexer_scores_flat, all 4 DSA layers, PAIR_MS (5.6 ms
# for the 8.4 M pairs of a 4K prefill); per scanned score of topk_segments, all 4 layers, TOPK_MS
# (0.72 ms per layer at 4K x 4K, fitted when every row scanned its whole score row; since HAS_END
# a row scans its causal range [0, ke) only, i.e. the causal pairs again). Fit (whole rows):
# 4K: 55.3 + 5.6 + 2.9 = 64 ms (measured 64.3); 32K: 442 + 358 + 184 = 985 ms (measured 979).
LINEAR_MS, PAIR_MS, TOPK_MS = 1.35e-2, 6.67e-7, 1.72e-7
ALLGATHER_GBS = 300.0        # assumed NCCL all-gather bandwidth per rank on H200 NVLink (GB/s received)
ALLGATHER_LAT_MS = 0.05      # assumed per-call latency (a CP step makes ~6 gathers per KDA layer, 2 per DSA)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def auto_chunk(T: int) -> int:
    """Single-runner chunk: 16384 tokens, less when the widest step's [chunk, width] fp32 score
    tensors would pass 2^32 elements (16 GB each). `--chunk T` runs the prompt as one step (the
    small preset's 131072 tokens fit an H200 since the arena plan: planned_gb)."""
    from k31dsl.model.config import pages_for
    return max(64, min(16384, (1 << 32) // (_next_pow2(pages_for(T)) * 64)))


def single_model(T: int, chunk: int) -> dict:
    """Predicted ms of the single-runner prefill in `chunk`-token chunks: each chunk a step over its
    context + itself (memory: planned_gb)."""
    ms = 0.0
    for c0 in range(0, T, chunk):
        n = min(chunk, T - c0)
        pairs = n * c0 + n * (n + 1) // 2
        ms += LINEAR_MS * n + (PAIR_MS + TOPK_MS) * pairs      # top-k: each row up to its own key end
    return {"chunk": chunk, "predicted_ms": ms}


def cp_model(cfg, T: int, P: int) -> dict:
    """Per-rank time, memory and traffic of cp_prefill over P ranks (one step of 2 x chunk rows, every
    row max_pages x 64 = the padded prompt wide)."""
    from k31dsl.model.config import INDEX_DIM, KV_LORA, ROPE_DIM
    from k31dsl.model.distributed import zigzag_layout
    lay = zigzag_layout(T, P)
    rows, width = 2 * lay.chunk, lay.padded
    n_kda, n_dsa = len(cfg.kda_layers), len(cfg.dsa_layers)
    hv, K, V = cfg.kda_value_heads, cfg.kda_head_dim, cfg.kda_value_dim
    summary = hv * K * (K + V) * 4                       # (M, E) fp32 of one piece
    idx_b, lat_b = INDEX_DIM + INDEX_DIM // 32, KV_LORA + 4 * 4 + ROPE_DIM * 2     # 132, 656 B per token
    dsa_bytes = width * (idx_b + lat_b)                  # received per DSA layer (own share included)
    kda_bytes = 4 * P * summary                          # 4 pieces per rank (2 chunks + their padding)
    comm = 0.0
    if P > 1:
        comm = (n_dsa * (dsa_bytes / (ALLGATHER_GBS * 1e9) * 1e3 + 2 * ALLGATHER_LAT_MS)
                + n_kda * (kda_bytes / (ALLGATHER_GBS * 1e9) * 1e3 + 5 * ALLGATHER_LAT_MS))
    work = max(lay.indexer_work(r) for r in range(P))
    ms = LINEAR_MS * rows + (PAIR_MS + TOPK_MS) * work + comm         # top-k rows scan their causal range
    return {"chunk": lay.chunk, "rows": rows, "row_width": width, "predicted_ms": ms, "comm_ms": comm,
            "gather_bytes_per_dsa_layer": dsa_bytes,
            "gather_bytes_per_kda_layer": kda_bytes, "summary_bytes_per_piece_layer": summary}


_PLAN_RUNNERS: dict = {}


def planned_gb(cfg, T: int, P: int = 0, chunk: int = 0) -> float:
    """GB one rank needs, from the program itself: the memory plan's arena of its largest step
    (rank 0's cp_prefill step over P ranks, or the single runner's last `chunk`-token step), built
    here on the host (the CPU flavour of the program: GPU tiles differ, intermediates do not), plus
    the runner's weights, caches and state pools. H200 check (NOTES.md, memory plan): 27.6 GB
    planned + 5.0 GB of runner tensors vs a measured peak of 32.6 GB (cp_prefill, 1 rank, 128K)."""
    from k31dsl.model.assembler import ModelRunner, prefill_bucket
    from k31dsl.model.config import pages_for
    from k31dsl.model.distributed import cp_shape, zigzag_layout
    from k31dsl.model.layers.common import ShapeClass
    from k31dsl.model.weights import cast_weights, init_weights
    key = (cfg.name, T)
    if key not in _PLAN_RUNNERS:
        weights = cast_weights(init_weights(cfg, 0), cfg.dtype)
        _PLAN_RUNNERS.clear()                   # one at a time: each holds its caches for T tokens
        _PLAN_RUNNERS[key] = ModelRunner(cfg, weights, "triton", num_pages=pages_for(T), num_slots=1, device="cpu")
    runner = _PLAN_RUNNERS[key]
    held = [*runner.weights.values(), *runner.states.values()]
    if P:
        shape = cp_shape(runner, zigzag_layout(T, P), 0)
        held += list(runner.cp_buffers(shape).values())
    else:       # a full chunk at the last chunk's width: the largest step (an upper bound)
        shape = ShapeClass("prefill", 1, prefill_bucket(min(chunk, T)), _next_pow2(pages_for(T)))
    arena = runner._after_passes(shape).meta["memory_plan"]["arena_bytes"]
    return (arena + sum(t.numel() * t.element_size() for t in held)) / 1e9


def work_balance(T: int, P: int) -> dict:
    """Indexer work per rank (causal (query, key) pairs) for the zigzag layout and a contiguous split."""
    from k31dsl.model.distributed import contiguous_work, zigzag_layout
    lay = zigzag_layout(T, P)
    zig = [lay.indexer_work(r) for r in range(P)]
    con = contiguous_work(T, P)
    return {"zigzag": zig, "contiguous": con,
            "zigzag_max_min": max(zig) / max(min(zig), 1), "contiguous_max_min": max(con) / max(min(con), 1)}


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
        return ""
    x = torch.tensor([torch.cuda.max_memory_allocated(ctx.device) / 1e9], dtype=torch.float64, device=ctx.device)
    if ctx.world > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(x.item())


def _is_oom(e: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a CUDA 'out of memory' surfacing as another error type."""
    msg = f"{type(e).__name__}: {e}".lower()
    return "outofmemory" in msg or "out of memory" in msg


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
    """Communicator.stats records ({"name", "bytes" received, "seconds"}) of one prefill, summed per
    name ("l3 indexer keys", "l0 kda M", ...): {name: {calls, bytes, seconds}}."""
    out: dict = {}
    for rec in records:
        e = out.setdefault(str(rec["name"]), {"calls": 0, "bytes": 0, "seconds": 0.0})
        e["calls"] += 1
        e["bytes"] += int(rec["bytes"])
        e["seconds"] += float(rec["seconds"])
    return out


def per_layer(gathers: dict, layers: dict) -> dict:
    """Gathers of one prefill per layer kind: {"DSA"|"KDA"|"other": {bytes, seconds}} per layer
    (the sum over the kind's layers divided by their number; `layers` maps 'K'/'D' to indices)."""
    out = {"DSA": [0, 0.0], "KDA": [0, 0.0], "other": [0, 0.0]}
    for name, g in gathers.items():
        head = name.split(" ", 1)[0]
        kind = "other"
        if head[:1] == "l" and head[1:].isdigit():
            kind = "DSA" if int(head[1:]) in layers["D"] else "KDA" if int(head[1:]) in layers["K"] else "other"
        out[kind][0] += g["bytes"]
        out[kind][1] += g["seconds"]
    n = {"DSA": max(1, len(layers["D"])), "KDA": max(1, len(layers["K"])), "other": 1}
    return {k: {"bytes": b / n[k], "seconds": s / n[k]} for k, (b, s) in out.items()}


def cp_worker(ctx, spec: dict) -> dict:
    """One rank of a cp_prefill case; rank 0's dict is the case's result. The timed repeats use an
    untimed Communicator (no synchronisation around its gathers); one more prefill with
    Communicator(timed=True) (a GPU sync before and after each gather) gives the gather seconds
    on a GPU (gloo gathers on the CPU are synchronous: the repeats' own records are used)."""
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
        gathers = _gathers(comm.stats[marks[-1]:])
        timed = None
        if torch.device(ctx.device).type != "cuda":
            timed = {"prefill_s": times[-1], "gathers": gathers}     # gloo gathers are synchronous: already timed
        elif spec["gather_timing"]:
            tcomm = Communicator(ctx.group, timed=True)
            _sync(ctx.device)
            t0 = time.perf_counter()
            cp_prefill(runner, tokens, tcomm, logits=spec["logits"])
            _sync(ctx.device)
            timed = {"prefill_s": time.perf_counter() - t0, "gathers": _gathers(tcomm.stats)}
    except Exception as e:  # noqa: BLE001
        if ctx.world > 1 or not _is_oom(e):
            raise                      # peers wait in a collective: cp_launch ends them and names this rank
        return {"status": "OOM", "detail": str(e)[:300]}
    logits = torch.as_tensor(res.logits)
    stats = {k: v for k, v in res.stats.items() if k != "gathers"}
    return {"status": "ok", "times_s": times, "warmup_s": warm, "gathers": gathers, "timed_gathers": timed,
            "stats": _plain(stats), "peak_gb": _peak_gb(ctx),
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
    except Exception as e:  # noqa: BLE001
        if not _is_oom(e):
            raise
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
        out = {"status": "OOM" if _is_oom(e) else "failed", "detail": msg[-1500:]}
    out["launch_s"] = time.perf_counter() - t
    if out.get("status") == "ok":
        out["ms"] = statistics.median(out["times_s"]) * 1e3
        peak = f", peak {out['peak_gb']:.1f} GB/rank" if out["peak_gb"] != "" else ""
        what = (f"{out['ms']:.1f} ms (repeats {[round(s * 1e3, 1) for s in out['times_s']]} ms, warm-up "
                f"{[round(s, 1) for s in out['warmup_s']]} s{peak})")
    else:
        what = f"({out.get('detail', '')[-400:]})"
    print(f"  T={spec['T']} P={P} {worker.__name__}: {out['status']} {what} [launch {out['launch_s']:.0f} s]", flush=True)
    return out


def _max_rel(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


COLUMNS = ["T", "GPUs", "impl", "ms", "speedup vs 1 GPU", "predicted ms", "predicted speedup",
           "DSA gather MB/layer", "DSA gather ms/layer", "KDA gather MB/layer", "KDA gather ms/layer",
           "peak GB/rank", "planned GB/rank", "indexer max/min zigzag", "indexer max/min contiguous",
           "last-token logits rel diff", "status"]


def main(argv=None) -> int:
    import torch
    from k31dsl.model.config import K31Config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny preset, numpy target, T=256")
    ap.add_argument("--config", default="small")
    ap.add_argument("--tokens", default="131072", help="sequence lengths, comma-separated")
    ap.add_argument("--ranks", default="1,2", help="rank counts, comma-separated")
    ap.add_argument("--chunk", type=int, default=0,
                    help="chunk of the single-runner 1-GPU prefill (0: 16384, less at long T: auto_chunk)")
    ap.add_argument("--one-gpu", default="single,cp", help="1-GPU figures to measure: single, cp (comma-separated)")
    ap.add_argument("--logits", default="all", choices=["all", "last"])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case-budget", type=float, default=120.0, help="seconds of timed repeats per case")
    ap.add_argument("--no-gather-timing", action="store_true", help="skip the extra prefill with timed gathers")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per launch (collective timeout)")
    ap.add_argument("--run-all", action="store_true",
                    help="also run cases whose predicted score buffers exceed the GPU's memory (default: an "
                         "'OOM (predicted)' row without spending device time on them)")
    ap.add_argument("--target", default="triton")
    ap.add_argument("--backend", default=None, help="nccl (GPU) / gloo (CPU); default by --smoke")
    args = ap.parse_args(argv)
    if args.smoke:
        if "--tokens" not in (argv or sys.argv):
            args.tokens = "256"
        args.config, args.chunk, args.target = "tiny", 128, "numpy"
        args.warmup, args.repeats, args.timeout = 0, 1, 300.0
        harness.RESULTS = Path(tempfile.mkdtemp(prefix="k31_cp_smoke_"))
    backend = args.backend or ("gloo" if args.smoke else "nccl")
    devices = torch.cuda.device_count() if backend == "nccl" else None      # None: CPU ranks, no limit
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if devices else float("inf")

    def hopeless(need_gb: float) -> str:
        if args.run_all or need_gb <= gpu_gb:
            return ""
        return f"OOM (planned: {need_gb:.0f} GB > {gpu_gb:.0f} GB; --run-all runs it)"
    cfg = K31Config.load(args.config)
    layers = {"K": set(cfg.kda_layers), "D": set(cfg.dsa_layers)}
    # lists split on ',' or '+' (gpu_run.sh turns commas in a benchmark's args into spaces)
    lengths = [int(t) for t in args.tokens.replace("+", ",").split(",") if t]
    ranks = sorted({int(p) for p in args.ranks.replace("+", ",").split(",") if p})
    one_gpu = set(args.one_gpu.replace("+", ",").split(","))
    results = {"env": harness.environment(), "smoke": args.smoke, "config": cfg.name, "backend": backend,
               "devices": devices if devices is not None else "cpu", "args": vars(args), "cases": {}}
    rows: list[dict] = []
    print(f"{cfg.name}: {backend}, devices {results['devices']}, T {lengths}, ranks {ranks}", flush=True)

    def speedups(T, one, case):
        """The baseline is the faster 1-GPU figure of this T."""
        base = min((r["ms"] for r in one if r.get("status") == "ok"), default=float("nan"))
        case["baseline_ms"] = base
        for r in rows:
            if r["T"] == T and r.get("status") == "ok":
                r["speedup vs 1 GPU"] = base / r["ms"]

    def save():
        results["rows"] = rows
        harness.write("cp", _plain(results), COLUMNS, rows, notes=_notes(results))

    for T in lengths:
        chunk = args.chunk or auto_chunk(T)
        spec = {"smoke": args.smoke, "config": args.config, "target": args.target, "T": T, "chunk": chunk,
                "logits": args.logits, "warmup": args.warmup, "repeats": args.repeats,
                "case_budget_s": args.case_budget, "gather_timing": not args.no_gather_timing}
        case = results["cases"].setdefault(str(T), {})
        ref_logits, one = None, []
        sm = single_model(T, chunk)
        base_pred = sm["predicted_ms"]
        if 1 in ranks and "single" in one_gpu:
            sm["planned_gb"] = planned_gb(cfg, T, chunk=chunk)
            skip = hopeless(sm["planned_gb"])
            case["single"] = out = {"status": skip} if skip else run_case(single_worker, 1, spec, backend, args.timeout)
            out["model"] = sm
            row = {"T": T, "GPUs": 1, "impl": f"single runner, {chunk}-token chunks", "status": out["status"],
                   "ms": out.get("ms", float("nan")), "peak GB/rank": out.get("peak_gb", ""),
                   "predicted ms": sm["predicted_ms"], "predicted speedup": 1.0,
                   "planned GB/rank": sm["planned_gb"]}
            rows.append(row)
            one.append(row)
            ref_logits = out.get("last_logits")
            speedups(T, one, case)
            save()
        for P in ranks:
            if P == 1 and "cp" not in one_gpu:
                continue
            m, bal = cp_model(cfg, T, P), work_balance(T, P)
            m["planned_gb"] = planned_gb(cfg, T, P)
            row = {"T": T, "GPUs": P, "impl": "cp_prefill zigzag" + (" (1 rank)" if P == 1 else ""),
                   "predicted ms": m["predicted_ms"], "predicted speedup": base_pred / m["predicted_ms"],
                   "planned GB/rank": m["planned_gb"],
                   "indexer max/min zigzag": bal["zigzag_max_min"], "indexer max/min contiguous": bal["contiguous_max_min"]}
            rows.append(row)
            skip = f"skipped: {devices} GPU(s) on this host" if devices is not None and P > devices else \
                hopeless(m["planned_gb"])
            if skip:
                row["status"] = skip
                case[f"cp{P}"] = {"status": row["status"], "model": m, "balance": bal}
                save()
                continue
            case[f"cp{P}"] = out = run_case(cp_worker, P, spec, backend, args.timeout)
            out["model"], out["balance"] = m, bal
            row.update({"status": out["status"], "ms": out.get("ms", float("nan")), "peak GB/rank": out.get("peak_gb", "")})
            if out["status"] == "ok":
                lay = per_layer(out["gathers"], layers)
                row["DSA gather MB/layer"] = lay["DSA"]["bytes"] / 1e6
                row["KDA gather MB/layer"] = lay["KDA"]["bytes"] / 1e6
                if out.get("timed_gathers"):
                    tl = per_layer(out["timed_gathers"]["gathers"], layers)
                    row["DSA gather ms/layer"] = tl["DSA"]["seconds"] * 1e3
                    row["KDA gather ms/layer"] = tl["KDA"]["seconds"] * 1e3
                    out["per_layer_timed"] = tl
                out["per_layer"] = lay
                if ref_logits is not None:
                    row["last-token logits rel diff"] = _max_rel(out["last_logits"], ref_logits)
                else:
                    ref_logits = out["last_logits"]
            if P == 1:
                one.append(row)
            speedups(T, one, case)
            save()
    harness.print_table(COLUMNS, rows)
    print(f"results: {harness.RESULTS / 'cp.md'}")
    return 0


def _notes(results) -> str:
    a = results["args"]
    return (f"{results['config']} preset, {results['backend']}, one sequence of random tokens (seed 1). ms: median "
            f"of up to {a['repeats']} prefills after {a['warmup']} warm-up(s), each after a barrier, the slowest "
            "rank's wall time (all-reduce MAX). Speedup vs the faster 1-GPU figure of the same T (single runner in "
            f"chunks of --chunk or auto_chunk(T) tokens, or cp_prefill with one rank). Gather MB/layer: bytes each rank receives per "
            "layer (Communicator.stats of one prefill; DSA: MLA cache + indexer keys, KDA: M, E and conv halos); "
            "gather ms/layer: one more prefill with Communicator(timed=True), a GPU sync around each gather. "
            "Indexer max/min: causal (query, key) pairs per rank, zigzag as run vs a contiguous split. Logits: "
            "last token vs the first 1-GPU figure (max abs diff / max abs). Predicted: the cost model of NOTES.md "
            "'Context-parallel prefill' (linear + causal pairs for the indexer and the top-k + gathers); 'planned GB/rank': "
            "the memory plan's arena of the rank's largest step + the runner's weights, caches and states "
            "(planned_gb).")


if __name__ == "__main__":
    raise SystemExit(main())

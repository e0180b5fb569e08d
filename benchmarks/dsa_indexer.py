"""DSA Lightning Indexer (MXFP8, 64 heads x 128) on a GPU: the generated kernels vs torch eager and
torch.compile of the same math with bf16 keys (research/dsa.md §1.2, §5).

  1. causal prefill indexer, one sequence of T = 16384 tokens over its paged key cache
     (scores [T, T] fp32, -inf above the diagonal); TFLOP/s counts the causal pairs only:
     2 * 64 * 128 * T (T + 1) / 2 (the anchors compute the full square in query chunks)
  2. decode: lightning_indexer + topk(2048) at B=64, L=32768 and B=32, L=131072 (one query token
     per sequence, pages shuffled) — the unfused path of benchmarks/dsa.py; byte floor
     B * L * (132 + 4 + 4) (keys, scores written and read back by top-k)

    python benchmarks/dsa_indexer.py            # GPU; writes benchmarks/results/dsa_indexer.{json,md}
    python benchmarks/dsa_indexer.py --smoke    # tiny shapes on the CPU (Triton interpreter), no timing of anchors

Correctness is checked before timing: scores against an fp32 torch computation from the
dequantized MXFP8 values (sampled rows), top-k values against torch.topk of the same scores."""
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

H, D, PAGE, TOPK = 64, 128, 64, 2048


# ---------------------------------------------------------------- anchors: the same math in torch

def torch_prefill_chunk(q, k, w, ke):
    """Scores of a chunk of queries q [c, H, D] bf16 against all keys k [L, D] bf16 (one matmul in
    bf16 with fp32 accumulation, then ReLU, head weights w [c, H] fp32, head sum, causal mask)."""
    import torch
    c, h, d = q.shape
    lg = (q.reshape(c * h, d) @ k.T).view(c, h, -1).float()
    s = (lg.relu() * w[:, :, None]).sum(1)
    pos = torch.arange(k.shape[0], device=k.device)
    return s.masked_fill(pos[None, :] >= ke[:, None], float("-inf"))


def torch_prefill(q, k, w, ke, chunk_fn, chunk: int = 256):
    import torch
    t = q.shape[0]
    out = torch.empty((t, k.shape[0]), dtype=torch.float32, device=q.device)
    for c0 in range(0, t, chunk):
        out[c0:c0 + chunk] = chunk_fn(q[c0:c0 + chunk], k, w[c0:c0 + chunk], ke[c0:c0 + chunk])
    return out


def torch_decode(q, kk, w, ke, topk: int = TOPK):
    """q [B, H, D] bf16, keys kk [B, L, D] bf16 (already gathered: favours the anchor), w [B, H]
    -> top-k positions [B, topk]."""
    import torch
    lg = torch.einsum("bhd,bld->bhl", q, kk).float()
    s = (lg.relu() * w[:, :, None]).sum(1)
    pos = torch.arange(kk.shape[1], device=kk.device)
    s = s.masked_fill(pos[None, :] >= ke[:, None], float("-inf"))
    return s.topk(min(topk, kk.shape[1]), dim=1).indices


# ---------------------------------------------------------------- inputs

def make_case(b: int, length: int, nq: int, dev, target: str, seed: int = 0):
    """A paged cache holding b sequences of `length` keys on shuffled pages, nq query tokens per
    sequence (MXFP8 of random normals), head weights, and the dequantized bf16 copies."""
    import torch
    from k31dsl.ops import quant
    from k31dsl.ops.dsa import indexer as I
    g = torch.Generator(device="cpu").manual_seed(seed)
    pages_per = -(-length // PAGE)
    num_pages = b * pages_per
    table = torch.randperm(num_pages, generator=g).view(b, pages_per).to(torch.int32).to(dev)
    keys = torch.randn(b * pages_per * PAGE, D, generator=g).to(dev)
    kc, ksc = quant.mxfp8_quantize(keys, target=target)
    slots = (table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=dev)).view(-1).to(torch.int32)
    cache = I.new_indexer_cache(num_pages, dev)
    I.indexer_cache_write(cache, kc, ksc, slots, target=target)
    q = torch.randn(b * nq, H, D, generator=g).to(dev)
    qc, qs = quant.mxfp8_quantize(q, target=target)
    w = torch.randn(b * nq, H, generator=g).to(dev) * H ** -0.5
    k_deq = quant.mxfp8_dequantize(kc, ksc, torch.float32, target=target).view(b, pages_per * PAGE, D)[:, :length]
    q_deq = quant.mxfp8_dequantize(qc, qs, torch.float32, target=target)
    return dict(cache=cache, table=table, qc=qc, qs=qs, w=w, k32=k_deq, q32=q_deq)


def check_scores(scores, case, ks, ke, rows) -> float:
    """Max |error| / max |score| on sampled rows against fp32 torch math on the dequantized values."""
    import torch
    n = scores.shape[0] // case["table"].shape[0]
    worst = 0.0
    for r in rows:
        kk = case["k32"][r // n][: scores.shape[1]]
        lg = (case["q32"][r] @ kk.T).relu()                     # [H, L]
        want = (lg * case["w"][r][:, None]).sum(0)
        pos = torch.arange(want.shape[0], device=want.device)
        want = want.masked_fill((pos < ks[r]) | (pos >= ke[r]), float("-inf"))
        got = scores[r]
        if not torch.equal(torch.isneginf(got), torch.isneginf(want)):
            return float("inf")
        fin = torch.isfinite(want)
        worst = max(worst, float((got[fin] - want[fin]).abs().max() / want[fin].abs().max().clamp_min(1e-30)))
    return worst


# ---------------------------------------------------------------- benchmarks

class Timer:
    def __init__(self, smoke: bool):
        self.smoke = smoke

    def ms(self, fn) -> float:
        if not self.smoke:
            return harness.median_ms(fn, warmup=5, rep=50)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def graph_ms(self, fn) -> float:
        return float("nan") if self.smoke else harness.graph_median_ms(fn, rep=50)


def bench_prefill(t: int, dev, target: str, timer, compile_ok: bool, rows: list, results: dict):
    import torch
    from k31dsl.ops.dsa import lightning_indexer
    case = make_case(1, t, t, dev, target)
    ks = torch.zeros(t, dtype=torch.int32, device=dev)
    ke = torch.arange(1, t + 1, dtype=torch.int32, device=dev)

    def ours(mma):
        return lambda: lightning_indexer(case["qc"], case["qs"], case["cache"], case["table"], case["w"], ks, ke,
                                         max_len=t, mma=mma, target=target)

    errs = {m: check_scores(ours(m)(), case, ks, ke, [0, t // 3, t - 1]) for m in ("fp8", "bf16")}
    flop = 2 * H * D * t * (t + 1) / 2
    qb, kb = case["q32"].to(torch.bfloat16), case["k32"][0].to(torch.bfloat16)
    fns = {"k31dsl (MXFP8, paged, fp8 mma)": ours("fp8"), "k31dsl (MXFP8, paged, bf16 mma)": ours("bf16"),
           "torch eager (bf16 keys)": lambda: torch_prefill(qb, kb, case["w"], ke, torch_prefill_chunk)}
    if compile_ok:
        chunk_c = torch.compile(torch_prefill_chunk)
        fns["torch.compile (bf16 keys)"] = lambda: torch_prefill(qb, kb, case["w"], ke, chunk_c)
    for name, fn in fns.items():
        if timer.smoke and not name.startswith("k31dsl"):
            continue
        ms = timer.ms(fn)
        err = errs["bf16" if "bf16 mma" in name else "fp8"] if name.startswith("k31dsl") else ""
        rows.append({"case": f"prefill T={t}", "impl": name, "ms": ms, "TFLOP/s": flop / (ms * 1e-3) / 1e12,
                     "max rel err": err})
    results["prefill"] = {"T": t, "flop": flop, "rows": [r for r in rows if r["case"] == f"prefill T={t}"]}


def bench_decode(b: int, length: int, dev, target: str, timer, compile_ok: bool, rows: list, results: dict,
                 topk_k: int = TOPK, ceiling: float = float("nan")):
    import torch
    from k31dsl.ops.dsa import lightning_indexer, topk
    case = make_case(b, length, 1, dev, target, seed=1)
    ks = torch.zeros(b, dtype=torch.int32, device=dev)
    ke = torch.full((b,), length, dtype=torch.int32, device=dev)

    def scores_fn(mma="fp8"):
        return lightning_indexer(case["qc"], case["qs"], case["cache"], case["table"], case["w"], ks, ke,
                                 max_len=length, mma=mma, target=target)

    scores = scores_fn()
    err = check_scores(scores, case, ks, ke, [0, b - 1])
    err16 = check_scores(scores_fn("bf16"), case, ks, ke, [0, b - 1])
    idx = topk(scores, topk_k, target=target)
    want_v = scores.topk(min(topk_k, length), dim=1).values
    got_v = torch.where(idx >= 0, scores.gather(1, idx.clamp_min(0).long()), torch.full_like(want_v, float("-inf")))
    topk_ok = bool(torch.equal(got_v.sort(1, descending=True).values, want_v))
    idx_set = topk(scores, topk_k, sorted=False, target=target)       # the same set in position order
    topk_ok = topk_ok and bool(torch.equal(idx_set.sort(1).values, idx.sort(1).values))
    label = f"decode B={b} L={length}"
    floor_bytes = b * length * (132 + 4 + 4)
    qb, kb = case["q32"].to(torch.bfloat16), case["k32"].to(torch.bfloat16).contiguous()
    fns = {"k31dsl lightning_indexer": scores_fn,
           "k31dsl lightning_indexer (bf16 mma)": lambda: scores_fn("bf16"),
           "k31dsl topk": lambda: topk(scores, topk_k, target=target),
           "k31dsl topk (set)": lambda: topk(scores, topk_k, sorted=False, target=target),
           "k31dsl indexer + topk": lambda: topk(scores_fn(), topk_k, target=target),
           "k31dsl indexer (bf16 mma) + topk": lambda: topk(scores_fn("bf16"), topk_k, target=target),
           "k31dsl indexer (bf16 mma) + topk (set)": lambda: topk(scores_fn("bf16"), topk_k, sorted=False,
                                                                   target=target),
           "torch eager (bf16 keys)": lambda: torch_decode(qb, kb, case["w"], ke, topk_k)}
    if compile_ok:
        dec_c = torch.compile(torch_decode)
        fns["torch.compile (bf16 keys)"] = lambda: dec_c(qb, kb, case["w"], ke, topk_k)
    for name, fn in fns.items():
        if timer.smoke and not name.startswith("k31dsl"):
            continue
        ms = timer.ms(fn)
        row = {"case": label, "impl": name, "ms": ms, "graph ms": timer.graph_ms(fn) if name.startswith("k31dsl") else ""}
        if name.startswith("k31dsl indexer"):
            row["GB/s"] = floor_bytes / (ms * 1e-3) / 1e9
            row["% of floor"] = 100 * floor_bytes / (ms * 1e-3) / (ceiling * 1e12) if ceiling == ceiling else ""
        if name.startswith("k31dsl lightning_indexer"):
            row["max rel err"] = err16 if "bf16" in name else err
        if name.startswith("k31dsl topk"):
            row["max rel err"] = 0.0 if topk_ok else "MISMATCH"
        rows.append(row)
    results[label] = {"B": b, "L": length, "floor_bytes": floor_bytes, "topk_ok": topk_ok, "score_err": err,
                      "score_err_bf16": err16}


def main(argv=None) -> int:
    import torch
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    ap.add_argument("--prefill", type=int, default=16384)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args(argv)
    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        print("no GPU: run with --smoke for the CPU check")
        return 2
    dev = "cpu" if smoke else "cuda"
    target = "triton"
    timer = Timer(smoke)
    compile_ok = not smoke and not args.no_compile
    rows, results = [], {"env": harness.environment()}
    ceiling = float("nan") if smoke else harness.copy_ceiling_tbs()
    results["copy_ceiling_tbs"] = ceiling
    bench_prefill(40 if smoke else args.prefill, dev, target, timer, compile_ok, rows, results)
    decode = [(2, 200, 48)] if smoke else [(64, 32768, TOPK), (32, 131072, TOPK)]
    for b, length, kk in decode:
        bench_decode(b, length, dev, target, timer, compile_ok, rows, results, kk, ceiling)
        if not smoke:
            torch.cuda.empty_cache()
    cols = ["case", "impl", "ms", "graph ms", "TFLOP/s", "GB/s", "% of floor", "max rel err"]
    harness.print_table(cols, rows)
    bad = [r for r in rows if r.get("max rel err") not in ("", None) and
           (r["max rel err"] == "MISMATCH" or float(r["max rel err"]) > 1e-3)]
    if smoke:
        print("smoke: ok" if not bad else f"smoke: FAILED {bad}")
        return 1 if bad else 0
    results["rows"] = rows
    from k31dsl.ops.dsa.indexer import lightning_indexer_paged
    from k31dsl.ops.dsa.topk import topk_segments
    tuned = [r for label, kdef in (("lightning_indexer_paged", lightning_indexer_paged), ("topk_segments", topk_segments))
             for r in harness.tuning_rows(label, kdef["triton"])]
    results["tuning"] = tuned
    path = harness.write("dsa_indexer", results, cols, rows,
                         notes=f"copy ceiling {ceiling:.3g} TB/s; anchors use bf16 keys (decode: pre-gathered)",
                         extra=harness.tuning_section(tuned))
    print(f"wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

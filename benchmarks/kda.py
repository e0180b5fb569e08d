"""KDA chunked prefill on a GPU: the generated Triton kernels (chunk_kda: prep + state/output) vs
fla-core's chunk_kda, same inputs, bf16, K = V = 128, lower-bound gate -5 with A_log/dt_bias, L2
norm and gate in the kernel, fp32 initial and final state; then the decode part from
benchmarks/kda_decode.py (fused_recurrent_kda) when that file is present.

    python benchmarks/kda.py [--shapes all] [--budget 200] [--no-variants] [--no-decode]   # GPU
    python benchmarks/kda.py --smoke                                                      # CPU, interpreter
    python benchmarks/kda.py --sm90-stats       # CPU: registers, spills, smem of each kernel for sm_90a
    python benchmarks/kda.py --gate softplus --shapes T8192_H96 --no-decode   # the Kimi Linear gate, ours vs
                                                # fla, default and sub-prep tilings: results/kda_softplus.*

Phases, with timestamped progress and results/kda.{json,md} rewritten after every row: the fp64
oracle check at a small shape (compiles and autotunes our kernels), ours on every shape, fla on
every shape (its first call per shape autotunes, which can take minutes), the variant rows, the
decode rows. No phase starts after --budget seconds.

Shapes (fla reference on H200, research/kda.md §5.3): B=1 T=8192 H=96 (2.63 ms), B=1 T=32768
H=12 (2.04 ms), varlen 8 x 8192 H=96 (20.75 ms), B=1 T=131072 H=12 (7.36 ms). Reports ms (do_bench
median, and CUDA-graph replay), speed-up vs fla measured in the same run, TFLOP/s against the FLOP
model of research §5.4 (paper: H T (6 d^2 + 3 C d + C^2); full tiles: H T (6 d^2 + 10 C d)), the
max error of o and of the final state vs fla (relative to max |fla|), an fp64-oracle check of a
small shape, and the tuned configs. Writes results/kda.json and .md (not in --smoke)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

FLA_REF_MS = {"T8192_H96": 2.63, "T32768_H12": 2.04, "varlen8x8192_H96": 20.75, "T131072_H12": 7.36}
SHAPES = {  # name: (sequence lengths, heads)
    "T8192_H96": ([8192], 96),
    "T32768_H12": ([32768], 12),
    "varlen8x8192_H96": ([8192] * 8, 96),
    "T131072_H12": ([131072], 12),
}
LB = -5.0
CHUNK = 64
DEVICE, HEAD_DIM = "cuda", 128           # module constants so a CPU dry run can shrink them


def flops(tokens: int, heads: int, d: int = 128, c: int = CHUNK) -> tuple[float, float]:
    """(paper model, full-tile count) of research/kda.md §5.4 for the forward pass."""
    return heads * tokens * (6 * d * d + 3 * c * d + c * c), heads * tokens * (6 * d * d + c * (6 * d + 4 * d))


def make_inputs(lens, heads, d, device, dtype, seed=0, varlen=None):
    """fla-shaped bf16 inputs: q, k, v, raw gate g, beta (post-sigmoid), A_log, dt_bias (fp32),
    fp32 initial state; cu_seqlens when there is more than one sequence (or varlen=True)."""
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)      # on the device: 3 GB of randn on a CPU is slow
    t = sum(lens)
    n = len(lens)

    def rnd(*shape, s=1.0):
        return torch.randn(*shape, generator=gen, device=device) * s
    q, k, v = (rnd(1, t, heads, d).to(dtype) for _ in range(3))
    g = rnd(1, t, heads, d, s=2.0).to(dtype)
    beta = torch.sigmoid(rnd(1, t, heads)).to(dtype)
    a_log = rnd(heads, s=0.5).float()
    dt_bias = rnd(heads * d).float()
    h0 = rnd(n, heads, d, d, s=0.1).float()
    cu = None
    if n > 1 or varlen:
        import itertools
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)
    return (q, k, v, g, beta), {"A_log": a_log, "dt_bias": dt_bias, "lower_bound": LB, "initial_state": h0,
                                "cu_seqlens": cu}


def gate_inputs(lens, heads, gate: str):
    """make_inputs on the benchmark's device in bf16, with the gate of `gate`: "lb" (lower bound
    -5) or "softplus" (no lower bound: the Kimi Linear form)."""
    import torch
    args, kw = make_inputs(lens, heads, HEAD_DIM, DEVICE, torch.bfloat16)
    return args, (dict(kw, lower_bound=None) if gate == "softplus" else kw)


def ours(args, kw, target, chunk=None, variant=None, prep=None):
    """chunk_kda on the inputs; chunk / prep None: chunk_kda's default_tiling (under this
    benchmark's lower-bound gate the whole-chunk prep: chunk 16, or paired halves with few heads)."""
    from k31dsl.ops.kda import chunk_kda
    return lambda: chunk_kda(*args, **kw, output_final_state=True, chunk_size=chunk, target=target, _variant=variant,
                             _prep=prep)


def fla_fn(args, kw):
    """fla-core's chunk_kda on the same inputs (gate, L2 norm in kernel; safe gate at lb = -5, or
    the softplus gate when kw's lower_bound is None)."""
    import torch
    from fla.ops.kda import chunk_kda as fla_chunk_kda
    cu = kw["cu_seqlens"]
    extra = {"cu_seqlens": cu.long()} if cu is not None else {}
    if cu is not None:
        extra["cu_seqlens_cpu"] = cu.long().cpu()

    def run():
        with torch.inference_mode():
            return fla_chunk_kda(*args, A_log=kw["A_log"], dt_bias=kw["dt_bias"], initial_state=kw["initial_state"],
                                 output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 safe_gate=kw["lower_bound"] is not None, lower_bound=kw["lower_bound"], **extra)
    return run


def phase_ms(fn, rep: int = 30) -> dict:
    """Median GPU time of each kernel launch inside one chunk_kda call ("prep", "merge", "state"), from CUDA
    events that chunk_kda's private `_PHASE_HOOK` puts around each launch (fn already warm)."""
    import contextlib
    import statistics
    import torch
    from k31dsl.ops.kda import chunk as chunk_mod
    events: dict = {}

    @contextlib.contextmanager
    def hook(name):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        yield
        b.record()
        events.setdefault(name, []).append((a, b))
    chunk_mod._PHASE_HOOK = hook
    try:
        for _ in range(rep):
            fn()
        torch.cuda.synchronize()
    finally:
        chunk_mod._PHASE_HOOK = None
    return {f"{n} ms": statistics.median(a.elapsed_time(b) for a, b in ev) for n, ev in events.items()}


def rel_err(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def oracle_check(device, target, smoke) -> dict:
    """Our kernels vs the fp64 oracle at a small shape (two ragged sequences, no GVA)."""
    import numpy as np
    import torch
    from k31dsl.ops.testing import load_oracle, max_rel_err
    ref = load_oracle("kda")
    d = 32 if smoke else 128
    # GPU: T = 960, 16 heads, 16 chunks: every size the prep kernel sees is a multiple of 16, as at
    # T=8192 H=96, so Triton's argument specialisation is the same and the ~40 s prep compile done
    # here is reused by the first shape (a ragged pair [300, 517] at 2 heads compiled it twice)
    lens, heads = ([70, 131], 2) if smoke else ([190, 770], 16)
    args, kw = make_inputs(lens, heads, d, device, torch.bfloat16, seed=1, varlen=True)
    o, ht = ours(args, kw, target)()
    cpu = {n: (t.cpu() if hasattr(t, "cpu") else t) for n, t in kw.items()}
    want_o, want_s = ref.kda(*(a.cpu() for a in args), **cpu)
    floor_o, floor_s = np.abs(want_o).max(), np.abs(want_s).max()        # normwise (bf16 operands)
    return {"oracle o err": max_rel_err(o.cpu().double().numpy(), want_o, floor=floor_o),
            "oracle state err": max_rel_err(ht.cpu().double().numpy(), want_s, floor=floor_s)}


def tuned_configs() -> dict:
    from k31dsl.ops.kda.chunk_kernels import kda_chunk_prep, kda_chunk_state
    return {"prep": [str(v) for v in kda_chunk_prep["triton"]._tuned.values()],
            "state": [str(v) for v in kda_chunk_state["triton"]._tuned.values()]}


VARIANTS = ("tf32", "bf16")           # the default is "mixed" (ops/kda/chunk.py)
T0 = [0.0]


def log(msg: str) -> None:
    """Progress with the elapsed time, flushed (a time limit keeps what was printed)."""
    import time
    if not T0[0]:
        T0[0] = time.time()
    print(f"[{time.time() - T0[0]:7.1f} s] {msg}", flush=True)


def elapsed() -> float:
    import time
    return time.time() - T0[0] if T0[0] else 0.0


def smoke_rows():
    import time
    import torch
    rows = []
    for name, (lens, heads, d) in {"smoke_T96_H2": ([96], 2, 32), "smoke_varlen_3": ([40, 9, 77], 2, 32)}.items():
        args, kw = make_inputs(lens, heads, d, "cpu", torch.bfloat16)
        for prep, chunk in (("sub", None), ("wide", None), ("pair", 64)):
            t0 = time.perf_counter()
            ours(args, kw, "triton", chunk, prep=prep)()
            rows.append({"shape": name, "impl": f"k31dsl {prep} prep (interpreter)",
                         "ms": 1e3 * (time.perf_counter() - t0)})
    return rows


def prefill_rows(names, budget: float, variants=True, save=None, gate="lb"):
    """Phases, each skipped once the time budget is spent (fla's first call autotunes for minutes):
    1. ours on every shape (first call = compile + autotune, then timings; at T=8192 H=96 also
    chunk 32); 2. fla on every shape (first call, error vs ours, timings); 3. the prep-numerics
    variant rows on T=8192 H=96. Our rows carry each kernel's time (prep ms, state ms).
    gate="softplus": the Kimi Linear gate (no lower bound) for ours and fla, default tilings only."""
    import time
    import torch
    import harness
    rows, ours_row, more_rows = [], {}, {}

    def done(r):
        rows.append(r)
        if save is not None:
            save(rows)
    for name in names:
        if elapsed() > budget:
            log(f"budget spent: skipping k31dsl {name}")
            continue
        lens, heads = SHAPES[name]
        args, kw = gate_inputs(lens, heads, gate)
        fn = ours(args, kw, "triton")
        log(f"k31dsl {name}: first call ...")
        t0 = time.time()
        fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        log(f"k31dsl {name}: first call (compile/autotune) {time.time() - t0:.1f} s")
        paper, full = flops(sum(lens), heads)
        ms = harness.median_ms(fn, warmup=5, rep=50)
        gms = harness.graph_median_ms(fn, rep=20)
        phases = phase_ms(fn) if DEVICE == "cuda" else {}
        r = {"shape": name, "impl": "k31dsl", "ms": ms, "graph ms": gms, **phases, "fla ref ms": FLA_REF_MS[name],
             "vs fla ref": FLA_REF_MS[name] / ms, "TFLOP/s (paper model)": paper / ms / 1e9,
             "TFLOP/s (full tiles)": full / ms / 1e9}
        log(f"k31dsl {name}: {ms:.3f} ms (graph {gms:.3f} ms; per kernel {phases}), fla ref {FLA_REF_MS[name]} ms")
        ours_row[name] = r
        done(r)
        # other tilings on every shape (more on T=8192 H=96, and there the softplus gate's default
        # and paired tilings too), each with its difference from the default path's outputs
        o_ref, s_ref = fn()
        from k31dsl.ops.kda.chunk import default_tiling
        tiling = default_tiling(kw["lower_bound"] is not None, None, None, heads * len(lens))
        r["tiling"] = f"chunk {tiling[0]}, {tiling[1]} prep"
        # the default before KDA run 9, and the other whole-chunk tilings (chunk 16 with many heads)
        alternatives = ((32, "wide"), (64, "pair"), (32, "pair")) + (((16, "wide"),) if heads * len(lens) > 16 else ())
        others = [("k31dsl sub prep chunk 64", 64, "sub")] + [
            (f"k31dsl {p} prep chunk {c}", c, p) for c, p in alternatives if (c, p) != tiling]
        if variants and name == "T8192_H96":
            others += [("k31dsl sub prep chunk 32", 32, "sub"), ("k31dsl wide prep chunk 64", 64, "wide")]
        others = [(*o, kw) for o in others]
        if gate == "softplus":         # the sub-chunk prep's tilings (the whole-chunk prep needs the bound)
            others = [(f"k31dsl softplus gate, {p} prep chunk {c}", c, p, kw)
                      for c, p in ((16, "sub"), (32, "pair"), (64, "pair"), (32, "sub"), (64, "sub")) if (c, p) != tiling]
        elif name == "T8192_H96":        # the softplus gate (no lower bound; sub prep at 64 took 20.4 ms in run 18)
            soft = dict(kw, lower_bound=None)
            others += [("k31dsl softplus gate, sub prep chunk 16 (its default)", 16, "sub", soft)]
        soft_ref = None
        for label, chunk, prep, kwx in others:
            fnw = ours(args, kwx, "triton", chunk, prep=prep)
            t0 = time.time()
            ow, sw = fnw()
            if kwx is not kw and soft_ref is None:      # softplus rows: errors vs the first of them
                soft_ref = (ow, sw)
            ref = (o_ref, s_ref) if kwx is kw else soft_ref
            rw = {"shape": name, "impl": label, "ms": harness.median_ms(fnw, warmup=5, rep=50),
                  "graph ms": harness.graph_median_ms(fnw, rep=20), **(phase_ms(fnw) if DEVICE == "cuda" else {}),
                  "o / state err vs default path": f"{rel_err(ow, ref[0]):.2e} / {rel_err(sw, ref[1]):.2e}"}
            log(f"{label} {name}: {rw['ms']:.3f} ms ({rw}; first call {time.time() - t0:.1f} s)")
            if kwx is kw:                               # fla runs the lower-bound gate only
                more_rows.setdefault(name, []).append(rw)
            done(rw)
            del fnw, ow, sw
        del o_ref, s_ref
        del args, kw, fn
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    fla_ms = {}
    for name in names:
        if elapsed() > budget:
            log(f"budget spent: skipping fla {name}")
            continue
        lens, heads = SHAPES[name]
        args, kw = gate_inputs(lens, heads, gate)
        try:
            theirs = fla_fn(args, kw)
            log(f"fla {name}: first call (fla autotunes on its first calls; minutes are normal) ...")
            t0 = time.time()
            fo, fs = theirs()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            log(f"fla {name}: first call (compile/autotune) {time.time() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 - report, keep what we have
            log(f"fla unavailable for {name}: {type(e).__name__}: {e}")
            break
        o, ht = ours(args, kw, "triton")()
        errs = {"o err vs fla": rel_err(o, fo), "state err vs fla": rel_err(ht, fs)}
        del o, ht
        paper, full = flops(sum(lens), heads)
        ms = harness.median_ms(theirs, warmup=5, rep=50)
        gms = harness.graph_median_ms(theirs, rep=20)
        fla_ms[name] = ms
        if name in ours_row:
            ours_row[name].update(errs)
            ours_row[name]["speed-up vs fla"] = ms / ours_row[name]["ms"]
        for extra in more_rows.get(name, []):
            extra["speed-up vs fla"] = ms / extra["ms"]
        log(f"fla {name}: {ms:.3f} ms (graph {gms:.3f} ms); errors of ours vs fla {errs}")
        done({"shape": name, "impl": "fla (same run)", "ms": ms, "graph ms": gms, "fla ref ms": FLA_REF_MS[name],
              "TFLOP/s (paper model)": paper / ms / 1e9, "TFLOP/s (full tiles)": full / ms / 1e9})
        del args, kw, fo, fs
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    name = "T8192_H96"
    if variants and name in names and gate == "lb":     # other prep numerics
        args, kw = make_inputs(*SHAPES[name], HEAD_DIM, DEVICE, torch.bfloat16)
        for label, chunk, variant in ((f"k31dsl prep {v}", CHUNK, v) for v in VARIANTS):
            if elapsed() > budget:
                log(f"budget spent: skipping {label}")
                continue
            fn = ours(args, kw, "triton", chunk, variant, prep="sub")
            fn()
            r = {"shape": name, "impl": label, "ms": harness.median_ms(fn, warmup=5, rep=50), **phase_ms(fn)}
            if name in fla_ms:
                r["speed-up vs fla"] = fla_ms[name] / r["ms"]
            log(f"{label}: {r['ms']:.3f} ms (prep {r.get('prep ms', 0):.3f}, state {r.get('state ms', 0):.3f})")
            done(r)
    return rows


def sm90_stats(specs=None) -> list[str]:
    """CPU-side evidence, no GPU: compile each kernel for sm_90a as the GPU JIT would specialise it
    at T=8192 H=96 (pointers aligned, sizes/strides multiples of 16: `tt.divisibility` 16, which
    decides vectorised loads and cp.async pipelining) and report registers, spill stack, shared
    memory and load/mma counts. Run in a process without TRITON_INTERPRET."""
    import tempfile
    import k31dsl as k
    from k31dsl.ops.kda.chunk_kernels import kda_chunk_prep, kda_chunk_state
    from k31dsl.targets.triton.aot import compile_for_gpu
    from k31dsl.targets.triton.resources import register_usage
    prep = dict(XT=k.bf16, GT=k.bf16, BETAT=k.bf16, MT=k.bf16, GATE=2, SAFE=True, PREC="bf16", SOLVE="tf32",
                BC=16, BK=128, BVV=128)
    state = dict(MT=k.bf16, OT=k.bf16, HAS_H0=True, STORE_HT=True, BT=64, BK=128)
    from k31dsl.ops.kda.chunk_prep_wide import kda_chunk_prep_wide
    wide = {n: prep[n] for n in ("XT", "GT", "BETAT", "MT", "PREC", "SOLVE", "BK", "BVV")}
    specs = specs or [("prep chunk 64", kda_chunk_prep, {**prep, "BT": 64}, 8, 1),
                      ("prep chunk 32", kda_chunk_prep, {**prep, "BT": 32}, 8, 1),
                      *((f"wide prep chunk {bt}", kda_chunk_prep_wide, {**wide, "BT": bt}, nw, 1)
                        for bt, nw in ((64, 8), (64, 16), (32, 4), (32, 8))),
                      *((f"state BV {bv}", kda_chunk_state, {**state, "BV": bv}, 4 if bv <= 32 else 8, 2)
                        for bv in (16, 32, 64, 128))]
    small = ("seq_chunks_", "cu_", "chunk_info_", "h0_size_0", "ht_size_0", "h0_size_1", "ht_size_1")
    out, folder = [], Path(tempfile.mkdtemp())
    for label, kdef, cx, warps, stages in specs:
        c = compile_for_gpu(kdef.ir(**cx), folder, arch=90, divisible=lambda n: not n.startswith(small),
                            num_warps=warps, num_stages=stages)
        cubin = folder / f"{len(out)}.cubin"
        cubin.write_bytes(c.asm["cubin"])
        res = register_usage(cubin)
        ptx = c.asm["ptx"]
        counts = {w: ptx.count(w) for w in ("ld.global.v4", "ld.global.b16", "cp.async.cg", "mma.sync", "wgmma.mma_async",
                                             "bar.sync")}
        out.append(f"{label} ({warps} warps, {stages} stages): {res} smem {c.metadata.shared} B {counts}")
        print(out[-1], flush=True)
    return out


COLUMNS = ["shape", "impl", "tiling", "ms", "graph ms", "prep ms", "merge ms", "state ms", "fla ref ms", "speed-up vs fla", "vs fla ref", "TFLOP/s (paper model)",
           "TFLOP/s (full tiles)", "o err vs fla", "state err vs fla", "o / state err vs default path"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="all", help="comma (or +) list of " + ", ".join(SHAPES))
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--no-variants", action="store_true", help="skip the chunk-32 / prep-numerics rows")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    ap.add_argument("--sm90-stats", action="store_true",
                    help="no GPU: registers/spills/shared memory of each kernel compiled for sm_90a, then exit")
    ap.add_argument("--gate", choices=["lb", "softplus"], default="lb",
                    help="lb: the K3 lower-bound gate -5 (results/kda.*); softplus: the Kimi Linear gate, default "
                         "tilings only, ours and fla (results/kda_softplus.*)")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds after which no new phase starts (each phase prints and saves as it goes)")
    args = ap.parse_args(argv)
    if args.sm90_stats:
        os.environ.pop("TRITON_INTERPRET", None)
        sm90_stats()
        return 0
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import harness
    names = list(SHAPES) if args.shapes == "all" else args.shapes.replace("+", ",").split(",")
    if any(n not in SHAPES for n in names):
        ap.error(f"--shapes: unknown {[n for n in names if n not in SHAPES]}; known: {', '.join(SHAPES)}")
    log("fp64 oracle check (small shape; compiles and autotunes our kernels) ...")
    check = oracle_check("cpu" if args.smoke else "cuda", "triton", args.smoke)
    log(f"fp64 oracle check: {check}")

    out_name = "kda" if args.gate == "lb" else "kda_softplus"

    def save(rows):                     # after every shape, so a time limit keeps what was measured
        harness.write(out_name, {"env": harness.environment(), "oracle_check": check, "rows": rows, "partial": True},
                      COLUMNS, rows, notes="partial run (written after each shape)")
    rows = smoke_rows() if args.smoke else prefill_rows(names, args.budget, not args.no_variants, save, args.gate)
    harness.print_table(COLUMNS if not args.smoke else ["shape", "impl", "ms"], rows)
    decode = []
    if not args.no_decode and (Path(__file__).parent / "kda_decode.py").exists() and elapsed() <= args.budget:
        log("decode rows (benchmarks/kda_decode.py) ...")
        import kda_decode
        decode = kda_decode.decode_rows(ns=(1, 3), h=1, hv=2, kdim=16, vdim=32, smoke=True) if args.smoke \
            else kda_decode.decode_rows()
        harness.print_table(kda_decode.COLUMNS, decode)
    bad = check["oracle o err"] > 2e-2 or check["oracle state err"] > 2e-2
    if args.smoke:
        return 1 if bad else 0
    from k31dsl.ops.kda.chunk_kernels import kda_chunk_prep, kda_chunk_state
    from k31dsl.ops.kda.chunk_pair import kda_chunk_pair_merge
    from k31dsl.ops.kda.chunk_prep_wide import kda_chunk_prep_wide
    tuning = (harness.tuning_rows("kda_chunk_prep", kda_chunk_prep["triton"])
              + harness.tuning_rows("kda_chunk_prep_wide", kda_chunk_prep_wide["triton"])
              + harness.tuning_rows("kda_chunk_pair_merge", kda_chunk_pair_merge["triton"])
              + harness.tuning_rows("kda_chunk_state", kda_chunk_state["triton"]))
    payload = {"env": harness.environment(), "oracle_check": check, "tuned_configs": tuned_configs(),
               "rows": rows, "decode_rows": decode, "tuning": tuning}
    gate_note = ("lower-bound gate -5" if args.gate == "lb" else
                 "softplus (Kimi Linear) gate, no lower bound, fla with safe_gate=False")
    harness.write(out_name, payload, COLUMNS, rows, extra=harness.tuning_section(tuning),
                  notes="chunk_kda forward, bf16 q/k/v/raw gate/beta, K = V = 128, default tiling (column `tiling`: the whole-chunk prep at chunk 16, or with few heads its halves of 32 paired into chunk 64; chunk_kda's default_tiling) unless the row says otherwise, " + gate_note + " "
                        "(A_log, dt_bias) and L2 norm in kernel, fp32 initial + final state. `ms`: do_bench median "
                        "(host launch included); `graph ms`: CUDA-graph replay. Errors: max |ours - fla| / max |fla|. "
                        f"fp64 oracle check (small shape): {check}. Tuned: {tuned_configs()}. Decode rows: "
                        "results/kda.json (and benchmarks/kda_decode.py's own table).")
    print("tuned:", tuned_configs())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""KDA decode over an fp32 state pool on a GPU: the generated Triton kernel (kda_decode, one fused
kernel per step) vs fla-core's fused_recurrent_kda (state pool, in place) and torch eager, with
CUDA-graph replay, K3 shapes (H = HV = 96, K = V = 128, lower-bound gate -5, bf16 inputs, L2 norm
and gate in the kernel), N = 1/16/64/256 sequences in scattered pool slots.

    python benchmarks/kda_decode.py [--ns 1,16,64,256] [--heads 96]     # GPU
    python benchmarks/kda_decode.py --smoke                               # CPU, Triton interpreter

Reports µs per step and TB/s of state traffic (read + write of N*HV*K*V*4 bytes; the q/k/v/g/o
traffic is ~1.6% of it at K = V = 128), the copy ceiling measured in the same run, the tuned
(BV, num_warps), and the max error vs fla and vs an fp32 torch reference. Also times the
speculative-verify pair: a T=4 verify that only reads the state (update_state=False) plus the
commit (kda_rollback of the accepted prefix onto the pool rows). Writes results/kda_decode.json
and .md (not in --smoke). Both state layouts: [N, HV, K, V] (the default) and [N, HV, V, K]
(state_v_first, K contiguous) for k31dsl and fla. Then the context-parallel pieces on one
shard of 8192 tokens (kda_cp_summary by recurrence and by chunks, kda_cp_merge of 8 shards;
printed and in the JSON, skip with --no-cp). `decode_rows(...)` is what benchmarks/kda.py can call."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

FLA_REF_US = {1: 5.9, 16: 62.3, 64: 264.5, 256: 1143.0}      # research/kda.md 5.3, H=96, H200


def make_inputs(n, t, h, hv, kdim, vdim, device, seed=0):
    """bf16 q/k/v/raw gate/beta, gate parameters of the K3 form (lb = -5), a pool of 2N slots
    holding small random states, and N distinct slots in random order."""
    import torch
    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)          # noqa: E731
    bf = lambda x: x.to(device=device, dtype=torch.bfloat16)   # noqa: E731
    x = dict(q=bf(r(n, t, h, kdim)), k=bf(r(n, t, h, kdim)), v=bf(r(n, t, hv, vdim)), g=bf(r(n, t, hv, kdim) * 2),
             beta=bf(torch.sigmoid(r(n, t, hv))))
    x["A_log"] = (r(hv) * 0.5).to(device)
    x["dt_bias"] = r(hv * kdim).to(device)
    x["pool"] = (r(2 * n, hv, kdim, vdim) * 0.1).to(device)
    x["slots"] = torch.randperm(2 * n, generator=gen)[:n].to(device=device, dtype=torch.int32)
    return x


def torch_decode(x, pool, lb=-5.0):
    """fp32 torch reference of one step (T tokens serially): gather, L2 norm, gate, delta rule,
    output, scatter."""
    import torch
    q, k, v, g, beta = (x[n].float() for n in ("q", "k", "v", "g", "beta"))
    n, t, h, kdim = q.shape
    hv = v.shape[2]
    rep = hv // h
    q = (q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 2) * kdim ** -0.5
    k = (k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 2)
    a = lb * torch.sigmoid(torch.exp(x["A_log"])[:, None] * (g + x["dt_bias"].view(hv, kdim)))
    slots = x["slots"].long()
    s = pool[slots]
    outs = []
    for i in range(t):
        s = s * torch.exp(a[:, i])[..., None]
        u = beta[:, i, :, None] * (v[:, i] - torch.einsum("nhkv,nhk->nhv", s, k[:, i]))
        s = s + k[:, i, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("nhkv,nhk->nhv", s, q[:, i]))
    pool[slots] = s
    return torch.stack(outs, 1).to(x["q"].dtype)


def fla_decode_fn(x, pool, v_first=False):
    """fla-core's decode over the pool, in place (fused_recurrent_kda_fwd with ssm_state_indices,
    as vLLM calls it); None when fla is not installed."""
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as e:  # noqa: BLE001 - the anchor is optional
        print(f"fla-core not available: {type(e).__name__}: {e}")
        return None

    def run():
        return fused_recurrent_kda_fwd(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
                                       dt_bias=x["dt_bias"], initial_state=pool, inplace_final_state=True,
                                       ssm_state_indices=x["slots"], use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=True, lower_bound=-5.0, state_v_first=v_first)[0]
    return run


def _timer(smoke):
    import harness
    if not smoke:
        return harness.graph_median_ms

    def cpu_ms(fn, rep=3):
        fn()
        t0 = time.perf_counter()
        for _ in range(rep):
            fn()
        return (time.perf_counter() - t0) / rep * 1e3
    return cpu_ms


def decode_kernel():
    """The compiled decode kernel kda_decode launches on Triton (with or without fp fusion)."""
    from k31dsl.ops.kda.decode import _fused, kda_decode_step
    return _fused(kda_decode_step, "triton")


def tuned_configs():
    return [str(v) for v in decode_kernel()._tuned.values()]


def decode_rows(ns=(1, 16, 64, 256), h=96, hv=96, kdim=128, vdim=128, smoke=False, verify_t=4):
    """One row per (N, implementation): µs per step, state TB/s, errors. CUDA-graph medians on a
    GPU; wall-clock on the CPU interpreter in smoke mode (no fla there)."""
    import torch
    from k31dsl.ops.kda.decode import kda_decode, kda_rollback
    dev = "cpu" if smoke else "cuda"
    timer = _timer(smoke)
    rows = []
    for n in ns:
        x = make_inputs(n, 1, h, hv, kdim, vdim, dev, seed=n)
        state_bytes = n * hv * kdim * vdim * 4
        gate = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0)
        ref_pool = x["pool"].clone()
        ref_o = torch_decode(x, ref_pool)
        vk = x["pool"].transpose(2, 3).contiguous()                     # [2N, HV, V, K]
        pools = {"k31dsl": x["pool"].clone(), "k31dsl [V,K]": vk.clone(), "fla": x["pool"].clone(),
                 "fla [V,K]": vk.clone(), "eager": x["pool"].clone()}
        fns = {"k31dsl": lambda p=pools["k31dsl"]: kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], p, x["slots"],
                                                             target="triton", **gate)[0],
               "k31dsl [V,K]": lambda p=pools["k31dsl [V,K]"]: kda_decode(
                   x["q"], x["k"], x["v"], x["g"], x["beta"], p, x["slots"], state_v_first=True, target="triton",
                   **gate)[0],
               "eager": lambda p=pools["eager"]: torch_decode(x, p)}
        fla = None if smoke else fla_decode_fn(x, pools["fla"])
        if fla is not None:
            fns["fla"] = fla
            fns["fla [V,K]"] = fla_decode_fn(x, pools["fla [V,K]"], v_first=True)
        errs = {}
        for name, fn in fns.items():            # one step from the same state: compare, then time
            try:
                o = fn()
            except Exception as e:  # noqa: BLE001 - an anchor variant that this fla lacks
                print(f"{name}: {type(e).__name__}: {e}")
                errs[name] = None
                continue
            st = pools[name][x["slots"].long()]
            if "[V,K]" in name:
                st = st.transpose(2, 3)
            errs[name] = (float((o.float() - ref_o.float()).abs().max()),
                          float((st - ref_pool[x["slots"].long()]).abs().max()))
        k31_vs_fla = ""
        if fla is not None:
            pa, pb = x["pool"].clone(), x["pool"].clone()
            oa = kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], pa, x["slots"], target="triton", **gate)[0]
            ob = fla_decode_fn(x, pb)()
            k31_vs_fla = f"o {float((oa.float() - ob.float()).abs().max()):.2e}, " \
                         f"S {float((pa - pb).abs().max()):.2e}"
        for name, fn in fns.items():
            if errs[name] is None:
                continue
            ms = timer(fn)
            rows.append({"N": n, "impl": name, "us": ms * 1e3, "state TB/s": 2 * state_bytes / (ms * 1e-3) / 1e12,
                         "fla ref us": FLA_REF_US.get(n, "") if h == 96 else "",
                         "max |o - ref|": errs[name][0], "max |S - ref|": errs[name][1],
                         "k31dsl vs fla": k31_vs_fla if name == "k31dsl" else ""})
        if verify_t:                              # speculative verify (reads the state) + commit
            xv = make_inputs(n, verify_t, h, hv, kdim, vdim, dev, seed=n + 1)
            pool = xv["pool"]
            acc = torch.full((n,), verify_t // 2, dtype=torch.int32, device=dev)

            def spec(pool=pool, xv=xv, acc=acc):
                _, rep = kda_decode(xv["q"], xv["k"], xv["v"], xv["g"], xv["beta"], pool, xv["slots"],
                                    save_replay=True, update_state=False, target="triton",
                                    A_log=xv["A_log"], dt_bias=xv["dt_bias"], lower_bound=-5.0)
                kda_rollback(pool, xv["slots"], None, rep, acc, target="triton")
            ms = timer(spec)
            rows.append({"N": n, "impl": f"k31dsl verify T={verify_t} + commit", "us": ms * 1e3,
                         "state TB/s": 3 * state_bytes / (ms * 1e-3) / 1e12})
    return rows


def cp_rows(t=8192, h=96, hv=96, kdim=128, vdim=128, shards=8, smoke=False):
    """Context-parallel building blocks on one shard of t tokens: kda_cp_summary by the fp32
    recurrence and by two chunk_kda passes (max difference between them), and kda_cp_merge of
    `shards` summaries. do_bench medians (ms) on a GPU, wall-clock in smoke mode."""
    import torch
    from k31dsl.ops.kda.cp import kda_cp_merge, kda_cp_summary
    dev = "cpu" if smoke else "cuda"
    x = make_inputs(1, t, h, hv, kdim, vdim, dev, seed=7)
    gate = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0)
    timer = _timer(smoke) if smoke else __import__("harness").median_ms
    rows, res = [], {}
    for method in ("recurrent", "chunk"):
        def fn(m=method):
            return kda_cp_summary(x["k"], x["v"], x["g"], x["beta"], method=m, target="triton", **gate)
        res[method] = fn()
        rows.append({"op": f"kda_cp_summary ({method})", "shape": f"T={t} HV={hv} K={kdim} V={vdim}",
                     "ms": timer(fn)})
    dm = float((res["recurrent"][0] - res["chunk"][0]).abs().max())
    de = float((res["recurrent"][1] - res["chunk"][1]).abs().max())
    rows[-1]["max |recurrent - chunk|"] = f"M {dm:.2e}, E {de:.2e}"
    sums = [tuple(z.clone() for z in res["recurrent"]) for _ in range(shards)]
    s0 = torch.zeros(1, hv, kdim, vdim, device=dev)
    rows.append({"op": "kda_cp_merge", "shape": f"R={shards} HV={hv} K={kdim} V={vdim}",
                 "ms": timer(lambda: kda_cp_merge(sums, s0, target="triton"))})
    return rows


CP_COLUMNS = ["op", "shape", "ms", "max |recurrent - chunk|"]


COLUMNS = ["N", "impl", "us", "state TB/s", "fla ref us", "max |o - ref|", "max |S - ref|", "k31dsl vs fla"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="1,16,64,256")
    ap.add_argument("--heads", type=int, default=96)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    ap.add_argument("--no-cp", action="store_true", help="skip the context-parallel summary/merge timings")
    ap.add_argument("--fp-fusion", choices=["on", "off"], default=None,
                    help="compile the decode/rollback kernels with or without multiply-add contraction "
                         "(default: kda_decode's own setting, ops/kda/decode.py FP_FUSION)")
    args = ap.parse_args(argv)
    import k31dsl.ops.kda.decode as decode_mod
    if args.fp_fusion is not None:
        decode_mod.FP_FUSION = args.fp_fusion == "on"
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import harness
    if args.smoke:
        rows = decode_rows(ns=(1, 3), h=1, hv=2, kdim=16, vdim=32, smoke=True)
        harness.print_table(COLUMNS, rows)
        if not args.no_cp:
            harness.print_table(CP_COLUMNS, cp_rows(t=20, h=1, hv=2, kdim=16, vdim=16, shards=3, smoke=True))
        bad = [r for r in rows if r.get("max |S - ref|", 0) > 1e-4]
        return 1 if bad else 0
    ns = tuple(int(s) for s in args.ns.replace("+", ",").split(","))
    ceiling = harness.copy_ceiling_tbs()
    rows = decode_rows(ns=ns, h=args.heads, hv=args.heads)
    for r in rows:
        r["% copy ceiling"] = 100 * r["state TB/s"] / ceiling
    cols = COLUMNS[:4] + ["% copy ceiling"] + COLUMNS[4:]
    cp = [] if args.no_cp else cp_rows(h=args.heads, hv=args.heads)
    tuning = harness.tuning_rows("kda_decode_step", decode_kernel())
    payload = {"env": harness.environment(), "copy_ceiling_tbs": ceiling, "heads": args.heads, "K": 128, "V": 128,
               "tuned_configs": tuned_configs(), "rows": rows, "cp_rows": cp, "tuning": tuning}
    harness.write("kda_decode", payload, cols, rows, extra=harness.tuning_section(tuning),
                  notes=f"KDA decode step, fp32 state pool [2N, {args.heads}, 128, 128], bf16 inputs, lower-bound "
                        f"gate -5, L2 norm in kernel; CUDA-graph replay medians (do_bench_cudagraph). State TB/s "
                        f"= 2 N HV K V 4 B / time (verify + commit: 3x, one read in the verify, read + write in "
                        f"the commit). Copy ceiling {ceiling:.3f} TB/s. Tuned (BV, num_warps): {tuned_configs()}.")
    harness.print_table(cols, rows)
    if cp:
        harness.print_table(CP_COLUMNS, cp)
    print(f"copy ceiling: {ceiling:.3f} TB/s; tuned: {tuned_configs()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

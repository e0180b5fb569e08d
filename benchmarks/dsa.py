"""One DSA decode step of one layer on a GPU: the fused LI+SFA kernel (k31dsl fused_li_sfa) and the
unfused k31dsl path (lightning_indexer -> topk -> slots_of_positions -> sparse_mla_attention) vs
torch eager and torch.compile of the same math with bf16 keys (indexer scores, ReLU, head
weights, torch.topk, gather, softmax attention over the 576/512 MLA latents).

    python benchmarks/dsa.py [--shapes 64x32768,32x131072]     # GPU
    python benchmarks/dsa.py --smoke                            # CPU, Triton interpreter, tiny shapes

Shapes: indexer 64 heads x 128 (MXFP8 codes + e8m0 scales, paged key cache 132 B/token), top-k
2048, MLA 128 heads, 576/512 (paged FP8 latent cache 656 B/token), next_n = 1, every sequence
at full context L, pages shuffled over the pool. Byte floor of the fused FP8 path:
B * (L * 132 + 2048 * 656) bytes at the copy ceiling measured in this run. Before timing, the
fused and unfused selections are compared (rows whose key sets differ) and their outputs
(max |o_fused - o_unfused| / max |o|). Timed variants: unfused (fp8 / bf16 indexer scoring),
fused (one program per token), fused split4 (two launches, 4 scoring programs per token), each
with fp8 and bf16 scoring. Writes results/dsa.json and .md and the plot results/dsa_step.png (not in
--smoke; `--plot` redraws the plot from the JSON on any machine); `--tag NAME` writes
results/dsa_NAME.* instead, e.g. a short-context run that sets FUSED_MAX_KEYS:

    python benchmarks/dsa.py --shapes 64x2048,128x1024 --tag short"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

REF_MS = {(64, 32768): {"eager": 1.60, "compile": 0.880}, (32, 131072): {"eager": 2.35, "compile": 1.33}}
SM_SCALE = 0.135234
SPLITS = 4          # the split-L fused variant: 4 scoring programs per token (T * 4 programs)


def make_step(b, length, topk, h_idx, h, device, seed=0, anchors: bool = True):
    """Paged caches of B sequences of L tokens (random codes; fp32 tile scales ~ N(0,1) latents;
    e8m0 scales near 2^0), the decode queries, and (anchors; else None) the same keys as dense
    bf16 tensors for the torch anchors."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per = -(-length // 64)
    n_pages = b * pages_per
    bt = torch.randperm(n_pages, device=device, generator=g).to(torch.int32).view(b, pages_per)
    # indexer cache: [P, 64*128 codes | 64*4 scales]
    kx = torch.randn(n_pages, 64, 128, device=device, generator=g) * 4
    kcodes = kx.to(torch.float8_e4m3fn)
    kscale_b = torch.randint(125, 130, (n_pages, 64, 4), device=device, generator=g, dtype=torch.uint8)
    icache = torch.cat([kcodes.view(torch.uint8).view(n_pages, -1), kscale_b.view(n_pages, -1)], 1).contiguous()
    # MLA cache: [P, 64, 656] records
    lat = torch.randn(n_pages, 64, 4, 128, device=device, generator=g)
    amax = lat.abs().amax(-1).clamp_min(1e-4)
    scale = amax / 448.0
    codes = (lat / scale[..., None]).to(torch.float8_e4m3fn)
    rope = torch.randn(n_pages, 64, 64, device=device, generator=g).to(torch.bfloat16)
    mcache = torch.cat([codes.view(torch.uint8).view(n_pages, 64, 512), scale.view(torch.uint8).view(n_pages, 64, 16),
                        rope.view(torch.uint8).view(n_pages, 64, 128)], 2).contiguous()
    qc = (torch.randn(b, h_idx, 128, device=device, generator=g) * 4).to(torch.float8_e4m3fn)
    qs = torch.randint(125, 130, (b, h_idx, 4), device=device, generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    w = torch.randn(b, h_idx, device=device, generator=g)
    q = torch.randn(b, h, 576, device=device, generator=g).to(torch.bfloat16)
    ks = torch.zeros(b, dtype=torch.int32, device=device)
    ke = torch.full((b,), length, dtype=torch.int32, device=device)
    args = (qc, qs, w, icache, q, mcache, bt, ks, ke)
    if not anchors:
        return args, None
    # dense bf16 keys in logical order for the anchors (the same values)
    perm = bt.long()
    k_dense = (kcodes.float() * torch.exp2(kscale_b.float() - 127).repeat_interleave(32, -1))[perm].view(b, -1, 128)
    kv_lat = (codes.float() * scale[..., None]).view(n_pages, 64, 512)[perm].view(b, -1, 512)
    kv_dense = torch.cat([kv_lat, rope.float()[perm].view(b, -1, 64)], -1)[:, :length].to(torch.bfloat16)
    q_idx = (qc.float() * torch.exp2(qs.view(torch.uint8).float() - 127).repeat_interleave(32, -1)).to(torch.bfloat16)
    anchor_in = (q_idx, w, k_dense[:, :length].to(torch.bfloat16).contiguous(), q, kv_dense.contiguous())
    return args, anchor_in


def step_scores(b: int, length: int):
    """The probes' decode step on the GPU: make_step at the benchmark's head counts and top-k
    (no anchor tensors) and the step's indexer logits [B, L] from bf16 scoring."""
    from k31dsl.ops.dsa.indexer import lightning_indexer
    args, _ = make_step(b, length, 2048, 64, 128, "cuda", anchors=False)
    qc, qs, w, icache, _q, _m, table, ks, ke = args
    return args, lightning_indexer(qc, qs, icache, table, w, ks, ke, length, mma="bf16", target="triton")


def step_attention_inputs(b: int, length: int):
    """The sparse attention's inputs at the probes' decode step: (MLA query [B, 128, 576], MLA
    cache, its three views, physical slots [B, 2048] from the step's own indexer scores -> top-k
    (set) -> block table). The indexer cache and the scores are dropped here."""
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import slots as S
    from k31dsl.ops.dsa.topk import topk
    (_qc, _qs, _w, _icache, q, mcache, table, _ks, _ke), scores = step_scores(b, length)
    slots = S.slots_of_positions(topk(scores, 2048, sorted=False, target="triton"), table, 1, target="triton")
    return q, mcache, A.cache_views(mcache), slots


def torch_step(q_idx, w, k_idx, q, kv, topk: int = 2048, sm_scale: float = SM_SCALE):
    """The same math in torch with bf16 keys: scores -> top-k -> sparse MQA attention."""
    import torch
    logits = torch.einsum("bhd,bld->bhl", q_idx, k_idx).float().relu_()
    scores = torch.einsum("bhl,bh->bl", logits, w)
    idx = scores.topk(min(topk, scores.shape[1]), dim=-1).indices
    g = torch.gather(kv, 1, idx[..., None].expand(-1, -1, kv.shape[-1]))       # [B, k, 576]
    s = torch.einsum("bhd,bkd->bhk", q, g).float() * sm_scale
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).to(kv.dtype)
    return torch.einsum("bhk,bkc->bhc", p, g[..., :512]), lse


def compare(fused, unfused):
    import torch
    o, lse, sel = fused
    uo, ul, usel = unfused
    diff_rows = sum(set(a.tolist()) != set(b_.tolist()) for a, b_ in zip(sel.cpu(), usel.cpu()))
    rel = float((o.float() - uo.float()).abs().max() / uo.float().abs().max().clamp_min(1e-30))
    return diff_rows, rel, float((lse - ul).abs().max()) if torch.isfinite(ul).all() else float("nan")


def stage_times(args, topk, length, target):
    """CUDA-graph medians of the unfused bf16 path's four launches, each on the previous stage's
    output: where the step's time goes."""
    import harness
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import slots as S
    from k31dsl.ops.dsa.indexer import lightning_indexer
    from k31dsl.ops.dsa.topk import topk as topk_op
    q_codes, q_scales, w, idx_cache, mla_q, mla_cache, table, ks, ke = args
    t = q_codes.shape[0]
    stages = {
        "indexer": lambda: lightning_indexer(q_codes, q_scales, idx_cache, table, w, ks, ke, length, mma="bf16",
                                             target=target)}
    scores = stages["indexer"]()
    stages["topk"] = lambda: topk_op(scores, topk, sorted=False, target=target)
    pos = stages["topk"]()
    stages["slots"] = lambda: S.slots_of_positions(pos, table, t // table.shape[0], target=target)
    slots = stages["slots"]()
    stages["sfa"] = lambda: A.sparse_mla_attention(mla_q, mla_cache, slots, SM_SCALE, target=target)   # its default
    stages["sfa one-pass"] = lambda: A.sparse_mla_attention(mla_q, mla_cache, slots, SM_SCALE, form="one_pass",
                                                            target=target)
    stages["sfa two-pass"] = lambda: A.sparse_mla_attention(mla_q, mla_cache, slots, SM_SCALE, form="two_pass",
                                                            target=target)
    split = A.sfa_split(t, mla_q.shape[1], topk, A.max_head_block(target))   # the one-pass form's split
    if split > 1:                       # flash-decoding form (the model's decode steps)
        stages[f"sfa split{split}"] = lambda: A.sparse_mla_attention(mla_q, mla_cache, slots, SM_SCALE, split=split,
                                                                    form="one_pass", target=target)
    out = {}
    for name, fn in stages.items():
        out[f"stage {name} graph ms"] = harness.graph_median_ms(fn)
        print(f"  stage {name}: {out[f'stage {name} graph ms']:.4f} ms (graph)", flush=True)
    return out


def run_shape(b, length, topk, h_idx, h, device, timed: bool, ceiling: float | None, fused: bool = True,
              save=lambda row: None):
    """Correctness first, then timings; the unfused path and the anchors before the fused kernel
    (its first compile at KP = 2048 takes ~30 s per scoring variant), `save(row)` after each step."""
    import torch
    from k31dsl.ops.dsa import fused as F
    import harness
    t0 = time.time()
    args, anchor_in = make_step(b, length, topk, h_idx, h, device)
    target = "triton"
    row = {"B": b, "L": length}
    unf = F.li_sfa_unfused(*args, topk, SM_SCALE, return_indices=True, mma="fp8", target=target, max_len=length)
    print(f"[B={b} L={length}] inputs + unfused first call {time.time() - t0:.1f}s", flush=True)
    ref_o, _ = torch_step(*anchor_in, topk=topk)
    row["unfused o rel diff vs torch"] = float((unf[0].float() - ref_o.float()).abs().max() / ref_o.float().abs().max())
    fns = {"unfused": lambda: F.li_sfa_unfused(*args, topk, SM_SCALE, mma="fp8", target=target, max_len=length),
           "unfused bf16": lambda: F.li_sfa_unfused(*args, topk, SM_SCALE, target=target, max_len=length, mma="bf16"),
           "eager": lambda: torch_step(*anchor_in, topk=topk)}
    if timed:
        compiled = torch.compile(torch_step)
        fns["compile"] = lambda: compiled(*anchor_in, topk=topk)
        row["floor ms"] = b * (length * 132 + topk * 656) / (ceiling * 1e12) * 1e3
        row["ref compile ms"] = REF_MS.get((b, length), {}).get("compile", float("nan"))

    def measure(name):
        row[f"{name} ms"] = harness.median_ms(fns[name])
        row[f"{name} graph ms"] = harness.graph_median_ms(fns[name])
        print(f"[B={b} L={length}] {name}: {row[f'{name} ms']:.4f} ms, graph {row[f'{name} graph ms']:.4f} ms",
              flush=True)
        if name.startswith(("fused", "unfused")) and "compile ms" in row:
            best = min(row[f"{name} ms"], row[f"{name} graph ms"])
            row[f"{name} % floor BW"] = 100 * row["floor ms"] / best
            row[f"{name} vs compile"] = min(row["compile ms"], row["compile graph ms"]) / best
        save(row)

    if timed:
        for name in ("eager", "compile", "unfused", "unfused bf16"):
            measure(name)
        row.update(stage_times(args, topk, length, target))
        save(row)
    if not fused:
        return row
    fus = F.fused_li_sfa(*args, topk, SM_SCALE, return_indices=True, mma="fp8", target=target)
    print(f"[B={b} L={length}] fused first call {time.time() - t0:.1f}s", flush=True)
    row["rows with different keys"], row["o rel diff"], row["lse diff"] = compare(fus, unf)
    fus16 = F.fused_li_sfa(*args, topk, SM_SCALE, return_indices=True, mma="bf16", target=target)
    unf16 = F.li_sfa_unfused(*args, topk, SM_SCALE, return_indices=True, mma="bf16", target=target, max_len=length)
    row["bf16: rows with different keys"], row["bf16: o rel diff"], _ = compare(fus16, unf16)
    fus4 = F.fused_li_sfa(*args, topk, SM_SCALE, return_indices=True, splits=SPLITS, mma="fp8", target=target)
    row[f"split{SPLITS}: rows with different keys"], row[f"split{SPLITS}: o rel diff"], _ = compare(fus4, unf)
    save(row)
    if timed:
        fns["fused"] = lambda: F.fused_li_sfa(*args, topk, SM_SCALE, mma="fp8", target=target)
        fns["fused bf16"] = lambda: F.fused_li_sfa(*args, topk, SM_SCALE, mma="bf16", target=target)
        fns[f"fused split{SPLITS}"] = lambda: F.fused_li_sfa(*args, topk, SM_SCALE, splits=SPLITS, mma="fp8",
                                                              target=target)
        fns[f"fused split{SPLITS} bf16"] = lambda: F.fused_li_sfa(*args, topk, SM_SCALE, splits=SPLITS, mma="bf16",
                                                                  target=target)
        for name in ("fused", "fused bf16", f"fused split{SPLITS}", f"fused split{SPLITS} bf16"):
            measure(name)
    return row


def tuning_tables() -> list[dict]:
    """Every config the Triton autotuner timed for the unfused path's kernels."""
    import importlib
    import harness
    A, I, K, TP = (importlib.import_module(f"k31dsl.ops.dsa.{m}") for m in ("attention", "indexer", "topk",
                                                                               "sfa_two_pass"))
    kernels = [("lightning_indexer_paged", I.lightning_indexer_paged), ("topk_segments", K.topk_segments),
               ("sparse_mla_attention_fwd", A.sparse_mla_attention_fwd),
               ("sparse_mla_attention_split", A.sparse_mla_attention_split),
               ("sparse_mla_attention_combine", A.sparse_mla_attention_combine),
               ("sfa_scores", TP.sfa_scores), ("sfa_values", TP.sfa_values)]
    return [r for label, kdef in kernels for r in harness.tuning_rows(label, kdef["triton"])]


STAGES = (("indexer", "stage indexer graph ms"), ("top-k", "stage topk graph ms"),
          ("slots", "stage slots graph ms"), ("SFA", "stage sfa graph ms"))


def plot(rows: list[dict], path: Path) -> Path:
    """One panel per shape: CUDA-graph times of the anchors and of each k31dsl path (the unfused bf16
    path stacked by its launches, each timed alone; the rest of its total is launch gaps and tails),
    with the issue's goal (torch.compile / 8) and the byte floor as vertical lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 2.6 * len(rows)), squeeze=False)
    colors = dict(zip([n for n, _ in STAGES] + ["gaps"], ["#4c72b0", "#dd8452", "#937860", "#55a868", "#cccccc"]))
    for ax, r in zip(axes[:, 0], rows):
        bars = [(label, r.get(key)) for label, key in (
            ("torch eager", "eager graph ms"), ("torch.compile", "compile graph ms"),
            ("k31dsl fused (bf16)", "fused bf16 graph ms"), ("k31dsl fused split4 (bf16)", "fused split4 bf16 graph ms"),
            ("k31dsl unfused (bf16)", "unfused bf16 graph ms")) if r.get(key) == r.get(key) and r.get(key)]
        for y, (label, ms) in enumerate(bars):
            if label != "k31dsl unfused (bf16)":
                ax.barh(y, ms, color="#8c8c8c")
                ax.text(ms, y, f" {ms:.3f}", va="center", fontsize=8)
                continue
            left = 0.0
            for name, key in STAGES:
                ax.barh(y, r[key], left=left, color=colors[name], label=name)
                left += r[key]
            ax.barh(y, max(ms - left, 0.0), left=left, color=colors["gaps"], label="gaps")
            ax.text(ms, y, f" {ms:.3f}", va="center", fontsize=8)
        goal = r["compile graph ms"] / 8
        ax.axvline(goal, color="#c44e52", ls="--", lw=1, label=f"goal: compile / 8 = {goal:.3f}")
        ax.axvline(r["floor ms"], color="black", ls=":", lw=1, label=f"byte floor {r['floor ms']:.3f}")
        ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        ax.set_title(f"DSA decode step, one layer: B={r['B']}, L={r['L']}", fontsize=9)
        ax.set_xlabel("ms (CUDA-graph median)", fontsize=8)
        ax.set_xlim(0, 1.12 * max(ms for _, ms in bars))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter), no timing")
    ap.add_argument("--no-fused", action="store_true", help="skip the fused kernel")
    ap.add_argument("--plot", action="store_true",
                    help="only draw results/dsa_step.png from results/dsa.json (any machine)")
    ap.add_argument("--tag", default="", help="write results/dsa_TAG.{json,md} and dsa_TAG_step.png (keeps the "
                                              "main results of the default shapes)")
    args = ap.parse_args(argv)
    if args.tag and not args.tag.replace("_", "").isalnum():
        ap.error(f"--tag {args.tag!r}: letters, digits and _ only (it becomes a file name)")
    name = f"dsa_{args.tag}" if args.tag else "dsa"
    if args.plot:
        import json
        res = Path(__file__).parent / "results"
        print(plot(json.loads((res / f"{name}.json").read_text())["rows"], res / f"{name}_step.png"))
        return 0
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        row = run_shape(2, 200, 16, 16, 4, "cpu", timed=False, ceiling=None)
        print(row)
        ok = row["rows with different keys"] == 0 and row["o rel diff"] < 2e-2 and \
            row["bf16: rows with different keys"] == 0 and row["bf16: o rel diff"] < 2e-2 and \
            row[f"split{SPLITS}: rows with different keys"] == 0 and row[f"split{SPLITS}: o rel diff"] < 2e-2
        print("smoke", "ok" if ok else "FAILED")
        return 0 if ok else 1
    import harness
    ceiling = harness.copy_ceiling_tbs()
    rows = []

    def save(row):
        cols = list(dict.fromkeys(c for r in rows + [row] for c in r))
        done = rows + ([row] if row not in rows else [])
        payload = {"env": harness.environment(), "copy_ceiling_tbs": ceiling, "rows": done}
        tuning = tuning_tables()
        harness.write(name, payload, cols, done,
                      notes=f"one decode step, one layer; copy ceiling {ceiling:.3f} TB/s; floor = "
                            "B*(L*132 + 2048*656) bytes at that ceiling; `ms` do_bench median (Python launch "
                            "included), `graph ms` CUDA-graph replay; `unfused` / `fused`: fp8 indexer scoring, "
                            "`bf16`: bf16 scoring (the ops' default on a GPU, mma=\"auto\"); `stage` columns: "
                            "the unfused bf16 path's launches timed one by one",
                      extra=harness.tuning_section(tuning))

    for b, length in harness.shape_pairs(args.shapes):
        rows.append(run_shape(b, length, 2048, 64, 128, "cuda", timed=True, ceiling=ceiling,
                              fused=not args.no_fused, save=save))
        save(rows[-1])
    cols = list(dict.fromkeys(c for r in rows for c in r))
    harness.print_table(cols, rows)
    if all(key in r for r in rows for _, key in STAGES):
        plot(rows, harness.RESULTS / f"{name}_step.png")
    harness.print_table(harness.TUNING_COLUMNS, tuning_tables())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

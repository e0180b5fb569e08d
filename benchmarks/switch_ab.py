"""An A/B of an environment switch of k31dsl, same GPU, same run: each setting in its own process
(the switches are read when a kernel is emitted or a step graph is built), at the model's decode
steps (hundreds of few-µs kernels per token, replayed as CUDA graphs) and at the DSA decode step,
with a check that the outputs do not change. Switches:
  K31_PDL            programmatic dependent launch: off | start | end | auto (default; on = start;
                     targets/triton/emit.py, pdl_mode)
  K31_SHORT_RANGES   a step whose every query has at most topk keys in range: all (default: every
                     key attended, no indexer) | score (indexer and top-k anyway;
                     ops/dsa/slots.py, short_ranges)
By default the order is end, off, end (K31_PDL), so drift over the run shows up as a difference
between the two runs of one setting; --base names the setting the others are compared to.
The torch anchors of each case (eager and torch.compile; the DSA step's from benchmarks/dsa.py,
the model's from the reference model) are measured once, in the first process: the switches do
not touch torch's kernels.

    python benchmarks/switch_ab.py                 # K31_PDL; writes benchmarks/results/pdl.{json,md}
    python benchmarks/switch_ab.py --parts dsa --order on,off --tag dsa      # results/pdl_dsa.*
    python benchmarks/switch_ab.py --switch K31_SHORT_RANGES --order all,score,all --base score \
        --shapes 64x2048,128x1024                  # results/short_ranges.*

Each worker prints its progress and writes one JSON file (times, output digests) for the driver.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402


def _digest(*tensors) -> str:
    """A short hash of the tensors' bytes: equal outputs <=> equal digests."""
    import torch
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:12]


def work_model(anchors: bool, batches: list[int], context: int, steps: int) -> list[dict]:
    import model as M
    from k31dsl.model.config import K31Config, pages_for
    from k31dsl.model.weights import cast_weights, init_weights
    cfg = K31Config.load("small")
    weights = {n: w.to("cuda") for n, w in cast_weights(init_weights(cfg, 0), cfg.dtype).items()}
    impls = ["k31dsl"] + (["eager", "torch.compile"] if anchors else [])
    num_pages = max(b * pages_for(context + steps + 3) for b in batches)
    runners = M.Runners(cfg, weights, impls, num_pages, max(batches), "cuda")
    results: dict = {}
    M.bench_decode(runners.for_section(max(batches), context + steps + 3), batches, context, steps, "cuda",
                   [], results, warmup=2)
    rows = [{"case": f"model decode B={b} L={context}", "impl": impl, "ms": r["ms_per_step"],
             "digest": r["tokens_sha1"], "timing": f"wall per step, {steps} steps"}
            for b, per in results["decode"].items() for impl, r in per.items()]
    # the device side alone: the k31dsl runner's captured decode graphs replayed back to back (no
    # host work, no sync per step; the wall figures above move by several % between runs)
    for shape, (graph, _static, _out) in sorted(runners.k31._graphs.items(), key=lambda kv: kv[0].n_seqs):
        if shape.kind == "decode":
            rows.append({"case": f"model decode graph B={shape.n_seqs} L={context}", "impl": "k31dsl",
                         "ms": harness.median_ms(graph.replay, warmup=10, rep=200), "digest": "-",
                         "timing": "do_bench median of graph replays"})
            print(f"{rows[-1]['case']}: {rows[-1]['ms']:.4f} ms", flush=True)
    return rows


def work_dsa(anchors: bool, shapes: list[tuple[int, int]]) -> list[dict]:
    import torch
    import dsa as D
    from k31dsl.ops.dsa import fused as F
    rows = []
    for b, length in shapes:
        args, anchor_in = D.make_step(b, length, 2048, 64, 128, "cuda", anchors=anchors)

        def step():
            return F.li_sfa_unfused(*args, 2048, D.SM_SCALE, target="triton", max_len=length, mma="bf16")
        o, lse = step()
        case = f"DSA step B={b} L={length}"
        rows.append({"case": case, "impl": "k31dsl", "ms": harness.graph_median_ms(step), "digest": _digest(o, lse),
                     "timing": "CUDA-graph median"})
        if anchors:
            compiled = torch.compile(D.torch_step)
            for impl, fn in (("eager", lambda: D.torch_step(*anchor_in)), ("torch.compile", lambda: compiled(*anchor_in))):
                fn()
                rows.append({"case": case, "impl": impl, "ms": harness.graph_median_ms(fn), "digest": "",
                             "timing": "CUDA-graph median"})
        print(*(f"{r['case']} {r['impl']}: {r['ms']:.4f} ms" for r in rows[-3 if anchors else -1:]), sep="\n",
              flush=True)
        torch.cuda.empty_cache()
    return rows


def worker(args) -> int:
    anchors = args.anchors
    rows = []
    if args.worker == "model":
        rows = work_model(anchors, [int(b) for b in args.batches.split(",")], args.context, args.steps)
    elif args.worker == "dsa":
        rows = work_dsa(anchors, harness.shape_pairs(args.shapes))
    Path(args.out).write_text(json.dumps(rows))
    return 0


def summarise(runs: list[tuple[str, list[dict]]], switch: str, base: str) -> list[dict]:
    """One row per (case, impl, setting, run); k31dsl rows get the change against the median `base`
    time of their case and whether their outputs equal the first `base` run's."""
    base_ms: dict = {}
    base_digest: dict = {}
    for setting, rows in runs:
        for r in rows:
            if setting == base and r["impl"] == "k31dsl":
                base_ms.setdefault(r["case"], []).append(r["ms"])
                base_digest.setdefault(r["case"], r["digest"])
    out = []
    for i, (setting, rows) in enumerate(runs):
        for r in rows:
            row = {"case": r["case"], "impl": r["impl"], switch: setting if r["impl"] == "k31dsl" else "-",
                   "run": i + 1, "ms": r["ms"], "timing": r["timing"]}
            if r["impl"] == "k31dsl" and r["case"] in base_ms:
                mid = sorted(base_ms[r["case"]])[len(base_ms[r["case"]]) // 2]
                row[f"vs {base} %"] = 100 * (r["ms"] / mid - 1)
                row[f"same outputs as {base}"] = r["digest"] == base_digest[r["case"]] and bool(r["digest"])
            out.append(row)
    return sorted(out, key=lambda r: (r["case"], r["impl"] != "k31dsl", r["run"]))


SWITCHES = {  # name: (settings, the default --base, the results' default name)
    "K31_PDL": (("on", "off", "start", "end", "auto"), "off", "pdl"),
    "K31_SHORT_RANGES": (("all", "score"), "score", "short_ranges"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="model,dsa", help="which cases: model (decode steps), dsa (the decode step)")
    ap.add_argument("--switch", default="K31_PDL", choices=sorted(SWITCHES), help="the environment switch")
    ap.add_argument("--order", default="end,off,end",
                    help="the switch's settings, one process each, in this order (K31_PDL: off, start, end, auto; "
                         "on = start)")
    ap.add_argument("--base", help="the setting the others are compared to (default: off for K31_PDL, score for "
                                   "K31_SHORT_RANGES)")
    ap.add_argument("--batches", default="1,64", help="model decode batch sizes")
    ap.add_argument("--context", type=int, default=1024, help="model decode context")
    ap.add_argument("--steps", type=int, default=32, help="model decode steps timed")
    ap.add_argument("--shapes", default="64x32768,32x131072", help="DSA step shapes BxL")
    ap.add_argument("--no-anchors", action="store_true", help="skip the torch anchors (an A/B of settings only)")
    ap.add_argument("--tag", default="", help="write results/NAME_TAG.{json,md} (NAME: pdl, short_ranges)")
    ap.add_argument("--worker", choices=["model", "dsa"], help=argparse.SUPPRESS)
    ap.add_argument("--anchors", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    order = [s.strip() for s in args.order.replace("+", ",").split(",")]   # "+": gpu_run.sh lists
    settings, base, name = SWITCHES[args.switch]
    base = args.base or base
    if any(s not in settings for s in order) or base not in order:
        ap.error(f"--order takes {', '.join(settings)} for {args.switch} and must include --base {base}; "
                 f"got {args.order!r}")
    results = {"env": harness.environment(), "switch": args.switch, "order": order, "runs": []}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in [p for p in args.parts.split(",") if p]:
            for i, setting in enumerate(order):
                out = Path(tmp) / f"{part}_{i}.json"
                cmd = [sys.executable, __file__, "--worker", part, "--out", str(out), "--batches", args.batches,
                       "--context", str(args.context), "--steps", str(args.steps), "--shapes", args.shapes]
                if i == 0 and not args.no_anchors:
                    cmd.append("--anchors")
                value = "start" if args.switch == "K31_PDL" and setting == "on" else setting
                env = {**os.environ, args.switch: value}
                print(f"=== {part}, {args.switch}={value} (run {i + 1})", flush=True)
                rc = subprocess.run(cmd, env=env).returncode
                if rc != 0 or not out.exists():
                    print(f"{part} {args.switch}={value}: worker failed (rc {rc})")
                    continue
                rows = json.loads(out.read_text())
                runs.append((setting, rows))
                results["runs"].append({"part": part, args.switch: setting, "rows": rows})
    table = summarise(runs, args.switch, base)
    cols = ["case", "impl", args.switch, "run", "ms", f"vs {base} %", f"same outputs as {base}", "timing"]
    harness.write(f"{name}_{args.tag}" if args.tag else name, {**results, "rows": table}, cols, table,
                  notes=f"k31dsl rows: each run in its own process; vs {base} % against the median of the {base} "
                        "runs of the case; outputs compared as a hash of the tokens (model) or of o and lse (DSA)")
    harness.print_table(cols, table)
    return 0 if all(r.get(f"same outputs as {base}", True) for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())

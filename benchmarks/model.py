"""The K31 model end to end on a GPU: the generated-op runner (model/assembler.py ModelRunner, target
triton, decode in graph mode) vs the torch reference model (model/reference ReferenceModel) eager
and under torch.compile, all in one run, on the `small` preset (~1.2 B parameters, bf16).

  1. prefill TTFT: one sequence of 4K and 32K tokens from an empty cache, one `forward` of the
     whole prompt (the time to the first token's logits). Median of triton.testing.do_bench when a
     call takes < 50 ms, else the median of 3 wall-clock calls after a warm-up (synchronised).
     Then each runner's prefill logits against the eager reference's (largest difference over the
     largest |logit|, argmax agreement). In bf16 this differs even between eager and torch.compile
     (the random-weight model is chaotic); section 4 is the end-to-end check.
  2. decode tokens/s at batch 1 and 64: every sequence prefilled to `--decode-context` tokens, then
     `--decode-steps` decode steps, each feeding the greedy token of the step before (argmax on the
     device, to the host: what an engine does). Wall clock over the N steps after 2 warm-up steps.
  3. speculative decoding at gamma = 3 through the engine (model/engine.py): the same greedy
     requests with and without a draft; speedup = decode tokens/s ratio (engine stats), acceptance
     rate, and a check that the tokens are identical. Draft: the layer-skip draft of `k31dsl run`
     (the target's first quarter of layers, its own weights: a small K31 config).
  4. accuracy: one prefill of `--accuracy-tokens` tokens against an fp32 truth (the reference model,
     eager, TF32 off, on the bf16 weights upcast exactly): the generated ops in fp32 (must sit near
     the truth: this is the check that Triton's compiler computes what the interpreter does) and
     in bf16, next to torch's own bf16 runs. With random weights a bf16 model is chaotic (MoE
     routing and the top-k flip on rounding noise: eager and torch.compile disagree with each
     other), so a bf16 runner is judged by its distance to the truth relative to the closer of
     eager's and torch.compile's in the same dtype (column "rms / torch's").

    python benchmarks/model.py            # GPU; writes benchmarks/results/model.{json,md}
    python benchmarks/model.py --smoke    # tiny preset on the CPU (Triton interpreter), end to end

Every runner speaks the Runner protocol (model/step.py), so the three are timed by the same code.
Floors (bytes and FLOPs of a decode step / a prefill, from the config): `floors()`, printed first."""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from k31dsl.model.config import pages_for  # noqa: E402

HBM_TBS = 4.28           # H200 copy ceiling measured in earlier runs (NOTES.md); re-measured here
BF16_TFLOPS = 790.0      # H200 bf16 dense GEMM on random data (NOTES.md)
KDA_FLOP_PER_TOKEN_HEAD = 156e3      # our chunk_kda kernels, K = V = 128 (NOTES.md, KDA prefill)


# ---------------------------------------------------------------- floors from the config

def _numel(shape) -> int:
    return math.prod(shape)


def floors(cfg, batch: int = 64, context: int = 1024, prefill: int = 32768) -> dict:
    """Bytes and FLOPs of one decode step (batch sequences at `context` tokens each) and of one
    prefill of `prefill` tokens, from the config alone. Weights in cfg.dtype, KDA state fp32
    (read + written), conv state fp32, DSA caches 656 B (latent: 512 e4m3 + 4 fp32 scales + 64
    bf16 rope) + 132 B (indexer: 128 e4m3 + 4 e8m0) per token and layer."""
    from k31dsl.model.config import CONV, INDEX_DIM, KV_LORA, ROPE_DIM
    wb = 2 if cfg.dtype == "bfloat16" else 4
    shapes = cfg.weight_shapes()
    experts = sum(_numel(s) for n, s in shapes.items() if n.endswith((".moe.gate_up", ".moe.down")))
    embed = _numel(shapes["embed"])
    dense = cfg.n_params() - embed - experts
    e, k = cfg.n_experts, cfg.n_experts_per_tok
    n_kda, n_dsa = len(cfg.kda_layers), len(cfg.dsa_layers)
    active = dense + experts * k / e                       # matmul parameters one token uses
    lat_b, idx_b = KV_LORA + 4 * 4 + ROPE_DIM * 2, INDEX_DIM + INDEX_DIM // 32
    hv, K, V = cfg.kda_value_heads, cfg.kda_head_dim, cfg.kda_value_dim
    conv_ch = 2 * cfg.kda_heads * K + hv * V
    mla_dot = KV_LORA + ROPE_DIM + KV_LORA                 # scores over 576 dims + output over 512

    def decode(b):
        touched = e * (1 - (1 - k / e) ** b)               # experts a batch of b routes to (uniform routing)
        weight_bytes = (dense + experts * touched / e) * wb + b * cfg.d_model * wb
        state = b * n_kda * (hv * K * V * 4 + conv_ch * (CONV - 1) * 4) * 2
        keys = min(context + 1, cfg.index_topk)
        cache = b * n_dsa * ((context + 1) * idx_b + keys * lat_b + lat_b + idx_b)
        flop = (2 * b * active + b * n_dsa * ((context + 1) * cfg.index_heads * INDEX_DIM * 2
                                             + keys * cfg.mla_heads * mla_dot * 2)
                + b * n_kda * hv * K * V * 8)
        total = weight_bytes + state + cache
        return {"batch": b, "context": context, "weight_bytes": weight_bytes, "state_bytes": state,
                "cache_bytes": cache, "bytes": total, "flop": flop,
                "floor_ms": max(total / (HBM_TBS * 1e12), flop / (BF16_TFLOPS * 1e12)) * 1e3,
                "floor_tokens_per_s": b / max(total / (HBM_TBS * 1e12), flop / (BF16_TFLOPS * 1e12))}

    def prefill_cost(t):
        pairs_idx = t * (t + 1) / 2
        pairs_mla = sum(min(i + 1, cfg.index_topk) for i in range(t))
        mm = 2 * t * active
        idx = n_dsa * cfg.index_heads * INDEX_DIM * 2 * pairs_idx
        mla = n_dsa * cfg.mla_heads * mla_dot * 2 * pairs_mla
        kda = n_kda * t * hv * KDA_FLOP_PER_TOKEN_HEAD * (K * V) / (128 * 128)
        flop = mm + idx + mla + kda
        act = t * cfg.d_model * 4 * (cfg.n_blocks + 2) * cfg.n_layers * 2   # AttnRes sources re-read per sublayer
        by = cfg.n_params() * wb + act
        return {"tokens": t, "matmul_flop": mm, "indexer_flop": idx, "mla_flop": mla, "kda_flop": kda,
                "flop": flop, "bytes": by,
                "floor_ms": max(flop / (BF16_TFLOPS * 1e12), by / (HBM_TBS * 1e12)) * 1e3}

    return {"params": cfg.n_params(), "active_params_per_token": active,
            "decode": {b: decode(b) for b in sorted({1, batch})}, "prefill": prefill_cost(prefill)}


def print_floors(cfg, f: dict) -> None:
    print(f"floors for {cfg.name}: {f['params'] / 1e9:.3f} B parameters, "
          f"{f['active_params_per_token'] / 1e9:.3f} B matmul parameters per token")
    for b, d in f["decode"].items():
        print(f"  decode B={b} L={d['context']}: weights {d['weight_bytes'] / 1e9:.3f} GB, KDA+conv state "
              f"{d['state_bytes'] / 1e9:.3f} GB (r+w), caches {d['cache_bytes'] / 1e9:.3f} GB -> "
              f"{d['bytes'] / 1e9:.3f} GB, {d['flop'] / 1e9:.1f} GFLOP: floor {d['floor_ms']:.3f} ms "
              f"({d['floor_tokens_per_s']:,.0f} tokens/s)")
    p = f["prefill"]
    print(f"  prefill T={p['tokens']}: matmul {p['matmul_flop'] / 1e12:.1f} + indexer {p['indexer_flop'] / 1e12:.1f} "
          f"+ MLA {p['mla_flop'] / 1e12:.1f} + KDA {p['kda_flop'] / 1e12:.2f} = {p['flop'] / 1e12:.1f} TFLOP, "
          f"{p['bytes'] / 1e9:.1f} GB: floor {p['floor_ms']:.1f} ms")


# ---------------------------------------------------------------- runners

class Runners:
    """The implementations under test. The k31dsl runner (generated ops on Triton, graph mode for
    decode on a GPU) is built once with room for every section; the reference runners keep dense
    per-slot caches [slots, max_len, ...], so each section builds them at its own size."""

    def __init__(self, cfg, weights, impls: list[str], num_pages: int, num_slots: int, device: str):
        self.cfg, self.weights, self.impls, self.device = cfg, weights, impls, device
        self.k31 = None
        if "k31dsl" in impls:
            t = time.perf_counter()
            try:
                from k31dsl.model.assembler import ModelRunner
                self.k31 = ModelRunner(cfg, weights, "triton", num_pages=num_pages, num_slots=num_slots)
                print(f"k31dsl: runner built in {time.perf_counter() - t:.1f} s")
            except Exception as e:  # noqa: BLE001 - the anchors still run
                print(f"k31dsl: could not build the runner: {type(e).__name__}: {e}")

    def for_section(self, num_slots: int, max_len: int) -> dict:
        import gc
        import torch
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        out = {}
        for impl in self.impls:
            if impl == "k31dsl":
                if self.k31 is not None:
                    out[impl] = self.k31
                continue
            try:
                from k31dsl.model.reference import ReferenceModel
                # compile=True: torch.compile(dynamic=True) of the tensor pieces between the
                # reference's Python loops (layers, chunks, query blocks, experts)
                out[impl] = ReferenceModel(self.cfg, self.weights, device=self.device, num_slots=num_slots,
                                           max_len=max_len, compile=(impl == "torch.compile"))
            except Exception as e:  # noqa: BLE001
                print(f"{impl}: could not build the runner: {type(e).__name__}: {e}")
        return out


# ---------------------------------------------------------------- timing

def _sync(device):
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def time_call_ms(fn, device: str, repeats: int = 3) -> tuple[float, str]:
    """(median ms, how): do_bench for calls under 50 ms on a GPU, else the wall-clock median of
    `repeats` calls after a first (warm-up, compile) call."""
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    first = (time.perf_counter() - t) * 1e3
    if device == "cuda" and first < 50:
        return harness.median_ms(fn, warmup=5, rep=100), "do_bench median"
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[len(ts) // 2], f"wall median of {repeats}"


def _prompt(n: int, seed: int, vocab: int = 256) -> list[int]:
    import numpy as np
    return [int(x) for x in np.random.default_rng(seed).integers(32, 127, n) % vocab]


def bench_prefill(runners, lengths, device, rows, results, repeats: int = 3):
    from k31dsl.model.step import Step
    out = {}
    for t in lengths:
        step = Step("prefill", [_prompt(t, 1)], [0], [0], [list(range(pages_for(t)))])
        logits = {}                      # each runner's output of its last timed call
        for name, r in runners.items():
            def fn(r=r, name=name):
                r.reset_slot(0)
                logits[name] = r.forward(step)
            try:
                ms, how = time_call_ms(fn, device, repeats)
            except Exception as e:  # noqa: BLE001 - e.g. the eager reference out of memory at 32K
                print(f"prefill T={t} {name}: {type(e).__name__}: {str(e)[:200]}")
                ms, how = float("nan"), f"failed: {type(e).__name__}"
            out.setdefault(t, {})[name] = ms
            rows.append({"case": f"prefill TTFT T={t}", "impl": name, "ms": ms, "tokens/s": t / (ms * 1e-3),
                         "timing": how})
            print(f"prefill T={t} {name}: {ms:.3f} ms ({how})")
        base = out[t].get("torch.compile")
        for row in rows[-len(runners):]:
            row["vs torch.compile"] = base / row["ms"] if base else float("nan")
        agreement = logits_agreement(logits)
        for row in rows[-len(runners):]:
            row.update(agreement.get(row["impl"], {}))
    results["prefill_ms"] = out


def logits_agreement(logits: dict) -> dict:
    """Each runner's prefill logits (runner name -> its last timed call's output; same weights,
    same prompt) against the eager reference's: the largest difference over the largest |logit|,
    and the share of positions whose argmax agrees. The GPU is where Triton's own compiler runs
    (CI's CPU tests use its interpreter), so this is the model's end-to-end check on it. {} when
    the eager runner has no output (e.g. out of memory at 32K)."""
    if "eager" not in logits:
        return {}
    out = {}
    for name, got in logits.items():
        err = logits_error(got, logits["eager"])
        rel, agree = err["max rel"], err["argmax agree"]
        out[name] = {"logits rel diff vs eager": rel, "argmax == eager": agree}
        print(f"  {name}: logits max diff / max |logit| {rel:.2e}, argmax agrees at {agree:.1%} of positions")
    return out


def logits_error(got, want) -> dict:
    """`got` against `want` (same positions): largest |difference| over the largest |want|, the
    relative RMS error ||got - want|| / ||want||, the share of positions whose argmax agrees, and
    the first position where it does not (-1: none)."""
    got, want = got.double(), want.double()
    diff = got - want
    agree = got.argmax(-1) == want.argmax(-1)
    first = int((~agree).nonzero()[0, 0]) if not bool(agree.all()) else -1
    return {"max rel": float(diff.abs().max() / want.abs().max()),
            "rms rel": float(diff.norm() / want.norm()),
            "argmax agree": float(agree.double().mean()), "first argmax miss": first}


def bench_accuracy(cfg, weights, impls, tokens: int, num_pages: int, device: str, results: dict) -> list[dict]:
    """Section 4 (module docstring): each runner's prefill logits against the fp32 truth."""
    import gc
    import torch
    from k31dsl.model.assembler import ModelRunner
    from k31dsl.model.reference import ReferenceModel
    from k31dsl.model.step import Step
    from k31dsl.model.weights import cast_weights
    cfg32, w32 = cfg.replace(dtype="float32"), cast_weights(weights, "float32")
    step = Step("prefill", [_prompt(tokens, 2)], [0], [0], [list(range(pages_for(tokens)))])
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def run(name, make):
        # TF32 off everywhere but in the row that measures it (restored after the section)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = "TF32 on" in name
        runner = make()
        runner.reset_slot(0)
        out = runner.forward(step).float()
        del runner
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        return out

    builders = {"truth (reference fp32, eager)": lambda: ReferenceModel(cfg32, w32, device=device, num_slots=1,
                                                                       max_len=tokens)}
    low = {"bfloat16": "bf16"}.get(cfg.dtype)           # None: the config is fp32 already
    if "k31dsl" in impls:
        builders["k31dsl fp32"] = lambda: ModelRunner(cfg32, w32, "triton", num_pages=num_pages, num_slots=1)
    if device == "cuda":
        # what tf32 products alone do to this model, for scale (the generated fp32 dots are ieee)
        builders["eager fp32, TF32 on"] = lambda: ReferenceModel(cfg32, w32, device=device, num_slots=1,
                                                                 max_len=tokens)
        if "torch.compile" in impls:
            # fp32 again but other fusions and reduction orders: the model's own fp32 noise floor
            builders["torch.compile fp32"] = lambda: ReferenceModel(cfg32, w32, device=device, num_slots=1,
                                                                    max_len=tokens, compile=True)
        if low:
            builders[f"k31dsl {low}"] = lambda: ModelRunner(cfg, weights, "triton", num_pages=num_pages,
                                                            num_slots=1)
    for impl in ("eager", "torch.compile") if low else ():
        if impl in impls:
            builders[f"{impl} {low}"] = lambda impl=impl: ReferenceModel(
                cfg, weights, device=device, num_slots=1, max_len=tokens, compile=impl == "torch.compile")
    rows, truth = [], None
    try:
        for name, make in builders.items():
            try:
                out = run(name, make)
            except Exception as e:  # noqa: BLE001 - the other runners still report
                print(f"accuracy {name}: {type(e).__name__}: {str(e)[:200]}")
                if truth is None:        # nothing to compare with: no rows rather than a wrong anchor
                    break
                continue
            if truth is None:
                truth = out
            err = logits_error(out, truth)
            rows.append({"case": f"accuracy T={tokens}", "impl": name, **err})
            print(f"accuracy T={tokens} {name}: max rel {err['max rel']:.2e}, rms rel {err['rms rel']:.2e}, "
                  f"argmax {err['argmax agree']:.1%} (first miss at {err['first argmax miss']})")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    for row in rows:                     # k31dsl's RMS error over the closest torch run of its dtype
        impl = row["impl"]
        if impl.startswith("k31dsl "):
            dt = impl.split()[1]
            anchors = [r["rms rel"] for r in rows if r["impl"] in (f"eager {dt}", f"torch.compile {dt}")]
            if anchors and min(anchors) > 0:
                row["rms / torch's"] = row["rms rel"] / min(anchors)
    results["accuracy"] = rows
    return rows


def bench_decode(runners, batches, context, steps, device, rows, results, warmup: int = 2):
    import torch
    from k31dsl.model.step import Step
    out = {}
    for b in batches:
        prompts = [_prompt(context, 100 + i) for i in range(b)]
        per = pages_for(context + steps + 3)
        tables = [list(range(i * per, (i + 1) * per)) for i in range(b)]
        for name, r in runners.items():
            try:
                for i in range(b):
                    r.reset_slot(i)
                logits = r.forward(Step("prefill", prompts, [0] * b, list(range(b)), tables))
                last = torch.as_tensor(logits).view(b, context, -1)[:, -1].argmax(-1).tolist()
                ctx = context

                def one():
                    nonlocal last, ctx
                    lg = r.forward(Step("decode", [[x] for x in last], [ctx] * b, list(range(b)), tables))
                    last = torch.as_tensor(lg).argmax(-1).tolist()
                    ctx += 1
                for _ in range(warmup):
                    one()
                _sync(device)
                t0 = time.perf_counter()
                tokens = []
                for _ in range(steps):
                    one()
                    tokens.append(last)
                _sync(device)
                s = time.perf_counter() - t0
                ms, tps = s * 1e3 / steps, b * steps / s
                digest = hashlib.sha1(repr(tokens).encode()).hexdigest()[:12]   # same tokens <=> same digest
            except Exception as e:  # noqa: BLE001
                print(f"decode B={b} {name}: {type(e).__name__}: {str(e)[:200]}")
                ms, tps, digest = float("nan"), float("nan"), ""
            out.setdefault(b, {})[name] = {"ms_per_step": ms, "tokens_per_s": tps, "tokens_sha1": digest}
            rows.append({"case": f"decode B={b} L={context}", "impl": name, "ms": ms, "tokens/s": tps,
                         "timing": f"wall, {steps} steps"})
            print(f"decode B={b} {name}: {ms:.3f} ms/step, {tps:,.0f} tokens/s")
        base = out[b].get("torch.compile", {}).get("tokens_per_s")
        for row in rows[-len(runners):]:
            row["vs torch.compile"] = row["tokens/s"] / base if base else float("nan")
    results["decode"] = out


def bench_spec(target_runner, drafts: dict, num_pages, num_slots, batch, prompt_len, new_tokens, gamma,
               rows, results) -> bool:
    """The engine with each draft (label -> runner) at gamma vs without one, same greedy requests."""
    from k31dsl.model.engine import Engine
    prompts = [_prompt(prompt_len, 200 + i) for i in range(batch)]

    def run(draft, g):
        def engine():
            return Engine(target_runner, num_pages=num_pages, num_slots=num_slots, max_batch=batch, draft=draft,
                          gamma=g)
        engine().generate(prompts, g + 2)        # warm-up: compiles (and captures) every step program
        eng = engine()
        res = eng.generate(prompts, new_tokens)
        return [r.tokens for r in res], eng.stats.as_dict()

    case = f"engine B={batch}, prompt {prompt_len}, {new_tokens} new"
    plain_tokens, plain = run(None, 0)
    rows.append({"case": case, "impl": "k31dsl plain decode", "tokens/s": plain["decode_tokens_per_s"],
                 "timing": "engine stats (decode_s)", "vs torch.compile": ""})
    out, all_same = {"gamma": gamma, "batch": batch, "plain": plain, "drafts": {}}, True
    for label, draft in drafts.items():
        tokens, st = run(draft, gamma)
        speedup = st["decode_tokens_per_s"] / plain["decode_tokens_per_s"] if plain["decode_tokens_per_s"] else float("nan")
        same = tokens == plain_tokens
        all_same &= same
        rows.append({"case": case, "impl": f"k31dsl spec gamma={gamma}, draft {label}", "tokens/s": st["decode_tokens_per_s"],
                     "timing": "engine stats (decode_s)", "acceptance": st["acceptance_rate"],
                     "vs torch.compile": "", "speedup vs plain": speedup, "tokens == plain": same})
        print(f"speculative gamma={gamma}, draft {label}: speedup {speedup:.2f}x, acceptance "
              f"{st['acceptance_rate']}, draft share of decode time {st['draft_s'] / max(st['decode_s'], 1e-12):.0%}, "
              f"tokens identical to plain greedy: {same}")
        out["drafts"][label] = {"speedup": speedup, "identical": same, "stats": st}
    results["spec"] = out
    return all_same


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    from k31dsl.model.config import K31Config
    from k31dsl.model.weights import cast_weights, init_weights

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny preset on the CPU (Triton interpreter)")
    ap.add_argument("--config", default="small")
    ap.add_argument("--prefill", default="4096,32768", help="prefill lengths")
    ap.add_argument("--batches", default="1,64", help="decode batch sizes")
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--spec-batch", type=int, default=1)
    ap.add_argument("--spec-tokens", type=int, default=64)
    ap.add_argument("--draft-layers", default="4,8", help="depths of the layer-skip drafts to try")
    ap.add_argument("--impls", default="k31dsl,eager,torch.compile")
    ap.add_argument("--accuracy-tokens", type=int, default=1024, help="prefill length of the accuracy section")
    ap.add_argument("--skip", default="", help="sections to skip: prefill,decode,spec,accuracy (comma- or plus-separated)")
    args = ap.parse_args(argv)
    if args.smoke:
        # The Triton interpreter runs a tiny prefill in about a minute and a decode step in ~10 s
        # (2 loaded cores): one of each shape, one timed call, gamma 1 (few shape classes).
        args.config, args.prefill, args.batches = "tiny", "12", "1,2"
        args.decode_context, args.decode_steps, args.spec_batch, args.spec_tokens, args.gamma = 8, 1, 1, 3, 1
        args.draft_layers, args.accuracy_tokens = "2", 12
        args.impls = ",".join(i for i in args.impls.split(",") if i != "torch.compile")
    device = "cpu" if args.smoke else "cuda"
    cfg = K31Config.load(args.config)
    f = floors(cfg, batch=max(int(b) for b in args.batches.split(",")), context=args.decode_context,
               prefill=max(int(t) for t in args.prefill.split(",")))
    print_floors(cfg, f)
    results = {"env": harness.environment(), "smoke": args.smoke, "config": cfg.to_dict(), "floors": f}
    if not args.smoke:
        results["ceiling_tbs"] = harness.copy_ceiling_tbs()
        print(f"copy ceiling {results['ceiling_tbs']:.3f} TB/s")
    weights = cast_weights(init_weights(cfg, 0), cfg.dtype)
    if device == "cuda":
        weights = {n: w.to(device) for n, w in weights.items()}
    lengths = [int(t) for t in args.prefill.split(",") if t]
    batches = [int(b) for b in args.batches.split(",") if b]
    num_slots = max(batches + [args.spec_batch])
    num_pages = max([pages_for(t) for t in lengths]
                    + [b * pages_for(args.decode_context + args.decode_steps + 3) for b in batches]
                    + [args.spec_batch * pages_for(args.decode_context + args.spec_tokens + args.gamma + 1)])
    runners = Runners(cfg, weights, args.impls.split(","), num_pages, num_slots, device)
    rows: list[dict] = []
    skip = set(args.skip.replace("+", ",").split(","))   # "+": gpu_run.sh turns commas into spaces
    cols = ["case", "impl", "ms", "tokens/s", "vs torch.compile", "timing", "acceptance", "speedup vs plain",
            "tokens == plain", "logits rel diff vs eager", "argmax == eager"]

    def save():
        results["rows"] = rows
        if not args.smoke:
            harness.write("model", results, cols, rows, notes=_notes(results))

    if "prefill" not in skip:
        bench_prefill(runners.for_section(1, max(lengths)), lengths, device, rows, results, 1 if args.smoke else 3)
        save()
    if "decode" not in skip:
        bench_decode(runners.for_section(max(batches), args.decode_context + args.decode_steps + 3),
                     batches, args.decode_context, args.decode_steps, device, rows, results, 1 if args.smoke else 2)
        save()
    ok = True
    if "spec" not in skip and runners.k31 is not None:
        from k31dsl.model.assembler import ModelRunner
        from k31dsl.run_cmd import layer_skip_draft
        drafts = {}
        for n in [int(x) for x in args.draft_layers.split(",") if x]:
            dcfg, dweights = layer_skip_draft(cfg, weights, n)
            drafts[f"{n} layers (layer-skip)"] = ModelRunner(dcfg, dweights, "triton", num_pages=num_pages,
                                                            num_slots=num_slots)
        ok = bench_spec(runners.k31, drafts, num_pages, num_slots, args.spec_batch, args.decode_context,
                        args.spec_tokens, args.gamma, rows, results)
        save()
    if "accuracy" not in skip:
        acc_cols = ["case", "impl", "max rel", "rms rel", "rms / torch's", "argmax agree", "first argmax miss"]
        acc = bench_accuracy(cfg, weights, args.impls.split(","), args.accuracy_tokens,
                             pages_for(args.accuracy_tokens), device, results)
        if not args.smoke:
            harness.write("model_accuracy", {"env": results["env"], "config": results["config"], "rows": acc},
                          acc_cols, acc, notes="Prefill logits against an fp32 truth: the reference model, eager, "
                          "TF32 off, on the bf16 weights upcast. See model.py's docstring, section 4.")
        harness.print_table(acc_cols, acc)
    harness.print_table(cols, rows)
    if args.smoke:
        print("smoke run: tiny preset in the Triton interpreter; nothing written")
    return 0 if ok else 1


def _notes(results) -> str:
    f = results["floors"]
    parts = [f"copy ceiling {results.get('ceiling_tbs', float('nan')):.3f} TB/s (this run)."]
    for b, d in f["decode"].items():
        parts.append(f"decode B={b} floor {d['floor_ms']:.3f} ms/step ({d['floor_tokens_per_s']:,.0f} tokens/s; "
                     f"{d['bytes'] / 1e9:.2f} GB, {d['flop'] / 1e9:.0f} GFLOP).")
    p = f["prefill"]
    parts.append(f"prefill T={p['tokens']} floor {p['floor_ms']:.1f} ms ({p['flop'] / 1e12:.1f} TFLOP).")
    parts.append("prefill: one forward of the whole prompt (do_bench median < 50 ms, else wall median of 3); "
                 "decode: wall clock over N steps, greedy token fed back through the host; spec: engine stats.")
    return " ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())

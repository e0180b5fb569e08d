"""Probe: sparse MLA attention at 16 heads per query (the model's small preset; 128 heads over
tensor-parallel 8) — the heads-major one-pass kernel (16-row MMAs: mma.sync on Hopper) against
the keys-major kernel of ops/dsa/sfa_keys_major.py (64/128-row wgmma), each config pinned.

Shapes: a causal prefill (T queries over their own past, top-k 2048: query t has min(t + 1, 2048)
valid slots, compacted) and a decode step (B queries over L-token contexts, split into segments
as sfa_split chooses, then the combine). Every output is compared with the one-pass output first.
CUDA-graph medians; writes results/sfa_heads16.json and .md.

    python benchmarks/probes/sfa_heads16.py [--prefill 4096] [--decode 64x32768]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SM_SCALE = 0.135234
HEADS = 16
TOPK = 2048
ONE_PASS = [{"BH": 16, "BK": 32, "num_warps": 8, "PREFETCH": True}, {"BH": 16, "BK": 32, "num_warps": 8}]


def fmt(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def make_cache(n_tokens: int, dev):
    import torch
    from k31dsl.ops.dsa import attention as A
    pages = -(-n_tokens // A.PAGE)
    cache = A.new_mla_cache(pages, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    kv = torch.randn(pages * A.PAGE, A.LATENT, device=dev, generator=g).bfloat16()
    kr = torch.randn(pages * A.PAGE, A.ROPE, device=dev, generator=g).bfloat16()
    A.mla_cache_write(cache, kv, kr, torch.arange(pages * A.PAGE, device=dev, dtype=torch.int32), target="triton")
    return cache


def causal_indices(t: int, dev):
    """[T, TOPK] slots: query i picks min(i + 1, TOPK) random positions of [0, i], compacted."""
    import torch
    r = torch.rand(t, t, device=dev)
    r = r.masked_fill(torch.ones(t, t, device=dev, dtype=torch.bool).triu(1), -1.0)
    v, i = r.topk(min(TOPK, t), dim=1)
    idx = torch.where(v >= 0, i, -1).int()
    return torch.sort(idx, dim=1, descending=True).values.contiguous()      # valid first, -1 after


def decode_indices(b: int, length: int, dev):
    import torch
    return torch.stack([torch.randperm(length, device=dev)[:TOPK] + s * length for s in range(b)]).int()


def main(argv=None) -> int:
    import torch

    import harness
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import sfa_keys_major as KM
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--decode", default="64x32768")
    ap.add_argument("--configs", default="", help="keys-major configs as BH/BK/warps+... (default: KEYS_CONFIGS)")
    args = ap.parse_args(argv)
    dev = "cuda"
    keys_cfgs = KM.KEYS_CONFIGS if not args.configs else [
        dict(zip(("BH", "BK", "num_warps"), map(int, c.split("/")))) for c in args.configs.split("+")]
    rows = []
    cases = []
    if args.prefill:
        cases.append(("prefill", args.prefill, make_cache(args.prefill, dev), causal_indices(args.prefill, dev)))
    for b, length in harness.shape_pairs(args.decode) if args.decode else []:
        cases.append((f"decode B={b} L={length}", b, make_cache(b * length, dev), decode_indices(b, length, dev)))
    for name, t, cache, idx in cases:
        q = torch.randn(t, HEADS, A.LATENT + A.ROPE, device=dev).bfloat16()
        views = A.cache_views(cache)
        split = A.sfa_split(t, HEADS, TOPK, 16)
        flops = 2 * HEADS * int((idx >= 0).sum()) * (A.LATENT + A.ROPE + A.LATENT)
        ref_o, ref_l = A.sparse_mla_attention(q, cache, idx, SM_SCALE, form="one_pass", split=split,
                                              target="triton", **ONE_PASS[0])
        scale = float(ref_o.float().abs().max())

        def record(form, cfg, fn, out):
            o, lse = out
            ms = harness.graph_median_ms(fn)
            rows.append({"case": name, "split": split, "form": form, "config": fmt(cfg), "ms": ms,
                         "TFLOP/s": flops / ms / 1e9,
                         "max |o - one pass| / max |o|": float((o.float() - ref_o.float()).abs().max()) / scale,
                         "max |lse diff|": float((lse - ref_l).abs().max())})
            print(rows[-1], flush=True)

        for cfg in ONE_PASS:
            call = (lambda cfg=cfg: A.sparse_mla_attention(q, cache, idx, SM_SCALE, form="one_pass", split=split,
                                                           target="triton", **cfg))
            record("heads-major one pass", cfg, call, call())
        for cfg in keys_cfgs:
            o = torch.empty(t, HEADS, A.LATENT, device=dev, dtype=torch.bfloat16)
            lse = torch.empty(t, HEADS, device=dev)
            if split == 1:
                def call(cfg=cfg, o=o, lse=lse):
                    KM.sfa_keys_major["triton"](q, *views, idx, o, lse, SM_SCALE, **cfg)
                    return o, lse
            else:
                po = torch.empty(split, t, HEADS, A.LATENT, device=dev)
                pl = torch.empty(split, t, HEADS, device=dev)

                def call(cfg=cfg, o=o, lse=lse, po=po, pl=pl):
                    KM.sfa_keys_major_split["triton"](q, *views, idx, po, pl, SM_SCALE, **cfg)
                    A.sparse_mla_attention_combine["triton"](po, pl, o, lse, BH=16, **A.combine_tiles(t, HEADS, 16))
                    return o, lse
            try:
                record("keys-major", cfg, call, call())
            except Exception as exc:          # a config that does not compile: record it and go on
                rows.append({"case": name, "split": split, "form": "keys-major", "config": fmt(cfg),
                             "ms": float("nan"), "TFLOP/s": float("nan"),
                             "max |o - one pass| / max |o|": f"{type(exc).__name__}: {str(exc)[:60]}",
                             "max |lse diff|": float("nan")})
                print(rows[-1], flush=True)
    harness.report("sfa_heads16", ["case", "split", "form", "config", "ms", "TFLOP/s", "max |o - one pass| / max |o|",
                                   "max |lse diff|"], rows,
                   notes=f"{HEADS} heads, top-k {TOPK}, bf16 q; FLOPs count valid (query, key) pairs only "
                         "(2 x heads x (576 + 512) per pair). CUDA-graph medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: what sparse MLA attention at the DSA decode step costs when the selected records are
first gathered into a contiguous buffer and the two products run as dense batched GEMMs (cuBLAS
through torch), part by part. It answers whether a "stage, then dense GEMMs" form could beat the
two-pass gather kernels (0.251 ms at B=64 L=32K): the dense parts are the best the tensor cores
give these shapes ([128, 576] x [576, 2048] and [128, 2048] x [2048, 512] per query) with no
gather in their loops. Times are CUDA-graph medians; writes results/sfa_dense_anchor.json and .md.

    python benchmarks/probes/sfa_dense_anchor.py [--shapes 64x32768,32x131072]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SM_SCALE = 0.135234


def dequant_records(rec):
    """[N, 656] uint8 records -> [N, 576] bf16 keys (latent codes x tile scale, then the rope)."""
    import torch
    codes = rec[:, :512].view(torch.float8_e4m3fn).float().view(-1, 4, 128)
    scales = rec[:, 512:528].contiguous().view(torch.float32).view(-1, 4, 1)
    rope = rec[:, 528:656].contiguous().view(torch.bfloat16)
    return torch.cat([(codes * scales).view(-1, 512).to(torch.bfloat16), rope], dim=1)


def main(argv=None) -> int:
    import torch

    import harness
    from dsa import step_attention_inputs
    from k31dsl.ops.dsa import attention as A
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x32768,32x131072")
    args = ap.parse_args(argv)
    rows = []
    for b, length in harness.shape_pairs(args.shapes):
        q, mcache, views, slots = step_attention_inputs(b, length)
        T, H, K = q.shape[0], q.shape[1], slots.shape[1]
        flat = mcache.view(-1, A.RECORD)
        idx = slots.reshape(-1).long()
        base = {"B": b, "L": length}

        def timed(name, fn, nbytes=None, flop=None):
            ms = harness.graph_median_ms(fn)
            row = {**base, "part": name, "ms": ms}
            if nbytes:
                row["TB/s"] = nbytes / ms / 1e9
            if flop:
                row["TFLOP/s"] = flop / ms / 1e9
            rows.append(row)
            print(row, flush=True)

        rec = flat[idx]
        timed("gather records (torch index)", lambda: flat[idx], nbytes=2 * rec.numel())
        stage = torch.compile(lambda f, i: dequant_records(f[i]).view(T, K, 576))
        kd = stage(flat, idx)
        timed("gather + dequantize to bf16 (torch.compile)", lambda: stage(flat, idx),
              nbytes=rec.numel() + kd.numel() * 2)
        ref_o, ref_l = A.sparse_mla_attention(q, mcache, slots, SM_SCALE, target="triton")
        timed("two-pass kernels (committed)", lambda: A.sparse_mla_attention(q, mcache, slots, SM_SCALE,
                                                                            target="triton"))
        kt = kd.transpose(1, 2)
        s = torch.bmm(q, kt)
        timed("scores bmm bf16 (cuBLAS)", lambda: torch.bmm(q, kt), flop=2 * T * H * K * 576,
              nbytes=kd.numel() * 2 + s.numel() * 2)
        p = torch.softmax(s.float() * SM_SCALE, dim=-1).to(torch.bfloat16)
        v = kd[..., :512]
        timed("softmax (torch eager, fp32)", lambda: torch.softmax(s.float() * SM_SCALE, dim=-1).to(torch.bfloat16))
        o = torch.bmm(p, v)
        timed("values bmm bf16 (cuBLAS)", lambda: torch.bmm(p, v), flop=2 * T * H * K * 512,
              nbytes=v.numel() * 2 + p.numel() * 2)

        def dense():
            sc = torch.bmm(q, kd.transpose(1, 2)).float() * SM_SCALE
            lse = torch.logsumexp(sc, -1)
            return torch.bmm(torch.exp(sc - lse[..., None]).to(torch.bfloat16), kd[..., :512]), lse
        dense_c = torch.compile(dense)
        do, dl = dense_c()
        timed("staged dense attention (torch.compile, from bf16 keys)", dense_c)
        rel = float((do.float() - ref_o.float()).abs().max() / ref_o.float().abs().max())
        rows.append({**base, "part": "check: staged dense o vs the op", "rel diff": rel,
                     "lse diff": float((dl - ref_l).abs().max()), "o diff plain bmm": float(
                         (o.float() - ref_o.float()).abs().max() / ref_o.float().abs().max())})
        print(rows[-1], flush=True)
        del mcache, flat, rec, kd, kt, s, p, v
        torch.cuda.empty_cache()
    harness.report("sfa_dense_anchor", ["B", "L", "part", "ms", "TB/s", "TFLOP/s", "rel diff", "lse diff",
                                        "o diff plain bmm"], rows,
                   notes="CUDA-graph medians; TB/s counts bytes read + written by the part alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())

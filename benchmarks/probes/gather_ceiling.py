"""Probe: how fast an H200 gathers 656-byte MLA cache records (the SFA passes' loads), by how
large the cache is and how the slots are spread (plain Triton, not the DSL).

One program per (query, block of BK slots) loads the block's records as int32 words (164 per
record, 16-byte vectors) and folds them into one word it stores, so every byte is read and
nothing but the reads costs. Each case gathers T x 2048 records (the DSA decode step's count at
T queries): their bytes over the CUDA-graph median are the gather rate. Cases:
  contiguous   the same bytes as one dense read (slots 0, 1, 2, ...): the copy-like ceiling
  random/S     uniform random slots over a cache of S records (S x 656 B)
  step         the DSA step's own slots (make_step's random block tables, its indexer's top-k)
If the rate falls with the cache size at random slots while the step's slots sit at the same
rate, the SFA passes' record reads are bound by where the records lie (TLB reach, DRAM pages),
not by the kernels' code.

    python benchmarks/probes/gather_ceiling.py          # writes results/gather_ceiling.{json,md}
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECORD_WORDS = 164          # 656 bytes


def main() -> int:
    import torch
    import triton
    import triton.language as tl

    import harness

    @triton.jit
    def gather(cache, slots, out, n_slots, K: tl.constexpr, BK: tl.constexpr, W: tl.constexpr):
        t = tl.program_id(0)
        jb = tl.program_id(1)
        idx = tl.load(slots + t * K + jb * BK + tl.arange(0, BK))
        ok = (idx >= 0) & (idx < n_slots)
        cols = tl.arange(0, W)
        ptr = cache + idx.to(tl.int64)[:, None] * 164 + cols[None, :]
        words = tl.load(ptr, mask=ok[:, None] & (cols[None, :] < 164), other=0)
        tl.store(out + t * (K // BK) + jb, tl.sum(tl.sum(words ^ (words >> 7), axis=1), axis=0))

    t_queries, k = 64, 2048
    bk = 32
    rows = []
    largest = 1 << 22                                   # 2.75 GB of records
    cache = torch.randint(-2 ** 31, 2 ** 31 - 1, (largest, RECORD_WORDS), dtype=torch.int32, device="cuda")
    out = torch.empty(t_queries * (k // bk), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = [("contiguous", torch.arange(t_queries * k, device="cuda", dtype=torch.int32).view(t_queries, k), largest)]
    for log2 in (15, 17, 19, 21, 22):
        s = 1 << log2
        cases.append((f"random/2^{log2} ({s * 656 / 2**20:.0f} MB)",
                      torch.randint(0, s, (t_queries, k), generator=gen, device="cuda", dtype=torch.int32), s))
    try:
        from dsa import step_attention_inputs
        _q, mcache, _views, slots = step_attention_inputs(t_queries, 32768)
        n = mcache.shape[0] * mcache.shape[1]
        cases.append((f"step slots (B=64 L=32K, {n * 656 / 2**20:.0f} MB cache)", slots.contiguous(), n))
        del mcache
    except Exception as e:  # noqa: BLE001 - the synthetic cases still tell the story
        print(f"step slots unavailable: {type(e).__name__}: {e}")
    for name, slots, n_slots in cases:
        grid = (t_queries, k // bk)

        def run(slots=slots, n_slots=n_slots):
            gather[grid](cache, slots, out, n_slots, K=k, BK=bk, W=256, num_warps=4)
        run()
        ms = harness.graph_median_ms(run)
        gb = t_queries * k * 656 / 1e9
        rows.append({"slots": name, "records": t_queries * k, "MB read": gb * 1e3, "ms": ms, "TB/s": gb / ms})
        print(rows[-1], flush=True)
    harness.report("gather_ceiling", ["slots", "records", "MB read", "ms", "TB/s"], rows,
                   notes="CUDA-graph medians; 656-byte records gathered as 16-byte int32 vectors, 32 per program, 4 warps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Registry entries of the DSA attention ops (MLA cache write, sparse MLA attention in both forms)
with their checks against the fp64 oracle tests/oracles/dsa_attention.py. Shapes stay small: every
check runs on the Triton interpreter and the AscendC emulator in CI."""
from __future__ import annotations

from k31dsl.ops.dsa import sfa_keys_major as _keys_major
from k31dsl.ops.dsa import sfa_two_pass as _two_pass
from k31dsl.ops.dsa.attention import (LATENT, PAGE, RECORD, ROPE, mla_cache_write, mla_cache_write_rows,
                                      new_mla_cache, random_latent, sfa_errors, sparse_mla_attention,
                                      sparse_mla_attention_combine, sparse_mla_attention_fwd,
                                      sparse_mla_attention_split)
from k31dsl.ops.registry import CaseResult, OpSpec, register


def _check_write(target: str, seed: int = 0) -> list[CaseResult]:
    import torch
    from k31dsl.ops.testing import device_for, load_oracle, mismatches, to_f64
    ref = load_oracle("dsa_attention")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, pages, dt, pow2 in ((70, 3, torch.bfloat16, False), (33, 2, torch.float32, True), (5, 1, torch.float16, False)):
        kv, kr = random_latent(n, g, dt), torch.randn(n, ROPE, generator=g).to(dt)
        slots = torch.randperm(pages * PAGE, generator=g)[:n].int()
        slots[n // 2] = -1                                        # padding token: skipped
        before = torch.randint(0, 256, (pages, PAGE, RECORD), generator=g, dtype=torch.uint8)
        cache = before.clone().to(dev)
        mla_cache_write(cache, kv.to(dev), kr.to(dev), slots.to(dev), pow2_scale=pow2, target=target)
        want = ref.mla_cache_write(before.numpy(), to_f64(kv), to_f64(kr), slots.numpy(), pow2)
        bad = mismatches(cache.cpu().numpy(), want)
        out.append(CaseResult(f"write {n} tokens {str(dt)[6:]} into {pages} pages, pow2_scale={pow2}", bad, 0,
                              bad == 0, "cache bytes differing from the oracle's records"))
    return out


def _check_sfa(target: str, seed: int = 0) -> list[CaseResult]:
    import torch
    from k31dsl.ops.testing import device_for, load_oracle, to_f64
    ref = load_oracle("dsa_attention")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for T, H, K, pages, qdt, scale, split, form in (
            (3, 5, 40, 3, torch.bfloat16, 0.135234, 1, "one_pass"),
            (2, 20, 70, 2, torch.float32, 0.05, 1, "one_pass"),
            (3, 5, 100, 2, torch.bfloat16, 0.135234, 3, "one_pass"),
            (2, 5, 200, 4, torch.bfloat16, 0.1, 6, "one_pass"),         # 6 segments: 2 combine loads
            (3, 20, 100, 2, torch.bfloat16, 0.1, 3, "two_pass"),
            (3, 5, 70, 2, torch.bfloat16, 0.1, 1, "keys_major"),
            (2, 9, 100, 2, torch.float32, 0.1, 3, "keys_major")):
        n = pages * PAGE
        cache = new_mla_cache(pages)
        mla_cache_write(cache, random_latent(n, g, torch.float32), torch.randn(n, ROPE, generator=g),
                        torch.arange(n, dtype=torch.int32), target="numpy")
        q = torch.randn(T, H, LATENT + ROPE, generator=g).to(qdt)
        idx = torch.randint(-3, n + 5, (T, K), generator=g, dtype=torch.int32)   # -1.. and past the end
        idx[1, K // 3:] = -1                          # a compacted top-k list: -1 padding at the end
        idx[-1] = -1                                                             # a lonely query
        if split > 1:
            idx[0, : K // 2] = -1                       # query 0: its first segments hold no valid index
        o, lse = sparse_mla_attention(q.to(dev), cache.to(dev), idx.to(dev), scale, split=split, form=form,
                                      target=target)
        lat, rope = ref.mla_cache_decode(cache.numpy())
        q_mma = ref.round_to(to_f64(q), ref.BF16)                  # the kernel's MMA operand
        want_o, want_l = ref.sparse_mla_attention(q_mma, lat, rope, idx.numpy(), scale)
        e_o, e_l = sfa_errors(o, lse, want_o, want_l)
        name = f"T={T} H={H} topk={K} {str(qdt)[6:]} q" + (f" split={split}" if split > 1 else "") + \
            {"one_pass": "", "two_pass": " two-pass", "keys_major": " keys-major"}[form]
        out.append(CaseResult(f"{name}: o", e_o, 2e-2, e_o <= 2e-2, "max abs err / max |o| (bf16 output)"))
        out.append(CaseResult(f"{name}: lse", e_l, 1e-3, e_l <= 1e-3, "max abs err (natural log)"))
    return out


register(OpSpec("mla_cache_write", "dsa", mla_cache_write, [mla_cache_write_rows],
                "paged MLA latent cache write: 656 B records (512 E4M3 in 128-tiles + 4 fp32 scales + 64 bf16 rope)",
                _check_write, exact=True, tags=["dsa", "fp8", "cache"]))
register(OpSpec("sparse_mla_attention", "dsa", sparse_mla_attention,
                [sparse_mla_attention_fwd, sparse_mla_attention_split, sparse_mla_attention_combine,
                 _two_pass.sfa_scores, _two_pass.sfa_values, _keys_major.sfa_keys_major,
                 _keys_major.sfa_keys_major_split],
                "sparse MLA attention over the paged FP8 latent cache (physical indices, -1 ignored, lse natural log)",
                _check_sfa, tags=["dsa", "attention"]))

"""Probe (diagnosis): each keys-major SFA config in its own process on a small causal case,
synchronised and compared with the one-pass kernel; `--one BH/BK/warps` runs a single config
(for compute-sanitizer)."""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def one(cfg_text: str, t: int = 96) -> None:
    import torch
    from sfa_heads16 import HEADS, SM_SCALE, causal_indices, make_cache
    from k31dsl.ops.dsa import attention as A
    from k31dsl.ops.dsa import sfa_keys_major as KM
    cfg = dict(zip(("BH", "BK", "num_warps"), map(int, cfg_text.split("/"))))
    cache, idx = make_cache(t, "cuda"), causal_indices(t, "cuda")
    q = torch.randn(t, HEADS, 576, device="cuda").bfloat16()
    ref_o, ref_l = A.sparse_mla_attention(q, cache, idx, SM_SCALE, form="one_pass", target="triton")
    o = torch.empty_like(ref_o)
    lse = torch.empty_like(ref_l)
    KM.sfa_keys_major["triton"](q, *A.cache_views(cache), idx, o, lse, SM_SCALE, **cfg)
    torch.cuda.synchronize()
    print(cfg_text, "o diff", float((o.float() - ref_o.float()).abs().max()), "lse diff",
          float((lse - ref_l).abs().max()), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        one(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 96)
    else:
        for c in sys.argv[1:]:
            r = subprocess.run([sys.executable, __file__, "--one", c], capture_output=True, text=True)
            print(c, "rc", r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:], flush=True)

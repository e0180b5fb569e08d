"""Why tl.max over axis 0 of (-u32).bitcast(i32) came out as a positive number on the H200
(tests/program_fuzz.py, seed 202878: the reference's -35 against 993). Each kernel reduces one
variant over axis 0 of a [32, 16] u32 tile; the host computes the same in numpy."""
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def k_neg_max(x, o, VARIANT: tl.constexpr):
    r = tl.arange(0, 32)[:, None] * 16 + tl.arange(0, 16)[None, :]
    v1 = tl.load(x + r)
    if VARIANT == 0:
        v = (-v1).to(tl.int32, bitcast=True)
    elif VARIANT == 1:
        v = (-tl.maximum(v1, v1)).to(tl.int32, bitcast=True)
    elif VARIANT == 2:
        v = (0 - tl.maximum(v1, v1)).to(tl.int32, bitcast=True)
    else:
        v = (-(v1.to(tl.int32, bitcast=True)))
    tl.store(o + tl.arange(0, 16), tl.max(v, 0))


def main():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 1000, (32, 16)).astype(np.uint32)
    x[3, 4], x[7, 1] = 0, 4294967295
    want = (-x.astype(np.int64)).astype(np.uint32).view(np.int32).max(0)
    print("want     ", want[:8].tolist())
    xt = torch.from_numpy(x.view(np.int32)).cuda().view(torch.uint32)
    for variant in range(4):
        o = torch.zeros(16, dtype=torch.int32, device="cuda")
        k_neg_max[(1,)](xt, o, VARIANT=variant)
        print(f"variant {variant}", o[:8].tolist())


if __name__ == "__main__":
    main()

"""Which reverse cumsums and sorts Triton 3.6 gets right on the H200 (fuzz seeds 300771: a reverse
cumsum along axis 1 of a [16, 64] f32 tile; 302679: k.topk over a [32, 64] tile, a tl.sort of
int64 keys, wrong even with distinct keys and right only at one row and four warps).

Every case runs a few forms on integer data (so every sum is exact) against numpy:
  scans: tl.cumsum(reverse=True), flip -> cumsum -> flip, tl.associative_scan(reverse=True)
  sorts: tl.sort of int64 / int32 keys, ascending and descending
over several tile shapes and warp counts. One line per case: the forms that agree, those that do not."""
import itertools

import numpy as np
import torch
import triton
import triton.language as tl

DEV = "cuda" if torch.cuda.is_available() else "cpu"     # cpu: the interpreter, to try the script


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def k_scan(x, o, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr, FORM: tl.constexpr):
    off = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    v = tl.load(x + off)
    if FORM == 0:
        s = tl.cumsum(v, AXIS, reverse=True)
    elif FORM == 1:
        s = tl.flip(tl.cumsum(tl.flip(v, AXIS), AXIS), AXIS)
    else:
        s = tl.associative_scan(v, AXIS, _add, reverse=True)
    tl.store(o + off, s)


@triton.jit
def k_sort(x, o, R: tl.constexpr, C: tl.constexpr, DESC: tl.constexpr):
    off = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(o + off, tl.sort(tl.load(x + off), descending=DESC))


def main():
    rng = np.random.default_rng(0)
    print("reverse cumsum (forms: tl.cumsum reverse, flip, associative_scan reverse)")
    for (r, c), axis, dt, warps in itertools.product([(16, 64), (32, 16), (1, 64), (64, 32), (8, 128)], (0, 1),
                                                     ("f32", "i32"), (1, 4, 8)):
        xn = rng.integers(-50, 50, (r, c)).astype(np.float32 if dt == "f32" else np.int32)
        want = np.flip(np.cumsum(np.flip(xn, axis), axis), axis)
        x = torch.from_numpy(xn).to(DEV)
        res = []
        for form in range(3):
            o = torch.zeros_like(x)
            k_scan[(1,)](x, o, R=r, C=c, AXIS=axis, FORM=form, num_warps=warps)
            res.append("ok" if np.array_equal(o.cpu().numpy(), want) else "BAD")
        print(f"  [{r:2d},{c:3d}] axis {axis} {dt} w{warps}: {' '.join(res)}")
    print("sort (forms: int64 asc, int64 desc, int32 asc, int32 desc)")
    for (r, c), warps in itertools.product([(1, 64), (8, 64), (32, 64), (4, 16), (16, 32), (2, 128)], (1, 4, 8)):
        res = []
        for dt, desc in (("i64", False), ("i64", True), ("i32", False), ("i32", True)):
            npdt = np.int64 if dt == "i64" else np.int32
            xn = rng.permutation(r * c).reshape(r, c).astype(npdt) * 7 - 100
            if dt == "i64":
                xn = (xn << 32) | rng.integers(0, 1 << 20, (r, c))
            want = np.sort(xn, 1)[:, ::-1] if desc else np.sort(xn, 1)
            x = torch.from_numpy(np.ascontiguousarray(xn)).to(DEV)
            o = torch.zeros_like(x)
            k_sort[(1,)](x, o, R=r, C=c, DESC=desc, num_warps=warps)
            res.append("ok" if np.array_equal(o.cpu().numpy(), want) else "BAD")
        print(f"  [{r:2d},{c:3d}] w{warps}: {' '.join(res)}")


if __name__ == "__main__":
    main()

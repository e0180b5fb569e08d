"""Which integer-abs forms keep abs(INT_MIN) = INT_MIN through Triton and ptxas on this GPU: each
kernel computes abs(x) % d for x = INT_MIN and a few others, d = -3 read from memory (C: -2).
Found by tests/program_fuzz.py (seed 101852): tl.abs(x) % d gave +2 on the H200."""
import torch
import triton
import triton.language as tl


@triton.jit
def k_tl_abs(x, d, o):
    v = tl.load(x + tl.arange(0, 8))
    tl.store(o + tl.arange(0, 8), tl.abs(v) % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_where(x, d, o):
    v = tl.load(x + tl.arange(0, 8))
    tl.store(o + tl.arange(0, 8), tl.where(v < 0, -v, v) % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_xor(x, d, o):
    v = tl.load(x + tl.arange(0, 8))
    s = v >> 31
    tl.store(o + tl.arange(0, 8), ((v ^ s) - s) % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_mul(x, d, o):
    v = tl.load(x + tl.arange(0, 8))
    sign = tl.where(v < 0, -1, 1)
    tl.store(o + tl.arange(0, 8), (v * sign) % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_plain(x, d, o):                      # no abs: INT_MIN % -3 itself
    v = tl.load(x + tl.arange(0, 8))
    tl.store(o + tl.arange(0, 8), v % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_guard(x, d, o):                      # INT_MIN picked explicitly
    v = tl.load(x + tl.arange(0, 8))
    a = tl.where(v == -2147483648, v, tl.abs(v))
    tl.store(o + tl.arange(0, 8), a % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_wide(x, d, o):                       # abs in 64 bits, wrapped back
    v = tl.load(x + tl.arange(0, 8))
    a = tl.abs(v.to(tl.int64)).to(tl.int32)
    tl.store(o + tl.arange(0, 8), a % tl.load(d + tl.arange(0, 8)))


@triton.jit
def k_abs_only(x, d, o):
    v = tl.load(x + tl.arange(0, 8))
    tl.store(o + tl.arange(0, 8), tl.abs(v))


def main():
    x = torch.tensor([-2 ** 31, -7, -1, 0, 5, 2 ** 31 - 1, -2 ** 31 + 1, 12], dtype=torch.int32, device="cuda")
    d = torch.full((8,), -3, dtype=torch.int32, device="cuda")
    want = [int(abs(v)) if v != -2 ** 31 else v for v in x.tolist()]
    want = [a - int(a / -3) * -3 for a in want]                  # C remainder of abs(x) by -3
    print("want      ", want, "(k_plain: the same but -1 for x = -7, -1, ...)")
    for kern in (k_tl_abs, k_where, k_xor, k_mul, k_plain, k_guard, k_wide, k_abs_only):
        o = torch.zeros(8, dtype=torch.int32, device="cuda")
        kern[(1,)](x, d, o)
        print(f"{kern.__name__:10s}", o.tolist())


if __name__ == "__main__":
    main()

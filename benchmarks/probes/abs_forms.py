"""Which PTX form of integer abs keeps abs(INT_MIN) = INT_MIN through ptxas on the H200.

The 3 Dec run showed PTX's own `abs.s32` (emitted by inline asm so that LLVM cannot see it) still
gives abs(INT_MIN) % -3 = +2: ptxas, too, takes abs for non-negative. Each form below computes abs
in inline asm, then the uses the fuzzer found sensitive (signed %, //, the sign bit, a compare);
the host computes the same with wrapping numpy arithmetic."""
import numpy as np
import torch
import triton
import triton.language as tl

FORMS32 = {
    "abs": "abs.s32 $0, $1;",
    "xor_sub": "{ .reg .s32 t; shr.s32 t, $1, 31; xor.b32 $0, $1, t; sub.s32 $0, $0, t; }",
    "mul_sign": "{ .reg .s32 t; shr.s32 t, $1, 31; or.b32 t, t, 1; mul.lo.s32 $0, $1, t; }",
    "selp": "{ .reg .pred p; .reg .s32 t; setp.lt.s32 p, $1, 0; neg.s32 t, $1; selp.b32 $0, t, $1, p; }",
}
FORMS64 = {
    "abs": "abs.s64 $0, $1;",
    "xor_sub": "{ .reg .s64 t; shr.s64 t, $1, 63; xor.b64 $0, $1, t; sub.s64 $0, $0, t; }",
    "mul_sign": "{ .reg .s64 t; shr.s64 t, $1, 63; or.b64 t, t, 1; mul.lo.s64 $0, $1, t; }",
    "selp": "{ .reg .pred p; .reg .s64 t; setp.lt.s64 p, $1, 0; neg.s64 t, $1; selp.b64 $0, t, $1, p; }",
}


@triton.jit
def k_abs(x, o, ASM: tl.constexpr, WIDE: tl.constexpr):
    i = tl.arange(0, 8)
    a = tl.load(x + i)
    if WIDE:
        m = tl.inline_asm_elementwise(ASM, "=l,l", [a], dtype=tl.int64, is_pure=True, pack=1)
        tl.store(o + 4 * 8 + i, (m >> 63).to(tl.int64))
    else:
        m = tl.inline_asm_elementwise(ASM, "=r,r", [a], dtype=tl.int32, is_pure=True, pack=1)
        tl.store(o + 4 * 8 + i, (m >> 31).to(tl.int64))
    tl.store(o + i, (m % -((a & 4) | 3)).to(tl.int64))
    tl.store(o + 8 + i, (m // 3).to(tl.int64))
    tl.store(o + 2 * 8 + i, (m % 3).to(tl.int64))
    tl.store(o + 3 * 8 + i, tl.where(m < 0, 1, 0).to(tl.int64))


def expect(x: np.ndarray, bits: int) -> np.ndarray:
    m = np.where(x < 0, -x, x)              # wraps: -INT_MIN is INT_MIN
    py = [int(v) for v in m]
    d = [-((int(v) & 4) | 3) for v in x]
    rem = [a - (abs(a) // abs(b)) * abs(b) * (1 if a >= 0 else -1) for a, b in zip(py, d)]
    div3 = [(abs(a) // 3) * (1 if a >= 0 else -1) for a in py]
    mod3 = [a - (abs(a) // 3) * 3 * (1 if a >= 0 else -1) for a in py]
    return np.array([rem, div3, mod3, [int(a < 0) for a in py], [-1 if a < 0 else 0 for a in py]], np.int64)


def main():
    for bits, forms, dt in ((32, FORMS32, np.int32), (64, FORMS64, np.int64)):
        lo, hi = -2 ** (bits - 1), 2 ** (bits - 1) - 1
        x = np.array([lo, -7, -1, 0, 5, hi, lo + 1, 12], dt)
        want = expect(x, bits)
        xt = torch.from_numpy(x).cuda()
        for name, asm in forms.items():
            o = torch.zeros(5 * 8, dtype=torch.int64, device="cuda")
            k_abs[(1,)](xt, o, ASM=asm, WIDE=bits == 64)
            got = o.cpu().numpy().reshape(5, 8)
            ok = np.array_equal(got, want)
            print(f"i{bits} {name:9s} {'OK ' if ok else 'BAD'} rem {got[0].tolist()} //3 {got[1].tolist()} "
                  f"%3 {got[2].tolist()} <0 {got[3].tolist()}")
        print(f"i{bits} want      rem {want[0].tolist()} //3 {want[1].tolist()} %3 {want[2].tolist()} <0 {want[3].tolist()}")


if __name__ == "__main__":
    main()

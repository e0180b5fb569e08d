# k31dsl random program, seed 301331 (tests/program_fuzz.py)
import k31dsl as k


@k.func
def fuzz_helper(a, c):
    return k.maximum(a * c, a - c) + 0.5


@k.kernel
def fuzz_kernel(x0: k.Tensor[k.i64, "R", "C"], x1: k.Tensor[k.e8m0, "R", "C"], o0: k.Tensor[k.bf16, "R", "C"], o1: k.Tensor[k.bf16, "R", "C"], o2: k.Tensor[k.i64, "R", "C"], o3: k.Tensor[k.f32, "R", "C"], o4: k.Tensor[k.f8e4m3, "R", "C"], o5: k.Tensor[k.f8e5m2, "R", "C"], o6: k.Tensor[k.bf16, "R", "C"], s_f: k.f32, s_i: k.i32, n_iter: k.i32, BR: k.constexpr = 16, BC: k.constexpr = 32):
    for i, j in k.grid(k.cdiv(x0.shape[0], BR), k.cdiv(x0.shape[1], BC)):
        v0 = x0[k.span(i * BR, BR, other=2), k.span(j * BC, BC, other=2)]
        v2 = k.zeros((BR, BC), k.i64)
        for it in range(n_iter):
            v2 = k.maximum(v2, v0 - 1) + 6
        v3 = v0.to(k.bf16)
        v4 = v3 * v2.to(k.bf16)
        v5 = k.cumsum(v4, axis=1)
        v8 = v5 * s_i
        o0[k.span(i * BR, BR), k.span(j * BC, BC)] = v8


# k31dsl random program, seed 300771 (tests/program_fuzz.py)
import k31dsl as k


@k.kernel
def fuzz_kernel(x0: k.Tensor[k.i8, "R", "C"], x1: k.Tensor[k.i8, "R", "C"], x2: k.Tensor[k.bf16, "R", "C"], o0: k.Tensor[k.bf16, "R", "C"], o1: k.Tensor[k.bf16, "R", "C"], o2: k.Tensor[k.bf16, "R", "C"], o3: k.Tensor[k.f8e4m3, "R", "C"], o4: k.Tensor[k.f8e5m2, "R", "C"], s_f: k.f32, s_i: k.i32, n_iter: k.i32, BR: k.constexpr = 16, BC: k.constexpr = 64):
    for i, j in k.grid(k.cdiv(x0.shape[0], BR), k.cdiv(x0.shape[1], BC)):
        v1 = x1[k.span(i * BR, BR, other=-6), k.span(j * BC, BC, other=-6)]
        v2 = x2[k.span(i * BR, BR, other=-2.0), k.span(j * BC, BC, other=-2.0)]
        v4 = v2 % (k.abs(v1.to(k.bf16)) + 1.0)
        v8 = k.cumsum(v4, axis=1, reverse=True)
        o2[k.span(i * BR, BR), k.span(j * BC, BC)] = v8


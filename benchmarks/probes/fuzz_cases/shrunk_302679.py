# k31dsl random program, seed 302679 (tests/program_fuzz.py)
import k31dsl as k


@k.kernel
def fuzz_kernel(x0: k.Tensor[k.i8, "R", "C"], x1: k.Tensor[k.u32, "R", "C"], o0: k.Tensor[k.i32, "R", "C"], o1: k.Tensor[k.u32, "R", "C"], o2: k.Tensor[k.f32, "R", "C"], o3: k.Tensor[k.f8e5m2, "R", "C"], s_f: k.f32, s_i: k.i32, n_iter: k.i32, BR: k.constexpr = 32, BC: k.constexpr = 64):
    for i, j in k.grid(k.cdiv(x0.shape[0], BR), k.cdiv(x0.shape[1], BC)):
        v0 = x0[k.span(i * BR, BR, other=-8), k.span(j * BC, BC, other=-8)]
        v2 = v0.to(k.f32)
        v7, v8 = k.topk(v2, BC)
        o0[k.span(i * BR, BR), k.span(j * BC, BC)] = v8


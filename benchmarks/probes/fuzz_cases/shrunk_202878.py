# k31dsl random program, seed 202878 (tests/program_fuzz.py)
import k31dsl as k


@k.func
def fuzz_helper(a, c):
    return k.maximum(a * c, a - c) + 2


@k.kernel
def fuzz_kernel(x0: k.Tensor[k.f32, "R", "C"], x1: k.Tensor[k.u32, "R", "C"], x2: k.Tensor[k.f8e5m2, "R", "C"], o0: k.Tensor[k.i32, "R", "C"], o1: k.Tensor[k.u32, "R", "C"], o2: k.Tensor[k.f32, "R", "C"], o3: k.Tensor[k.e8m0, "R", "C"], o4: k.Tensor[k.f8e4m3, "R", "C"], o5: k.Tensor[k.i32, "R", "C"], s_f: k.f32, s_i: k.i32, n_iter: k.i32, BR: k.constexpr = 32, BC: k.constexpr = 16):
    for i, j in k.grid(k.cdiv(x0.shape[0], BR), k.cdiv(x0.shape[1], BC)):
        v1 = x1[k.span(i * BR, BR, other=3), k.span(j * BC, BC, other=3)]
        v2 = k.maximum(v1, v1)
        v4 = -v2
        v6 = v4.bitcast(k.i32)
        v9 = k.max(v6, axis=0)[None, :]
        o0[k.span(i * BR, BR), k.span(j * BC, BC)] = k.broadcast_to(v9, (BR, BC))


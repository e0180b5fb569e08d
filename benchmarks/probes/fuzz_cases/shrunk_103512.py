# k31dsl random program, seed 103512 (tests/program_fuzz.py)
import k31dsl as k


@k.func
def fuzz_helper(a, c):
    return k.maximum(a * c, a - c) + 2


@k.kernel
def fuzz_kernel(x0: k.Tensor[k.i64, "R", "C"], x1: k.Tensor[k.i32, "R", "C"], o0: k.Tensor[k.f32, "R", "C"], o1: k.Tensor[k.i32, "R", "C"], o2: k.Tensor[k.i32, "R", "C"], o3: k.Tensor[k.f8e4m3, "R", "C"], o4: k.Tensor[k.i32, "R", "C"], s_f: k.f32, s_i: k.i32, n_iter: k.i32, BR: k.constexpr = 32, BC: k.constexpr = 64):
    for i, j in k.grid(k.cdiv(x0.shape[0], BR), k.cdiv(x0.shape[1], BC)):
        v1 = x1[k.span(i * BR, BR, other=-2), k.span(j * BC, BC, other=-2)]
        v3 = v1 + s_i
        v7 = -v3
        v8 = k.min(v7, axis=0)[None, :]
        v11 = v8.bitcast(k.f32)
        o0[k.span(i * BR, BR), k.span(j * BC, BC)] = k.broadcast_to(v11, (BR, BC))


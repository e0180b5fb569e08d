"""k31dsl: an operator-generating DSL compiler for hybrid long-context LLMs.

    import k31dsl as k

    @k.kernel
    def scale(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], a: k.f32, BLOCK: k.constexpr = 128):
        for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
            y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)] * a

    scale["numpy"](x, y, 2.0)
"""
from k31dsl.dsl.dtypes import (bf16, bool_, e8m0, f8e4m3, f8e5m2, f16, f32, f64, i8, i32, i64,  # noqa: F401
                               u8, u32, DType)
from k31dsl.dsl.errors import CapacityError, K31Error, Loc  # noqa: F401
from k31dsl.dsl.lang import (Tensor, aligned, constexpr, func, kernel, KernelDef, FuncDef,  # noqa: F401
                             grid, span, arange, zeros, full, exp, exp2, log, log2, sqrt, rsqrt, abs,
                             sigmoid, softplus, relu, floor, ceil, maximum, minimum, where, sum, max,
                             min, cumsum, histogram, dot, topk, take, cat, reshape, broadcast_to, cdiv, load,
                             store, static_range, range, cast, bitcast)
from k31dsl.version import __version__  # noqa: F401

bool = bool_  # noqa: A001 - k.bool reads naturally in annotations


def compile(kdef, target: str = "numpy", **options):  # noqa: A001 - the DSL's verb
    """`k.compile(kernel, target="numpy"|"triton"|"ascendc")` -> a callable over torch tensors."""
    return kdef.compile(target, **options)


def _install():
    from k31dsl.dsl import lang
    from k31dsl.targets import compile_kernel
    lang.set_compiler(compile_kernel)


_install()

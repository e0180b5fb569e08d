"""The bad kernels of tests/test_errors.py: name -> (module source, key phrase of the error).
The line the error must name ends with `# <-`; each source is written to its own file."""

CASES = {
    "while-endless": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                while i < 3:  # <-
                    x[i] = 1.0
        """, "assigns none of the names this `while` condition reads"),
    "while-constant": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                n = 0
                while n < 3:  # <-
                    n = 1
        """, "still true at compile time"),
    "while-tile": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                v = x[k.span(0, 16)]
                while v > 0.0:  # <-
                    v = v - 1.0
        """, "a `while` condition must be a scalar"),
    "while-else": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                n = 0
                while n < 3:  # <-
                    n += 1
                else:
                    x[i] = 1.0
        """, "`while ... else`"),
    "try": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                try:  # <-
                    x[i] = 1.0
                except Exception:
                    pass
        """, "`try` blocks"),
    "lambda": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                f = lambda a: a + 1.0  # <-
        """, "lambdas"),
    "with": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                with open("f"):  # <-
                    pass
        """, "`with` blocks"),
    "histogram_of_floats": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], h: k.Tensor[k.i32, "B"]):
            for i in k.grid(1):
                h[k.span(0, 8)] = k.histogram(x[k.span(0, 16)], 8)  # <-
        """, "k.histogram needs a 1-D integer tile"),
    "histogram_runtime_bins": ("""
        @k.kernel
        def kern(x: k.Tensor[k.i32, "N"], h: k.Tensor[k.i32, "B"], n: k.i32):
            for i in k.grid(1):
                h[k.span(0, 8)] = k.histogram(x[k.span(0, 16)], n)  # <-
        """, "k.histogram bins must be a compile-time integer"),
    "unknown_name": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                x[i] = undefined_thing * 2.0  # <-
        """, "unknown name `undefined_thing`"),
    "runtime_span_size": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, x.shape[0])]  # <-
        """, "k.span size must be a compile-time integer"),
    "dtype_mismatch": ("""
        @k.kernel
        def kern(x: k.Tensor[k.bf16, "N"], y: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                a = x[k.span(0, 16)]
                b = y[k.span(0, 16)]
                y[k.span(0, 16)] = a + b  # <-
        """, "dtype mismatch in `add`: bf16 and f32"),
    "shape_mismatch": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                a = x[k.span(0, 16)]
                b = x[k.span(0, 32)]
                c = a * b  # <-
        """, "shape mismatch"),
    "dot_inner_dim": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N", "M"]):
            for i in k.grid(1):
                a = x[k.span(0, 16), k.span(0, 32)]
                c = k.dot(a, a)  # <-
        """, "inner dimensions differ"),
    "dot_dtype": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N", "M"], y: k.Tensor[k.bf16, "N", "M"]):
            for i in k.grid(1):
                a = x[k.span(0, 16), k.span(0, 16)]
                b = y[k.span(0, 16), k.span(0, 16)]
                c = k.dot(a, b)  # <-
        """, "k.dot operand dtypes differ"),
    "index_count": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N", "M"]):
            for i in k.grid(x.shape[0]):
                t = x[i]  # <-
        """, "has rank 2 but is indexed with 1"),
    "store_into_tile": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                t[0] = 1.0  # <-
        """, "only tensor parameters can be stored to"),
    "store_into_scalar_param": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], a: k.f32):
            for i in k.grid(1):
                a[0] = 1.0  # <-
        """, "only tensor parameters can be stored to"),
    "grid_not_outermost": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for j in range(4):
                for i in k.grid(x.shape[0]):  # <-
                    x[i] = 1.0
        """, "outermost"),
    "grid_nested": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                for j in k.grid(4):  # <-
                    x[i] = 1.0
        """, "outermost"),
    "grid_then_statement": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                x[i] = 1.0
            n = 3  # <-
        """, "last statement"),
    "grid_four_dims": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for a, b, c, d in k.grid(1, 2, 3, 4):  # <-
                x[a] = 1.0
        """, "k.grid takes 1 to 3 extents"),
    "grid_missing": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):  # <-
            x[0] = 1.0
        """, "has no `for ... in k.grid"),
    "recursion_direct": ("""
        @k.func
        def f(a):
            return f(a)  # <-

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                x[i] = f(1.0)
        """, "recursive @k.func call: f -> f"),
    "recursion_mutual": ("""
        @k.func
        def f(a):
            return g(a)

        @k.func
        def g(a):
            return f(a)  # <-

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                x[i] = f(1.0)
        """, "recursive @k.func call: f -> g -> f"),
    "if_on_runtime_value": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                if i < 3:  # <-
                    x[i] = 1.0
        """, "compile time"),
    "loop_carried_type_change": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                acc = k.zeros((16,), k.f32)
                for j in range(4):  # <-
                    acc = acc.to(k.bf16)
        """, "changes type from f32[16] to bf16[16]"),
    "loop_local_after_loop": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in range(4):
                    t = x[k.span(j * 16, 16)]
                x[k.span(0, 16)] = t  # <-
        """, "assigned only inside the loop"),
    "float_literal_int_tile": ("""
        @k.kernel
        def kern(x: k.Tensor[k.i32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)] * 0.5  # <-
        """, "float literal 0.5"),
    "true_div_on_ints": ("""
        @k.kernel
        def kern(x: k.Tensor[k.i32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)] / 2  # <-
        """, "`/` on integers"),
    "break": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in range(4):
                    break  # <-
        """, "`break`"),
    "continue": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in range(4):
                    continue  # <-
        """, "`continue`"),
    "return_in_kernel": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                return x  # <-
        """, "kernels do not return values"),
    "missing_attribute": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)].size  # <-
        """, "tiles have no attribute `size`"),
    "missing_module_attribute": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = k.tanh(x[k.span(0, 16)])  # <-
        """, "has no `tanh`"),
    "tensor_missing_attribute": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.numel):  # <-
                pass
        """, "has no attribute `numel`"),
    "constexpr_without_value": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], BLOCK: k.constexpr):  # <-
            for i in k.grid(1):
                pass
        """, "constexpr `BLOCK` has no value"),
    "runtime_power": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], p: k.f32):
            for i in k.grid(1):
                t = x[k.span(0, 16)] ** p  # <-
        """, "compile-time exponent"),
    "store_dtype": ("""
        @k.kernel
        def kern(x: k.Tensor[k.bf16, "N"]):
            for i in k.grid(1):
                x[k.span(0, 16)] = k.zeros((16,), k.f32)  # <-
        """, "storing a f32 value into a bf16 tensor"),
    "kernel_calls_kernel": ("""
        @k.kernel
        def other(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                pass

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                other(x)  # <-
        """, "cannot be called from another kernel"),
    "fp8_math": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f8e4m3, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)] * x[k.span(0, 16)]  # <-
        """, "storage formats"),
    "bad_annotation": ("""
        @k.kernel
        def kern(x: int):  # <-
            for i in k.grid(1):
                pass
        """, "unsupported annotation"),
    "func_bad_call": ("""
        @k.func
        def f(a, b):
            return a + b

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                x[i] = f(1.0)  # <-
        """, "bad call of @k.func `f`"),
    "return_in_func_loop": ("""
        @k.func
        def f(a):
            for j in range(3):
                return a  # <-

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                x[i] = f(1.0)
        """, "`return` inside a loop"),
    "compile_time_assert": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 48):
            assert BLOCK % 32 == 0, "BLOCK must be a multiple of 32"  # <-
            for i in k.grid(1):
                pass
        """, "BLOCK must be a multiple of 32"),
    "where_condition_not_bool": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                u = k.where(t, t, 0.0)  # <-
        """, "condition must be bool"),
    "span_outside_index": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                s = k.span(0, 16)  # <-
        """, "k.span"),
    "reduce_axis_out_of_range": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                s = k.sum(x[k.span(0, 16)], axis=1)  # <-
        """, "axis 1 out of range"),
    "grid_on_float": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], a: k.f32):
            for i in k.grid(a):  # <-
                pass
        """, "k.grid extents must be integer"),
    "tile_used_as_index_float": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                u = x[t]  # <-
        """, "indices must be integers"),
    "bool_and_on_tiles": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                m = (t > 0.0) and (t < 1.0)  # <-
        """, "`and`/`or` need compile-time operands"),
    "aug_assign_into_tile": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                t[0] += 1.0  # <-
        """, "only tensor parameters can be stored to"),
    "tensor_in_arithmetic": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                y[k.span(0, 16)] = x * 2.0  # <-
        """, "on the tensor parameter `x`"),
    "huge_static_range": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in k.static_range(10 ** 9):  # <-
                    pass
        """, "too many"),
    "runtime_range_step": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], s: k.i32):
            for i in k.grid(1):
                for j in range(0, 64, s):  # <-
                    x[j] = 0.0
        """, "step must be a positive compile-time integer"),
    "range_stages_zero": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in k.range(4, stages=0):  # <-
                    x[j] = 0.0
        """, "stages must be a compile-time int >= 1"),
    "range_unknown_hint": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in k.range(4, unroll=2):  # <-
                    x[j] = 0.0
        """, "takes no keyword `unroll`"),
    "plain_range_keyword": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                for j in range(4, stages=2):  # <-
                    x[j] = 0.0
        """, "range() takes no keyword arguments"),
    "dot_unknown_precision": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N", "N"]):
            for i in k.grid(1):
                a = x[k.span(0, 16), k.span(0, 16)]
                x[k.span(0, 16), k.span(0, 16)] = k.dot(a, a, precision="bf16x3")  # <-
        """, "k.dot precision must be 'ieee', 'tf32' or 'tf32x3'"),
    "int_literal_out_of_range": ("""
        @k.kernel
        def kern(x: k.Tensor[k.i32, "N"]):
            for i in k.grid(1):
                x[k.span(0, 16)] = x[k.span(0, 16)] & 0xFFFFFFFF  # <-
        """, "does not fit i32"),
    "float_fill_for_int_tensor": ("""
        @k.kernel
        def kern(x: k.Tensor[k.i32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16, other=0.5)]  # <-
        """, "`other=0.5` cannot fill the i32 tensor"),
    "unpack_mismatch": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N", "M"]):
            for i in k.grid(1):
                a, b, c = x.shape  # <-
        """, "cannot unpack"),
    "compile_time_value_changed_in_loop": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                shape = (16,)
                for j in range(4):  # <-
                    shape = (32,)
        """, "reassigned inside a runtime loop"),
    "runtime_if_expression": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                u = t if i > 0 else -t  # <-
        """, "`a if c else b` needs a condition known at compile time"),
    "slice_on_tensor": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[0:16]  # <-
        """, "not slices"),
    "plain_python_function": ("""
        def helper(t):
            return t * 2.0

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = helper(x[k.span(0, 16)])  # <-
        """, "plain Python function"),
    "chained_comparison": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                t = x[k.span(0, 16)]
                m = 0.0 < t < 1.0  # <-
        """, "chained comparisons"),
    "bad_dim_annotation": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N / 2"]):  # <-
            for i in k.grid(1):
                pass
        """, "is not a dim expression"),
    "config_with_unknown_key": ("""
        @k.kernel(configs=[{"BLOCK": 32}])
        def kern(x: k.Tensor[k.f32, "N"], BD: k.constexpr = 16):  # <-
            for i in k.grid(1):
                pass
        """, "sets BLOCK, which is not a constexpr"),
    "numpy_array_global": ("""
        import numpy as np
        TABLE = np.arange(4)

        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                x[0] = TABLE  # <-
        """, "`TABLE` is a ndarray"),
}

"""C++ spellings for the AscendC emitter: element types, literals, and the per-element semantics of
every IR arithmetic op as a C++ expression over the scalar unit's computing types (the same text
serves scalar values and the lambdas of the scalar-unit tile helpers in k31_helpers.h).

Computing types: f32/bf16/f16 compute in `float` (16-bit results are rounded back after every
op, as targets/numpy/rt.py does), f64 in `double`, integers in their own width (wrapping through
k31::wrap_*), bool in `bool`, fp8/e8m0 as their code byte."""
from __future__ import annotations

import math

import numpy as np

from k31dsl.dsl import dtypes as D

STORAGE = {"f32": "float", "f64": "double", "bf16": "bfloat16_t", "f16": "half", "i8": "int8_t",
           "i32": "int32_t", "i64": "int64_t", "u8": "uint8_t", "u32": "uint32_t", "bool": "uint8_t",
           "f8e4m3": "uint8_t", "f8e5m2": "uint8_t", "e8m0": "uint8_t"}
COMPUTE = {"f32": "float", "f64": "double", "bf16": "float", "f16": "float", "i8": "int8_t",
           "i32": "int32_t", "i64": "int64_t", "u8": "uint8_t", "u32": "uint32_t", "bool": "bool",
           "f8e4m3": "uint8_t", "f8e5m2": "uint8_t", "e8m0": "uint8_t"}
LOW = ("bf16", "f16")


def storage(dt: D.DType) -> str:
    return STORAGE[dt.name]


def compute(dt: D.DType) -> str:
    return COMPUTE[dt.name]


def tag(dt: D.DType) -> str:
    return "k31::boolean" if dt is D.bool_ else f"k31::{dt.name}"


def itemsize(dt: D.DType) -> int:
    return 1 if dt is D.bool_ else dt.itemsize


def float_lit(x: float, ctype: str = "float") -> str:
    """An exact C++ literal of a float/double value."""
    if math.isnan(x):
        return f"std::numeric_limits<{ctype}>::quiet_NaN()"
    if math.isinf(x):
        return ("" if x > 0 else "-") + f"std::numeric_limits<{ctype}>::infinity()"
    text = float.hex(float(x))
    return text + ("f" if ctype == "float" else "")


def int_lit(v: int, ctype: str) -> str:
    v = int(v)
    if ctype in ("int64_t",):
        if v == -(2 ** 63):
            return "(-9223372036854775807LL - 1)"
        return f"int64_t({v}LL)"
    if ctype == "uint32_t":
        return f"uint32_t({v & 0xFFFFFFFF}u)"
    if ctype == "int32_t":
        if v == -(2 ** 31):
            return "int32_t(-2147483647 - 1)"
        return f"int32_t({v})" if v < 0 else str(v)
    return f"{ctype}({v})"


def literal(value, dt: D.DType) -> str:
    """`value` (a Python number) converted like the numpy target's DT_<dtype>(value), as a C++
    literal of dt's computing type (fp8/e8m0: the code byte the reference cast gives)."""
    if dt is D.bool_:
        return "true" if value else "false"
    if dt.is_int:
        return int_lit(int(value), compute(dt))
    if dt.is_storage_only:
        from k31dsl.targets.numpy import rt
        src = np.array(value, np.float32 if isinstance(value, float) else np.int64)
        byte = int(np.asarray(rt.cast(src, dt.name)).view(np.uint8))
        return f"uint8_t({byte})"
    v = float(np.array(value, np.float64).astype(D.numpy_dtype(dt)).astype(np.float64))
    return float_lit(v, "double" if dt is D.f64 else "float")


def fill_value(other, dt: D.DType) -> str:
    """A load's `other=` as a storage-type C++ value, converted like the reference's cast."""
    from k31dsl.targets.numpy import rt
    src = np.array(other, np.float32 if isinstance(other, float) else np.int64)
    val = np.asarray(rt.cast(src, dt.name))
    if dt.is_storage_only:
        return f"uint8_t({int(val.view(np.uint8))})"
    if dt is D.bool_:
        return f"uint8_t({1 if bool(val) else 0})"
    if dt.is_int:
        return int_lit(int(val), storage(dt))
    if dt in (D.bf16, D.f16):
        bits = int(val.view(np.uint16))
        return f"{storage(dt)}::from_bits({bits})"
    return float_lit(float(val), "double" if dt is D.f64 else "float")


# ---------------------------------------------------------------- element semantics

def rounded(expr: str, dt: D.DType) -> str:
    """A float expression rounded to dt's precision (16-bit floats: once, after the op)."""
    if dt is D.bf16:
        return f"k31::rbf({expr})"
    if dt is D.f16:
        return f"k31::rhf({expr})"
    return expr


def binary(name: str, dt: D.DType, a: str, b: str) -> str:
    """`a <name> b` for operands of dtype dt (the result dtype of compares is bool)."""
    c = compute(dt)
    cmp = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
    if name in cmp:
        return f"({a} {cmp[name]} {b})"
    if dt is D.bool_:
        op = {"and": "&&", "or": "||", "xor": "!=", "maximum": "||", "minimum": "&&"}.get(name)
        if op is None:
            op = {"add": "||", "mul": "&&", "sub": "!="}[name]
        return f"({a} {op} {b})"
    if dt.is_int:
        fn = {"add": "k31::wrap_add", "sub": "k31::wrap_sub", "mul": "k31::wrap_mul",
              "floordiv": "k31::idiv", "div": "k31::idiv", "mod": "k31::imod", "maximum": "k31::vmax",
              "minimum": "k31::vmin", "shl": "k31::shl", "shr": "k31::shr"}.get(name)
        if fn is not None:
            return f"{fn}<{c}>({a}, {b})"
        op = {"and": "&", "or": "|", "xor": "^"}[name]
        return f"{c}({a} {op} {b})"
    # floats
    if name in ("add", "sub", "mul", "div"):
        op = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[name]
        return rounded(f"({a} {op} {b})", dt)
    if name == "floordiv":
        return rounded(f"std::trunc({a} / {b})", dt)
    if name == "mod":
        return rounded(f"std::fmod({a}, {b})", dt)
    if name in ("maximum", "minimum"):
        return f"k31::v{name[:3]}<{c}>({a}, {b})"
    raise NotImplementedError(f"ascendc: binary {name} on {dt.name}")


def unary(name: str, dt: D.DType, x: str) -> str:
    c = compute(dt)
    if name == "neg":
        return f"k31::wrap_neg<{c}>({x})" if dt.is_int else f"(-({x}))"
    if name == "not":
        return f"(!{x})" if dt is D.bool_ else f"{c}(~{x})"
    if name == "abs":
        return f"k31::iabs<{c}>({x})"
    if name == "relu":
        return f"k31::vmax<{c}>({x}, {c}(0))"
    fn = {"exp": "std::exp", "exp2": "std::exp2", "log": "std::log", "log2": "std::log2",
          "sqrt": "std::sqrt", "floor": "std::floor", "ceil": "std::ceil",
          "rsqrt": f"k31::rsqrt<{c}>", "sigmoid": f"k31::sigmoid<{c}>",
          "softplus": f"k31::softplus<{c}>"}[name]
    return rounded(f"{fn}({x})", dt)


def cast(src: D.DType, dst: D.DType, x: str) -> str:
    return f"k31::cvt<{tag(src)}, {tag(dst)}>({x})"


def bitcast(src: D.DType, dst: D.DType, x: str) -> str:
    if src is dst:
        return x
    return f"{tag(dst)}::ld(k31::bits<{tag(dst)}::S>({tag(src)}::st({x})))"


def where(c: str, a: str, b: str) -> str:
    return f"({c} ? {a} : {b})"

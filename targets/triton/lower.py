"""Op lowerings of the Triton emitter, one function per op family. Each takes the emitter and the
op and returns the right-hand side of the op's assignment, or None once it named the result
itself (inlined constants and sizes). Helper lines go out through `em.pre(...)`.

Rounding rules (they make results match the numpy reference): f32 `/` and sqrt are correctly
rounded (tl.math.div_rn, tl.sqrt_rn); bf16/f16 math other than + - * runs in f32 and rounds
back; integer `//` and `%` truncate toward zero, which is what Triton's own operators do."""
from __future__ import annotations

import math

import numpy as np

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.ir import COMPARE, parse_index_kind
from k31dsl.targets.triton.gpu_guards import (holds_float_bits, int_asm, minmax_operand, opaque_int,
                                                 read_before, stored_copy)

INFIX = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^", "shl": "<<",
         "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
         "mod": "%"}
LOW = (D.bf16, D.f16)
FP8_HW = {"f8e4m3": "tl.float8e4nv", "f8e5m2": "tl.float8e5"}
F32_MIN_NORMAL, F32_MAX = 2.0 ** -126, float(np.finfo(np.float32).max)


# ---------------------------------------------------------------- literals

def float_text(x: float, npdt=np.float64) -> str:
    """Python text of a float that Triton turns back into exactly this value of `npdt`: the
    shortest form when parsing it and rounding to npdt returns x, else the exact value."""
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else '-float("inf")'
    text = repr(x)
    v = npdt(x)
    fmt = np.format_float_positional if x == 0 or 1e-5 <= abs(x) < 1e16 else np.format_float_scientific
    short = fmt(v, unique=True, trim="0")
    if float(np.array(float(short)).astype(npdt)) == x:
        text = short
    return text


def literal(value, dt: D.DType) -> str:
    """`value` as a Python literal of dt's carrier (fp8/e8m0: the byte NumPy's cast gives)."""
    if dt is D.bool_:
        return "True" if value else "False"
    if dt.is_int:
        return str(int(value))
    npdt = D.numpy_dtype(dt)
    if dt.is_storage_only:
        return str(int(np.array(value, np.float64).astype(npdt).view(np.uint8)))
    return float_text(float(np.array(value, np.float64).astype(npdt).astype(np.float64)), npdt)


def fill_literal(other, dt: D.DType, em) -> str:
    """A load's `other=` in the tensor's carrier, converted like a cast (the reference's rule:
    fp8 saturates, e8m0 takes ceil(log2), ints truncate and saturate); folded here through the
    reference's own cast so that both targets fill identically."""
    from k31dsl.targets.numpy import rt as reference
    src = np.array(other, np.float32 if isinstance(other, float) else np.int64)
    val = np.asarray(reference.cast(src, dt.name))
    if dt.is_storage_only:
        return str(int(val.view(np.uint8)))
    if dt is D.bf16 and em.interp:
        return str(int(val.view(np.int16)))          # the interpreter loads bf16 as its bits
    if dt is D.bool_:
        return "True" if bool(val) else "False"
    if dt.is_int:
        return literal(int(val), dt)
    return float_text(float(val), D.numpy_dtype(dt))


def natural(value, dt: D.DType, em) -> bool:
    """Whether Triton reads the bare literal as exactly this dtype (f32, i32, bool)."""
    if dt is D.bool_ or dt is D.i32:
        return True
    if em.carrier(dt) != "tl.float32" or dt.is_storage_only:
        return False
    r = abs(float(np.array(value, np.float64).astype(D.numpy_dtype(dt))))
    return r == 0 or math.isinf(r) or math.isnan(r) or F32_MIN_NORMAL <= r <= F32_MAX


def const(em, op):
    v, dt = op.attrs["value"], op.attrs["dtype"]
    text = literal(v, dt)
    if natural(v, dt, em):
        em.consts[op.result.uid] = text
        em.inline(op, text)
        return None
    return f"tl.full([], {text}, {em.carrier(dt)})"


def dim(em, op):
    em.inline(op, f"{em.n(op.operands[0])}_size_{op.attrs['axis']}")


def arange(em, op):
    return f"tl.arange(0, {op.attrs['size']})"


def full(em, op):
    dt = op.attrs["dtype"]
    return f"tl.full({list(op.attrs['shape'])}, {literal(op.attrs['value'], dt)}, {em.carrier(dt)})"


# ---------------------------------------------------------------- conversions through f32

def f32(em, v) -> str:
    """`v` (any non-bool dtype) as an f32 tensor expression."""
    dt = v.type.dtype
    x = em.t(v)
    if dt is D.f32 or (dt is D.bf16 and em.interp):
        return x
    if dt.kind == "fp8":
        if em.interp or em.soft_fp8:
            em.use("fp8_decode")
            e, m, bias = D.FP8_FORMAT[dt.name]
            return f"_fp8_decode({x}, {m}, {bias}, {dt is D.f8e4m3}, {2.0 ** (1 - bias - m)!r})"
        return f"{x}.to({FP8_HW[dt.name]}, bitcast=True).to(tl.float32)"
    if dt is D.e8m0:
        em.use("e8m0_decode")
        return f"_e8m0_decode({x})"
    return f"{x}.to(tl.float32)"


def from32(em, expr: str, dt: D.DType) -> str:
    """An f32 tensor expression converted to dt's carrier (rounding to nearest even)."""
    if dt is D.f32:
        return expr
    if dt is D.bf16 and em.interp:
        em.use("round_bf16")
        return f"_round_bf16({expr})"
    if dt.kind == "fp8":
        bound = D.from_name(dt.name).max_finite
        if em.interp or em.soft_fp8:
            em.use("fp8_encode")
            e, m, bias = D.FP8_FORMAT[dt.name]
            max_bits = int(np.array(bound, np.float32).view(np.uint32))
            return f"_fp8_encode({expr}, {m}, {bias}, {hex(max_bits)})"
        if em.satfinite:     # sm90+: cvt.rn.satfinite saturates and maps NaN to 0x7F itself
            return f"{expr if expr.isidentifier() else f'({expr})'}.to({FP8_HW[dt.name]}, " \
                   f"fp_downcast_rounding=\"rtne\").to(tl.uint8, bitcast=True)"
        em.use("fp8_encode_hw")
        return f"_fp8_encode_hw({expr}, {FP8_HW[dt.name]}, {bound!r})"
    if dt is D.e8m0:
        em.use("e8m0_encode")
        return f"_e8m0_encode({expr})"
    return f"{expr if expr.isidentifier() else f'({expr})'}.to({em.carrier(dt)})"


# ---------------------------------------------------------------- arithmetic

def _outer_product_operands(a, b) -> bool:
    """Whether a float product has the shapes (M, K, 1) * (1, K, N): Triton's combine pass rewrites
    `sum(a[:, :, None] * b[None, :, :], axis=1)` into a tt.dot, which Triton 3.6 emits with tf32
    inputs (inexact) and gets wrong for K < 8 (an H200 summed over query rows too: AttnRes prepare,
    S >= 9). The pattern only matches this operand order, so `binary` writes b * a instead: the same
    IEEE product, and the reduction stays the elementwise one the kernel states."""
    sa, sb = a.type.shape, b.type.shape
    return len(sa) == 3 and len(sb) == 3 and sa[2] == 1 and sb[0] == 1 and (sa[0] != 1 or sb[2] != 1)


def binary(em, op):
    a, b = op.operands
    dt, name = a.type.dtype, op.name
    if name == "mul" and dt.is_float and _outer_product_operands(a, b):
        a, b = b, a
    # two possible constexprs: make one a tensor where Python's rules would differ from the IR's
    both_cx = a.uid in em.maybe_cx and b.uid in em.maybe_cx
    A = em.t(a) if both_cx and (name in ("floordiv", "mod") or dt.is_float) else em.n(a)
    B = em.n(b)
    if name in COMPARE or (not dt.is_float and name in INFIX):
        text = f"{A} {INFIX[name]} {B}"
        if dt is D.bool_ and em.interp and a.type.is_scalar != b.type.is_scalar:
            return f"({text}) != 0"          # the interpreter's scalar & tile gives int32 data
        if name in COMPARE and em.interp and a.type.is_scalar and b.type.is_scalar and not both_cx:
            # Triton 3.9's interpreter types a scalar compare's data by its operands, so splatting it
            # onto a tile later (a store's mask, `&` with a tile) gives float lanes: rebuild it as int1
            return f"tl.where({text}, True, False)"
        return text
    if not dt.is_float:
        if name == "floordiv":
            return f"{A} // {B}"            # Triton's integer // truncates toward zero
        return f"tl.{name}({minmax_operand(em, a, A)}, {minmax_operand(em, b, B)})"    # maximum / minimum
    if name in ("maximum", "minimum"):
        em.use("fmax" if name == "maximum" else "fmin")
        if dt in LOW:        # Triton 3.6 returns f32 for a bf16 maximum: keep the IR's dtype
            return from32(em, f"_f{name[:3]}({f32(em, a)}, {f32(em, b)})", dt)
        return f"_f{name[:3]}({A}, {B})"
    if dt in LOW and name in ("add", "sub", "mul"):
        # one 16-bit + - * rounds the same natively as through f32 (24 >= 2 * 11 + 2 bits)
        text = f"{A} {INFIX[name]} {B}"
        return from32(em, text, dt) if dt is D.bf16 and em.interp else text
    if dt in LOW:
        return from32(em, _fdiv(em, name, f32(em, a), f32(em, b), D.f32), dt)
    if name in ("add", "sub", "mul"):
        return f"{A} {INFIX[name]} {B}"
    return _fdiv(em, name, A, B, dt)


def _fdiv(em, name, A, B, dt) -> str:
    if name == "mod":
        if em.interp:
            return f"{A} % {B}"              # the interpreter's frem is numpy's fmod: exact
        # on a GPU `%` is LLVM's frem, which NVPTX expands to x - trunc(x / y) * y: not exact, and
        # NaN for a finite x over an infinite y (tests/program_fuzz.py on the H200, seeds 100043,
        # 101344). libdevice's fmod is C's, but its f32 form flushes subnormals (seed 202899): f32
        # operands go through the f64 one (exact both ways: every f32 is an f64, and so is the result)
        if dt is D.f64:
            return f"tl.extra.cuda.libdevice.fmod({A}, {B})"
        return (f"tl.extra.cuda.libdevice.fmod(tl.cast({A}, tl.float64), tl.cast({B}, tl.float64))"
                ".to(tl.float32)")
    q = f"tl.math.div_rn({A}, {B})" if dt is D.f32 else f"{A} / {B}"
    if name == "floordiv":
        em.use("trunc")
        return f"_trunc({q})"
    return q


def _float_unary(em, name: str, X: str, dt: D.DType) -> str:
    if name == "sqrt":
        return f"tl.sqrt_rn({X})" if dt is D.f32 else f"tl.sqrt({X})"
    if name == "rsqrt":
        return f"tl.math.div_rn(1.0, tl.sqrt_rn({X}))" if dt is D.f32 else f"1.0 / tl.sqrt({X})"
    if name == "softplus":
        em.use("softplus")
        return f"_softplus({X})"
    if name in ("floor", "ceil") and dt is D.f32:
        em.use(name)                        # tl.floor / tl.ceil flush subnormals on a GPU
        return f"_{name}({X})"
    return f"tl.{name}({X})"


def unary(em, op):
    x = op.operands[0]
    dt, name = x.type.dtype, op.name
    X = em.t(x)
    if name == "neg":
        if dt.is_float and not em.interp:
            # Triton 3.6 writes float -x as 0 - x (sub.rn), so -(+0.0) came out +0.0, and a division
            # by it +inf where the reference has -inf (fuzz seed 392733, in the PTX emulator; 3.9
            # flips the sign bit). A product with -1 is exact and LLVM makes it a true negation
            return f"({X} * -1.0)"
        return f"-{X}"
    if name == "not":
        return f"~{X}"
    if name == "abs":
        if dt.is_int and dt.signed and not em.interp and x.type.shape:
            # tl.abs becomes llvm.abs with INT_MIN poison, so LLVM takes abs(x) >= 0: abs(INT_MIN) % -3
            # came out +2 on the H200 (fuzz seed 101852; every select / xor form of abs is folded
            # back into it, benchmarks/probes/abs_wrap.py). PTX's own abs does no better: ptxas, too,
            # takes IABS for non-negative (the SASS drops the remainder's sign fix-up). The
            # shift-xor-subtract form in inline asm wraps as the contract does, and neither LLVM
            # nor ptxas treats its result as non-negative (benchmarks/probes/abs_forms.py)
            return int_asm(em, dt, X, "{{ .reg .s{bits} t; shr.s{bits} t, $1, {top}; xor.b{bits} $0, $1, t; "
                                      "sub.s{bits} $0, $0, t; }}")
        return f"tl.abs({X})"
    if name == "relu":                        # maximum(x, 0): NaN stays NaN
        if dt.is_float:
            em.use("fmax")
            if dt in LOW:     # as binary()'s maximum: Triton 3.6 returns f32 for a 16-bit maximum
                return from32(em, f"_fmax({f32(em, x)}, 0.0)", dt)
            return f"_fmax({X}, tl.zeros_like({X}))"
        return f"tl.maximum({minmax_operand(em, x, X)}, tl.zeros_like({X}))"
    if dt in LOW:
        return from32(em, _float_unary(em, name, f32(em, x), D.f32), dt)
    return _float_unary(em, name, X, dt)


def where(em, op):
    c, a, b = op.operands
    return f"tl.where({em.n(c)}, {em.n(a)}, {em.n(b)})"


def cast(em, op):
    x = op.operands[0]
    src, dst = x.type.dtype, op.attrs["dtype"]
    if dst is D.bool_:
        if em.interp and x.type.is_scalar and src is not D.bool_:
            return f"tl.where({em.n(x)} != 0, True, False)"     # as binary()'s scalar compares
        return f"{em.n(x)} != 0"
    if dst.is_float or dst.is_storage_only:
        bf16_carrier = src is D.bf16 and em.interp
        if dst in (D.f32, D.f64, D.f16) and not src.is_storage_only and not bf16_carrier:
            return em.to(x, em.carrier(dst))            # one rounding, as NumPy's astype
        return from32(em, f32(em, x), dst)              # via f32 like the reference
    # to an integer
    if src.is_float:
        em.use("float_to_int")
        X = em.t(x) if src in (D.f32, D.f64) else f32(em, x)
        bits, signed = dst.bits, dst.signed
        lo, hi = (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1)) if signed else (-1.0, 2.0 ** bits)
        mn, mx = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
        return f"_float_to_int({X}, {em.carrier(dst)}, {lo!r}, {hi!r}, {mn}, {mx})"
    if dst.bits < src.bits <= 32 and holds_float_bits(em, x):
        return em.to(opaque_int(em, x, em.t(x)), em.carrier(dst))
    return em.to(x, em.carrier(dst))


def bitcast(em, op):
    x = op.operands[0]
    src, dst = x.type.dtype, op.attrs["dtype"]
    if em.interp and D.bf16 in (src, dst) and src is not dst:
        em.use("round_bf16")
        if src is D.bf16:            # f32 carrier -> 16 bits -> f16
            return f"_bf16_to_bits({em.t(x)}).to({em.carrier(dst)}, bitcast=True)"
        return f"_bf16_from_bits({em.t(x)}.to(tl.int16, bitcast=True))"
    if em.carrier(src) == em.carrier(dst):
        em.names[op.result.uid] = em.n(x)                  # same bits in the same carrier
        if x.uid in em.maybe_cx:
            em.maybe_cx.add(op.result.uid)
        return None
    return em.to(x, em.carrier(dst), bitcast=True)


# ---------------------------------------------------------------- reductions, scans, dot

def reduce(em, op):
    x = op.operands[0]
    dt, axis = x.type.dtype, op.attrs["axis"]
    X = em.t(x)
    if x.type.is_scalar:
        return X
    axis = None if axis is None else axis % len(x.type.shape)
    ax = "" if axis is None else f", {axis}"
    if dt is D.bool_:
        fn = "tl.sum" if op.name == "sum" else f"tl.{op.name}"
        return f"{fn}({X}.to(tl.int32){ax}) != 0"
    if dt.is_float and op.name != "sum":
        em.use("fmax" if op.name == "max" else "fmin")
        if dt in LOW:     # Triton 3.6's bf16 maximum returns f32, which a bf16 combine function may not: reduce in f32
            return from32(em, f"tl.reduce({f32(em, x)}, {axis}, _f{op.name})", dt)
        return f"tl.reduce({X}, {axis}, _f{op.name})"
    if dt in LOW:
        return from32(em, f"tl.sum({f32(em, x)}{ax})", dt)
    out = f"tl.{op.name}({X if op.name == 'sum' else minmax_operand(em, x, X)}{ax})"
    return f"{out}.to({em.carrier(dt)})" if dt.is_int and dt.bits < 32 else out


def cumsum(em, op):
    x = op.operands[0]
    dt = x.type.dtype
    args = f"{op.attrs['axis'] % len(x.type.shape)}, reverse={op.attrs['reverse']}"
    if dt in LOW:
        return from32(em, f"tl.cumsum({f32(em, x)}, {args})", dt)
    if dt is D.bool_:
        return f"tl.cumsum({em.t(x)}.to(tl.int32), {args}) != 0"
    out = f"tl.cumsum({em.t(x)}, {args})"
    return f"{out}.to({em.carrier(dt)})" if dt.is_int and dt.bits < 32 else out


def histogram(em, op):
    # explicit bounds mask: out-of-range values are dropped on NVIDIA but binned by their low
    # bits on AMD (triton PR 10376); the contract drops them everywhere
    x = em.t(op.operands[0])
    return f"tl.histogram({x}, {op.attrs['bins']}, mask=({x} >= 0) & ({x} < {op.attrs['bins']}))"


def dot(em, op):
    a, b = op.operands
    dt = a.type.dtype
    ieee = 'input_precision="ieee"'
    if dt is D.f32:
        prec = "ieee" if em.interp else op.attrs["precision"]
        return f'tl.dot({em.t(a)}, {em.t(b)}, input_precision="{prec}")'
    if dt.kind == "fp8" and not em.interp:
        hw = FP8_HW[dt.name]
        return f"tl.dot({em.t(a)}.to({hw}, bitcast=True), {em.t(b)}.to({hw}, bitcast=True))"
    if dt in LOW and not em.interp:
        return f"tl.dot({em.t(a)}, {em.t(b)})"
    # interpreter (its 16-bit dot is wrong), fp8 decoded in software, f64: f32 operands
    return f"tl.dot({f32(em, a)}, {f32(em, b)}, {ieee})"


def topk(em, op):
    x = op.operands[0]
    X = em.t(x)
    em.use("topk")
    rank = len(x.type.shape)
    if x.type.dtype is D.i64:       # packed sort keys: the values are the keys, no position half
        from k31dsl.dsl.ir import walk
        if any(op.results[1] in o.operands for o in walk(em.k.body)):
            from k31dsl.dsl.errors import error
            raise error("the triton target gives only the values of k.topk on an i64 tile, not their "
                        "positions", op.loc, "pack the position into the low bits of each i64 key")
        return f"_topk_i64({X}, {op.attrs['n']}, {x.type.shape[-1]}, {rank - 1})"
    order = X if x.type.dtype is D.i32 else f"_f32_order({X})"
    return f"_topk({X}, {order}, {op.attrs['n']}, {x.type.shape[-1]}, {rank - 1})"


def take(em, op):
    x, i = op.operands
    last = x.type.shape[-1]
    idx = em.fresh("take_idx")
    em.pre(f"{idx} = tl.minimum(tl.maximum({em.t(i)}, 0), {last - 1}).to(tl.int32)")
    return f"tl.gather({em.t(x)}, {idx}, {len(x.type.shape) - 1})"


# ---------------------------------------------------------------- shape ops

def expand(em, op):
    x = op.operands[0]
    rank, axis = len(x.type.shape), op.attrs["axis"]
    if rank == 0:
        return f"tl.expand_dims({em.t(x)}, 0)"
    idx = [":"] * rank
    idx.insert(axis, "None")
    return f"{em.t(x)}[{', '.join(idx)}]"


def trans(em, op):
    return f"tl.trans({em.t(op.operands[0])})"


def broadcast(em, op):
    x = op.operands[0]
    if x.type.shape == tuple(op.attrs["shape"]):
        return em.t(x)
    return f"tl.broadcast_to({em.t(x)}, {list(op.attrs['shape'])})"


def reshape(em, op):
    return f"tl.reshape({em.t(op.operands[0])}, {list(op.attrs['shape'])})"


def cat(em, op):
    a, b = op.operands
    n = 2 * a.type.shape[0]
    # join -> [L, 2]; transposed -> [2, L]; row-major flattening puts a before b
    return f"tl.reshape(tl.trans(tl.join({em.t(a)}, {em.t(b)})), [{n}])"


# ---------------------------------------------------------------- memory

def _access(em, op, has_value: bool):
    """(pointer expr, mask expr, value operand) of a load/store. Each tile axis gets an index
    line laid out on its result axis; offsets are `em.idx` (int64 in the interpreter; on GPUs the
    launcher picks int32 unless a tensor spans 2^30 elements or more); lanes are
    in bounds when every index is in [0, size). Tile accesses name their offsets and mask."""
    kinds = op.attrs["index"]
    tensor = op.operands[0]
    t = em.n(tensor)
    idx = op.operands[1:1 + len(kinds)]
    rest = op.operands[1 + len(kinds):]
    value = rest[0] if has_value else None
    user_mask = rest[-1] if op.attrs["mask"] else None
    rank = sum(parse_index_kind(k)[0] != "scalar" for k in kinds)
    offs, masks, scalar_masks, r = [], [], [], 0
    for axis, (kind, v) in enumerate(zip(kinds, idx)):
        k, size = parse_index_kind(kind)
        stride, bound = f"{t}_stride_{axis}", f"{t}_size_{axis}"
        if k == "scalar":
            ix = em.n(v)
            scalar_masks += [] if em.nonneg(v) else [f"({ix} >= 0)"]
            scalar_masks.append(f"({ix} < {bound})")
            if v.uid in em.consts:
                offs += [] if ix == "0" else [f"{ix} * {stride}"]
            else:
                offs.append(f"{em.to(v, em.idx)} * {stride}")
            continue
        if k == "span":
            start = em.n(v)
            lanes = f"tl.arange(0, {size})" if start == "0" else f"{start} + tl.arange(0, {size})"
        else:
            lanes = em.t(v)
        if rank > 1:
            sub = ["None"] * rank
            sub[r] = ":"
            bare = lanes.isidentifier() or lanes == f"tl.arange(0, {size})"
            lanes = f"{lanes if bare else f'({lanes})'}[{', '.join(sub)}]"
        name = em.fresh(f"{t}_i{axis}")
        em.pre(f"{name} = {lanes}")
        masks += [] if em.nonneg(v) else [f"({name} >= 0)"]
        masks.append(f"({name} < {bound})")
        offs.append(f"{name}.to({em.idx}) * {stride}")
        r += 1
    if user_mask is not None:
        (scalar_masks if user_mask.type.is_scalar else masks).append(em.n(user_mask))
    mask = " & ".join(scalar_masks + masks)
    if em.interp and masks and scalar_masks:
        mask = f"({mask}) != 0"               # the interpreter's scalar & tile gives int32 data
    off = " + ".join(offs) or "0"
    if rank:
        off_name, mask_name = em.fresh(f"{t}_off"), em.fresh(f"{t}_ok")
        em.pre(f"{off_name} = {off}")
        em.pre(f"{mask_name} = {mask}")
        off, mask = off_name, mask_name
    return f"{t} + {off}", mask, value


def _eviction(op) -> str:
    """The L2 cache hint of a load/store (`evict=` in the DSL): Triton's eviction_policy."""
    hint = op.attrs.get("evict")
    return f', eviction_policy="evict_{hint}"' if hint else ""


def load(em, op):
    ptr, mask, _ = _access(em, op, False)
    dt = op.operands[0].type.dtype
    other = op.attrs["other"]
    fill = None if other is None else fill_literal(other, dt, em)
    extra = "" if other is None else f", other={fill}"
    text = f"tl.load({ptr}, mask={mask}{extra}{_eviction(op)})"
    if (fill is not None and not em.interp and not dt.is_float and dt.bits < 32
            and fill not in ("0", "False") and op.result.type.shape):
        # Triton 3.6 fills the masked lanes of a vectorised 8- or 16-bit integer load with the
        # 32-bit pattern of `other` (-2 becomes 0xFFFFFFFE: lanes -2, -1, -1, -1 on the H200,
        # fuzz seed 312048; the PTX shows it); float fills are splatted right. Load, then select
        # -- only where Triton may vectorise: a tile axis whose stride it specialised to 1 (a
        # strided walk loads one lane at a time and Triton's own fill is right there)
        em.use("may_vectorise")
        strides = ", ".join(f"{em.n(op.operands[0])}_stride_{axis}" for axis, kind in enumerate(op.attrs["index"])
                            if parse_index_kind(kind)[0] != "scalar")
        select = (f"tl.where({mask}, tl.load({ptr}, mask={mask}{_eviction(op)}), "
                  f"tl.full([], {fill}, {em.carrier(dt)}))")
        return f"({select} if _may_vectorise({strides}) else {text})"
    if dt is D.bf16 and em.interp:
        em.use("round_bf16")
        return f"_bf16_from_bits({text})"
    return text


def store(em, op):
    ptr, mask, value = _access(em, op, True)
    dt = op.operands[0].type.dtype
    v = em.n(value)
    if dt is D.bf16 and em.interp:
        em.use("round_bf16")
        v = f"_bf16_to_bits({em.t(value)})"
    elif read_before(em, value, op):
        v = stored_copy(em, value, em.t(value))
    return f"tl.store({ptr}, {v}, mask={mask}{_eviction(op)})"


RULES = {
    "const": const, "dim": dim, "arange": arange, "full": full, "load": load, "store": store,
    "where": where, "cast": cast, "bitcast": bitcast, "sum": reduce, "max": reduce, "min": reduce,
    "cumsum": cumsum, "histogram": histogram, "dot": dot, "topk": topk, "take": take, "expand": expand, "trans": trans,
    "broadcast": broadcast, "reshape": reshape, "cat": cat,
    **{n: unary for n in ("neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sigmoid",
                          "softplus", "relu", "not", "floor", "ceil")},
}

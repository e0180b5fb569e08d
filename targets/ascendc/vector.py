"""Lowerings of the compute ops onto the AscendC vector unit (count-form instructions on whole
UB tiles) and, where it has no instruction, onto the scalar unit (k31_helpers.h loops; the
generated line before the call says so).

Vector instructions are used where their result is the IR's exactly: f32 Add/Sub/Mul/Div/Exp/
Ln/Sqrt/Rsqrt/Abs, Adds/Muls with a scalar, int32 Add/Sub/Mul/Max/Min/Abs, And/Or on int32 as
int16 pairs, ShiftLeft/ShiftRight by a constant, Cast f32<->bf16/f16 (CAST_RINT) and
int32->f32, Duplicate, ReduceSum (f32), Compare+Select for an f32 `where` of an f32 compare.
bf16/f16 + - * / run as Cast to f32, the f32 instruction, Cast back with CAST_RINT (one rounding,
as the IR defines). Float max/min stay on the scalar unit: the IR propagates NaN."""
from __future__ import annotations

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.ir import COMPARE, Op, Value, walk
from k31dsl.targets.ascendc import cexpr

VEC_F32_BIN = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "minimum": "Min"}
VEC_SCALAR = {"add": "Adds", "mul": "Muls", "maximum": "Maxs", "minimum": "Mins"}
VEC_I32_BIN = {"add": "Add", "sub": "Sub", "mul": "Mul", "maximum": "Max", "minimum": "Min"}
VEC_F32_UN = {"exp": "Exp", "log": "Ln", "sqrt": "Sqrt", "rsqrt": "Rsqrt", "abs": "Abs"}
CMP = {"lt": "LT", "le": "LE", "gt": "GT", "ge": "GE", "eq": "EQ", "ne": "NE"}


def sh4(shape) -> str:
    s = (1,) * (4 - len(shape)) + tuple(shape)
    return "k31::Sh{{" + ", ".join(map(str, s)) + "}}"


def strides4(op_shape, out_shape) -> str:
    """Broadcast strides (rank 4) of an operand of `op_shape` read at `out_shape` lanes."""
    r = len(out_shape)
    shp = (1,) * (r - len(op_shape)) + tuple(op_shape)
    dense, acc = [0] * r, 1
    for i in range(r - 1, -1, -1):
        dense[i] = 0 if (shp[i] == 1 and out_shape[i] != 1) else acc
        acc *= shp[i]
    full = [0] * (4 - r) + dense
    return "k31::St{{" + ", ".join(map(str, full)) + "}}"


def _fill(em, name: str, v: Value, value_text: str, n: int):
    """Set every lane of tile `name` to a scalar (Duplicate on 2/4-byte types)."""
    dt = v.type.dtype
    size = cexpr.itemsize(dt)
    if size in (2, 4) and dt is not D.bool_:
        em.vector_ops.add("Duplicate")
        S = cexpr.storage(dt)
        val = value_text if dt not in (D.bf16, D.f16) else f"{cexpr.tag(dt)}::st({value_text})"
        em.pre(f"AscendC::Duplicate<{S}>({name}, static_cast<{S}>({val}), {n});")
    else:
        em.pre(f"// scalar unit: fill of {dt.name} lanes (Duplicate takes 2/4-byte types)")
        em.scalar_unit.add("full")
        em.pre(f"k31::Fill<{cexpr.tag(dt)}>({name}, {n}, {value_text});")


# ---------------------------------------------------------------- scalars and the generic map

def scalar_def(em, op: Op, text: str):
    r = op.result
    em.pre(f"const {em.C(r)} {em.name(r)} = {text};")


def mapped(em, op: Op, expr_of, operands=None):
    """Lane-by-lane scalar-unit evaluation of `expr_of(texts)` with broadcast operands."""
    operands = list(op.operands if operands is None else operands)
    r = op.result
    out = em.define(r)
    tiles = [x for x in operands if em.is_tile(x)]
    if len(tiles) > 3:
        raise AssertionError("ascendc: more than 3 tile operands")
    params, texts, k = [], [], 0
    for x in operands:
        if em.is_tile(x):
            texts.append(f"x{k}")
            params.append(f"{em.C(x)} x{k}")
            k += 1
        else:
            texts.append(em.n(x))
    expr = expr_of(texts)
    shape = r.type.shape
    tags = ", ".join([cexpr.tag(r.type.dtype)] + [cexpr.tag(x.type.dtype) for x in tiles])
    lam = f"[=]({', '.join(params)}) -> {em.C(r)} {{ return {expr}; }}"
    em.scalar_unit.add(op.name)
    em.pre(f"// scalar unit: {op.name} lane by lane" + (" (broadcast operand)" if any(
        x.type.shape != shape for x in tiles) else ""))
    if len(tiles) == 1:
        em.pre(f"k31::Map1<{tags}>({out}, {em.n(tiles[0])}, {sh4(shape)}, {strides4(tiles[0].type.shape, shape)}, {lam});")
    else:
        args = ", ".join(f"{em.n(x)}, {strides4(x.type.shape, shape)}" for x in tiles)
        em.pre(f"k31::Map{len(tiles)}<{tags}>({out}, {args}, {sh4(shape)}, {lam});")


# ---------------------------------------------------------------- constants, sizes, ranges

def const(em, op):
    em.names[op.result.uid] = cexpr.literal(op.attrs["value"], op.attrs["dtype"])


def dim(em, op):
    scalar_def(em, op, f"static_cast<int32_t>(td.{em.n(op.operands[0])}_size[{op.attrs['axis']}])")


def arange(em, op):
    out = em.define(op.result)
    em.note_scalar(op, "arange")
    em.pre(f"k31::Arange({out}, {op.attrs['size']});")


def full(em, op):
    r, dt = op.result, op.attrs["dtype"]
    lit = cexpr.literal(op.attrs["value"], dt)
    if not em.is_tile(r):
        em.names[r.uid] = lit
        return
    out = em.define(r)
    _fill(em, out, r, lit, r.type.numel)


# ---------------------------------------------------------------- element-wise

def _same(x: Value, r: Value) -> bool:
    return x.type.shape == r.type.shape


def binary(em, op):
    a, b = op.operands
    r = op.result
    dt = a.type.dtype
    if not em.is_tile(r):
        return scalar_def(em, op, cexpr.binary(op.name, dt, em.n(a), em.n(b)))
    n = r.type.numel
    both = em.is_tile(a) and em.is_tile(b) and _same(a, r) and _same(b, r)
    tile_scalar = em.is_tile(a) and _same(a, r) and not em.is_tile(b)
    if dt is D.f32 and op.name in VEC_F32_BIN and both:
        em.vector_ops.add(VEC_F32_BIN[op.name])
        out = em.define(r)
        return em.pre(f"AscendC::{VEC_F32_BIN[op.name]}({out}, {em.n(a)}, {em.n(b)}, {n});")
    if dt is D.i32 and op.name in VEC_I32_BIN and both:
        em.vector_ops.add(VEC_I32_BIN[op.name])
        out = em.define(r)
        return em.pre(f"AscendC::{VEC_I32_BIN[op.name]}({out}, {em.n(a)}, {em.n(b)}, {n});")
    if dt in (D.f32, D.i32) and tile_scalar and (op.name in VEC_SCALAR or op.name == "sub"):
        out = em.define(r)
        return em.pre(_scalar_inst(em, op.name, dt, out, em.n(a), em.n(b), n) + ";")
    if dt in (D.f32, D.i32) and em.is_tile(b) and _same(b, r) and not em.is_tile(a) and op.name in (
            "add", "mul", "maximum", "minimum"):
        out = em.define(r)                       # commutative: scalar on the left
        return em.pre(_scalar_inst(em, op.name, dt, out, em.n(b), em.n(a), n) + ";")
    if _row_broadcast(em, op):
        return
    if dt is D.f32 and op.name in VEC_F32_BIN and (tile_scalar or (em.is_tile(b) and _same(b, r) and not em.is_tile(a))):
        # a scalar operand without an instruction of its own (Div, Sub from a scalar): Duplicate it
        out = em.define(r)
        ta = _as_tile(em, a, n)
        tb = _as_tile(em, b, n)
        em.vector_ops.add(VEC_F32_BIN[op.name])
        return em.pre(f"AscendC::{VEC_F32_BIN[op.name]}({out}, {ta}, {tb}, {n});")
    if dt is D.i32 and op.name in ("and", "or") and both:
        inst = "And" if op.name == "and" else "Or"
        em.vector_ops.add(inst)
        out = em.define(r)
        return em.pre(f"AscendC::{inst}({out}.ReinterpretCast<int16_t>(), {em.n(a)}.ReinterpretCast<int16_t>(), "
                      f"{em.n(b)}.ReinterpretCast<int16_t>(), {2 * n});  // int32 as int16 pairs")
    if dt is D.i32 and op.name in ("and", "or") and (tile_scalar or (em.is_tile(b) and _same(b, r) and not em.is_tile(a))):
        t, sc = (a, b) if tile_scalar else (b, a)
        inst = "And" if op.name == "and" else "Or"
        em.vector_ops.update({inst, "Duplicate"})
        out = em.define(r)
        splat = em.fresh("splat")
        em.pre(f"AscendC::LocalTensor<int32_t> {splat} = {em.scratch('int32_t', n)};")
        em.pre(f"AscendC::Duplicate<int32_t>({splat}, static_cast<int32_t>({em.n(sc)}), {n});")
        return em.pre(f"AscendC::{inst}({out}.ReinterpretCast<int16_t>(), {em.n(t)}.ReinterpretCast<int16_t>(), "
                      f"{splat}.ReinterpretCast<int16_t>(), {2 * n});  // int32 as int16 pairs")
    if dt is D.i32 and op.name == "sub" and em.is_tile(b) and _same(b, r) and not em.is_tile(a):
        em.vector_ops.update({"Muls", "Adds"})     # s - t = (-t) + s, wrapping like the IR
        out = em.define(r)
        em.pre(f"AscendC::Muls({out}, {em.n(b)}, int32_t(-1), {n});")
        return em.pre(f"AscendC::Adds({out}, {out}, static_cast<int32_t>({em.n(a)}), {n});")
    if dt is D.i32 and op.name in ("shl", "shr") and tile_scalar:
        sop = em.plan.defs.get(b.uid)
        if sop is not None and sop.name == "const" and 0 <= sop.attrs["value"] < 32:
            inst = "ShiftLeft" if op.name == "shl" else "ShiftRight"
            em.vector_ops.add(inst)
            out = em.define(r)
            return em.pre(f"AscendC::{inst}({out}, {em.n(a)}, int32_t({sop.attrs['value']}), {n});")
    if dt in (D.bf16, D.f16) and op.name in VEC_F32_BIN and both:
        # 16-bit floats: widen, the f32 instruction, round back once (CAST_RINT)
        S = cexpr.storage(dt)
        fa, fb = em.scratch("float", n), em.scratch("float", n)
        em.vector_ops.update({"Cast", VEC_F32_BIN[op.name]})
        out = em.define(r)
        em.pre(f"{{ AscendC::LocalTensor<float> fa = {fa}, fb = {fb};")
        em.pre(f"  AscendC::Cast(fa, {em.n(a)}, AscendC::RoundMode::CAST_NONE, {n});")
        em.pre(f"  AscendC::Cast(fb, {em.n(b)}, AscendC::RoundMode::CAST_NONE, {n});")
        em.pre(f"  AscendC::{VEC_F32_BIN[op.name]}(fa, fa, fb, {n});")
        em.pre(f"  AscendC::Cast<{S}, float>({out}, fa, AscendC::RoundMode::CAST_RINT, {n}); }}")
        return
    if op.name in COMPARE:
        return mapped(em, op, lambda t: cexpr.binary(op.name, dt, t[0], t[1]))
    mapped(em, op, lambda t: cexpr.binary(op.name, dt, t[0], t[1]))


def _scalar_inst(em, name, dt, out, t, sc, n) -> str:
    """`out = t <name> sc` for a tile and a scalar with Adds/Muls/Maxs/Mins (sub: Adds of -sc,
    exact); None when there is no such instruction."""
    if name == "sub":
        sc = f"(-({sc}))" if dt is D.f32 else f"k31::wrap_neg<int32_t>({sc})"
        name = "add"
    inst = VEC_SCALAR[name]
    em.vector_ops.add(inst)
    return f"AscendC::{inst}({out}, {t}, static_cast<{cexpr.compute(dt)}>({sc}), {n})"


def _row_broadcast(em, op) -> bool:
    """Binary f32/i32 ops whose operands are full tiles, per-row values ([..., 1]) or one row
    ([1, ..., L]): one vector instruction per row of 32-byte aligned rows."""
    a, b = op.operands
    r = op.result
    dt = a.type.dtype
    shape = r.type.shape
    if dt not in (D.f32, D.i32) or len(shape) < 2 or not em.is_tile(a) or not em.is_tile(b):
        return False
    L = shape[-1]
    rows = r.type.numel // L
    if (L * 4) % 32:
        return False
    table = VEC_F32_BIN if dt is D.f32 else VEC_I32_BIN
    if op.name not in table:
        return False

    def kind(x):
        xs = (1,) * (len(shape) - len(x.type.shape)) + tuple(x.type.shape)
        if xs == tuple(shape):
            return "full"
        if xs[:-1] == tuple(shape[:-1]) and xs[-1] == 1:
            return "per_row"
        if all(d == 1 for d in xs[:-1]) and xs[-1] == L:
            return "one_row"
        return None
    ka, kb = kind(a), kind(b)
    if None in (ka, kb) or (ka == "per_row" and kb == "per_row"):
        return False
    if "per_row" in (ka, kb):
        name = op.name
        if kb == "per_row":
            t, sc = (a, b)
        else:
            t, sc = (b, a)
            if name not in ("add", "mul", "maximum", "minimum"):
                return False
        if name not in VEC_SCALAR and name != "sub":
            return False
        out = em.define(r)
        tx = f"{em.n(t)}[row * {L}]" if kind(t) == "full" else em.n(t)
        inst = _scalar_inst(em, name, dt, f"{out}[row * {L}]", tx, f"{em.n(sc)}.GetValue(row)", L)
        em.pre(f"for (int32_t row = 0; row < {rows}; ++row) {inst};   // per-row scalar operand")
        return True
    out = em.define(r)
    ta = f"{em.n(a)}[row * {L}]" if ka == "full" else em.n(a)
    tb = f"{em.n(b)}[row * {L}]" if kb == "full" else em.n(b)
    em.vector_ops.add(table[op.name])
    em.pre(f"for (int32_t row = 0; row < {rows}; ++row) AscendC::{table[op.name]}({out}[row * {L}], {ta}, {tb}, {L});"
           "   // row-broadcast operand")
    return True


def unary(em, op):
    x = op.operands[0]
    r = op.result
    dt = x.type.dtype
    if not em.is_tile(r):
        return scalar_def(em, op, cexpr.unary(op.name, dt, em.n(x)))
    n = r.type.numel
    if dt is D.f32 and op.name in VEC_F32_UN:
        inst = VEC_F32_UN[op.name]
        em.vector_ops.add(inst)
        out = em.define(r)
        return em.pre(f"AscendC::{inst}({out}, {em.n(x)}, {n});")
    if dt is D.i32 and op.name == "abs":
        em.vector_ops.add("Abs")
        out = em.define(r)
        return em.pre(f"AscendC::Abs({out}, {em.n(x)}, {n});")
    if dt is D.f32 and op.name == "neg":
        em.vector_ops.add("Muls")
        out = em.define(r)
        return em.pre(f"AscendC::Muls({out}, {em.n(x)}, -1.0f, {n});")
    mapped(em, op, lambda t: cexpr.unary(op.name, dt, t[0]))


def where(em, op):
    c, a, b = op.operands
    r = op.result
    if not em.is_tile(r):
        return scalar_def(em, op, cexpr.where(em.n(c), em.n(a), em.n(b)))
    cop = em.plan.defs.get(c.uid)
    n = r.type.numel
    if id(cop) in em.fused:
        x, y = cop.operands
        mask = em.scratch("uint8_t", n // 8)
        em.vector_ops.update({"Compare", "Select"})
        ta = _as_tile(em, a, n)
        tb = _as_tile(em, b, n)
        out = em.define(r)
        em.pre(f"{{ AscendC::LocalTensor<uint8_t> mask = {mask};")
        if em.is_tile(y):
            em.pre(f"  AscendC::Compare(mask, {em.n(x)}, {em.n(y)}, AscendC::CMPMODE::{CMP[cop.name]}, {n});")
        else:
            em.pre(f"  AscendC::CompareScalar(mask, {em.n(x)}, static_cast<float>({em.n(y)}), "
                   f"AscendC::CMPMODE::{CMP[cop.name]}, {n});")
        em.pre(f"  AscendC::Select({out}, mask, {ta}, {tb}, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, {n}); }}")
        return
    mapped(em, op, lambda t: cexpr.where(t[0], t[1], t[2]))


def _as_tile(em, v: Value, n: int) -> str:
    if em.is_tile(v):
        return em.n(v)
    t = em.scratch("float", n)
    name = em.fresh("splat")
    em.pre(f"AscendC::LocalTensor<float> {name} = {t};")
    em.vector_ops.add("Duplicate")
    em.pre(f"AscendC::Duplicate<float>({name}, static_cast<float>({em.n(v)}), {n});")
    return name


def prepare(em):
    """Compares whose only use is an f32 `where` of full tiles become Compare + Select."""
    extra = []
    for op in walk(em.k.body):
        if op.name != "where" or op.result.type.dtype is not D.f32 or not em.is_tile(op.result):
            continue
        c, a, b = op.operands
        cop = em.plan.defs.get(c.uid)
        n = op.result.type.numel
        if cop is None or cop.name not in CMP or (n * 4) % 256 or len(em.plan.uses.get(c.uid, [])) != 1:
            continue
        x, y = cop.operands
        shape = op.result.type.shape
        if x.type.dtype is not D.f32 or not em.is_tile(x) or x.type.shape != shape:
            continue
        if em.is_tile(y) and y.type.shape != shape:
            continue
        if any(em.is_tile(v) and v.type.shape != shape for v in (a, b)) or c.type.shape != shape:
            continue
        if em.plan.chain[id(cop)] != em.plan.chain[id(op)]:
            continue
        em.fused.add(id(cop))
        extra += [(v, op) for v in cop.operands]      # the compare's operands are read at the where
    return extra, set()


CAST_VEC = {("f32", "bf16"): "CAST_RINT", ("f32", "f16"): "CAST_RINT", ("bf16", "f32"): "CAST_NONE",
            ("f16", "f32"): "CAST_NONE", ("i32", "f32"): "CAST_NONE"}


def cast(em, op):
    x = op.operands[0]
    r = op.result
    src, dst = x.type.dtype, op.attrs["dtype"]
    if not em.is_tile(r):
        return scalar_def(em, op, cexpr.cast(src, dst, em.n(x)))
    mode = CAST_VEC.get((src.name, dst.name))
    if mode is not None:
        em.vector_ops.add("Cast")
        out = em.define(r)
        return em.pre(f"AscendC::Cast({out}, {em.n(x)}, AscendC::RoundMode::{mode}, {r.type.numel});")
    why = "fp8/e8m0 conversion by integer bit operations (A2 has no fp8 cast)" if (
        src.is_storage_only or dst.is_storage_only) else f"{src.name} -> {dst.name} cast with the IR's saturation rules"
    em.scalar_unit.add("cast")
    out = em.define(r)
    em.pre(f"// scalar unit: {why}")
    em.pre(f"k31::Map1<{cexpr.tag(dst)}, {cexpr.tag(src)}>({out}, {em.n(x)}, {sh4(r.type.shape)}, "
           f"{strides4(x.type.shape, r.type.shape)}, [=]({cexpr.compute(src)} v) -> {cexpr.compute(dst)} "
           f"{{ return {cexpr.cast(src, dst, 'v')}; }});")


def bitcast(em, op):
    x = op.operands[0]
    r = op.result
    src, dst = x.type.dtype, op.attrs["dtype"]
    if not em.is_tile(r):
        return scalar_def(em, op, cexpr.bitcast(src, dst, em.n(x)))
    if cexpr.storage(src) == cexpr.storage(dst):
        em.names[r.uid] = em.n(x)
        return
    name = em.name(r)
    em.pre(f"AscendC::LocalTensor<{cexpr.storage(dst)}> {name} = {em.n(x)}.ReinterpretCast<{cexpr.storage(dst)}>();")


# ---------------------------------------------------------------- reductions and scans

RED = {"sum": "k31::SUM", "max": "k31::MAX", "min": "k31::MIN"}
VEC_RED = {"sum": "ReduceSum", "max": "ReduceMax", "min": "ReduceMin"}


def reduce(em, op):
    x = op.operands[0]
    r = op.result
    dt = x.type.dtype
    axis = op.attrs["axis"]
    if not em.is_tile(x):
        em.names[r.uid] = em.n(x)
        return
    n = x.type.numel
    if not em.is_tile(r):
        if dt is D.f32:
            inst = VEC_RED[op.name]
            em.vector_ops.add(inst)
            one, work = em.scratch("float", 8), em.scratch("float", n)
            red = em.fresh("red")
            em.pre(f"AscendC::LocalTensor<float> {red} = {one};")
            em.pre(f"AscendC::{inst}({red}, {em.n(x)}, {work}, {n});")
            return scalar_def(em, op, f"{red}.GetValue(0)")
        em.note_scalar(op, f"{op.name} of {dt.name}" + (" (NaN propagates)" if dt.is_float else ""))
        return scalar_def(em, op, f"k31::ReduceAll<{cexpr.tag(dt)}, {RED[op.name]}>({em.n(x)}, {n})")
    shape = x.type.shape
    L = shape[-1]
    if dt is D.f32 and axis == len(shape) - 1 and (L * 4) % 32 == 0:
        inst = VEC_RED[op.name]
        em.vector_ops.add(inst)
        rows = n // L
        one, work = em.scratch("float", 8), em.scratch("float", L)
        out = em.define(r)
        em.pre(f"{{ AscendC::LocalTensor<float> one = {one}, work = {work};")
        em.pre(f"  for (int32_t row = 0; row < {rows}; ++row) {{")
        em.pre(f"    AscendC::{inst}(one, {em.n(x)}[row * {L}], work, {L});")
        em.pre(f"    {out}.SetValue(row, one.GetValue(0));")
        em.pre("  } }")
        return
    inner = 1
    for d_ in shape[axis + 1:]:
        inner *= d_
    table = VEC_F32_BIN if dt is D.f32 else VEC_I32_BIN
    if dt in (D.f32, D.i32) and axis < len(shape) - 1 and (inner * 4) % 32 == 0:
        # over an outer axis: whole rows combine lane by lane on the vector unit
        outer, R = n // (shape[axis] * inner), shape[axis]
        inst = table[{"sum": "add", "max": "maximum", "min": "minimum"}[op.name]]
        em.vector_ops.update({inst, "DataCopy"})
        out = em.define(r)
        em.pre(f"for (int32_t o = 0; o < {outer}; ++o) {{   // {op.name} over axis {axis}: row by row")
        em.pre(f"  AscendC::DataCopy({out}[o * {inner}], {em.n(x)}[o * {R * inner}], {inner});")
        em.pre(f"  for (int32_t row = 1; row < {R}; ++row)")
        em.pre(f"    AscendC::{inst}({out}[o * {inner}], {out}[o * {inner}], {em.n(x)}[(o * {R} + row) * {inner}], {inner});")
        em.pre("}")
        return
    out = em.define(r)
    em.note_scalar(op, f"{op.name} over axis {axis} of {dt.name}" + (" (NaN propagates)" if dt.is_float else ""))
    em.pre(f"k31::ReduceAxis<{cexpr.tag(dt)}, {RED[op.name]}>({out}, {em.n(x)}, {sh4(shape)}, {axis + 4 - len(shape)});")


def cumsum(em, op):
    x = op.operands[0]
    r = op.result
    shape = x.type.shape
    out = em.define(r)
    em.note_scalar(op, "cumsum (a scan)")
    em.pre(f"k31::Cumsum<{cexpr.tag(x.type.dtype)}>({out}, {em.n(x)}, {sh4(shape)}, "
           f"{op.attrs['axis'] + 4 - len(shape)}, {'true' if op.attrs['reverse'] else 'false'});")


def histogram(em, op):
    x = op.operands[0]
    out = em.define(op.result)
    em.note_scalar(op, "histogram (counting loop)")
    em.pre(f"k31::Histogram<{cexpr.tag(x.type.dtype)}>({out}, {em.n(x)}, {x.type.shape[0]}, {op.attrs['bins']});")


def topk(em, op):
    x = op.operands[0]
    vals, idx = op.results
    L, n = x.type.shape[-1], op.attrs["n"]
    rows = x.type.numel // L
    ov, oi = em.define(vals), em.define(idx)
    em.note_scalar(op, "top-k selection")
    em.pre(f"k31::TopK<{cexpr.tag(x.type.dtype)}>({ov}, {oi}, {em.n(x)}, {rows}, {L}, {n});")


def take(em, op):
    x, i = op.operands
    r = op.result
    L, n = x.type.shape[-1], i.type.shape[-1]
    rows = r.type.numel // n
    out = em.define(r)
    em.note_scalar(op, "gather along the last axis")
    sx = L if x.type.numel > L else 0
    si = n if i.type.numel > n else 0
    em.pre(f"k31::Take({out}, {em.n(x)}, {em.n(i)}, {rows}, {L}, {n}, {sx}, {si});")


# ---------------------------------------------------------------- shape ops

def view(em, op):
    x = op.operands[0]
    r = op.result
    if em.is_tile(x):
        em.names[r.uid] = em.n(x)          # same bytes, another shape
        return
    out = em.define(r)
    _fill(em, out, r, em.n(x), r.type.numel)


def trans(em, op):
    x = op.operands[0]
    a, b = x.type.shape
    out = em.define(op.result)
    em.note_scalar(op, "transpose")
    em.pre(f"k31::Trans({out}, {em.n(x)}, {a}, {b});")


def broadcast(em, op):
    x = op.operands[0]
    r = op.result
    shape = r.type.shape
    if not em.is_tile(x):
        out = em.define(r)
        return _fill(em, out, r, em.n(x), r.type.numel)
    out = em.define(r)
    xs = (1,) * (len(shape) - len(x.type.shape)) + tuple(x.type.shape)
    L = shape[-1]
    isz = cexpr.itemsize(r.type.dtype)
    if xs[-1] == L and all(d == 1 for d in xs[:-1]) and (L * isz) % 32 == 0:
        rows = r.type.numel // L
        em.vector_ops.add("DataCopy")
        em.pre(f"for (int32_t row = 0; row < {rows}; ++row) AscendC::DataCopy({out}[row * {L}], {em.n(x)}, {L});")
        return
    em.scalar_unit.add("broadcast")
    em.pre("// scalar unit: broadcast lane by lane")
    em.pre(f"k31::Map1<{cexpr.tag(r.type.dtype)}, {cexpr.tag(x.type.dtype)}>({out}, {em.n(x)}, {sh4(shape)}, "
           f"{strides4(x.type.shape, shape)}, [=]({em.C(x)} v) -> {em.C(x)} {{ return v; }});")


def cat(em, op):
    a, b = op.operands
    r = op.result
    L = a.type.shape[0]
    out = em.define(r)
    if (L * cexpr.itemsize(a.type.dtype)) % 32 == 0:
        em.pre(f"AscendC::DataCopy({out}, {em.n(a)}, {L});")
        em.pre(f"AscendC::DataCopy({out}[{L}], {em.n(b)}, {L});")
        return
    em.note_scalar(op, "concatenation of sub-block tiles")
    em.pre(f"k31::Copy({out}, {em.n(a)}, {L});")
    em.pre(f"{{ auto hi = {out}[{L}]; k31::Copy(hi, {em.n(b)}, {L}); }}")


RULES = {"const": const, "dim": dim, "arange": arange, "full": full, "where": where, "cast": cast,
         "bitcast": bitcast, "sum": reduce, "max": reduce, "min": reduce, "cumsum": cumsum, "histogram": histogram,
         "topk": topk, "take": take, "expand": view, "reshape": view, "trans": trans,
         "broadcast": broadcast, "cat": cat}
for _n in ("add", "sub", "mul", "div", "floordiv", "mod", "maximum", "minimum", "and", "or", "xor",
           "shl", "shr", *CMP):
    RULES[_n] = binary
for _n in ("neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sigmoid", "softplus", "relu",
           "not", "floor", "ceil"):
    RULES[_n] = unary

"""Per-thread instructions: moves, loads and stores, integer and float arithmetic, compares, conversions."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .parse import Instr
from .values import (NUMPY, UINT, WIDTH, Unsupported, bf16_type, dests, gather, imm, is_float, is_reg, is_signed,
                     scatter, to_bits, to_typed)

if TYPE_CHECKING:
    from .machine import _CTA


def shared_space(parts: list[str]) -> bool:
    return any(p.startswith("shared") for p in parts)             # .shared, .shared::cta


def instr_type(ins: Instr) -> str:
    return ins.parts[-1]


def _mov(cta: _CTA, ins: Instr):
    ty = instr_type(ins)
    dst, src = ins.args
    if src.startswith("{"):                       # pack registers, lowest first
        parts = dests(src)
        w = WIDTH[ty] // len(parts)
        out = np.zeros(cta.n, np.uint64)
        for i, p in enumerate(parts):
            out |= (cta.bits(p) & np.uint64((1 << w) - 1)) << np.uint64(i * w)
        cta.set(dst, out, "b64")
        return
    if dst.startswith("{"):                       # unpack
        parts = dests(dst)
        w = WIDTH[ty] // len(parts)
        b = cta.bits(src)
        for i, p in enumerate(parts):
            cta.set(p, (b >> np.uint64(i * w)) & np.uint64((1 << w) - 1), "b64")
        return
    if ty == "pred":
        cta.set(dst, cta.val(src, "pred"), "pred")
    else:
        cta.set(dst, cta.val(src, ty), ty)


def _ld(cta: _CTA, ins: Instr):
    parts, ty = ins.parts, instr_type(ins)
    dst, addr = ins.args[0], ins.args[1]
    if "param" in parts:
        name = addr.strip()[1:-1].strip()
        cta.set(dst, np.full(cta.n, cta.params[name] & ((1 << 64) - 1), np.uint64), "b64")
        return
    size = WIDTH[ty] // 8
    regs = dests(dst)
    base = cta.address(addr)
    act = cta.active
    for i, d in enumerate(regs):
        where = base[act] + i * size
        if shared_space(parts):
            cta.touch_shared(where, size, np.nonzero(act)[0], False, ins.op)
            got = gather(cta.shared, where, size)
        elif "global" in parts or "const" not in parts:
            got = cta.memory.read(where.astype(np.uint64), size)
        else:
            raise Unsupported("ld from this state space")
        full = np.zeros(cta.n, np.uint64)
        full[act] = got
        if ty.startswith("s") and size < 8:       # sign-extend into the register
            full = to_typed(full, ty).astype(np.int64).view(np.uint64)
        cta.set(d, full, "b64")


def _st(cta: _CTA, ins: Instr):
    parts, ty = ins.parts, instr_type(ins)
    addr, src = ins.args[0], ins.args[1]
    size = WIDTH[ty] // 8
    base = cta.address(addr)
    act = cta.active
    for i, s in enumerate(dests(src)):
        where = base[act] + i * size
        vals = (cta.bits(s) if is_reg(s) else to_bits(imm(s, ty, cta.n), ty))[act]
        if shared_space(parts):
            cta.touch_shared(where, size, np.nonzero(act)[0], True, ins.op, vals)
            scatter(cta.shared, where, size, vals)
        elif "global" in parts:
            cta.memory.write(where.astype(np.uint64), size, vals)
        else:
            raise Unsupported("st to this state space")


def half_val(cta: _CTA, tok: str, ty: str, half: int) -> np.ndarray:
    """Half `half` (0: the low bits) of a packed x2 operand, as `ty` (a register or a literal)."""
    if is_reg(tok):
        return to_typed(cta.bits(tok) >> np.uint64(half * WIDTH[ty]), ty)
    return imm(tok, ty, cta.n)


def _arith(cta: _CTA, ins: Instr):
    head, ty, mods = ins.parts[0], instr_type(ins), ins.parts[1:-1]
    if ty.endswith("x2"):                          # packed pairs: each half on its own
        one = ty[:-2]
        w = WIDTH[one]
        out = np.zeros(cta.n, np.uint64)
        for half in range(2):
            a = [half_val(cta, x, one, half) for x in ins.args[1:]]
            got = _float_arith(head, mods, one, a) if is_float(one) else _int_arith(head, mods, one, a)
            out |= to_bits(got, one) << np.uint64(half * w)
        cta.set(ins.args[0], out, "b64")
        return
    a = [cta.val(x, ty) for x in ins.args[1:]]
    if "wide" in mods and head == "mad":          # the addend has the product's width
        a[2] = cta.val(ins.args[3], ty[0] + str(2 * WIDTH[ty]))
    if ty in ("f32", "f64", "f16", "bf16"):
        out = _float_arith(head, mods, ty, a)
    else:
        out = _int_arith(head, mods, ty, a)
        if "wide" in mods:
            cta.set(ins.args[0], out, ty[0] + str(2 * WIDTH[ty]))
            return
    cta.set(ins.args[0], out, ty)


def _fma(a, b, c, ty):
    if ty == "f64":
        wide = getattr(np, "float128", np.longdouble)
        return (a.astype(wide) * b.astype(wide) + c.astype(wide)).astype(np.float64)
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(a.dtype)


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """.ftz on f32: subnormal inputs and results become zeros of their sign."""
    if x.dtype != np.float32:
        return x
    return np.where(np.abs(x) < np.float32(2.0 ** -126), np.copysign(np.float32(0), x), x).astype(np.float32)


def _float_arith(head, mods, ty, a):
    if "ftz" in mods:
        return flush_subnormals(_float_arith(head, [m for m in mods if m != "ftz"], ty,
                                             [flush_subnormals(x) for x in a]))
    calc = ty
    if ty in ("f16", "bf16"):                   # exact in f32, then one rounding
        a = [x.astype(np.float32) for x in a]
        calc = "f32"
    nan_keep = "NaN" in mods
    if head == "add":
        out = a[0] + a[1]
    elif head == "sub":
        out = a[0] - a[1]
    elif head == "mul":
        out = a[0] * a[1]
    elif head in ("fma", "mad"):
        out = _fma(a[0], a[1], a[2], calc)
    elif head == "div":
        out = a[0] / a[1]
    elif head == "neg":
        out = -a[0]
    elif head == "abs":
        out = np.abs(a[0])
    elif head in ("min", "max"):
        f = np.fmin if head == "min" else np.fmax
        out = (np.minimum if head == "min" else np.maximum)(a[0], a[1]) if nan_keep else f(a[0], a[1])
        if not nan_keep:                         # -0 < +0 for PTX min / max
            both0 = (a[0] == 0) & (a[1] == 0)
            signed = np.signbit(a[0]) | np.signbit(a[1]) if head == "min" else np.signbit(a[0]) & np.signbit(a[1])
            out = np.where(both0, np.where(signed, -0.0, 0.0).astype(out.dtype), out)
    elif head == "rcp":
        out = 1 / a[0]
    elif head == "sqrt":
        out = np.sqrt(a[0])
    elif head == "rsqrt":
        out = 1 / np.sqrt(a[0])
    elif head == "ex2":
        out = np.exp2(a[0])
    elif head == "lg2":
        out = np.log2(a[0])
    elif head == "sin":
        out = np.sin(a[0])
    elif head == "cos":
        out = np.cos(a[0])
    elif head == "tanh":
        out = np.tanh(a[0])
    elif head == "copysign":                     # copysign.f32 d, a, b: |b| with a's sign
        out = np.copysign(a[1], a[0])
    else:
        raise Unsupported(f"float {head}")
    if "sat" in mods:
        out = np.clip(np.nan_to_num(out, nan=0.0), 0, 1)
    if "relu" in mods:                             # min / max.relu.{f16,bf16}: negatives to +0
        out = np.where(out < 0, 0, out)
    if ty in ("f16", "bf16"):
        return out.astype(np.float16 if ty == "f16" else bf16_type())
    return out.astype(NUMPY[calc])


def _int_arith(head, mods, ty, a):
    w = WIDTH[ty]
    big = [x.astype(object) if w == 64 else x.astype(np.int64) for x in a]
    mask = (1 << w) - 1
    if head in ("add", "sub"):
        out = big[0] + big[1] if head == "add" else big[0] - big[1]
        if "sat" in mods:
            info = np.iinfo(NUMPY[ty])
            out = np.clip(out, info.min, info.max)
    elif head in ("mul", "mad"):
        prod = big[0] * big[1]
        if "hi" in mods:
            prod = prod >> w if w < 64 else np.array([int(p) >> 64 for p in prod], dtype=object)
        out = prod + (big[2] if head == "mad" else 0)
        if "wide" in mods:
            return np.array([int(v) & ((1 << (2 * w)) - 1) for v in out], dtype=np.uint64) \
                .view(np.int64 if is_signed(ty) else np.uint64)
    elif head in ("div", "rem"):
        x, y = big
        safe = np.where(y == 0, 1, y)
        q = np.array([int(abs(int(p)) // abs(int(r))) * (1 if (p >= 0) == (r > 0) else -1)
                      for p, r in zip(x, safe)], dtype=object)
        out = q if head == "div" else x - q * safe
        out = np.where(y == 0, -1 if head == "div" else x, out)
    elif head == "neg":
        out = -big[0]
    elif head == "abs":
        out = np.abs(big[0])
    elif head in ("min", "max"):
        out = (np.minimum if head == "min" else np.maximum)(big[0], big[1])
        if "relu" in mods:                         # min / max.relu.s32: then max with 0
            out = np.maximum(out, 0)
    elif head in ("and", "or", "xor", "not"):
        out = {"and": lambda: big[0] & big[1], "or": lambda: big[0] | big[1],
               "xor": lambda: big[0] ^ big[1], "not": lambda: ~big[0]}[head]()
    elif head in ("popc", "clz", "brev"):
        u = [int(v) & mask for v in big[0]]
        if head == "popc":
            out = np.array([bin(v).count("1") for v in u], dtype=object)
        elif head == "clz":
            out = np.array([w - v.bit_length() for v in u], dtype=object)
        else:
            out = np.array([int(f"{v:0{w}b}"[::-1], 2) for v in u], dtype=object)
        return np.array([int(v) for v in out], dtype=np.uint32)
    else:
        raise Unsupported(f"integer {head}")
    return np.array([int(v) & mask for v in out], dtype=np.uint64).view(UINT[w]) \
        .view(NUMPY[ty]) if w == 64 else (np.asarray(out).astype(np.int64) & mask).astype(UINT[w]).view(NUMPY[ty])


def _logic(cta: _CTA, ins: Instr):
    ty = instr_type(ins)
    if ty != "pred":
        return _arith(cta, ins)
    a = [cta.val(x, "pred") for x in ins.args[1:]]
    out = {"and": lambda: a[0] & a[1], "or": lambda: a[0] | a[1], "xor": lambda: a[0] ^ a[1],
           "not": lambda: ~a[0]}[ins.parts[0]]()
    cta.set(ins.args[0], out, "pred")


def _shift(cta: _CTA, ins: Instr):
    ty = instr_type(ins)
    w = WIDTH[ty]
    a = cta.val(ins.args[1], ty)
    n = cta.val(ins.args[2], "u32").astype(np.int64)
    big = a.astype(np.int64) if w < 64 else a
    if ins.parts[0] == "shl":
        out = np.where(n >= w, 0, (a.astype(np.uint64) << np.minimum(n, w - 1).astype(np.uint64)))
        cta.set(ins.args[0], out.astype(np.uint64) & np.uint64((1 << w) - 1) if w < 64 else out, "b64")
        return
    if is_signed(ty):
        out = big >> np.minimum(n, w - 1).astype(big.dtype)
    else:
        u = a.astype(np.uint64)
        out = np.where(n >= w, 0, u >> np.minimum(n, w - 1).astype(np.uint64))
    cta.set(ins.args[0], np.asarray(out).astype(NUMPY[ty]), ty)


def _bfe(cta: _CTA, ins: Instr):
    ty = instr_type(ins)
    w = WIDTH[ty]
    pos = np.minimum(cta.val(ins.args[2], "u32").astype(np.int64) & 0xFF, w)
    ln = np.minimum(cta.val(ins.args[3], "u32").astype(np.int64) & 0xFF, w)
    ua = to_bits(cta.val(ins.args[1], ty), ty)
    out = np.zeros(cta.n, np.uint64)
    for i in range(cta.n):
        p, ll = int(pos[i]), int(ln[i])
        v = int(ua[i])
        field_ = (v >> p) & ((1 << ll) - 1) if p < w else 0
        if is_signed(ty):
            sbit = (v >> min(p + ll - 1, w - 1)) & 1 if ll else 0
            if sbit:
                field_ |= ((1 << w) - 1) ^ ((1 << ll) - 1)
        out[i] = field_ & ((1 << w) - 1)
    cta.set(ins.args[0], out, "b64")


def _bfi(cta: _CTA, ins: Instr):
    ty = instr_type(ins)
    w = WIDTH[ty]
    a, b = to_bits(cta.val(ins.args[1], ty), ty), to_bits(cta.val(ins.args[2], ty), ty)
    pos, ln = cta.val(ins.args[3], "u32"), cta.val(ins.args[4], "u32")
    out = np.zeros(cta.n, np.uint64)
    for i in range(cta.n):
        p, ll = int(pos[i]) & 0xFF, int(ln[i]) & 0xFF
        m = (((1 << ll) - 1) << p) & ((1 << w) - 1) if p < w else 0
        out[i] = (int(b[i]) & ~m | (int(a[i]) << p) & m) & ((1 << w) - 1)
    cta.set(ins.args[0], out, "b64")


def _prmt(cta: _CTA, ins: Instr):
    if len(ins.parts) > 2:
        raise Unsupported("prmt mode")
    a, b = cta.val(ins.args[1], "b32"), cta.val(ins.args[2], "b32")
    c = cta.val(ins.args[3], "b32")
    pool = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros(cta.n, np.uint64)
    for k in range(4):
        sel = (c.astype(np.uint64) >> np.uint64(4 * k)) & np.uint64(0xF)
        byte = (pool >> ((sel & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
        byte = np.where(sel & np.uint64(8), np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0)), byte)
        out |= byte << np.uint64(8 * k)
    cta.set(ins.args[0], out, "b64")


def _selp(cta: _CTA, ins: Instr):
    ty = instr_type(ins)
    a, b = cta.val(ins.args[1], ty), cta.val(ins.args[2], ty)
    cta.set(ins.args[0], np.where(cta.val(ins.args[3], "pred"), a, b), ty)


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}


def _compare(cmp: str, ty: str, a, b):
    if is_float(ty):
        a, b = a.astype(np.float64), b.astype(np.float64)
        nan = np.isnan(a) | np.isnan(b)
        if cmp == "num":
            return ~nan
        if cmp == "nan":
            return nan
        if cmp.endswith("u") and cmp[:-1] in _CMP:
            return _CMP[cmp[:-1]](a, b) | nan
        return _CMP[cmp](a, b) & ~nan
    if cmp in ("lo", "ls", "hi", "hs") or not is_signed(ty):
        a, b = a.astype(np.uint64), b.astype(np.uint64)
    return _CMP[cmp](a, b)


def _setp(cta: _CTA, ins: Instr):
    parts, ty = ins.parts, instr_type(ins)
    cmp = parts[1]
    dests = ins.args[0].split("|")
    if ty.endswith("x2"):                          # p from the low halves, q from the high halves
        one = ty[:-2]
        for half, dst in enumerate(dests):
            x, y = (half_val(cta, a, one, half) for a in ins.args[1:3])
            got = _compare(cmp, one, x, y)
            if len(ins.args) > 3:
                f = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[parts[2]]
                got = f(got, cta.val(ins.args[3], "pred"))
            cta.set(dst, got, "pred")
        return
    x, y = cta.val(ins.args[1], ty), cta.val(ins.args[2], ty)
    if "ftz" in parts:
        x, y = flush_subnormals(x), flush_subnormals(y)
    got = _compare(cmp, ty, x, y)
    combine = next((p for p in parts[2:-1] if p in ("and", "or", "xor")), None)
    if combine:
        c = cta.val(ins.args[3], "pred")
        f = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[combine]
        cta.set(dests[0], f(got, c), "pred")
        if len(dests) > 1:
            cta.set(dests[1], f(~got, c), "pred")
        return
    cta.set(dests[0], got, "pred")
    if len(dests) > 1:
        cta.set(dests[1], ~got, "pred")


_ROUND_INT = {"rzi": np.trunc, "rni": np.rint, "rmi": np.floor, "rpi": np.ceil}


def _fp8(name):
    import ml_dtypes
    return {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[name]


def _cvt(cta: _CTA, ins: Instr):
    parts = ins.parts
    dty, aty, mods = parts[-2], parts[-1], parts[1:-2]
    if dty in ("e4m3x2", "e5m2x2"):              # two f32 -> two fp8 codes: d.hi = a, d.lo = b
        if aty != "f32" or "satfinite" not in mods:
            raise Unsupported(f"fp8 cvt {ins.op}")
        f8 = _fp8(dty[:4])
        limit = 448.0 if dty.startswith("e4m3") else 57344.0
        codes = []
        for x in ins.args[1:3]:
            v = cta.val(x, "f32")
            v = np.where(np.isnan(v), v, np.clip(v, -limit, limit)).astype(np.float32)
            code = v.astype(f8).view(np.uint8)
            codes.append(np.where(np.isnan(v), 0x7F, code).astype(np.uint64))      # one NaN code
        cta.set(ins.args[0], (codes[0] << np.uint64(8)) | codes[1], "b64")
        return
    if aty in ("e4m3x2", "e5m2x2"):              # two fp8 codes -> f16x2
        src = to_bits(cta.val(ins.args[1], "b16"), "b16")
        f8 = _fp8(aty[:4])
        lo = (src & np.uint64(0xFF)).astype(np.uint8).view(f8).astype(np.float32)
        hi = (src >> np.uint64(8)).astype(np.uint8).view(f8).astype(np.float32)
        if dty != "f16x2":
            raise Unsupported(f"cvt {ins.op}")
        out = to_bits(lo.astype(np.float16), "f16") | (to_bits(hi.astype(np.float16), "f16") << np.uint64(16))
        cta.set(ins.args[0], out, "b64")
        return
    if dty in ("f16x2", "bf16x2"):               # d.hi = a, d.lo = b
        one = "f16" if dty == "f16x2" else "bf16"
        hi, lo = (to_bits(_tois_float(cta.val(x, aty), one, mods), one) for x in ins.args[1:3])
        cta.set(ins.args[0], lo | (hi << np.uint64(16)), "b64")
        return
    a = cta.val(ins.args[1], aty)
    if "ftz" in mods:
        a = flush_subnormals(a)
    if is_float(dty):
        if is_float(aty):
            a = a.astype(np.float64)
            irnd = next((m for m in mods if m in _ROUND_INT), None)
            if irnd:
                a = _ROUND_INT[irnd](a)
        cta.set(ins.args[0], _tois_float(a, dty, mods), dty)
        return
    info = np.iinfo(NUMPY[dty])
    if is_float(aty):
        irnd = next((m for m in mods if m in _ROUND_INT), None)
        if irnd is None:
            raise Unsupported(f"float-to-int cvt without rounding: {ins.op}")
        f = _ROUND_INT[irnd](a.astype(np.float64))
        vals = [0 if np.isnan(v) else int(min(max(v, info.min), info.max)) for v in f]
    else:
        vals = [int(v) for v in a]
        if "sat" in mods:
            vals = [min(max(v, info.min), info.max) for v in vals]
    w = WIDTH[dty]
    wrapped = [v & ((1 << w) - 1) for v in vals]
    if is_signed(dty):                               # sign-extended to the register (8-bit types
        wrapped = [v - (1 << w) if v >> (w - 1) else v for v in wrapped]   # in 16-bit registers)
    cta.set(ins.args[0], np.array([v & ((1 << 64) - 1) for v in wrapped], dtype=np.uint64), "b64")


def _tois_float(a, dty, mods):
    if not any(m in mods for m in ("rn", "rzi", "rni", "rmi", "rpi")) and a.dtype.kind in "iu" and dty != "f64":
        raise Unsupported("int-to-float cvt without .rn")
    if any(m in mods for m in ("rz", "rm", "rp")):
        raise Unsupported(f"cvt rounding {mods}")
    if dty == "bf16":
        out = np.asarray(a).astype(np.float32).astype(bf16_type()) if a.dtype != np.float64 else \
            np.asarray(a).astype(bf16_type())
    else:
        out = np.asarray(a).astype(NUMPY[dty])
    if "satfinite" in mods:
        big = float(np.finfo(np.float16).max) if dty == "f16" else float(_bf16_max()) if dty == "bf16" else None
        if big is not None:
            out = np.where(np.isinf(out), np.copysign(big, out.astype(np.float32)), out).astype(out.dtype)
    if "sat" in mods:
        out = np.clip(np.nan_to_num(out.astype(np.float64), nan=0.0), 0, 1).astype(out.dtype)
    return out


def _bf16_max():
    import ml_dtypes
    return ml_dtypes.finfo(ml_dtypes.bfloat16).max


def _cp_async(cta: _CTA, ins: Instr):
    """cp.async.{ca,cg}.shared.global [dst], [src], size{, src-size}{, policy}: the first src-size
    bytes from global memory, zeros after them. Done at issue: the groups' commit / wait only
    order it, and a program may read the bytes only after its wait and a barrier."""
    parts, args = ins.parts, ins.args
    if {"commit_group", "wait_group", "wait_all"} & set(parts):
        return
    if "bulk" in parts:
        raise Unsupported(f"instruction {ins.op}")
    dst, src = cta.address(args[0]), cta.address(args[1])
    size = int(args[2], 0)
    extra = args[3:-1] if any(p.startswith("L2::cache_hint") for p in parts) else args[3:]
    act = np.nonzero(cta.active)[0]
    if not extra:
        src_size = np.full(cta.n, size)
    elif extra[0].startswith(("%p", "!%p")):      # ignore-src: zeros when set
        src_size = np.where(cta.val(extra[0], "pred"), 0, size)
    else:
        src_size = np.minimum(cta.val(extra[0], "u32").astype(np.int64), size)
    for b in range(size):
        lanes = act[src_size[act] > b]
        byte = np.zeros(cta.n, np.uint64)
        byte[lanes] = cta.memory.read((src[lanes] + b).astype(np.uint64), 1)
        cta.touch_shared(dst[act] + b, 1, act, True, ins.op, byte[act])
        scatter(cta.shared, dst[act] + b, 1, byte[act])


def _const_zero(cta: _CTA, ins: Instr):
    cta.set(ins.args[0], np.zeros(cta.n, np.uint64), "b64")


SCALAR_OPS = {"mov": _mov, "ld": _ld, "st": _st, "add": _arith, "sub": _arith, "mul": _arith, "mad": _arith,
              "fma": _arith, "div": _arith, "rem": _arith, "neg": _arith, "abs": _arith, "min": _arith,
              "max": _arith, "rcp": _arith, "sqrt": _arith, "rsqrt": _arith, "ex2": _arith, "lg2": _arith,
              "sin": _arith, "cos": _arith, "tanh": _arith, "copysign": _arith, "popc": _arith, "clz": _arith,
              "brev": _arith, "and": _logic, "or": _logic, "xor": _logic, "not": _logic, "shl": _shift,
              "shr": _shift, "bfe": _bfe, "bfi": _bfi, "prmt": _prmt, "selp": _selp, "setp": _setp, "cvt": _cvt,
              "createpolicy": _const_zero, "cp": _cp_async}

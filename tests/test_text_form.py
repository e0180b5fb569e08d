"""The `.k31` text form: print -> parse -> print is identical, parsed IR verifies and runs on the
numpy target exactly like the original, and bad text gives K31Error with file:line:col.

The kernels below together use every op of dsl/ir.py (a test checks that they do)."""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import k31dsl as k
from k31dsl.dsl.errors import K31Error, Loc
from k31dsl.dsl.ir import BINARY, COMPARE, REDUCE, UNARY, all_ops
from k31dsl.dsl.parse import parse_file, parse_kernel
from k31dsl.dsl.text import print_kernel
from k31dsl.dsl.verify import verify
from k31dsl.targets import runtime
from k31dsl.targets.numpy.emit import emit


# ---------------------------------------------------------------- kernels covering every op

@k.func
def soft_clip(v, lim):
    return lim * (2.0 * k.sigmoid(v / lim) - 1.0)


@k.kernel
def float_math(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], out: k.Tensor[k.f32, "R", "N"],
               B: k.constexpr = 16):
    for i in k.grid(k.cdiv(x.shape[0], B)):
        a = x[k.span(i * B, B, other=1.0)]
        b = y[k.span(i * B, B, other=2.0)]
        flags = ((a < b).to(k.f32) + (a <= b).to(k.f32) * 2.0 + (a > b).to(k.f32) * 4.0
                 + (a >= b).to(k.f32) * 8.0 + (a == b).to(k.f32) * 16.0 + (a != b).to(k.f32) * 32.0)
        rows = (k.exp(a), k.exp2(a), k.log(k.abs(a) + 1.0), k.log2(k.abs(a) + 1.0), k.sqrt(k.abs(a)),
                k.rsqrt(k.abs(a) + 1.0), k.sigmoid(a), k.softplus(a), k.relu(a), k.floor(a), k.ceil(a),
                -a, a - b, a * b, a / b, k.maximum(a, b), k.minimum(a, b), k.where(a < b, a, b), flags,
                a ** 3, soft_clip(a, 2.5))
        for r in k.static_range(len(rows)):
            out[r, k.span(i * B, B)] = rows[r]


@k.kernel
def int_math(a: k.Tensor[k.i32, "N"], b: k.Tensor[k.i32, "N"], out: k.Tensor[k.i32, "R", "N"],
             B: k.constexpr = 16):
    for i in k.grid(k.cdiv(a.shape[0], B)):
        p = a[k.span(i * B, B, other=0)]
        q = b[k.span(i * B, B, other=1)]
        rows = (p // q, p % q, p & q, p | q, p ^ q, p << 2, p >> 1, ~p, k.abs(p), k.maximum(p, q),
                k.minimum(p, q), p - q, p * q + 7, ((p < q) & (q > 3)).to(k.i32),
                k.histogram(p & (B - 1), B, mask=q > 2))
        for r in k.static_range(len(rows)):
            out[r, k.span(i * B, B)] = rows[r]


@k.kernel
def memory(x: k.Tensor[k.f32, "M", "N"], rows: k.Tensor[k.i32, "G"], g_out: k.Tensor[k.f32, "G", "N"],
           o_inf: k.Tensor[k.f32, "M", "N"], o_neg: k.Tensor[k.f32, "M", "N"], o_nan: k.Tensor[k.f32, "M", "N"],
           first: k.Tensor[k.f32, "M", "NB"], scat: k.Tensor[k.f32, "M", "N"],
           BG: k.constexpr = 4, BN: k.constexpr = 8):
    for gb, nb in k.grid(k.cdiv(rows.shape[0], BG), k.cdiv(x.shape[1], BN)):
        r = rows[k.span(gb * BG, BG, other=0)]
        rmask = gb * BG + k.arange(BG) < rows.shape[0]
        cols = nb * BN + k.arange(BN)
        # a gather on axis 0, a span on axis 1, a 2-D mask, stored back through a span + mask
        g = k.load(x, (r, k.span(nb * BN, BN)), mask=rmask[:, None], other=0.0)
        k.store(g_out, (k.span(gb * BG, BG), k.span(nb * BN, BN)), g, mask=rmask[:, None])
        # out-of-bounds fills of each special float, scalar-row loads and stores
        for m in range(gb, x.shape[0], 1000):
            o_inf[m, k.span(nb * BN, BN)] = x[m, k.span(nb * BN, BN, other=float("inf"))]
            o_neg[m, k.span(nb * BN, BN)] = k.load(x, (m, k.span(nb * BN, BN)), other=float("-inf"))
            nan_row = k.load(x, (m, cols), mask=cols < x.shape[1] - 1, other=float("nan"))
            o_nan[m, k.span(nb * BN, BN)] = nan_row
            first[m, nb] = x[m, nb * BN]
            # a gather-indexed store with a mask: reversed lanes of the block
            k.store(scat, (m, nb * BN + BN - 1 - k.arange(BN)), nan_row, mask=cols < x.shape[1])


@k.kernel
def loops(x: k.Tensor[k.f32, "M", "N"], total: k.Tensor[k.f32, "M"], count: k.Tensor[k.i32, "M"],
          trace: k.Tensor[k.f32, "M", "J"], B: k.constexpr = 8):
    for m in k.grid(x.shape[0]):
        acc = k.zeros((B,), k.f32)
        best = float("-inf")
        n = 0
        for j in range(k.cdiv(x.shape[1], B)):
            t = x[m, k.span(j * B, B, other=0.0)]
            acc += t
            best = k.maximum(best, k.max(x[m, k.span(j * B, B, other=float("-inf"))]))
            for rep in range(1, j + 2, 2):          # nested loop, carries n through both
                n += rep
            trace[m, j] = k.sum(acc)
        total[m] = k.sum(acc) * 0.5 + best
        count[m] = n
        for j in range(0, trace.shape[1] - k.cdiv(x.shape[1], B)):   # a loop carrying nothing
            trace[m, j + k.cdiv(x.shape[1], B)] = best


@k.kernel
def tiles(x: k.Tensor[k.f32, "M", "K"], w: k.Tensor[k.f32, "K", "N"], prod: k.Tensor[k.f32, "M", "N"],
          vals: k.Tensor[k.f32, "M", "T"], pos: k.Tensor[k.i32, "M", "T"], picked: k.Tensor[k.f32, "M", "T"],
          csum: k.Tensor[k.f32, "M", "N"], joined: k.Tensor[k.f32, "M", "N2"], stats: k.Tensor[k.f32, "S", "N"],
          BM: k.constexpr = 4, BK: k.constexpr = 8, BN: k.constexpr = 8, TOP: k.constexpr = 3):
    for mb in k.grid(k.cdiv(x.shape[0], BM)):
        a = x[k.span(mb * BM, BM, other=0.0), k.span(0, BK, other=0.0)]
        b = w[k.span(0, BK, other=0.0), k.span(0, BN, other=0.0)]
        c = k.dot(a, b) + k.dot(b.T, a.T, precision="tf32").T * 0.5
        c = k.reshape(k.reshape(c, (BM * BN,)), (BM, BN)) + k.broadcast_to(k.sum(a, axis=1)[:, None], (BM, BN))
        prod[k.span(mb * BM, BM), k.span(0, BN)] = c
        v, p = k.topk(c, TOP)
        vals[k.span(mb * BM, BM), k.span(0, TOP)] = v
        pos[k.span(mb * BM, BM), k.span(0, TOP)] = p
        picked[k.span(mb * BM, BM), k.span(0, TOP)] = k.take(c, p) - v
        csum[k.span(mb * BM, BM), k.span(0, BN)] = k.cumsum(c, axis=1, reverse=True)
        top_i, top_p = k.topk(k.max(c, axis=1).to(k.i32), 2)
        joined[mb, k.span(0, 2 * BN)] = k.cat(k.min(c, axis=0), k.max(c, axis=0)) + (k.sum(top_p) + k.sum(top_i)).to(k.f32)
        stats[mb, k.span(0, BN)] = k.sum(k.full((BM, BN), 0.5) * c, axis=0) + k.max(c) - k.min(c)


@k.kernel
def casts(x: k.Tensor[k.f32, "N"], q43: k.Tensor[k.f8e4m3, "N"], q52: k.Tensor[k.f8e5m2, "N"],
          scale: k.Tensor[k.e8m0, "NB"], ebits: k.Tensor[k.e8m0, "NB"], half: k.Tensor[k.bf16, "N"],
          bits: k.Tensor[k.i32, "N"], back: k.Tensor[k.f32, "N"], B: k.constexpr = 16):
    for i in k.grid(k.cdiv(x.shape[0], B)):
        v = x[k.span(i * B, B, other=0.0)]
        q43[k.span(i * B, B)] = v.to(k.f8e4m3)
        q52[k.span(i * B, B)] = k.cast(v, k.f8e5m2)
        amax = k.max(k.abs(v))
        scale[i] = amax.to(k.e8m0)
        ebits[i] = ((amax.bitcast(k.i32) >> 23) & 255).to(k.u8).bitcast(k.e8m0)
        half[k.span(i * B, B)] = v.to(k.bf16)
        bits[k.span(i * B, B)] = k.bitcast(v, k.i32)
        back[k.span(i * B, B)] = v.to(k.f8e4m3).to(k.f32) + amax.to(k.e8m0).to(k.f32) * 0.001


@k.kernel(configs=[{"B": 8}, {"B": 32}])
def variants(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], a: k.f32, n_prog: k.i32, B: k.constexpr,
             DT: k.constexpr = k.bf16, DOUBLE: k.constexpr = False, TAG: k.constexpr = 'say "hi"\n\tbye\\'):
    for i in k.grid(n_prog):
        v = x[k.span(i * B, B, other=0.0)].to(DT).to(k.f32) * a
        if DOUBLE:
            v = v * 2.0
        größe = soft_clip(v, 4.0)                  # a non-ASCII name prints and parses
        y[k.span(i * B, B)] = größe


# ---------------------------------------------------------------- inputs per kernel

def _args(name: str, rng: np.random.Generator, kern) -> list:
    f32 = np.float32
    if name == "float_math":
        n = 37
        return [rng.standard_normal(n).astype(f32), rng.standard_normal(n).astype(f32) + 0.5,
                np.zeros((21, n), f32)]
    if name == "int_math":
        n = 29
        return [rng.integers(-50, 50, n, dtype=np.int32), rng.integers(1, 9, n, dtype=np.int32),
                np.zeros((15, n), np.int32)]
    if name == "memory":
        m, n, g = 5, 19, 6
        return [rng.standard_normal((m, n)).astype(f32), rng.integers(0, m, g, dtype=np.int32),
                np.zeros((g, n), f32), np.zeros((m, n), f32), np.zeros((m, n), f32), np.zeros((m, n), f32),
                np.zeros((m, 3), f32), np.zeros((m, n), f32)]
    if name == "loops":
        m, n = 3, 21
        return [rng.standard_normal((m, n)).astype(f32), np.zeros(m, f32), np.zeros(m, np.int32),
                np.zeros((m, 5), f32)]
    if name == "tiles":
        m = 7
        return [rng.standard_normal((m, 8)).astype(f32), rng.standard_normal((8, 8)).astype(f32),
                np.zeros((m, 8), f32), np.zeros((m, 3), f32), np.zeros((m, 3), np.int32), np.zeros((m, 3), f32),
                np.zeros((m, 8), f32), np.zeros((2, 16), f32), np.zeros((2, 8), f32)]
    if name == "casts":
        n = 40
        x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(f32)
        nb = -(-n // 16)
        return [x, np.zeros(n, ml_dtypes.float8_e4m3fn), np.zeros(n, ml_dtypes.float8_e5m2),
                np.zeros(nb, ml_dtypes.float8_e8m0fnu), np.zeros(nb, ml_dtypes.float8_e8m0fnu),
                np.zeros(n, ml_dtypes.bfloat16), np.zeros(n, np.int32), np.zeros(n, f32)]
    if name == "variants":
        n, b = 45, kern.constexprs["B"]
        return [rng.standard_normal(n).astype(f32) * 3, np.zeros(n, f32), float(rng.uniform(0.5, 2)), -(-n // b)]
    raise KeyError(name)


KERNELS = {"float_math": float_math, "int_math": int_math, "memory": memory, "loops": loops,
           "tiles": tiles, "casts": casts, "variants": variants}
# (kernel name, constexpr overrides): several specialisations of the constexpr-driven kernels
CASES = [(n, {}) for n in KERNELS] + [
    ("variants", {"B": 32}), ("variants", {"B": 16, "DT": k.f16, "DOUBLE": True, "TAG": ""}),
    ("float_math", {"B": 8}), ("tiles", {"BM": 2, "TOP": 5}),
]


def _ir(name, cx):
    return KERNELS[name].ir(**cx)


def _round_trip(kern):
    text = print_kernel(kern)
    parsed = parse_kernel(text, "<round-trip>")
    again = print_kernel(parsed)
    assert again == text, "print(parse(print(ir))) differs from print(ir)"
    verify(kern)
    verify(parsed)
    return parsed


def _same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name,cx", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_round_trip_and_run(name, cx):
    kern = _ir(name, cx)
    parsed = _round_trip(kern)
    # the same IR emits the same program ...
    assert emit(parsed) == emit(kern)
    # ... and runs to the same bits (NaN lanes included) on fresh inputs
    rng = np.random.default_rng()
    args = _args(name, rng, kern)
    args2 = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    zero_before = [isinstance(a, np.ndarray) and not np.any(np.asarray(a, np.float64) != 0) for a in args]
    rt = runtime("numpy")
    rt.build(kern)(*args)
    rt.build(parsed)(*args2)
    for i, (a, b) in enumerate(zip(args, args2)):
        if isinstance(a, np.ndarray):
            assert _same_bits(a, b), f"{name}: argument {i} differs between original and parsed IR"
    # the outputs (the arrays that start as zeros) got written
    written = [a for a, z in zip(args, zero_before) if z and np.any(np.asarray(a, np.float64) != 0)]
    assert written, f"{name}: the kernel wrote nothing"


def test_every_op_is_covered():
    from k31dsl.dsl.infer import RULES as TYPE_RULES
    seen = set()
    for name, cx in CASES:
        kern = _ir(name, cx)
        seen |= {op.name for op in all_ops(kern)}
    assert set(TYPE_RULES) - seen == set(), f"ops no test kernel uses: {sorted(set(TYPE_RULES) - seen)}"
    assert BINARY | COMPARE | UNARY | REDUCE <= seen


def test_parsed_values_and_attrs():
    text = print_kernel(memory.ir())
    kern = parse_kernel(text, "<t>")
    others = [op.attrs["other"] for op in all_ops(kern) if op.name == "load"]
    assert math.inf in others and -math.inf in others and any(isinstance(o, float) and math.isnan(o) for o in others)
    kinds = {kind for op in all_ops(kern) if op.name in ("load", "store") for kind in op.attrs["index"]}
    assert kinds == {"scalar", "gather", "span:4", "span:8"}
    assert all(op.loc.file == memory.file and op.loc.line > memory.first_line for op in all_ops(kern))
    assert kern.loc == memory.ir().loc and kern.loc.line == memory.first_line + 1
    ps = {p.name: p.value.type for p in kern.params}
    assert str(ps["x"]) == 'tensor<f32>["M", "N"]' and ps["rows"].dims == ("G",)
    cx = parse_kernel(print_kernel(variants.ir(DT=k.f16, DOUBLE=True)), "<t>").constexprs
    assert cx == {"B": 8, "DT": k.f16, "DOUBLE": True, "TAG": 'say "hi"\n\tbye\\'}
    assert cx["DT"] is k.f16 and isinstance(cx["B"], int) and cx["DOUBLE"] is True


def test_foreign_file_locations_round_trip():
    kern = variants.ir()
    moved = [op for op in all_ops(kern) if op.name == "sigmoid"]
    assert moved
    for op in moved:
        op.loc = Loc("/elsewhere/helpers.py", 3, 11)
    text = print_kernel(kern)
    assert '@"/elsewhere/helpers.py":3:11' in text
    parsed = parse_kernel(text)
    assert [op.loc for op in all_ops(parsed) if op.name == "sigmoid"] == [Loc("/elsewhere/helpers.py", 3, 11)] * len(moved)
    assert print_kernel(parsed) == text


def test_parse_file(tmp_path):
    path = tmp_path / "loops.k31"
    path.write_text(print_kernel(loops.ir()))
    kern = parse_file(path)
    assert print_kernel(kern) == path.read_text()
    with pytest.raises(K31Error, match="cannot read"):
        parse_file(tmp_path / "missing.k31")


# ---------------------------------------------------------------- errors

def _text_with(old: str, new: str, kern=None) -> str:
    text = print_kernel(kern or loops.ir())
    assert old in text
    return text.replace(old, new, 1)


def _where(text: str, needle: str) -> tuple[int, int]:
    for n, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return n, line.index(needle)
    raise AssertionError(needle)


@pytest.mark.parametrize("old,new,needle,shift,expect", [
    ("{axis = 0}", "{axis = 0", ": i32", 0, "expected one of `,`, `}`"),   # unclosed attribute dict
    (" : i32 @", " : i32 @@", "@@", 1, "unexpected '@'"),                  # doubled token
    ("param %x", "param x", "x :", 0, "expected a value name"),            # a param needs a %name
    ("= dim(", "= dim(%x,, ", ",, ", 1, "unexpected ','"),
    ("axis = 0", "axis = $", "$", 0, "unexpected character '$'"),
])
def test_syntax_errors_name_line_and_column(old, new, needle, shift, expect):
    text = _text_with(old, new)
    line, col = _where(text, needle)
    with pytest.raises(K31Error) as ei:
        parse_kernel(text, "bad.k31")
    err = ei.value
    assert expect in err.message
    assert (err.loc.file, err.loc.line, err.loc.col) == ("bad.k31", line, col + shift)
    assert str(err).startswith(f"bad.k31:{line}:{col + shift}: syntax error")
    assert "^" in str(err)         # the caret excerpt of the offending line


def test_text_ending_early():
    text = print_kernel(loops.ir())
    cut = text[: text.index("host {") + len("host {")]
    with pytest.raises(K31Error, match=r"ends early; expected") as ei:
        parse_kernel(cut, "cut.k31")
    assert ei.value.loc.line == cut.count("\n") + 1


@pytest.mark.parametrize("old,new,needle,message", [
    ("f32[8]", "f33[8]", "f33", "unknown dtype `f33`"),
    ("{dtype = f32", "{dtype = float32", "float32", "unknown attribute value"),
    ("%0 = dim(%x)", "%0 = dim(%nope)", "%nope", "not defined anywhere"),
    ("%acc = full()", "%x = full()", "%x = full", "defined twice"),
    (" : f32[8] @", " @", "%acc = full", "1 result name(s) but 0 result type(s)"),
    ('"scalar"', '"sc\\q"', '"sc\\q"', "unknown escape"),
])
def test_semantic_text_errors(old, new, needle, message):
    text = _text_with(old, new)
    line, col = _where(text, needle)
    with pytest.raises(K31Error, match=re.escape(message)) as ei:
        parse_kernel(text, "bad.k31")
    assert (ei.value.loc.line, ei.value.loc.col) == (line, col)


def test_parsed_bad_ir_is_left_to_the_verifier():
    # moving a definition below its use still parses (every name is defined somewhere) and the
    # verifier reports it (naming values as print_kernel of the parsed IR does)
    lines = print_kernel(loops.ir()).splitlines()
    acc = lines.pop(next(i for i, line in enumerate(lines) if "%acc = full()" in line))
    lines.insert(len(lines) - 2, acc)          # last op of the grid body
    kern = parse_kernel("\n".join(lines) + "\n")
    with pytest.raises(K31Error, match=r"\[dominance\] operand 3 of `for` \(%acc(\.\d+)?\) is used before its definition"):
        verify(kern)


# ---------------------------------------------------------------- the op library

def _library_kernels():
    from k31dsl.ops.registry import all_ops as library
    specs = library()
    out = []
    for spec in specs.values():
        for kdef in spec.kernels:
            variants_ = [{}] + [dict(c) for c in kdef.configs]
            for cx in variants_:
                out.append((f"{spec.name}/{kdef.name}/{cx}", kdef, cx))
    assert out, "the op library registers no kernels"
    return out


def test_op_library_round_trips():
    for label, kdef, cx in _library_kernels():
        kern = kdef.ir(**cx)
        parsed = _round_trip(kern)
        assert emit(parsed) == emit(kern), label

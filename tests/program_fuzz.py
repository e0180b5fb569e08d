"""Random kernels for differential testing: each compiled target against the numpy reference.

A program is a random chain of tile ops over loaded inputs, written out as DSL source (so a
failure is a file a person can read, run and shrink). Every value carries whether the semantics
contract (dsl/ir.py, SEMANTICS) fixes its bits on every target:

  exact    loads, literals, IEEE + - * / and f32 sqrt, fmod, min / max, compares, where, floor / ceil,
           casts and bitcasts, integer math and integer sums, a loop of exact steps
  inexact  transcendentals, float sums and cumsums, dots, 16-bit sqrt: equal only up to rounding

Discontinuous ops (compares, floor / ceil, casts to an integer or fp8, //, %, shifts, bitcasts)
take exact operands only, so a last-bit difference never flips a branch; a division's denominator
is exact or kept >= 1. An output is compared bit for bit when exact, else within a tolerance by
dtype scaled to the output's largest finite value.

    python tests/program_fuzz.py --count 200 --targets triton,ascendc     # a long run
    python tests/program_fuzz.py --seed 1234 --show                        # one program's source
    env -u TRITON_INTERPRET python tests/program_fuzz.py --targets ptx     # the GPU's PTX, emulated

tests/test_random_programs.py runs a few per target in CI.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
from ptxemu import Unsupported as NotEmulated      # tests/ptxemu: the `ptx` target's emulator

FLOATS = ("f32", "bf16", "f16")
INTS = ("i32", "i8", "i64", "u32")
STORAGE = ("f8e4m3", "f8e5m2", "e8m0")          # loaded and widened, or narrowed and stored
BITS = {"f32": 32, "bf16": 16, "f16": 16, "i32": 32, "i8": 8, "i64": 64, "u32": 32, "bool": 1}
TOLERANCE = {"f32": 2e-4, "bf16": 4e-2, "f16": 4e-3}            # inexact outputs, relative


@dataclass
class Value:
    name: str
    dtype: str
    exact: bool
    shape: str = "tile"            # "tile" [BR, BC], "rows" [BR, 1], "cols" [1, BC]


@dataclass
class Program:
    seed: int
    source: str
    inputs: list[tuple[str, str]]                # (name, dtype) of the [R, C] input tensors
    outputs: list[tuple[str, str, bool]]         # (name, dtype, exact) of the [R, C] outputs
    rows: int
    cols: int
    scalars: tuple = ()                          # s_f (f32), s_i (i32), n_iter (i32)
    ops: list[str] = field(default_factory=list)  # the op kinds drawn, for coverage counts


class _Builder:
    def __init__(self, rng: np.random.Generator, square: bool):
        self.rng = rng
        self.square = square
        self.lines: list[str] = []
        self.values: list[Value] = []
        self.kinds: list[str] = []

    def pick(self, pred=lambda v: True, recent=True):
        cands = [v for v in self.values if pred(v)]
        if not cands:
            return None
        if recent and self.rng.random() < 0.6:               # favour recent values: deeper chains
            cands = cands[-3:]
        return cands[self.rng.integers(len(cands))]

    def new(self, expr: str, dtype: str, exact: bool, shape: str, kind: str) -> Value:
        v = Value(f"v{len(self.values)}", dtype, exact, shape)
        self.lines.append(f"{v.name} = {expr}")
        self.values.append(v)
        self.kinds.append(kind)
        return v

    def literal(self, dtype: str) -> str:
        r = self.rng
        if dtype in FLOATS:
            return repr(float(r.choice([0.5, 1.5, -2.0, 3.0, 0.25, -0.75, 4.0])))
        if dtype == "u32":
            return str(int(r.integers(0, 9)))
        return str(int(r.integers(-8, 9)))

    def as_dtype(self, v: Value, dtype: str) -> str | None:
        """v's text converted to dtype, or None where that would put an inexact value through a
        discontinuous cast."""
        if v.dtype == dtype:
            return v.name
        if not v.exact and (dtype not in FLOATS or v.dtype not in FLOATS):
            return None
        return f"{v.name}.to(k.{dtype})"

    @staticmethod
    def summand(text: str, dtype: str) -> str:
        """A float operand of a sum, cumsum or dot, clamped to +-1e4: the order of a float sum is
        left open, so terms near the f32 range (products of int64 extremes reach 1e37) cancel
        differently in a sequential and a tree order, past any tolerance scaled to the outputs.
        An f32 term is also cut to a multiple of 1/16 (and to +-1e3): then every partial sum of up
        to 1000 terms is exact, so no order rounds differently; a sum that cancels to a small
        value (seeds 350289, 392413, 411280: x / (|x| + 1) of a cumsum) no longer magnifies the
        order's rounding past the tolerance. NaN stays NaN."""
        if dtype == "f32":
            return f"k.floor(k.minimum(k.maximum({text}, -1e3), 1e3) * 16.0) * 0.0625"
        return f"k.minimum(k.maximum({text}, -1e4), 1e4)" if dtype in FLOATS else text

    def operand_like(self, a: Value, exact_only=False) -> tuple[str, bool, str]:
        """A second operand for a binary op with a: another value cast to a's dtype, or a literal."""
        b = self.pick(lambda v: (v.exact or not exact_only) and v.dtype != "bool")
        if b is not None and self.rng.random() < 0.75:
            text = self.as_dtype(b, a.dtype)
            if text is not None:
                return text, b.exact, b.shape
        return self.literal(a.dtype), True, "scalar"


def _shape_of(*shapes: str) -> str:
    s = set(shapes) - {"scalar"}
    if not s:
        return "scalar"
    if len(s) == 1:
        return s.pop()
    return "tile"


def _step(b: _Builder):
    """One random op appended to the program (or nothing when the drawn kind does not apply)."""
    r = b.rng
    kind = r.choice(["arith", "arith", "div", "intdiv", "minmax", "compare", "logic", "shift", "where",
                     "unary_exact", "unary_inexact", "cast", "bitcast", "reduce", "cumsum", "dot", "loop",
                     "gather", "scalar", "element", "sort", "take", "masked_load", "while", "trans"])
    if kind == "arith":
        a = b.pick(lambda v: v.dtype != "bool")
        text, ex, sh = b.operand_like(a)
        op = r.choice(["+", "-", "*"])
        if r.random() < 0.5:
            b.new(f"{a.name} {op} {text}", a.dtype, a.exact and ex, _shape_of(a.shape, sh), kind)
        else:
            b.new(f"{text} {op} {a.name}", a.dtype, a.exact and ex, _shape_of(a.shape, sh), kind)
    elif kind == "div":
        a = b.pick(lambda v: v.dtype in FLOATS)
        if a is None:
            return
        text, ex, sh = b.operand_like(a)
        op = r.choice(["/", "%"]) if a.exact and ex else "/"
        # denominator 1 + |d| >= 1: an inexact numerator or denominator stays within tolerance
        bounded = r.random() < 0.7 or not (a.exact and ex)
        if text[0].isdigit() or text[0] == "-":                  # a literal
            den = repr(abs(float(text)) + 1.0) if bounded else text
        else:
            den = f"(k.abs({text}) + 1.0)" if bounded else text
        b.new(f"{a.name} {op} {den}", a.dtype, a.exact and ex, _shape_of(a.shape, sh), kind)
    elif kind == "intdiv":
        a = b.pick(lambda v: v.dtype in INTS and v.exact)
        if a is None:
            return
        text, _, sh = b.operand_like(a, exact_only=True)
        den = f"(({text}) & 7 | 1)" if a.dtype == "u32" or r.random() < 0.6 else f"-(({text}) & 4 | 3)"
        b.new(f"{a.name} {r.choice(['//', '%'])} {den}", a.dtype, True, _shape_of(a.shape, sh), kind)
    elif kind == "minmax":
        a = b.pick(lambda v: v.dtype != "bool")
        text, ex, sh = b.operand_like(a)
        b.new(f"k.{r.choice(['maximum', 'minimum'])}({a.name}, {text})", a.dtype, a.exact and ex,
              _shape_of(a.shape, sh), kind)
    elif kind == "compare":
        a = b.pick(lambda v: v.exact and v.dtype != "bool")
        if a is None:
            return
        text, _, sh = b.operand_like(a, exact_only=True)
        b.new(f"{a.name} {r.choice(['<', '<=', '>', '>=', '==', '!='])} {text}", "bool", True,
              _shape_of(a.shape, sh), kind)
    elif kind == "logic":
        a = b.pick(lambda v: v.exact and (v.dtype in INTS or v.dtype == "bool"))
        if a is None:
            return
        if r.random() < 0.2:
            b.new(f"~{a.name}", a.dtype, True, a.shape, kind)
        elif a.dtype == "bool":
            c = b.pick(lambda v: v.dtype == "bool")
            b.new(f"{a.name} {r.choice(['&', '|', '^'])} {c.name}", "bool", True, _shape_of(a.shape, c.shape), kind)
        else:
            text, _, sh = b.operand_like(a, exact_only=True)
            b.new(f"({a.name} {r.choice(['&', '|', '^'])} {text})", a.dtype, True, _shape_of(a.shape, sh), kind)
    elif kind == "shift":
        a = b.pick(lambda v: v.exact and v.dtype in INTS)
        if a is None:
            return
        text, _, sh = b.operand_like(a, exact_only=True)
        b.new(f"{a.name} {r.choice(['<<', '>>'])} (({text}) & {BITS[a.dtype] - 1})", a.dtype, True,
              _shape_of(a.shape, sh), kind)
    elif kind == "where":
        c = b.pick(lambda v: v.dtype == "bool", recent=False)
        a = b.pick(lambda v: v.dtype != "bool")
        if c is None:
            return
        text, ex, sh = b.operand_like(a)
        b.new(f"k.where({c.name}, {a.name}, {text})", a.dtype, a.exact and ex, _shape_of(c.shape, a.shape, sh), kind)
    elif kind == "unary_exact":
        a = b.pick(lambda v: v.dtype != "bool")
        choices = ["-{}", "k.abs({})", "k.relu({})"]
        if a.dtype in FLOATS and a.exact:
            choices += ["k.floor({})", "k.ceil({})"]
        if a.dtype == "f32":
            choices += ["k.sqrt(k.abs({}))"]
        b.new(r.choice(choices).format(a.name), a.dtype, a.exact, a.shape, kind)
    elif kind == "unary_inexact":
        a = b.pick(lambda v: v.dtype in FLOATS)
        if a is None:
            return
        form = r.choice(["k.exp(k.minimum({}, 8.0))", "k.exp2(k.minimum({}, 10.0))", "k.log(k.abs({}) + 1.0)",
                         "k.log2(k.abs({}) + 0.5)", "k.sigmoid({})", "k.softplus({})", "k.rsqrt(k.abs({}) + 1.0)",
                         "k.sqrt(k.abs({}))"])
        exact = form == "k.sqrt(k.abs({}))" and a.dtype == "f32" and a.exact
        b.new(form.format(a.name), a.dtype, exact, a.shape, kind)
    elif kind == "cast":
        a = b.pick()
        dt = str(r.choice(FLOATS + INTS + ("bool",)))
        if a.dtype == dt:
            return
        if dt in FLOATS and a.dtype in FLOATS + INTS + ("bool",) and r.random() < 0.15 and a.exact:
            # through fp8 and back: saturating round to nearest even, exact in the contract
            b.new(f"{a.name}.to(k.{r.choice(['f8e4m3', 'f8e5m2'])}).to(k.{dt})", dt, True, a.shape, kind)
            return
        text = b.as_dtype(a, dt)
        if text is None:
            return
        b.new(text, dt, a.exact, a.shape, kind)
    elif kind == "bitcast":
        a = b.pick(lambda v: v.exact and v.dtype in ("f32", "i32", "u32"))
        if a is None:
            return
        dt = str(r.choice([d for d in ("f32", "i32", "u32") if d != a.dtype]))
        # a float's bits are exact up to what the contract leaves open: NaN payloads and the sign
        # of a zero from max / min, both made canonical first
        src = (f"k.where({a.name} == 0.0, 0.0, k.where({a.name} != {a.name}, float(\"nan\"), {a.name}))"
               if a.dtype == "f32" else a.name)
        b.new(f"{src}.bitcast(k.{dt})", dt, True, a.shape, kind)
    elif kind == "reduce":
        a = b.pick(lambda v: v.dtype != "bool" and v.shape == "tile")
        if a is None:
            return
        fn = str(r.choice(["sum", "max", "min"]))
        axis = int(r.integers(2))
        keep = "[:, None]" if axis == 1 else "[None, :]"
        exact = a.exact and (fn != "sum" or a.dtype not in FLOATS)
        x = b.summand(a.name, a.dtype) if fn == "sum" else a.name
        b.new(f"k.{fn}({x}, axis={axis}){keep}", a.dtype, exact, "rows" if axis == 1 else "cols", kind)
    elif kind == "cumsum":
        a = b.pick(lambda v: v.dtype not in ("bool", "i8") and v.shape == "tile")
        if a is None:
            return
        rev = ", reverse=True" if r.random() < 0.3 else ""
        b.new(f"k.cumsum({b.summand(a.name, a.dtype)}, axis={int(r.integers(2))}{rev})", a.dtype, a.exact and a.dtype not in FLOATS,
              "tile", kind)
    elif kind == "dot":
        if not b.square:
            return
        x = b.pick(lambda v: v.dtype in FLOATS and v.shape == "tile")
        y = b.pick(lambda v: v.dtype in FLOATS and v.shape == "tile", recent=False)
        if x is None or y is None:
            return
        dt = str(r.choice(FLOATS))
        yt = b.summand(b.as_dtype(y, dt), dt)
        yt = f"({yt}).T" if r.random() < 0.3 else yt
        b.new(f"k.dot({b.summand(b.as_dtype(x, dt), dt)}, {yt})", "f32", False, "tile", kind)
    elif kind == "loop":
        a = b.pick(lambda v: v.dtype != "bool" and v.shape == "tile")
        if a is None:
            return
        acc = f"v{len(b.values)}"
        lit = b.literal(a.dtype)
        b.lines.append(f"{acc} = k.zeros((BR, BC), k.{a.dtype})")
        step = (f"{acc} * {lit} + {a.name}" if r.random() < 0.5
                else f"k.maximum({acc}, {a.name} - {lit}) + {b.literal(a.dtype)}")
        loop = "range(n_iter)" if r.random() < 0.6 else f"k.range(0, n_iter, stages={int(r.integers(1, 4))})"
        b.lines.append(f"for it in {loop}:")
        b.lines.append(f"    {acc} = {step}")
        b.values.append(Value(acc, a.dtype, a.exact, "tile"))
        b.kinds.append(kind)
    elif kind == "gather":
        stride = int(r.choice([1, 3, 5, 7]))
        src = int(r.integers(b.n_inputs))
        other = b.literal(b.input_dtypes[src])
        b.new(f"x{src}[(i * BR + k.arange(0, BR) * {stride}) % x{src}.shape[0], "
              f"k.span(j * BC, BC, other={other})]", b.input_dtypes[src], True, "tile", kind)
    elif kind == "element":             # one element of an input: a scalar meeting tiles
        src = int(r.integers(b.n_inputs))
        b.new(f"x{src}[i, j]", b.input_dtypes[src], True, "scalar", kind)
    elif kind == "sort":                # k.topk over the whole row: a descending sort, ties to the lower lane
        a = b.pick(lambda v: v.dtype in ("f32", "i32") and v.exact and v.shape == "tile")
        if a is None:
            return
        vals, pos = f"v{len(b.values)}", f"v{len(b.values) + 1}"
        b.lines.append(f"{vals}, {pos} = k.topk({a.name}, BC)")
        b.values += [Value(vals, a.dtype, True), Value(pos, "i32", True)]
        b.kinds += [kind, kind]
    elif kind == "take":                # gather along the row, positions clamped to it
        a = b.pick(lambda v: v.shape == "tile" and v.dtype != "bool")
        i = b.pick(lambda v: v.exact and v.dtype == "i32" and v.shape == "tile", recent=False)
        if a is None or i is None:
            return
        b.new(f"k.take({a.name}, {i.name})", a.dtype, a.exact, "tile", kind)
    elif kind == "masked_load":         # lanes where the mask is off read `other`
        m = b.pick(lambda v: v.dtype == "bool" and v.shape == "tile")
        if m is None:
            return
        src = int(r.integers(b.n_inputs))
        b.new(f"k.load(x{src}, (k.span(i * BR, BR), k.span(j * BC, BC)), mask={m.name}, "
              f"other={b.literal(b.input_dtypes[src])})", b.input_dtypes[src], True, "tile", kind)
    elif kind == "while":               # a data-dependent loop: runs until a scalar condition fails
        a = b.pick(lambda v: v.dtype in ("f32", "i32") and v.exact and v.shape == "tile")
        if a is None:
            return
        acc, cnt = f"v{len(b.values)}", f"c{len(b.values)}"
        b.lines += [f"{acc} = {a.name}", f"{cnt} = 0",
                    f"while ({cnt} < n_iter + 1) & (k.max({acc}) < {b.literal(a.dtype)}):",
                    f"    {acc} = {acc} + {'1.0' if a.dtype == 'f32' else '1'}", f"    {cnt} = {cnt} + 1"]
        b.values.append(Value(acc, a.dtype, a.exact, "tile"))
        b.kinds.append(kind)
    elif kind == "trans":
        a = b.pick(lambda v: v.shape == "tile")
        if not b.square or a is None:
            return
        b.new(f"{a.name}.T", a.dtype, a.exact, "tile", kind)
    elif kind == "scalar":
        a = b.pick(lambda v: v.dtype in FLOATS + ("i32",))
        if a is None:
            return
        if a.dtype == "f32":
            b.new(f"{a.name} {r.choice(['+', '*', '-'])} s_f", "f32", a.exact, a.shape, kind)
        elif a.dtype == "i32":
            b.new(f"{a.name} {r.choice(['+', '*', '-'])} s_i", "i32", a.exact, a.shape, kind)
        else:                           # an i32 scalar meeting a 16-bit float converts to it
            b.new(f"{a.name} * s_i", a.dtype, a.exact, a.shape, kind)


def _storage_parts(b: _Builder, rng: np.random.Generator, outputs: list, output_lines: set) -> list[str]:
    """fp8 / e8m0 at the edges of the program, drawn from their own generator so that the rest of
    a seed's program stays as it was: maybe one storage input, loaded and widened to f32 and mixed
    into an exact f32 value, and maybe exact float values narrowed into storage outputs. Returns
    the storage inputs' dtypes (parameters after the other inputs)."""
    inputs = []
    if rng.random() < 0.3:
        dt = str(rng.choice(["f8e4m3", "f8e5m2", "e8m0"]))
        n = b.n_inputs
        inputs.append(dt)
        v = b.new(f"x{n}[k.span(i * BR, BR, other=2.0), k.span(j * BC, BC, other=2.0)].to(k.f32)", "f32", True,
                  "tile", "storage_load")
        mate = b.pick(lambda u: u.dtype == "f32" and u.exact and u.name != v.name, recent=False)
        if mate is not None:
            b.new(f"{v.name} * {mate.name}", "f32", True, _shape_of(v.shape, mate.shape), "storage_load")
        b.lines.append(f"o{len(outputs)}[k.span(i * BR, BR), k.span(j * BC, BC)] = "
                       + (b.values[-1].name if b.values[-1].shape == "tile"
                          else f"k.broadcast_to({b.values[-1].name}, (BR, BC))"))
        output_lines.add(len(b.lines) - 1)
        outputs.append((f"o{len(outputs)}", "f32", True))
    floats = [u for u in b.values if u.exact and u.dtype in FLOATS]
    for _ in range(int(rng.integers(0, 3)) if floats else 0):
        u = floats[int(rng.integers(len(floats)))]
        dt = str(rng.choice(["f8e4m3", "f8e5m2", "e8m0"]))
        text = f"{u.name}.to(k.{dt})"
        b.lines.append(f"o{len(outputs)}[k.span(i * BR, BR), k.span(j * BC, BC)] = "
                       + (text if u.shape == "tile" else f"k.broadcast_to({text}, (BR, BC))"))
        output_lines.add(len(b.lines) - 1)
        outputs.append((f"o{len(outputs)}", dt, True))
        b.kinds.append("storage_store")
    return inputs


def _helper_parts(b: _Builder, rng: np.random.Generator, outputs: list, output_lines: set) -> list[str]:
    """An @k.func helper (inlined by the frontend, called twice) and a k.static_range loop (unrolled),
    each maybe, at the end of the program and from their own generator; the helpers' source is
    returned for the module."""
    helpers, last = [], b.values[-1]
    tiles = [u for u in b.values if u.shape == "tile" and u.dtype in ("f32", "i32", "bf16", "f16", "i64")]
    if tiles and rng.random() < 0.3:
        u = tiles[int(rng.integers(len(tiles)))]
        lit = "2" if u.dtype in INTS else "0.5"
        helpers.append("@k.func\ndef fuzz_helper(a, c):\n"
                       f"    return k.maximum(a * c, a - c) + {lit}")
        first = b.new(f"fuzz_helper({u.name}, {u.name})", u.dtype, u.exact, "tile", "func")
        b.new(f"fuzz_helper({first.name}, {u.name})", u.dtype, u.exact, "tile", "func")
    if tiles and rng.random() < 0.3:
        u = tiles[int(rng.integers(len(tiles)))]
        acc = f"v{len(b.values)}"
        b.lines += [f"{acc} = {u.name}", f"for q in k.static_range({int(rng.integers(1, 4))}):",
                    f"    {acc} = {acc} * {'3' if u.dtype in INTS else '0.75'} + {u.name}"]
        b.values.append(Value(acc, u.dtype, u.exact, "tile"))
        b.kinds.append("static_loop")
    if b.values[-1] is not last:          # store what the helpers made last
        v = b.values[-1]
        b.lines.append(f"o{len(outputs)}[k.span(i * BR, BR), k.span(j * BC, BC)] = {v.name}")
        output_lines.add(len(b.lines) - 1)
        outputs.append((f"o{len(outputs)}", v.dtype, v.exact))
    return helpers


def generate(seed: int, steps: int | None = None, trace: bool = False) -> Program:
    """The program of one seed: the same seed gives the same source and inputs. `trace` stores
    every value (o<N> holds v<N>) so that a failure names the first op that went wrong."""
    rng = np.random.default_rng(seed)
    br, bc = int(rng.choice([1, 2, 8, 16, 16, 32, 32, 64])), int(rng.choice([8, 16, 16, 32, 32, 64]))
    square = br == bc >= 16                      # k.dot and .T keep the tile's shape; dots need 16
    rows = int(rng.integers(1, 2 * br + 5))
    cols = int(rng.integers(1, 2 * bc + 5))
    n_inputs = int(rng.integers(1, 4))
    input_dtypes = [str(rng.choice(FLOATS + INTS)) for _ in range(n_inputs)]
    b = _Builder(rng, square)
    b.n_inputs, b.input_dtypes = n_inputs, input_dtypes
    for n, dt in enumerate(input_dtypes):
        other = b.literal(dt)
        b.new(f"x{n}[k.span(i * BR, BR, other={other}), k.span(j * BC, BC, other={other})]", dt, True,
              "tile", "load")
    for _ in range(steps or int(rng.integers(3, 12))):
        _step(b)
    # outputs: the last value and up to two others, each broadcast to the tile and stored
    chosen = [b.values[-1]] + [b.values[int(i)] for i in rng.choice(len(b.values), size=min(2, len(b.values)),
                                                                    replace=False)]
    outputs, seen = [], set()
    for v in chosen:
        if v.name in seen:
            continue
        seen.add(v.name)
        dt = "i32" if v.dtype == "bool" else v.dtype
        text = f"{v.name}.to(k.i32)" if v.dtype == "bool" else v.name
        if v.shape != "tile" and (v.shape == "scalar" or rng.random() < 0.5):
            text = f"k.broadcast_to({text}, (BR, BC))"            # else the store broadcasts it
        masks = [m for m in b.values if m.dtype == "bool"]
        if masks and rng.random() < 0.25:        # lanes off the mask keep the output's fill
            m = masks[int(rng.integers(len(masks)))].name
            b.lines.append(f"k.store(o{len(outputs)}, (k.span(i * BR, BR), k.span(j * BC, BC)), {text}, mask={m})")
        else:
            b.lines.append(f"o{len(outputs)}[k.span(i * BR, BR), k.span(j * BC, BC)] = {text}")
        outputs.append((f"o{len(outputs)}", dt, v.exact))
    scalars = (float(np.float32(rng.choice([0.5, -1.25, 3.0, 1e-3]))), int(rng.integers(-5, 6)),
               int(rng.integers(0, 4)))
    output_lines = set(range(len(b.lines) - len(outputs), len(b.lines)))
    storage_inputs = _storage_parts(b, np.random.default_rng([seed, 1]), outputs, output_lines)
    helpers = _helper_parts(b, np.random.default_rng([seed, 2]), outputs, output_lines)
    if trace:                             # the same program, every value stored in order
        b.lines = [line for n, line in enumerate(b.lines) if n not in output_lines]
        outputs = []
        for v in b.values:
            text = f"{v.name}.to(k.i32)" if v.dtype == "bool" else v.name
            b.lines.append(f"o{len(outputs)}[k.span(i * BR, BR), k.span(j * BC, BC)] = "
                           + (text if v.shape == "tile" else f"k.broadcast_to({text}, (BR, BC))"))
            outputs.append((f"o{len(outputs)}", "i32" if v.dtype == "bool" else v.dtype, v.exact))
    input_dtypes = input_dtypes + storage_inputs
    params = ([f"x{n}: k.Tensor[k.{dt}, \"R\", \"C\"]" for n, dt in enumerate(input_dtypes)]
              + [f"{n}: k.Tensor[k.{dt}, \"R\", \"C\"]" for n, dt, _ in outputs]
              + ["s_f: k.f32", "s_i: k.i32", "n_iter: k.i32", f"BR: k.constexpr = {br}", f"BC: k.constexpr = {bc}"])
    body = "\n".join("        " + line for line in b.lines)
    source = (f"# k31dsl random program, seed {seed} (tests/program_fuzz.py)\nimport k31dsl as k\n\n\n"
              + "".join(f"{h}\n\n\n" for h in helpers) +
              f"@k.kernel\ndef fuzz_kernel({', '.join(params)}):\n"
              f"    for i, j in k.grid(k.cdiv(x0.shape[0], BR), k.cdiv(x0.shape[1], BC)):\n{body}\n")
    return Program(seed, source, [(f"x{n}", dt) for n, dt in enumerate(input_dtypes)], outputs, rows, cols,
                   scalars, b.kinds)


def draw_inputs(prog: Program):
    """The program's input tensors (torch, CPU): normal floats with a few specials, small integers
    with their extremes."""
    import torch
    rng = np.random.default_rng(prog.seed + 1)
    out = []
    for _, dt in prog.inputs:
        shape = (prog.rows, prog.cols)
        if dt in STORAGE:                # every byte: NaN, infinities and subnormals included
            x = rng.integers(0, 256, shape).astype(np.uint8)
            out.append(torch.from_numpy(x).view(torch_dtype(dt)))
            continue
        if dt in FLOATS:
            x = (rng.standard_normal(shape) * rng.choice([1.0, 4.0, 30.0])).astype(np.float32)
            specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -1.5], np.float32)
            pick = rng.random(shape) < 0.04
            x[pick] = rng.choice(specials, int(pick.sum()))
            t = torch.from_numpy(x).to(getattr(torch, {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dt]))
        else:
            info = np.iinfo({"i32": np.int32, "i8": np.int8, "i64": np.int64, "u32": np.uint32}[dt])
            x = rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape).astype(info.dtype)
            pick = rng.random(shape) < 0.04
            x[pick] = rng.choice(np.array([info.min, info.max, 0, 1], dtype=info.dtype), int(pick.sum()))
            t = torch.from_numpy(x)
        out.append(t)
    return out


def torch_dtype(dt: str):
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
            "i8": torch.int8, "i64": torch.int64, "u32": torch.uint32, "f8e4m3": torch.float8_e4m3fn,
            "f8e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu}[dt]


def load_kernel(prog: Program, directory: str):
    """Write the program's source to a file and import it (errors then point at its lines)."""
    path = os.path.join(directory, f"fuzz_{prog.seed}.py")
    with open(path, "w") as f:
        f.write(prog.source)
    spec = importlib.util.spec_from_file_location(f"k31_fuzz_{prog.seed}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fuzz_kernel, path


def run_on(target: str, kern, prog: Program, inputs) -> dict:
    """The kernel's outputs on one target (fresh NaN- or 77-filled output tensors, CPU copies)."""
    import torch
    import k31dsl as k
    dev = "cpu"
    if target == "triton":
        from k31dsl.targets.triton.emit import detect_mode
        dev = "cuda" if detect_mode() == "gpu" else "cpu"
    outs = [torch.full((prog.rows, prog.cols), 77, dtype=torch.uint8, device=dev).view(torch_dtype(dt))
            if dt in STORAGE else
            torch.full((prog.rows, prog.cols), float("nan") if dt in FLOATS else 77, dtype=torch_dtype(dt),
                       device=dev) for _, dt, _ in prog.outputs]
    if target == "ptx":                  # the H200's PTX, emulated on this CPU (tests/ptxemu)
        from ptxemu import run_gpu_code
        run_gpu_code(kern, *inputs, *outs, *prog.scalars, folder=os.path.join(tempfile.gettempdir(), "k31_ptx", str(prog.seed)))
    else:
        k.compile(kern, target=target)(*[x.to(dev) for x in inputs], *outs, *prog.scalars)
    return {name: o.cpu() for (name, _, _), o in zip(prog.outputs, outs)}


def mismatch(prog: Program, ref: dict, got: dict) -> str | None:
    """None when every output agrees (exact outputs bit for bit, inexact within tolerance), else why."""
    import torch
    for name, dt, exact in prog.outputs:
        a, b = ref[name], got[name]
        if dt in STORAGE:                  # codes, byte for byte, but -0 (0x80) as +0: the sign of a
            a, b = a.view(torch.uint8), b.view(torch.uint8)        # zero from max / min is left open
            if dt != "e8m0":
                a, b = a.masked_fill(a == 0x80, 0), b.masked_fill(b == 0x80, 0)
        if dt in FLOATS:
            na, nb = torch.isnan(a), torch.isnan(b)
            if not torch.equal(na, nb):
                return f"{name} ({dt}): NaN lanes differ at {torch.nonzero(na != nb)[:4].tolist()}"
            a, b = a.masked_fill(na, 0), b.masked_fill(nb, 0)
            if exact:
                bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
                a, b = a.masked_fill(a == 0, 0).view(bits), b.masked_fill(b == 0, 0).view(bits)
                if not torch.equal(a, b):
                    at = torch.nonzero(a != b)[:4].tolist()
                    return f"{name} ({dt}, exact): differs at {at}: {[a[i][j].item() for i, j in at]} vs {[b[i][j].item() for i, j in at]}"
                continue
            fa, fb = torch.isfinite(a), torch.isfinite(b)
            if not torch.equal(a[~fa], b[~fb]) or not torch.equal(fa, fb):
                return f"{name} ({dt}): infinities differ"
            ad, bd = a.double()[fa], b.double()[fb]
            scale = ad.abs().max().item() if ad.numel() else 0.0
            tol = TOLERANCE[dt]
            bad = (ad - bd).abs() > tol * (ad.abs() + scale) + 1e-30
            if bad.any():
                i = int(torch.nonzero(bad)[0])
                return f"{name} ({dt}): {ad[i].item()} vs {bd[i].item()} (tolerance {tol} x (|ref| + {scale:.3g}))"
        elif not torch.equal(a, b):
            at = torch.nonzero(a != b)[:4].tolist()
            return f"{name} ({dt}): differs at {at}: {[a[i][j].item() for i, j in at]} vs {[b[i][j].item() for i, j in at]}"
    return None


def text_round_trip(kern) -> str | None:
    """The kernel's IR through its `.k31` text form: print -> parse -> print must be the same text,
    and the parsed IR must emit the same numpy program. None when it holds, else what differs."""
    from k31dsl.dsl.parse import parse_kernel
    from k31dsl.dsl.text import print_kernel
    from k31dsl.targets.numpy.emit import emit
    ir = kern.ir()
    text = print_kernel(ir)
    try:
        parsed = parse_kernel(text, "<fuzz>")
    except Exception as e:                 # noqa: BLE001
        return f"the printed IR does not parse: {type(e).__name__}: {str(e).splitlines()[0]}"
    if print_kernel(parsed) != text:
        return "print(parse(print(ir))) differs from print(ir)"
    if emit(parsed) != emit(ir):
        return "the parsed IR emits another numpy program"
    return None


@dataclass
class Outcome:
    seed: int
    status: str          # "ok", "rejected" (a K31Error on the reference: the program is not valid DSL),
                         # "too big" (a target's CapacityError: its tiles do not fit), "FAIL"
    detail: str = ""
    path: str = ""


def check(seed: int, targets, directory: str, trace: bool = False) -> Outcome:
    """One program: the numpy reference first; a target that raises or disagrees is a failure.
    `trace`: every value is an output, so the first mismatch names the first wrong op."""
    import numpy as _np
    from k31dsl.dsl.errors import CapacityError, K31Error
    prog = generate(seed, trace=trace)
    inputs = draw_inputs(prog)
    try:
        kern, path = load_kernel(prog, directory)
        with _np.errstate(all="ignore"):
            ref = run_on("numpy", kern, prog, inputs)
    except K31Error as e:
        return Outcome(seed, "rejected", str(e).splitlines()[0])
    why = text_round_trip(kern)
    if why:
        return Outcome(seed, "FAIL", f"text form: {why}", path)
    for target in targets:
        try:
            with _np.errstate(all="ignore"):
                got = run_on(target, kern, prog, inputs)
        except CapacityError as e:         # a clear refusal, not a wrong result
            return Outcome(seed, "too big", f"{target}: {str(e).splitlines()[0]}", path)
        except NotEmulated as e:           # an instruction outside the emulator is no finding
            return Outcome(seed, "not emulated", str(e).splitlines()[0], path)
        except Exception as e:             # noqa: BLE001 - any failure of a valid program is a finding
            return Outcome(seed, "FAIL", f"{target}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", path)
        why = mismatch(prog, ref, got)
        if why and trace:                  # o<N> is v<N>: quote the line that made it
            v = "v" + why.split(" ", 1)[0][1:]
            why += "\n    first wrong value: " + next((line.strip() for line in prog.source.splitlines()
                                                        if line.strip().startswith(f"{v} =")), v)
        if why:
            return Outcome(seed, "FAIL", f"{target}: {why}", path)
    return Outcome(seed, "ok", path=path)


def map_seeds(check_one, seeds, jobs: int, chunksize: int = 4):
    """check_one(seed) over the seeds, in order: in `jobs` spawned processes when jobs > 1
    (check_one must then pickle: a module-level function or a functools.partial of one)."""
    if jobs <= 1:
        return map(check_one, seeds)
    import concurrent.futures as cf
    import multiprocessing as mp
    pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"))
    return pool.map(check_one, seeds, chunksize=chunksize)


def write_report(path: str | None, title: str, summary: str, lines: list[str]):
    """The run's summary and its failure lines as a Markdown file (nothing when path is None)."""
    if path:
        with open(path, "w") as f:
            f.write(f"# {title}\n\n{summary}\n\n" + "".join(f"- {line}\n" for line in lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Seeds run from --seed upwards; a failure prints the program's file, "
                                        "which `python tests/program_fuzz.py --seed N --show` reproduces.")
    ap.add_argument("--count", type=int, default=50, help="programs to run (default 50)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: a fresh one)")
    ap.add_argument("--targets", default="triton,ascendc",
                    help="compiled targets to check (default triton,ascendc); `ptx` runs the sm_90 PTX of this "
                         "process's Triton in tests/ptxemu (TRITON_INTERPRET unset; Triton 3.6 is the H200's)")
    ap.add_argument("--show", action="store_true", help="print the first program's source and stop")
    ap.add_argument("--dir", default=None, help="where the programs' files go (default: a temporary folder)")
    ap.add_argument("--jobs", type=int, default=1, help="programs checked in parallel processes (default 1)")
    ap.add_argument("--report", default=None, help="also write the outcome as a Markdown file here")
    ap.add_argument("--trace", action="store_true",
                    help="store every value of each program and name the first one a target gets wrong")
    args = ap.parse_args(argv)
    seed0 = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2 ** 31)
    if args.show:
        print(generate(seed0, trace=args.trace).source)
        return 0
    directory = args.dir or tempfile.mkdtemp(prefix="k31fuzz_")
    os.makedirs(directory, exist_ok=True)
    targets = [t for t in args.targets.split(",") if t]
    counts = {"ok": 0, "rejected": 0, "too big": 0, "not emulated": 0, "FAIL": 0}
    t0 = time.time()
    results = map_seeds(functools.partial(check, targets=targets, directory=directory, trace=args.trace),
                        range(seed0, seed0 + args.count), args.jobs)
    lines = []
    for n, out in enumerate(results):
        counts[out.status] += 1
        if out.status != "ok":
            lines.append(f"seed {out.seed}: {out.status}: {out.detail}" + (f"  [{out.path}]" if out.path else ""))
            print(lines[-1], flush=True)
        if (n + 1) % 100 == 0:
            print(f"  {n + 1} / {args.count} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    summary = (f"{args.count} programs from seed {seed0} on {', '.join(targets)}: {counts['ok']} agree, "
               f"{counts['rejected']} rejected by the frontend, {counts['too big']} too big for a target, "
               + (f"{counts['not emulated']} outside the PTX emulator, " if "ptx" in targets else "")
               + f"{counts['FAIL']} failed ({time.time() - t0:.0f} s)")
    print(summary)
    write_report(args.report, "Random programs against the numpy reference", summary, lines)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())

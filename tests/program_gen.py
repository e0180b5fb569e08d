"""The random-program generator behind tests/program_fuzz.py: a random chain of tile ops over
loaded inputs, written out as DSL source, each value marked exact or inexact by the semantics
contract (dsl/ir.py, SEMANTICS; the rules are in program_fuzz's docstring). `generate(seed)` gives
the same program for the same seed."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FLOATS = ("f32", "bf16", "f16")
INTS = ("i32", "i8", "i64", "u32")
STORAGE = ("f8e4m3", "f8e5m2", "e8m0")          # loaded and widened, or narrowed and stored
BITS = {"f32": 32, "bf16": 16, "f16": 16, "i32": 32, "i8": 8, "i64": 64, "u32": 32, "bool": 1}


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

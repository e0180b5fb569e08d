"""Kernel IR: SSA values in nested blocks, one node type (`Op`).

A `Kernel` is one specialisation of an `@k.kernel` function (its constexprs are fixed):
typed parameters, a `host` block that computes the launch grid from parameters, and a `body`
block whose arguments are the program ids. Tile shapes are static integers; tensor sizes,
strides and scalar parameters are runtime values. A tensor parameter may carry one static fact
about them, `align` (k.aligned(n): rows on n-byte multiples; text form `... align 16`), which
every call checks and a target may use to widen loads.

The op set (operands | attrs -> results). "tile" means any TileType, scalars are shape ().

  const         -              | value, dtype          -> scalar
  dim           tensor         | axis                  -> i32 scalar (tensor size on axis)
  arange        -              | size                  -> i32[size] (0 .. size-1)
  full          -              | shape, value, dtype   -> tile
  load          tensor, idx*, [mask] | index, other, [evict] -> tile    (see INDEX KINDS)
  store         tensor, idx*, value, [mask] | index, [evict] -> -
  <binary>      a, b           | -                     -> broadcast(a, b) (cmp -> bool)
  <unary>       x              | -                     -> like x
  where         cond, a, b     | -                     -> broadcast
  cast          x              | dtype                 -> x.shape of dtype
  bitcast       x              | dtype                 -> same width, bits reinterpreted
  sum/max/min   x              | axis (None = all)     -> reduced
  cumsum        x              | axis, reverse         -> like x
  histogram     x[N] (int)     | bins                  -> i32[bins]: lanes equal to 0 .. bins-1
  dot           a[M,K], b[K,N] | precision             -> f32[M,N]  (ieee, tf32, tf32x3)
  topk          x[..., L]      | n                     -> values[..., n], i32 positions[..., n]
  take          x[..., L], i[..., n] | -               -> x gathered along the last axis
  expand        x              | axis                  -> rank+1
  trans         x[A,B]         | -                     -> [B,A]
  broadcast     x              | shape                 -> tile of shape
  reshape       x              | shape                 -> tile of shape (row-major)
  cat           a[L], b[L]     | -                     -> [2L] (a then b)
  for           lo, hi, step, init* | stages?, while?  region(iv, carried*) -> carried*
                (stages: a pipelining hint from k.range, read by the Triton target only;
                while = j: carried value j is a bool flag and an iteration starts only while
                iv < hi (step > 0) and the flag is true; a kernel's `while cond:` is such a loop over
                (0, 2^31 - 1, 1) whose body ends by recomputing cond)
  yield         v*             | -                     -> -   (terminates a for body)

INDEX KINDS of load/store (attr `index`, one entry per tensor axis, each consumes one operand):
  "scalar"      an i32 scalar; the axis is dropped
  "span:N"      an i32 scalar start; the axis becomes a tile axis of size N (lanes start..start+N-1)
  "gather"      an i32 1-D index tile; the axis becomes a tile axis of that length
The result's axes are the non-scalar entries in order. A lane is in bounds when every index is in
[0, size of its axis); out-of-bounds lanes of a load read `other` (attr, or None = undefined; the
numpy target fills NaN/poison so that reliance on undefined lanes shows), out-of-bounds lanes of a
store are skipped. An optional bool `mask` operand (broadcast to the tile) further restricts lanes.
`other` is converted to the tensor's dtype like a `cast` (fp8 saturates, e8m0 is ceil(log2)).
Several lanes of one store writing the same element (duplicate gather indices): the last lane in
row-major order wins on numpy; other targets may pick any of them.

SEMANTICS (targets/numpy/rt.py is the executable reference; every target matches it):
  integers      two's complement, wrap on overflow; floordiv truncates toward zero and mod takes
                the dividend's sign (C); x // 0 is undefined. `//` is integer-only (type rule).
  floats        IEEE; bf16/f16 math other than + - * is computed in f32 and rounded once.
                maximum/minimum/max/min/relu propagate NaN. mod on floats is C fmod.
                Left open: NaN payloads and signs, and the sign of a zero that max / min / relu
                pick between +0 and -0 (abs and neg set the sign as IEEE says).
  cast          float -> int truncates toward zero and saturates; NaN and +-inf give 0.
                int -> int wraps; int -> bf16/f16 rounds through f32. x -> bool is x != 0.
                float -> fp8 rounds to nearest even and saturates to +-max_finite (inf too);
                NaN -> 0x7F. float -> e8m0 is the exact
                ceil(log2 x) clamped to [-127, 127] (byte = that + 127); x <= 0 -> 0x00; NaN and
                +-inf -> 0xFF. e8m0 -> float is 2^(byte - 127), 0xFF -> NaN.
  dot           f32 accumulation of the products (operands converted to f32 exactly).
  sum/cumsum    in f32 for 16-bit floats (result rounded back), in the dtype otherwise.
  topk          the n largest along the last axis, descending; equal values keep the lower
                position first; NaN ranks below every number.
  take          positions outside [0, L) are clamped to the nearest end.
  histogram     counts[v] = #{lanes of x equal to v}; lanes outside [0, bins) are not counted
                (k.histogram's mask= maps masked-off lanes to -1).
  cat           a then b along the only axis.

ADDITIONS (beyond the first version of this contract; targets must handle them):
  Param.loc     where the parameter is declared (call-time argument errors point there).
  reduce/cumsum `axis` attrs are non-negative (the frontend normalises `axis=-1`).
  for           attr `while` (a data-dependent loop: the kernel's `while cond:`; see the op table).
  topk          also on i64 tiles (packed sort keys, e.g. order bits << 32 | position bits);
                the Triton target gives only the values there (using the positions is a
                compile error): equal i64 values are identical, so their order is moot.

The frontend's own rules (no IR change, documented here for op authors): an integer *scalar* meeting
a float operand in arithmetic, comparisons, k.where or a store converts to that float type (an
int literal does the same with any tile); integer tiles never convert. Compiled targets also need
power-of-two tile dims and k.dot dims >= 16 (`frontend.check_portable`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from . import dtypes as D
from .errors import UNKNOWN, Loc


# ---------------------------------------------------------------- types

@dataclass(frozen=True)
class TileType:
    dtype: D.DType
    shape: tuple[int, ...] = ()

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype.name
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class TensorType:
    dtype: D.DType
    dims: tuple[str, ...]        # named/expression dims as written, e.g. ("N", "D // 128")
    align: int = 0               # k.aligned(n): rows start on n-byte multiples (0: no promise)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __str__(self) -> str:
        dims = ", ".join(f'"{d}"' for d in self.dims)
        return f"tensor<{self.dtype.name}>[{dims}]" + (f" align {self.align}" if self.align else "")

    def misalignment(self, shape, strides=None) -> str | None:
        """Why a tensor of this shape and strides (elements; None: contiguous) breaks the
        `k.aligned(n)` promise (every row on an n-byte multiple: innermost stride 1, the other
        strides and the innermost extent multiples of n bytes), or None when it keeps it. Axes of
        extent 1 never move an address."""
        if not self.align or not shape:
            return None
        if strides is None:
            strides = [1] * len(shape)
            for axis in range(len(shape) - 2, -1, -1):
                strides[axis] = strides[axis + 1] * shape[axis + 1]
        size = self.dtype.itemsize
        if shape[-1] > 1 and strides[-1] != 1:
            return f"its innermost stride is {strides[-1]}, not 1"
        for axis, (n, s) in enumerate(zip(shape[:-1], strides[:-1])):
            if n > 1 and s * size % self.align:
                return f"its stride on axis {axis} is {s * size} bytes"
        if shape[-1] * size % self.align:
            return f"its rows hold {shape[-1] * size} bytes"
        return None


Type = TileType | TensorType


# ---------------------------------------------------------------- values, ops, blocks

_ids = itertools.count()


class Value:
    """An SSA value. `name` is assigned by the printer; `hint` is the user's variable name."""
    __slots__ = ("type", "uid", "hint")

    def __init__(self, type: Type, hint: str | None = None):
        self.type = type
        self.uid = next(_ids)
        self.hint = hint

    def __repr__(self) -> str:
        return f"<Value {self.hint or ''}#{self.uid}: {self.type}>"


@dataclass(eq=False)
class Block:
    args: list[Value] = field(default_factory=list)
    ops: list["Op"] = field(default_factory=list)


@dataclass(eq=False)
class Op:
    name: str
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: list[Block] = field(default_factory=list)
    loc: Loc = UNKNOWN

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, self.name
        return self.results[0]


@dataclass(eq=False)
class Param:
    name: str
    value: Value          # type is TensorType or a scalar TileType
    loc: Loc = UNKNOWN    # where the parameter is declared (for call-time argument errors)

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.value.type, TensorType)


@dataclass(eq=False)
class Kernel:
    name: str
    params: list[Param]
    constexprs: dict[str, Any]
    host: Block                    # computes the grid extents (scalar i32 ops only)
    grid: list[Value]              # 1-3 values defined in `host`
    body: Block                    # args: program ids, one per grid dim
    loc: Loc = UNKNOWN
    configs: list[dict] = field(default_factory=list)

    @property
    def source_file(self) -> str:
        return self.loc.file


# ---------------------------------------------------------------- op families

WHILE_BOUND = 2147483647                       # `hi` of the `for` a kernel's `while cond:` becomes
DOT_PRECISIONS = ("ieee", "tf32", "tf32x3")   # k.dot's fp32 modes; numpy and AscendC compute all three exactly

BINARY = {"add", "sub", "mul", "div", "floordiv", "mod", "maximum", "minimum",
          "and", "or", "xor", "shl", "shr"}
COMPARE = {"lt", "le", "gt", "ge", "eq", "ne"}
UNARY = {"neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sigmoid", "softplus",
         "relu", "not", "floor", "ceil"}
FLOAT_ONLY_UNARY = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softplus",
                    "floor", "ceil"}
INT_ONLY_BINARY = {"and", "or", "xor", "shl", "shr"}
REDUCE = {"sum", "max", "min"}


def walk(block: Block):
    """Every op in a block, nested regions included, in program order."""
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk(region)


def all_ops(kernel: Kernel):
    yield from walk(kernel.host)
    yield from walk(kernel.body)


def parse_index_kind(kind: str) -> tuple[str, int | None]:
    """"span:128" -> ("span", 128); "scalar" -> ("scalar", None)."""
    if kind.startswith("span:"):
        return "span", int(kind[5:])
    return kind, None

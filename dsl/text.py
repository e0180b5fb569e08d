"""The `.k31` text form of kernel IR: a printer here, a lark grammar + parser in parse.py.

    kernel rms @ "ops/common.py":10:0 {
      constexpr BD = 128
      param %x : tensor<bf16>["N", "D"]
      param %w : tensor<bf16>["D"] align 16
      param %eps : f32
      host {
        %0 = dim(%x) {axis = 0} : i32 @12:16
      }
      grid(%0) (%n : i32) {
        %1 = full() {dtype = f32, shape = [128], value = 0.0} : f32[128] @13:14
        %5 = for(%2, %3, %4, %1) : f32[128] @14:8 {
        ^(%j : i32, %acc : f32[128]):
          ...
          yield(%9) @16:12
        }
      }
    }

Values print as `%<hint>` when the user named them (suffixed `.N` on reuse), else `%<number>`.
Every op line ends with `@line:col` in the kernel's file, or `@"file":line:col` when the op came
from another file (an inlined `@k.func`). Attributes print sorted by key; strings and tensor dims
are double-quoted, with backslash escapes for quotes, backslashes, tabs and newlines.
"""
from __future__ import annotations

import math
from typing import Any

from . import dtypes as D
from .ir import Block, Kernel, Op, TensorType, Value

VERSION_LINE = "# k31dsl kernel IR v1"
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def fmt_attr(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, D.DType):
        return v.name
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        return r if ("." in r or "e" in r) else r + ".0"
    if isinstance(v, str):
        return '"' + "".join(_ESCAPES.get(c, c) for c in v) + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_attr(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute {v!r}")


def fmt_type(t) -> str:
    """Like str(type), with tensor dims quoted the way fmt_attr quotes strings."""
    if isinstance(t, TensorType):
        align = f" align {t.align}" if t.align else ""
        return f"tensor<{t.dtype.name}>[{', '.join(fmt_attr(d) for d in t.dims)}]{align}"
    return str(t)


class Printer:
    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.counter = 0
        self.lines: list[str] = []

    def name(self, v: Value) -> str:
        if v.uid not in self.names:
            if v.hint and v.hint.isidentifier():
                base, n = v.hint, 0
                cand = base
                while cand in self.used:
                    n += 1
                    cand = f"{base}.{n}"
            else:
                while str(self.counter) in self.used:
                    self.counter += 1
                cand = str(self.counter)
                self.counter += 1
            self.used.add(cand)
            self.names[v.uid] = cand
        return "%" + self.names[v.uid]

    def ref(self, v: Value) -> str:
        if v.uid not in self.names:
            return f"%<undefined #{v.uid}>"
        return "%" + self.names[v.uid]

    def emit(self, depth: int, text: str):
        self.lines.append("  " * depth + text)

    def op(self, op: Op, depth: int):
        res = ", ".join(self.name(r) for r in op.results)
        lhs = f"{res} = " if op.results else ""
        args = ", ".join(self.ref(a) for a in op.operands)
        attrs = ""
        if op.attrs:
            attrs = " {" + ", ".join(f"{k} = {fmt_attr(op.attrs[k])}" for k in sorted(op.attrs)) + "}"
        types = ""
        if op.results:
            types = " : " + ", ".join(fmt_type(r.type) for r in op.results)
        loc = self.loc(op)
        head = f"{lhs}{op.name}({args}){attrs}{types}{loc}"
        if not op.regions:
            self.emit(depth, head)
            return
        self.emit(depth, head + " {")
        for region in op.regions:
            self.block_body(region, depth + 1, with_args=True)
        self.emit(depth, "}")

    def loc(self, op: Op) -> str:
        # the file is implied by the kernel header unless the op came from elsewhere (a k.func)
        if op.loc.file == self.k.loc.file:
            return f" @{op.loc.line}:{op.loc.col}"
        return f" @{fmt_attr(op.loc.file)}:{op.loc.line}:{op.loc.col}"

    def block_body(self, block: Block, depth: int, with_args: bool):
        if with_args:
            args = ", ".join(f"{self.name(a)} : {fmt_type(a.type)}" for a in block.args)
            self.emit(depth - 1, f"^({args}):")
        for op in block.ops:
            self.op(op, depth)

    def kernel(self) -> str:
        k = self.k
        self.lines = [VERSION_LINE]
        self.emit(0, f"kernel {k.name} @ {fmt_attr(k.loc.file)}:{k.loc.line}:{k.loc.col} {{")
        for n in sorted(k.constexprs):
            self.emit(1, f"constexpr {n} = {fmt_attr(k.constexprs[n])}")
        for p in k.params:
            self.emit(1, f"param {self.name(p.value)} : {fmt_type(p.value.type)}")
        self.emit(1, "host {")
        self.block_body(k.host, 2, with_args=False)
        self.emit(1, "}")
        grid = ", ".join(self.ref(g) for g in k.grid)
        pids = ", ".join(f"{self.name(a)} : {fmt_type(a.type)}" for a in k.body.args)
        self.emit(1, f"grid({grid}) ({pids}) {{")
        self.block_body(k.body, 2, with_args=False)
        self.emit(1, "}")
        self.emit(0, "}")
        return "\n".join(self.lines) + "\n"


def print_kernel(kernel: Kernel) -> str:
    return Printer(kernel).kernel()


def ir_hash(kernel: Kernel) -> str:
    import hashlib
    return hashlib.sha256(print_kernel(kernel).encode()).hexdigest()[:16]

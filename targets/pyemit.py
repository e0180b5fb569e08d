"""Shared skeleton of the two Python-source targets (numpy, triton): value naming, block walking,
`for` loops with carried values, and `# src: file:line` origin comments. A target subclasses
`PyEmitter` and supplies one method per op family (`op_<name>` or a RULES table)."""
from __future__ import annotations

import keyword
import linecache
import os
import re

from k31dsl.dsl.ir import WHILE_BOUND, Block, Kernel, Op, Value, all_ops, walk
from k31dsl.dsl.text import ir_hash
from k31dsl.version import __version__


class PyEmitter:
    target = "?"
    comment = "#"            # how an origin comment starts in the generated language
    origin_width = 110       # origin comments are cut to this many characters

    def __init__(self, kernel: Kernel, options: dict | None = None):
        self.k = kernel
        self.options = options or {}
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.lines: list[str] = []
        self.last_src: tuple[str, int] | None = None
        self.depth = 0               # indentation of the op being emitted (for pre-lines)
        self.ir_hash = ir_hash(kernel)
        self.hints = {x.hint for op in all_ops(kernel) for x in op.results if x.hint}
        self.const_values = {op.result.uid: op.attrs["value"] for op in all_ops(kernel) if op.name == "const"}

    # ------------------------------------------------------------ naming
    def name(self, v: Value) -> str:
        if v.uid in self.names:
            return self.names[v.uid]
        base = re.sub(r"\W", "_", v.hint) if v.hint else "v"
        if keyword.iskeyword(base) or base in self.reserved():
            base = base + "_"
        cand, n = base, 0
        # unnamed values leave the user's variable names to the values they name
        while cand in self.used or (not v.hint and cand in self.hints):
            n += 1
            cand = f"{base}_{n}"
        self.used.add(cand)
        self.names[v.uid] = cand
        return cand

    def reserved(self) -> set[str]:
        return {"np", "rt", "tl", "triton", "torch", "range", "min", "max", "abs"}

    def n(self, v: Value) -> str:
        return self.names[v.uid] if v.uid in self.names else self.name(v)

    def fresh(self, base: str) -> str:
        """A new local name for a helper value the target introduces (not an IR value)."""
        cand, n = base, 0
        while cand in self.used or cand in self.reserved():
            n += 1
            cand = f"{base}_{n}"
        self.used.add(cand)
        return cand

    # ------------------------------------------------------------ lines
    def line(self, depth: int, text: str):
        self.lines.append("    " * depth + text)

    def pre(self, text: str):
        """A line before the current op's own line (handlers that need several statements)."""
        self.line(self.depth, text)

    def origin(self, op: Op, depth: int):
        key = (op.loc.file, op.loc.line)
        if key == self.last_src or op.loc.line <= 0:
            return
        self.last_src = key
        text = linecache.getline(op.loc.file, op.loc.line).strip()
        short = os.path.basename(op.loc.file)
        line = f"{self.comment} src: {short}:{op.loc.line}: {text}"[:self.origin_width]
        self.line(depth, line.rstrip("\\ "))      # a trailing backslash would continue a C++ comment

    def block(self, block: Block, depth: int):
        for op in block.ops:
            self.op(op, depth)

    def op(self, op: Op, depth: int):
        if op.name == "yield":
            return  # handled by the enclosing for
        self.origin(op, depth)
        self.depth = depth
        if op.name == "for":
            self.for_op(op, depth)
            return
        handler = getattr(self, "op_" + op.name, None)
        if handler is None:
            handler = self.rule_for(op)
        text = handler(op)
        if text is None:
            return
        if op.results:
            lhs = ", ".join(self.name(r) for r in op.results)
            self.line(depth, f"{lhs} = {text}")
        else:
            self.line(depth, text)

    def rule_for(self, op: Op):
        raise NotImplementedError(f"{self.target}: no emitter for op `{op.name}`")

    def for_op(self, op: Op, depth: int):
        lo, hi, step, *inits = op.operands
        body = op.regions[0]
        iv, *carried = body.args
        flag_at = op.attrs.get("while")
        for c, r in zip(carried, op.results):
            # carried values live in one variable across iterations, named after the result
            self.names[c.uid] = self.name(r)
        # a while loop's flag is set last: Triton orders a loop's carried values by where each
        # name is first set, and Triton 3.6 crashes (RemoveLayoutConversions) on a tile carried
        # after the i1 flag of a `while` (tests/program_fuzz.py on the H200, seed 101948)
        order = [n for n in range(len(carried)) if n != flag_at] + ([] if flag_at is None else [flag_at])
        counted = True
        if flag_at is not None:
            # for ... while flag: a Python `while` (Triton has no `break`); the trip counter is
            # left out when nothing reads it and the bound is the frontend's WHILE_BOUND
            counted = any(iv.uid == v.uid for o in walk(body) for v in o.operands) or \
                self.const_value(hi) != WHILE_BOUND
            if counted:
                self.line(depth, f"{self.name(iv)} = {self.init_expr(lo)}")
        for n in order:
            self.line(depth, f"{self.names[carried[n].uid]} = {self.init_expr(inits[n])}")
        if flag_at is not None:
            flag = self.n(carried[flag_at])
            if counted:
                self.line(depth, f"while {self.both(flag, f'{self.name(iv)} < {self.n(hi)}')}:")
            else:
                self.line(depth, f"while {flag}:")
        else:
            self.line(depth, f"for {self.name(iv)} in {self.loop_range(lo, hi, step, op.attrs)}:")
        fix = self.loop_index(iv) if counted else None
        if fix is not None:
            self.line(depth + 1, fix)
        start = len(self.lines)
        self.block(body, depth + 1)
        yield_op = body.ops[-1]
        for c, y in zip(carried, yield_op.operands):
            if self.n(c) != self.n(y):
                self.line(depth + 1, f"{self.n(c)} = {self.n(y)}")
        if "while" in op.attrs and counted:
            self.line(depth + 1, f"{self.name(iv)} = {self.name(iv)} + {self.n(step)}")
        if len(self.lines) == start:
            self.line(depth + 1, "pass")
        self.last_src = None

    def both(self, a: str, b: str) -> str:
        """The conjunction of two scalar conditions (Python's `and`; Triton's tensors need `&`)."""
        return f"{a} and {b}"

    def const_value(self, v: Value):
        """The value of a `const` op's result, else None."""
        return self.const_values.get(v.uid)

    def loop_range(self, lo, hi, step, attrs: dict) -> str:
        """The loop's iterator; attrs are the `for` op's hints (stages), which only Triton reads."""
        return f"range({self.n(lo)}, {self.n(hi)}, {self.n(step)})"

    def loop_index(self, iv: Value) -> str | None:
        """A statement fixing up the induction variable at the top of the body, if any."""
        return None

    def init_expr(self, init: Value) -> str:
        """The initial value of a loop-carried variable."""
        return self.n(init)

    def header(self) -> list[str]:
        k = self.k
        cx = ", ".join(f"{a}={b!r}" for a, b in sorted(k.constexprs.items())) or "-"
        return [f"# Generated by k31dsl {__version__} for target `{self.target}`. Do not edit.",
                f"# kernel: {k.name}   ir-hash: {self.ir_hash}   constexprs: {cx}",
                f"# source: {k.loc.file}:{k.loc.line}"]

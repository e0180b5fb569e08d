"""Kernel IR -> AscendC C++ (a vector-core kernel class over TPipe/TQue/TBuf, its tiling header,
a CANN host launcher, an emulator launcher, CMakeLists.txt and build_emu.sh).

One program of the IR grid is the class's `Program(pid...)` method; `Process()` walks a block's
share of the flattened grid (program p runs on block p % GetBlockNum()). Scalars are C++ locals
on the scalar unit; tiles are UB LocalTensors placed by plan.py. Op lowerings: vector.py (vector
instructions, or the scalar-unit helpers of k31_helpers.h where the vector unit has no
instruction), memory.py (DataCopy/DataCopyPad GM<->UB), cube.py (k.dot on the Cube unit).
UB use is checked at compile time (budget: 192 KB, A2/A3): over budget, double buffering is
dropped, then per-site queues; still over, a K31Error names the live tiles and their bytes."""
from __future__ import annotations

import os
from pathlib import Path

import jinja2

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import CapacityError, K31Error, error
from k31dsl.dsl.ir import Kernel, Op, TileType, Value
from k31dsl.targets.ascendc import cexpr, cube, memory, vector
from k31dsl.targets.ascendc.plan import build_plan, ceil32, is_tile, live_at_peak
from k31dsl.targets.pyemit import PyEmitter
from k31dsl.version import __version__

UB_BYTES = 192 * 1024
MODES = ("double", "single", "pool")
CPP_RESERVED = {"int", "float", "double", "char", "bool", "auto", "const", "for", "if", "else", "return",
                "while", "do", "switch", "case", "default", "break", "continue", "class", "struct",
                "new", "delete", "this", "true", "false", "void", "unsigned", "signed", "short",
                "long", "static", "inline", "template", "typename", "namespace", "using", "operator",
                "register", "union", "enum", "goto", "sizeof", "volatile", "extern", "and", "or",
                "not", "xor", "pipe", "td", "calc", "tmp", "k31", "std", "AscendC", "half",
                "bfloat16_t", "exp", "log", "abs", "min", "max", "floor", "ceil", "sqrt", "int8_t",
                "int32_t", "int64_t", "uint8_t", "uint32_t", "main", "p", "total", "signbit",
                # locals of the generated blocks (DMA, reductions, Compare/Select, the cube path)
                "ac", "c0", "len", "fast", "sc_ok", "r0", "rlo", "rhi_", "rhi", "full", "g", "u",
                "bytes", "row", "one", "work", "fa", "fb", "mask", "hi", "l", "o0", "o1", "o2", "o3",
                "x0", "x1", "x2", "v", "wa", "wb", "wc", "ha", "hb", "bT", "c1", "a1", "b1", "a2", "b2",
                "mp", "k0", "m1", "k1", "ws", "op", "workspace", "tiling", "o"}

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


class AscendEmitter(PyEmitter):
    comment = "//"
    origin_width = 118
    target = "ascendc"

    def __init__(self, kernel: Kernel, options: dict | None = None, mode: str = "double"):
        super().__init__(kernel, options)
        self.mode = mode
        self.plan = build_plan(kernel, mode)
        self.qdepth = 2 if mode == "double" else 1
        self.queues: list[dict] = []         # name, pos, depth, bytes, what, loc
        self.queue_of: dict = {}             # key -> queue name
        self.scratch_used = 0
        self.scratch_max = 0
        self.scalar_unit: set[str] = set()   # IR ops lowered onto the scalar unit
        self.vector_ops: set[str] = set()
        self.uses_cube = False
        self.cube_bytes = {}
        self.fused: set[int] = set()         # ops folded into their user (compare, trans)
        self.b_transposed: dict = {}         # id(dot) -> x where the dot's B is x.T
        for p in kernel.params:
            self.used.add(p.name)
            # scalar parameters are locals of Program(): keep them clear of the generated locals
            local = p.name + "_" if (not p.is_tensor and p.name in CPP_RESERVED) else p.name
            self.used.add(local)
            self.names[p.value.uid] = local
        self.used.update(kernel.constexprs)

    def reserved(self) -> set[str]:
        return CPP_RESERVED

    # ------------------------------------------------------------ lines

    def line(self, depth: int, text: str):
        self.lines.append("  " * depth + text)

    def note_scalar(self, op: Op, why: str = ""):
        self.scalar_unit.add(op.name)
        self.pre(f"// scalar unit: {why or op.name} (no vector instruction)")

    # ------------------------------------------------------------ values
    def is_tile(self, v: Value) -> bool:
        return is_tile(v)

    def S(self, v: Value) -> str:
        return cexpr.storage(v.type.dtype)

    def C(self, v: Value) -> str:
        return cexpr.compute(v.type.dtype)

    def numel(self, v: Value) -> int:
        return v.type.numel

    def define(self, v: Value) -> str:
        """Declare the LocalTensor of a new tile result by its plan placement; returns its name."""
        name = self.name(v)
        root = self.plan.roots.get(v.uid)
        S = self.S(v)
        if root is None:
            raise AssertionError(f"ascendc: tile {v} has no buffer")
        if root.kind == "out":
            q = self.queue(("out", v.uid), "VECOUT", root.bytes, f"{name} (stored)", root.loc)
            self.pre(f"AscendC::LocalTensor<{S}> {name} = {q}.AllocTensor<{S}>();")
        else:
            self.pre(f"AscendC::LocalTensor<{S}> {name} = calc.GetWithOffset<{S}>({v.type.numel}, {root.offset});")
        return name

    def queue(self, key, pos: str, nbytes: int, what: str, loc) -> str:
        if key in self.queue_of:
            return self.queue_of[key]
        name = f"q{'In' if pos == 'VECIN' else 'Out'}{len(self.queues)}"
        self.queues.append({"name": name, "pos": pos, "depth": self.qdepth, "bytes": ceil32(nbytes),
                            "what": what, "loc": loc})
        self.queue_of[key] = name
        return name

    def scratch(self, ctype: str, count: int) -> str:
        """A per-op temporary in the `tmp` TBuf (released when the op is done)."""
        off = self.scratch_used
        size = ceil32(count * _csize(ctype))
        self.scratch_used += size
        self.scratch_max = max(self.scratch_max, self.scratch_used)
        return f"tmp.GetWithOffset<{ctype}>({count}, {off})"

    def copy_tile(self, dst: str, src: str, t: TileType):
        n = t.numel
        if (n * cexpr.itemsize(t.dtype)) % 32 == 0:
            self.pre(f"AscendC::DataCopy({dst}, {src}, {n});")
        else:
            self.pre(f"k31::Copy({dst}, {src}, {n});  // scalar unit: a {n}-lane copy below one 32 B block")

    # ------------------------------------------------------------ op driver
    def op(self, op: Op, depth: int):
        if op.name == "yield":
            return
        if id(op) in self.fused:
            return
        self.origin(op, depth)
        self.depth = depth
        self.scratch_used = 0
        for r in op.results:
            if isinstance(r.type, TileType) and len(r.type.shape) > 4:
                raise error(f"the ascendc target handles tiles of rank <= 4, `{op.name}` makes {r.type}",
                            op.loc, "reshape to at most 4 axes")
        if op.name == "for":
            self.for_op(op, depth)
        else:
            fn = RULES.get(op.name)
            if fn is None:
                raise K31Error(f"ascendc: no lowering for IR op `{op.name}`")
            fn(self, op)
        self.free_after(self.plan.pos[id(op)], depth)
        if op.name == "for":
            self.free_after(self.plan.end[id(op)], depth)

    def free_after(self, pos: int, depth: int):
        for root in self.plan.frees.get(pos, []):
            q = self.queue_of.get(("in", root.uid))
            if q is not None:
                self.line(depth, f"{q}.FreeTensor({self.n(root.value)});")

    def for_op(self, op: Op, depth: int):
        lo, hi, step, *inits = op.operands
        body = op.regions[0]
        iv, *carried = body.args
        for c, init, r in zip(carried, inits, op.results):
            name = self.name(r)
            self.names[c.uid] = name
            if self.is_tile(r):
                self.pre(f"AscendC::LocalTensor<{self.S(r)}> {name} = calc.GetWithOffset<{self.S(r)}>("
                         f"{r.type.numel}, {self.plan.roots[r.uid].offset});  // carried by the loop")
                if not self._coalesced(init, r):
                    self.copy_tile(name, self.n(init), r.type)
            else:
                self.pre(f"{self.C(r)} {name} = {self.n(init)};")
        i = self.name(iv)
        step_op = self.plan.defs.get(step.uid)
        if step_op is not None and step_op.name == "const" and step_op.attrs["value"] > 0:
            cond = f"{i} < {self.n(hi)}"
        else:
            cond = f"({self.n(step)} > 0 ? {i} < {self.n(hi)} : {i} > {self.n(hi)})"
        if "while" in op.attrs:                        # for ... while flag (a Python `while`)
            cond = f"{cond} && {self.n(carried[op.attrs['while']])}"
        self.line(depth, f"for (int32_t {i} = {self.n(lo)}; {cond}; {i} += {self.n(step)}) {{")
        self.block(body, depth + 1)
        y = body.ops[-1]
        self.depth = depth + 1
        self.scratch_used = 0
        pending = [(c, v) for c, v, r in zip(carried, y.operands, op.results)
                   if self.n(c) != self.n(v) and not self._coalesced(v, r)]
        staged = {}
        for c, v in pending:            # a yield reading another carried value: stage it first
            if any(self.n(v) == self.n(c2) for c2, _ in pending if c2 is not c):
                t = self.fresh(f"{self.n(c)}_next")
                if self.is_tile(v):
                    self.pre(f"AscendC::LocalTensor<{self.S(v)}> {t} = {self.scratch(self.S(v), v.type.numel)};")
                    self.copy_tile(t, self.n(v), v.type)
                else:
                    self.pre(f"const {self.C(v)} {t} = {self.n(v)};")
                staged[c.uid] = t
        for c, v in pending:
            src = staged.get(c.uid, self.n(v))
            if self.is_tile(c):
                self.copy_tile(self.n(c), src, c.type)
            else:
                self.pre(f"{self.n(c)} = {src};")
        self.free_after(self.plan.pos[id(y)], depth + 1)
        self.line(depth, "}")
        self.last_src = None

    def _coalesced(self, v: Value, res: Value) -> bool:
        root = self.plan.root_of(v) if self.is_tile(v) else None
        return root is not None and root.coalesce == res.uid

    # ------------------------------------------------------------ host side
    def host_lines(self) -> tuple[list[str], list[str]]:
        """C++ computing the host block (grid extents) from the tiling inputs; and the names of
        host values the body reads (they travel in the tiling struct)."""
        out = []
        self.host_names = {p.value.uid: f"td->{p.name}" for p in self.k.params if not p.is_tensor}
        for op in self.k.host.ops:
            r = op.result
            if op.name == "const":
                text = cexpr.literal(op.attrs["value"], op.attrs["dtype"])
            elif op.name == "dim":
                t = op.operands[0]
                text = f"static_cast<int32_t>(td->{self.n(t)}_size[{op.attrs['axis']}])"
            elif len(op.operands) == 2:
                a, b = (self.host_names[x.uid] for x in op.operands)
                text = cexpr.binary(op.name, op.operands[0].type.dtype, a, b)
            else:
                text = cexpr.unary(op.name, op.operands[0].type.dtype, self.host_names[op.operands[0].uid])
            name = f"h_{self.name(r)}"
            self.host_names[r.uid] = name
            out.append(f"const {self.C(r)} {name} = {text};")
        return out


def _csize(ctype: str) -> int:
    return {"float": 4, "double": 8, "bfloat16_t": 2, "half": 2, "int8_t": 1, "int32_t": 4, "int64_t": 8,
            "uint8_t": 1, "uint32_t": 4, "int16_t": 2, "uint16_t": 2}[ctype]


RULES = {**vector.RULES, **memory.RULES, **cube.RULES}


# ---------------------------------------------------------------- rendering

def _render(kernel: Kernel, options: dict, mode: str) -> tuple[AscendEmitter, dict]:
    em = AscendEmitter(kernel, options, mode)
    extra, skip = [], set()
    for prep in (vector.prepare, cube.prepare):
        e, s = prep(em)
        extra += e
        skip |= s
    if extra or skip:                  # fused operands are read at their user: plan again
        em.plan = build_plan(kernel, mode, extra, skip)
    host = em.host_lines()
    em.lines, em.last_src = [], None
    pids = [em.name(a) for a in kernel.body.args]
    # host values the body reads arrive through the tiling struct
    host_uids = {op.result.uid: op for op in kernel.host.ops}
    body_host = []
    seen = set()
    from k31dsl.dsl.ir import walk
    for op in walk(kernel.body):
        for x in op.operands:
            if x.uid in host_uids and x.uid not in seen:
                seen.add(x.uid)
                hop = host_uids[x.uid]
                if hop.name == "const":
                    em.names[x.uid] = cexpr.literal(hop.attrs["value"], hop.attrs["dtype"])
                else:
                    em.names[x.uid] = f"td.{em.host_names[x.uid]}"
                    body_host.append((em.host_names[x.uid], em.C(x)))
    em.block(kernel.body, 2)
    return em, {"host": host, "pids": pids, "body_host": body_host}


def emit_all(kernel: Kernel, **options) -> dict[str, str]:
    """Every generated file, the kernel first. Tries the UB modes in order until one fits."""
    errors = []
    for mode in (options.get("ub_mode"),) if options.get("ub_mode") else MODES:
        em, parts = _render(kernel, options, mode)
        used = ub_usage(em)
        if used["total"] <= UB_BYTES:
            return _files(em, parts, used)
        errors.append((mode, em, used))
    raise _budget_error(kernel, errors[-1][1], errors[-1][2], errors)


def ub_usage(em: AscendEmitter) -> dict:
    queues = sum(q["depth"] * q["bytes"] for q in em.queues)
    return {"queues": queues, "pool": ceil32(em.plan.pool_bytes), "tmp": ceil32(em.scratch_max),
            "total": queues + ceil32(em.plan.pool_bytes) + ceil32(em.scratch_max)}


def _budget_error(kernel: Kernel, em: AscendEmitter, used: dict, tried) -> K31Error:
    tiles = []
    for q in em.queues:
        tiles.append((q["depth"] * q["bytes"], f"{q['what']} ({q['pos']} queue x{q['depth']})", q["loc"]))
    for r in live_at_peak(em.plan):
        tiles.append((r.bytes, f"{em.n(r.value)}: {r.value.type}", r.loc))
    tiles.sort(key=lambda t: -t[0])
    lines = [f"  {b:>7} B  {what}  at {os.path.basename(loc.file)}:{loc.line}" if loc and loc.line else
             f"  {b:>7} B  {what}" for b, what, loc in tiles[:12]]
    first = [t for t in tried if t[0] == "double"]
    msg = (f"kernel `{kernel.name}` needs {used['total']} B of UB on the ascendc target, more than the "
           f"{UB_BYTES} B of an A2/A3 vector core (even without double buffering and with every tile "
           f"in one liveness-shared pool: {used['pool']} B of tiles + {used['tmp']} B of scratch"
           + (f"; {first[0][2]['total']} B with double buffering" if first else "") + "). Largest live tiles:\n"
           + "\n".join(lines))
    return error(msg, kernel.loc, "use smaller tile constexprs (block sizes) for this target", CapacityError)


def _files(em: AscendEmitter, parts: dict, used: dict) -> dict[str, str]:
    k = em.k
    name = k.name
    tensors = [p for p in k.params if p.is_tensor]
    scalars = [p for p in k.params if not p.is_tensor]
    cx = ", ".join(f"{a}={b!r}" for a, b in sorted(k.constexprs.items())) or "-"
    header = [f"// Generated by k31dsl {__version__} for target `ascendc`. Do not edit.",
              f"// kernel: {name}   ir-hash: {em.ir_hash}   constexprs: {cx}",
              f"// source: {k.loc.file}:{k.loc.line}",
              f"// UB: {used['total']} B of {UB_BYTES} (queues {used['queues']}, tile pool {used['pool']}, "
              f"scratch {used['tmp']}); buffering: {em.mode}"]
    scalar_unit = sorted(em.scalar_unit)
    ctx = dict(
        header=header, name=name, version=__version__,
        tensors=[{"name": p.name, "S": cexpr.storage(p.value.type.dtype), "rank": p.value.type.rank,
                  "dtype": p.value.type.dtype.name} for p in tensors],
        scalars=[{"name": p.name, "local": em.n(p.value), "C": cexpr.compute(p.value.type.dtype), "dtype": p.value.type.dtype.name,
                  "float": p.value.type.dtype.is_float} for p in scalars],
        params=[p.name for p in k.params], host=parts["host"], body_host=parts["body_host"],
        grid=[em.host_names[g.uid] if g.uid in em.host_names else em.n(g) for g in k.grid],
        pids=parts["pids"], body=em.lines, queues=em.queues, pool_bytes=ceil32(em.plan.pool_bytes),
        tmp_bytes=ceil32(em.scratch_max), cube=em.uses_cube, cube_bytes=em.cube_bytes,
        scalar_unit=scalar_unit, vector_ops=sorted(em.vector_ops), mode=em.mode, used=used,
        ub=UB_BYTES, ndims=len(k.grid), emu_dir=str(Path(__file__).resolve().parent / "emu"))
    files = {}
    for fname, tpl in ((f"{name}_kernel.cpp", "kernel.cpp.jinja"), (f"{name}_tiling.h", "tiling.h.jinja"),
                       (f"{name}_host.cpp", "host_cann.cpp.jinja"), (f"{name}_emu.cpp", "host_emu.cpp.jinja"),
                       ("k31_helpers.h", "k31_helpers.h.jinja"), ("CMakeLists.txt", "CMakeLists.txt.jinja"),
                       ("build_emu.sh", "build_emu.sh.jinja")):
        files[fname] = _ENV.get_template(tpl).render(**ctx)
    return files


def emit(kernel: Kernel, **options) -> str:
    return emit_all(kernel, **options)[f"{kernel.name}_kernel.cpp"]


__all__ = ["emit", "emit_all", "AscendEmitter", "UB_BYTES", "D"]

"""Kernel IR -> a Python module holding one `@triton.jit` kernel and a launcher.

The launcher takes the kernel's parameters (torch tensors, numbers), computes the grid from the
host block and passes every tensor as a data pointer plus all of its sizes and strides. Only
`tl.*` is used (no block pointers; libdevice and inline asm for the few ops below), and the code
is generated for one mode, fixed at emit time and written in the header:

  gpu        native bf16 tiles, hardware fp8 conversions, correctly rounded `/` and sqrt, float `%`
             as libdevice's fmod (frem is inexact there), integer abs and the operands of integer
             min / max through inline asm that LLVM and ptxas cannot see into (both miscompiled
             them), narrow integer loads filled by a select (lower.py says why for each); on
             sm_90+ programmatic dependent launch (`tl.extra.cuda.gdc_*`, `launch_pdl=True`).
  interpret  Triton's CPU interpreter: bf16 tiles live in f32 carriers rounded in software (its
             own bf16 is wrong), fp8 converts in software, dots run in f32.

fp8 and e8m0 tensors travel as uint8 views and their tiles are carried as uint8 bits. Values are
exact against the numpy reference for integer, fp8 and e8m0 results. Op lowerings that are not a
single `tl` call live in lower.py.
"""
from __future__ import annotations

import os
from pathlib import Path

import jinja2

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error, error
from k31dsl.dsl.ir import BINARY, COMPARE, Kernel, Op, TileType, Value, walk
from k31dsl.targets.pyemit import PyEmitter
from k31dsl.targets.triton import lower

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)

TL = {"bf16": "tl.bfloat16", "f16": "tl.float16", "f32": "tl.float32", "f64": "tl.float64",
      "i8": "tl.int8", "i32": "tl.int32", "i64": "tl.int64", "u8": "tl.uint8", "u32": "tl.uint32",
      "bool": "tl.int1", "f8e4m3": "tl.uint8", "f8e5m2": "tl.uint8", "e8m0": "tl.uint8"}
INFIX = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^", "shl": "<<",
         "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
HELPERS = ("_fmax", "_fmin", "_round_bf16", "_bf16_from_bits", "_bf16_to_bits", "_rne_shift",
           "_fp8_encode", "_fp8_encode_hw", "_fp8_decode", "_e8m0_encode", "_e8m0_decode",
           "_float_to_int", "_softplus", "_trunc", "_topk", "_topk_i64", "_f32_order", "_idiv", "_imod")
LAUNCH_KEYS = ("num_warps", "num_stages", "maxnreg")


def detect_mode() -> str:
    """"interpret" under TRITON_INTERPRET=1 or without a CUDA device, else "gpu"."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpret"
    try:
        import torch
        if torch.cuda.is_available():
            return "gpu"
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return "interpret"


def _sm90() -> bool:
    """Hopper and newer convert f32 -> fp8 with cvt.rn.satfinite (saturating, NaN -> 0x7F)."""
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
    except Exception:  # noqa: BLE001 - no device: the saturating helper is used
        return False


PDL_MODES = ("off", "start", "end", "auto")
# H200, CUDA-graph medians, each setting in its own process (results/pdl_*.md; NOTES.md, "PDL"):
# "end" -> DSA decode step -0.9 / -1.0 % (B=64 L=32K / B=32 L=128K), model decode graph -6.5..-7 %
# at B=1 (493 kernels a step), +-0.7 % at B=64; "start" -> -10 % at B=1 but +8 % on the DSA step
# and +7.5 % at B=64: the next kernel's CTAs, resident early and waiting, take SM slots the
# running kernel's later programs need (pdl_dsa_wait_first.md). "auto" starts early only from
# grids smaller than the GPU: model B=1 -11.5 % (end -6.4 %), B=64 and the DSA step as "end"
# (pdl_auto.md). Outputs bit-identical in every mode.
PDL_DEFAULT = "auto"


def pdl_mode(arch_ok: bool) -> str:
    """How gpu-mode kernels use programmatic dependent launch (sm_90 and newer, `arch_ok`): every
    kernel waits for the previous kernel of its stream before it touches memory, and lets the next
    one launch right after that wait ("start") or after its last store ("end"); "auto" decides per
    launch: "start" when the grid has fewer programs than the GPU has SMs (the next kernel's early
    CTAs then wait on SMs this one does not use), else "end"; "off" emits neither.
    K31_PDL=off|start|end|auto (also 0 / 1 for off / start) overrides PDL_DEFAULT; another value is
    refused."""
    if not arch_ok:
        return "off"
    raw = os.environ.get("K31_PDL", "").strip().lower()
    mode = {"0": "off", "1": "start", "": PDL_DEFAULT}.get(raw, raw)
    if mode not in PDL_MODES:
        raise K31Error(f"K31_PDL={raw!r}: expected one of {', '.join(PDL_MODES)} (or 0 / 1)")
    return mode


class TritonEmitter(PyEmitter):
    target = "triton"

    def __init__(self, kernel: Kernel, options: dict | None = None):
        super().__init__(kernel, options)
        self.mode = self.options.get("mode") or detect_mode()
        self.interp = self.mode == "interpret"
        self.soft_fp8 = bool(self.options.get("soft_fp8", self.interp))
        self.satfinite = not self.soft_fp8 and bool(self.options.get("satfinite", _sm90()))
        self.idx = "tl.int64" if self.interp else "K31_IDX"
        # programmatic dependent launch (pdl_mode; NOTES.md, "PDL" has the measurements)
        self.pdl = "off" if self.interp else self.options.get("pdl", pdl_mode(_sm90()))
        if self.pdl not in PDL_MODES:
            raise ValueError(f"pdl={self.pdl!r}: one of {PDL_MODES}")
        self.helpers: set[str] = set()
        self.consts: dict[int, str] = {}     # uid -> literal of an inlined constant
        self.maybe_cx: set[int] = set()      # values Triton may see as constexpr (no .to())
        self.defs: dict[int, Op] = {}
        self.iv_ops: dict[int, Op] = {}      # loop induction variable -> its for op
        self._nonneg: dict[int, bool] = {}
        self.position: dict[int, int] = {}   # id(op) -> its place in program order
        self.first_use: dict[int, int] = {}  # uid -> place of the first op that reads it
        for n, op in enumerate(list(walk(kernel.host)) + list(walk(kernel.body))):
            self.position[id(op)] = n
            for x in op.operands:
                self.first_use.setdefault(x.uid, n)
            for r in op.results:
                self.defs[r.uid] = op
            if op.name == "for":
                self.iv_ops[op.regions[0].args[0].uid] = op
        self.pids = {a.uid for a in kernel.body.args}
        self.maybe_cx.update(self.iv_ops)     # the interpreter's loop variables are Python ints
        for p in kernel.params:
            self.used.add(p.name)
            self.names[p.value.uid] = p.name
        self.used.update(n for n in kernel.constexprs)

    def reserved(self) -> set[str]:
        return super().reserved() | set(HELPERS) | {"grid", "float", "int", "bool"}

    def both(self, a: str, b: str) -> str:
        return f"({a}) & ({b})"

    def loop_range(self, lo, hi, step, attrs: dict) -> str:
        # k.range(stages=N): an explicit num_stages also makes Triton pipeline loads that feed no
        # dot (its AssignLatencies pass pipelines those only for loops carrying the attribute)
        if attrs.get("stages") is None:
            return super().loop_range(lo, hi, step, attrs)
        return f"tl.range({self.n(lo)}, {self.n(hi)}, {self.n(step)}, num_stages={int(attrs['stages'])})"

    # ------------------------------------------------------------ types and operand forms
    def carrier(self, dt: D.DType) -> str:
        """The tl dtype a value of `dt` lives in inside the kernel."""
        if dt is D.bf16 and self.interp:
            return "tl.float32"
        return TL[dt.name]

    def dt(self, v: Value) -> D.DType:
        return v.type.dtype

    def t(self, v: Value) -> str:
        """`v` as a tensor (constants and possibly-constexpr values are materialised)."""
        if v.uid in self.consts:
            return f"tl.full([], {self.consts[v.uid]}, {self.carrier(self.dt(v))})"
        if v.uid in self.maybe_cx:
            return f"tl.cast({self.n(v)}, {self.carrier(self.dt(v))})"
        return self.n(v)

    def to(self, v: Value | str, tl_dtype: str, bitcast: bool = False, cx: bool = False) -> str:
        """A conversion of a value (or an expression) to a tl dtype."""
        if isinstance(v, Value):
            cx, v = v.uid in self.maybe_cx, self.n(v)
        extra = ", bitcast=True" if bitcast else ""
        return f"tl.cast({v}, {tl_dtype}{extra})" if cx else f"{v}.to({tl_dtype}{extra})"

    def use(self, *groups: str):
        """Ask for prelude helper groups (names of the blocks in prelude.py.jinja)."""
        self.helpers.update(groups)

    def nonneg(self, v: Value) -> bool:
        """Whether an integer value is provably >= 0 (spares the `>= 0` half of bounds masks)."""
        if v.uid in self._nonneg:
            return self._nonneg[v.uid]
        self._nonneg[v.uid] = False          # cycles through loops resolve to "unknown"
        ok = v.uid in self.pids
        if v.uid in self.iv_ops:
            lo, _, step = self.iv_ops[v.uid].operands[:3]
            s = self.defs.get(step.uid)
            ok = self.nonneg(lo) and s is not None and s.name == "const" and s.attrs["value"] > 0
        op = self.defs.get(v.uid)
        if op is not None and not v.type.dtype.is_float:
            if op.name == "const":
                ok = op.attrs["value"] >= 0
            elif op.name in ("dim", "arange"):
                ok = True
            elif op.name in ("add", "mul", "floordiv", "mod", "minimum", "shr", "and"):
                ok = all(self.nonneg(x) for x in op.operands)
            elif op.name == "maximum":
                ok = any(self.nonneg(x) for x in op.operands)
            elif op.name == "broadcast" or op.name == "expand":
                ok = self.nonneg(op.operands[0])
        self._nonneg[v.uid] = ok
        return ok

    def inline(self, op: Op, text: str, cx: bool = True):
        r = op.result
        self.names[r.uid] = text
        if cx:
            self.maybe_cx.add(r.uid)

    # ------------------------------------------------------------ checks
    def check(self):
        """Triton's own limit beyond the compiled-target rules (power-of-two tiles, dots >= 16),
        which the pipeline's `portable` pass checks before any target emits."""
        for op in walk(self.k.body):
            if op.name == "dot" and op.operands[0].type.dtype.kind == "fp8":
                (m, kk), (_, n) = op.operands[0].type.shape, op.operands[1].type.shape
                if kk < 32:
                    raise error(f"Triton's tl.dot on fp8 needs K of at least 32, got [{m},{kk}] @ [{kk},{n}]",
                                op.loc, "use a K tile of 32 (mask the extra columns with other=0.0)")

    # ------------------------------------------------------------ emission driver
    def op(self, op: Op, depth: int):
        if op.name == "cast" and self.carrier(op.operands[0].type.dtype) == "tl.float32" \
                and op.attrs["dtype"] is D.f32:
            self.names[op.result.uid] = self.n(op.operands[0])   # bf16 in an f32 carrier
            return
        super().op(op, depth)
        # Triton folds arithmetic on constexprs into constexprs
        if op.results and op.name in BINARY | COMPARE | {"neg", "not", "where"}:
            if all(x.uid in self.maybe_cx for x in op.operands):
                self.maybe_cx.add(op.result.uid)

    def rule_for(self, op: Op):
        fn = lower.binary if op.name in BINARY or op.name in COMPARE else lower.RULES[op.name]
        return lambda op: fn(self, op)

    def init_expr(self, init: Value) -> str:
        return self.t(init)

    def render(self) -> str:
        self.check()
        k = self.k
        host = self.emit_host()
        host_args = self.host_values_in_body()
        self.lines, self.last_src = [], None
        if self.pdl != "off":
            self.line(0, "tl.extra.cuda.gdc_wait()              # the previous kernel's writes are visible")
        if self.pdl == "start":
            self.line(0, "tl.extra.cuda.gdc_launch_dependents()")
        elif self.pdl == "auto":
            self.line(0, "if K31_PDL_EARLY:                     # a grid smaller than the GPU (see the launcher)")
            self.line(1, "tl.extra.cuda.gdc_launch_dependents()")
        for axis, pid in enumerate(k.body.args):
            self.line(0, f"{self.name(pid)} = tl.program_id({axis})")
        self.prologue()
        self.block(k.body, 0)
        if self.pdl == "end":
            self.line(0, "tl.extra.cuda.gdc_launch_dependents()  # after the last store: the next kernel may launch")
        elif self.pdl == "auto":
            self.line(0, "if not K31_PDL_EARLY:")
            self.line(1, "tl.extra.cuda.gdc_launch_dependents()  # after the last store: the next kernel may launch")
        body = self.lines
        tensor_params = [p for p in k.params if p.is_tensor]
        scalar_params = [p for p in k.params if not p.is_tensor]
        kernel_params, launch_args, views = [], [], []
        for p in tensor_params:
            rank = p.value.type.rank
            sizes = [f"{p.name}_size_{a}" for a in range(rank)]
            strides = [f"{p.name}_stride_{a}" for a in range(rank)]
            kernel_params.append([p.name] + sizes + strides)
            arg = self.tensor_arg(p, views)
            launch_args.append([arg] + [f"{p.name}.shape[{a}]" for a in range(rank)]
                               + [f"{p.name}.stride({a})" for a in range(rank)])
        scalars = []
        for p in scalar_params:
            dt = p.value.type.dtype
            scalars.append(f"{p.name}: tl.float64" if dt is D.f64 else p.name)
            launch_args.append([self.scalar_arg(p)])
        if scalars:
            kernel_params.append(scalars)
        if host_args:
            kernel_params.append(host_args)
            launch_args.append(host_args)
        cx = [(n, v) for n, v in sorted(k.constexprs.items()) if isinstance(v, (int, float, bool))]
        cx_params = [f"{n}: tl.constexpr" for n, _ in cx]
        cx_args = [f"{n}={v!r}" for n, v in cx]
        if not self.interp and tensor_params:
            cx_params.append("K31_IDX: tl.constexpr")
            cx_args.append(f"K31_IDX=_index_type({', '.join(p.name for p in tensor_params)})")
        if self.pdl == "auto":
            cx_params.append("K31_PDL_EARLY: tl.constexpr")
            first = tensor_params[0].name if tensor_params else "None"
            cx_args.append(f"K31_PDL_EARLY=_fewer_programs_than_sms(grid, {first})")
        if cx_params:
            kernel_params.append(cx_params)
            launch_args.append(cx_args)
        launch_opts = []
        if not self.interp:
            opts = self.launch_options()
            launch_opts = [f"{n}={v!r}" for n, v in opts.items()]
            launch_args.append([f"{n}={n}" for n in opts] + (["launch_pdl=True"] if self.pdl != "off" else []))
        header = self.header() + [f"# mode: {self.mode}" + ("" if self.interp else
                                                           f"   soft-fp8: {self.soft_fp8}   satfinite-fp8: {self.satfinite}"
                                                           f"   pdl: {self.pdl}")]
        return _ENV.get_template("module.py.jinja").render(
            header=header, name=k.name, params=[p.name for p in k.params], host=host, views=views,
            grid=[self.host_expr(g) for g in k.grid], body=body or ["pass"],
            kernel_params=kernel_params, launch_args=launch_args, launch_opts=launch_opts,
            no_specialize=[p.name for p in scalar_params] + host_args,
            used=self.helpers,
            host_helpers=self.host_helpers, mode=self.mode, pdl_auto=self.pdl == "auto",
            device="the CPU (the interpreter copies them)" if self.interp else "the GPU")

    def launch_options(self) -> dict:
        """num_warps/num_stages of the config this specialisation came from; fp fusion off by
        default so that results track the reference rounding op by op."""
        out = {}
        for cfg in self.k.configs:
            if all(self.k.constexprs.get(n) == v for n, v in cfg.items() if n not in LAUNCH_KEYS):
                out.update({n: cfg[n] for n in LAUNCH_KEYS if n in cfg})
                break
        for n in LAUNCH_KEYS:
            if n in self.options:
                out[n] = self.options[n]
        out["enable_fp_fusion"] = bool(self.options.get("fp_fusion", False))
        return out

    def tensor_arg(self, p, views: list) -> str:
        dt = p.value.type.dtype
        if dt.is_storage_only:
            views.append(f"{p.name}_bytes = {p.name}.view(torch.uint8)  # {dt.name} travels as its bits")
            return f"{p.name}_bytes"
        if dt is D.bf16 and self.interp:
            views.append(f"{p.name}_bits = {p.name}.view(torch.int16)  # bf16 is done in software here")
            return f"{p.name}_bits"
        return p.name

    def scalar_arg(self, p) -> str:
        dt = p.value.type.dtype
        conv = "bool" if dt is D.bool_ else ("int" if dt.is_int else "float")
        return f"{conv}({p.name})"

    def prologue(self):
        """Scalar parameters arrive as i32/i64, f32 or (interpreter) Python numbers; give them
        their IR dtype. tl.full keeps an f64 argument's precision in the interpreter too."""
        for p in self.k.params:
            if p.is_tensor:
                self.alignment_facts(p)
                continue
            dt = p.value.type.dtype
            self.maybe_cx.add(p.value.uid)
            if dt is D.bf16 and self.interp:
                self.use("round_bf16")
                self.line(0, f"{p.name} = _round_bf16(tl.full([], {p.name}, tl.float32))")
            elif dt not in (D.f32, D.i32, D.bool_):
                self.line(0, f"{p.name} = tl.full([], {p.name}, {self.carrier(dt)})")
                self.maybe_cx.discard(p.value.uid)

    def alignment_facts(self, p):
        """A `k.aligned(n)` tensor's row strides and innermost extent restated as `v // A * A` (A: n
        bytes in elements), the identity on the values every call checks: Triton reads the multiply
        as "multiple of A" and can vectorise row gathers and their masks. The JIT itself marks only
        multiples of 16 elements, and tl.multiple_of cannot mark a kernel argument."""
        t = p.value.type
        per = t.align // t.dtype.itemsize
        if per < 2:
            return
        for n in [f"{p.name}_stride_{a}" for a in range(t.rank - 1)] + [f"{p.name}_size_{t.rank - 1}"]:
            self.line(0, f"{n} = {n} // {per} * {per}  # k.aligned({t.align}): a multiple of {per}")

    # ------------------------------------------------------------ host block (Python ints)
    host_helpers = False

    def emit_host(self) -> list[str]:
        self.lines = []
        self.host_names: dict[int, str] = {}
        for op in self.k.host.ops:
            a = [self.host_expr(x) for x in op.operands]
            if op.name == "const":
                self.host_names[op.result.uid] = repr(op.attrs["value"])
                continue
            if op.name == "dim":
                self.host_names[op.result.uid] = f"{a[0]}.shape[{op.attrs['axis']}]"
                continue
            if op.name in ("floordiv", "mod"):
                self.host_helpers = True
                text = f"_{'idiv' if op.name == 'floordiv' else 'imod'}({a[0]}, {a[1]})"
            elif op.name in ("maximum", "minimum"):
                text = f"{op.name[:3]}({a[0]}, {a[1]})"
            else:
                text = f"{a[0]} {INFIX[op.name]} {a[1]}"
            name = self.name(op.result)
            self.host_names[op.result.uid] = name
            self.line(0, f"{name} = {text}")
        return self.lines

    def host_expr(self, v: Value) -> str:
        if isinstance(v.type, TileType) and v.uid in self.host_names:
            return self.host_names[v.uid]
        return self.n(v)   # a tensor parameter, or a scalar parameter used in the grid

    def host_values_in_body(self) -> list[str]:
        """Host values the body reads travel as (unspecialised) scalar kernel arguments."""
        host = {r.uid: op for op in self.k.host.ops for r in op.results}
        out, seen = [], set()
        for op in walk(self.k.body):
            for x in op.operands:
                if x.uid not in host or x.uid in seen:
                    continue
                seen.add(x.uid)
                if host[x.uid].name == "const":
                    text = lower.literal(host[x.uid].attrs["value"], x.type.dtype)
                    self.names[x.uid] = self.consts[x.uid] = text
                    self.maybe_cx.add(x.uid)
                    continue
                name = self.host_names[x.uid]
                if not name.isidentifier():          # a dim: name it for the kernel
                    name = self.fresh(x.hint or "n")
                    self.lines.append(f"{name} = {self.host_names[x.uid]}")
                    self.host_names[x.uid] = name
                self.names[x.uid] = name
                out.append(name)
        return out


def emit(kernel: Kernel, **options) -> str:
    return TritonEmitter(kernel, options).render()

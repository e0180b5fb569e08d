"""Kernel IR -> a Python module over NumPy + ml_dtypes. Programs of the grid run one after
another; every op works on whole tiles. This target is the executable reference semantics:
exact fp8/e8m0 conversions, NaN-poisoned undefined lanes, IEEE float32 arithmetic."""
from __future__ import annotations

from pathlib import Path

import jinja2

from k31dsl.dsl.ir import Kernel, Op
from k31dsl.targets.pyemit import PyEmitter

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          keep_trailing_newline=True)

INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^",
         "shl": "<<", "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
CALLS = {"floordiv": "rt.idiv", "mod": "rt.imod", "maximum": "np.maximum", "minimum": "np.minimum",
         "neg": "np.negative", "abs": "np.abs", "not": "np.invert", "exp": "rt.exp", "exp2": "rt.exp2",
         "log": "rt.log", "log2": "rt.log2", "sqrt": "rt.sqrt", "rsqrt": "rt.rsqrt",
         "sigmoid": "rt.sigmoid", "softplus": "rt.softplus", "relu": "rt.relu", "floor": "rt.floor",
         "ceil": "rt.ceil", "where": "rt.where", "trans": "np.transpose", "cat": "rt.cat",
         "take": "rt.take", "dot": "rt.dot"}


def lit(v) -> str:
    """A Python literal for an attribute value; inf/nan have no literal of their own."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float('{v}')"
    return repr(v)


class NumpyEmitter(PyEmitter):
    target = "numpy"

    def dt(self, dtype) -> str:
        return f"DT_{dtype.name}"

    def rule_for(self, op: Op):
        if op.name in INFIX:
            a, b = op.operands
            return lambda op: f"({self.n(a)} {INFIX[op.name]} {self.n(b)})"
        if op.name in CALLS:
            return lambda op: f"{CALLS[op.name]}({', '.join(self.n(x) for x in op.operands)})"
        return super().rule_for(op)

    def op_const(self, op):
        return f"{self.dt(op.attrs['dtype'])}({lit(op.attrs['value'])})"

    def op_dim(self, op):
        return f"np.int32({self.n(op.operands[0])}.shape[{op.attrs['axis']}])"

    def op_arange(self, op):
        return f"np.arange({op.attrs['size']}, dtype=np.int32)"

    def op_full(self, op):
        return f"rt.full({tuple(op.attrs['shape'])!r}, {lit(op.attrs['value'])}, {self.dt(op.attrs['dtype'])})"

    def _access(self, op, has_value: bool):
        kinds = op.attrs["index"]
        t = self.n(op.operands[0])
        idx = [self.n(v) for v in op.operands[1:1 + len(kinds)]]
        rest = op.operands[1 + len(kinds):]
        value = self.n(rest[0]) if has_value else None
        mask = self.n(rest[-1]) if op.attrs["mask"] else "None"
        return t, tuple(kinds), "(" + "".join(i + ", " for i in idx) + ")", value, mask

    def op_load(self, op):
        t, kinds, idx, _, mask = self._access(op, False)
        return f"rt.load({t}, {kinds!r}, {idx}, {mask}, {lit(op.attrs['other'])})"

    def op_store(self, op):
        t, kinds, idx, value, mask = self._access(op, True)
        return f"rt.store({t}, {kinds!r}, {idx}, {value}, {mask})"

    def op_cast(self, op):
        return f"rt.cast({self.n(op.operands[0])}, '{op.attrs['dtype'].name}')"

    def op_bitcast(self, op):
        return f"rt.bitcast({self.n(op.operands[0])}, {self.dt(op.attrs['dtype'])})"

    def _reduce(self, op):
        return f"rt.reduce_{op.name}({self.n(op.operands[0])}, {op.attrs['axis']!r})"

    op_sum = op_max = op_min = _reduce

    def op_cumsum(self, op):
        return f"rt.cumsum({self.n(op.operands[0])}, {op.attrs['axis']}, {op.attrs['reverse']})"

    def op_histogram(self, op):
        return f"rt.histogram({self.n(op.operands[0])}, {op.attrs['bins']})"

    def op_topk(self, op):
        return f"rt.topk({self.n(op.operands[0])}, {op.attrs['n']})"

    def op_expand(self, op):
        return f"np.expand_dims({self.n(op.operands[0])}, {op.attrs['axis']})"

    def op_broadcast(self, op):
        return f"rt.broadcast({self.n(op.operands[0])}, {tuple(op.attrs['shape'])!r})"

    def op_reshape(self, op):
        return f"np.reshape({self.n(op.operands[0])}, {tuple(op.attrs['shape'])!r})"

    def loop_index(self, iv):
        return f"{self.n(iv)} = np.int32({self.n(iv)})"

    def render(self) -> str:
        k = self.k
        params = [self.name(p.value) for p in k.params]
        for p in k.params:      # scalars arrive as Python numbers: give them their declared type
            if not p.is_tensor:
                self.line(0, f"{self.n(p.value)} = {self.dt(p.value.type.dtype)}({self.n(p.value)})")
        self.block(k.host, 0)
        host, self.lines = self.lines, []
        grid = [self.n(g) for g in k.grid]
        pids = [self.name(a) for a in k.body.args]
        self.last_src = None
        self.block(k.body, 0)
        body = self.lines or ["pass"]
        used = sorted({t.name for t in _dtypes_of(k)})
        dtypes = [(f"DT_{n}", f"rt.DT[{n!r}]") for n in used]
        return _ENV.get_template("module.py.jinja").render(
            header=self.header(), name=k.name, params=params, host=host, grid=grid, pids=pids,
            body=body, dtypes=dtypes)


def _dtypes_of(k: Kernel):
    from k31dsl.dsl import dtypes as D
    from k31dsl.dsl.ir import all_ops
    out = {D.f32, D.i32} | {p.value.type.dtype for p in k.params}
    for op in all_ops(k):
        for key in ("dtype",):
            if key in op.attrs:
                out.add(op.attrs[key])
        for r in op.results:
            out.add(r.type.dtype)
    return out


def emit(kernel: Kernel, **options) -> str:
    return NumpyEmitter(kernel, options).render()

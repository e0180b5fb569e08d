"""The DSL surface an op author imports as `k`: decorators, annotations and the names that are
only meaningful inside a kernel. Calling those names from plain Python raises a K31Error; the
frontend recognises them by identity while it reads the kernel's AST."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from . import dtypes as D
from .errors import K31Error, Loc

# The front door (k31dsl/__init__) installs the target dispatcher here, so that `dsl` never
# imports `targets` (data flows one way).
_COMPILER: Callable | None = None


def set_compiler(fn: Callable) -> None:
    global _COMPILER
    _COMPILER = fn


ALIGNMENTS = (2, 4, 8, 16)


class aligned:  # noqa: N801 - spelled like the other names of the DSL surface
    """`k.aligned(16)`, the last item of a `k.Tensor[...]`: a promise that every row of the tensor
    starts on a multiple of that many bytes: each stride but the innermost, and the innermost
    extent, are multiples of it, and the innermost stride is 1. Every call checks it (a K31Error
    names the parameter); Triton is told, so gathers of rows whose length is no multiple of 16
    elements (a 656-byte record viewed as 328 bf16, say) become 16-byte vector loads instead of one
    load per element."""

    def __init__(self, nbytes: int):
        if isinstance(nbytes, bool) or nbytes not in ALIGNMENTS:
            raise K31Error(f"k.aligned takes a byte count out of {', '.join(map(str, ALIGNMENTS))}, got {nbytes!r}",
                           hint="16 is what a vector load wants")
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"k.aligned({self.nbytes})"


class TensorAnnot:
    """`k.Tensor[k.bf16, "N", "D"]`: dtype plus one named or expression dim per axis, and
    optionally `k.aligned(n)` last. The dtype slot may instead name a dtype constexpr of the
    kernel, `k.Tensor["XT", "N", "D"]`: a call binds it from the tensor's dtype (see `constexpr`)."""

    def __init__(self, dtype: D.DType | str, dims: tuple[str, ...], align: int = 0):
        self.dtype, self.dims, self.align = dtype, dims, align

    @property
    def dtype_param(self) -> str | None:
        """The constexpr that holds the dtype, or None for a fixed dtype."""
        return self.dtype if isinstance(self.dtype, str) else None

    def __class_getitem__(cls, item):
        item = item if isinstance(item, tuple) else (item,)
        first = item[0] if item else None
        shape = "e.g. k.Tensor[k.f32, \"N\", \"D\"], or k.Tensor[\"XT\", \"N\", \"D\"] with a dtype constexpr XT"
        if not (isinstance(first, D.DType) or (isinstance(first, str) and first.isidentifier())):
            raise K31Error(f"k.Tensor[...] starts with a dtype or the name of a dtype constexpr, {shape}")
        align = 0
        if len(item) > 1 and isinstance(item[-1], aligned):
            align, item = item[-1].nbytes, item[:-1]
        dims = []
        for d in item[1:]:
            if isinstance(d, aligned):
                raise K31Error(f"{d!r} goes last in k.Tensor[...], after the dims")
            if not isinstance(d, (str, int)):
                raise K31Error(f"k.Tensor dims are names or expressions in strings, got {d!r}")
            dims.append(str(d))
        if not dims:
            raise K31Error(f"k.Tensor[...] starts with a dtype (or a dtype constexpr's name), then at least "
                           f"one dim: {shape}")
        return cls(first, tuple(dims), align)

    def __repr__(self) -> str:
        tail = f", k.aligned({self.align})" if self.align else ""
        return f"k.Tensor[{self.dtype!r}, {', '.join(map(repr, self.dims))}{tail}]"


Tensor = TensorAnnot


def is_one_of(value, allowed) -> bool:
    """`value` is one of `allowed`, comparing like with like (True is not 1, dtypes by identity)."""
    return any(value is a or (type(value) is type(a) and not isinstance(a, D.DType) and value == a)
               for a in allowed)


class ConstexprAnnot:
    """`k.constexpr`: a compile-time parameter; each value gives its own specialisation.
    `k.constexpr[a, b, ...]` (or `k.constexpr[TUPLE]`) also restricts it to the listed values,
    e.g. `XT: k.constexpr[k.bf16, k.f16, k.f32] = k.bf16` for the dtype of `k.Tensor["XT", ...]`."""

    def __init__(self, allowed: tuple | None = None):
        self.allowed = allowed

    def __getitem__(self, item):
        if self.allowed is not None:
            raise K31Error(f"{self!r} already lists its allowed values; write k.constexpr[a, b, ...] once")
        values = item if isinstance(item, tuple) else (item,)
        if len(values) == 1 and isinstance(values[0], (tuple, list)):
            values = tuple(values[0])          # k.constexpr[FLOATS] with FLOATS a tuple of dtypes
        if not values:
            raise K31Error("k.constexpr[...] lists the values the constexpr allows; it needs at least one")
        return ConstexprAnnot(tuple(values))

    def __repr__(self) -> str:
        if self.allowed is None:
            return "k.constexpr"
        return f"k.constexpr[{', '.join(map(repr, self.allowed))}]"


constexpr = ConstexprAnnot()


def defining_locals(fn: Callable) -> dict:
    """The local names of the function whose body defines `fn` (a kernel factory), captured when
    the decorator runs. Names used only in string annotations (`from __future__ import
    annotations`) are no closure cells, so this is where `k.Tensor[dt, ...]` finds `dt`."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if fn.__code__ in frame.f_code.co_consts and frame.f_code.co_name != "<module>":
                return dict(frame.f_locals)
            frame = frame.f_back
    finally:
        del frame
    return {}


class FuncDef:
    """A `@k.func` device helper; the frontend inlines it at each call."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = fn.__name__
        self.def_locals = defining_locals(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *a, **kw):
        raise K31Error(f"@k.func `{self.name}` can only be called from inside a @k.kernel or another @k.func")


class KernelDef:
    """A `@k.kernel` function. `kern[target]` (or `k.compile(kern, target=...)`) gives a callable."""

    def __init__(self, fn: Callable, configs: list[dict] | None = None):
        self.fn = fn
        self.name = fn.__name__
        self.def_locals = defining_locals(fn)
        self.configs = [dict(c) for c in (configs or [])]
        functools.update_wrapper(self, fn)
        try:
            self.file = inspect.getsourcefile(fn) or "<unknown>"
            self.first_line = inspect.getsourcelines(fn)[1]
        except (OSError, TypeError):
            self.file, self.first_line = "<unknown>", 0
        self._compiled: dict = {}
        self._signature = None

    def signature(self):
        """The parameters read from the annotations (dsl/signature.py), read once."""
        if self._signature is None:
            from .frontend import kernel_signature
            self._signature = kernel_signature(self)
        return self._signature

    @property
    def loc(self) -> Loc:
        return Loc(self.file, self.first_line, 0)

    def __getitem__(self, target: str):
        return self.compile(target)

    def compile(self, target: str = "numpy", **options):
        if _COMPILER is None:
            raise K31Error("no target dispatcher installed; import k31dsl first")
        key = (target, tuple(sorted(options.items())))
        if key not in self._compiled:
            self._compiled[key] = _COMPILER(self, target, **options)
        return self._compiled[key]

    def ir(self, **constexprs):
        """The kernel IR for one specialisation (constexprs default from the signature/configs)."""
        from .frontend import build_kernel
        return build_kernel(self, constexprs)

    def __call__(self, *a, **kw):
        raise K31Error(f"call a compiled kernel: `{self.name}[\"numpy\"](...)` or "
                       f"`k.compile({self.name}, target=...)(...)`")

    def __repr__(self) -> str:
        return f"<k31dsl kernel {self.name} ({self.file}:{self.first_line})>"


def kernel(fn: Callable | None = None, *, configs: list[dict] | None = None):
    if fn is None:
        return lambda f: KernelDef(f, configs)
    return KernelDef(fn, configs)


def func(fn: Callable) -> FuncDef:
    return FuncDef(fn)


# ---------------------------------------------------------------- in-kernel names

def _in_kernel_only(name: str):
    def stub(*a, **kw):
        raise K31Error(f"k.{name} can only be used inside a @k.kernel or @k.func body")
    stub.__name__ = name
    stub.__qualname__ = name
    return stub


IN_KERNEL = ("grid span arange zeros full exp exp2 log log2 sqrt rsqrt abs sigmoid softplus relu "
             "floor ceil maximum minimum where sum max min cumsum histogram dot topk take cat reshape "
             "broadcast_to cdiv load store static_range range cast bitcast").split()

for _n in IN_KERNEL:
    globals()[_n] = _in_kernel_only(_n)

BUILTIN_BY_ID: dict[int, str] = {id(globals()[_n]): _n for _n in IN_KERNEL}


def builtin_name(obj: Any) -> str | None:
    return BUILTIN_BY_ID.get(id(obj))

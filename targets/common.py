"""What every target's callable shares: constexpr specialisation, argument checking against the
kernel's annotations (dtype, rank, named dims), and the error a wrong call produces."""
from __future__ import annotations

import ast
import functools
from typing import Any, Callable

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import CapacityError, K31Error, error, naming_the_call
from k31dsl.dsl.ir import Kernel, TensorType
from k31dsl.dsl.signature import EMPTY


def _array_facts(x, allow_numpy: bool):
    """(dtype, shape) of a torch tensor (or numpy array where the target accepts them)."""
    try:
        import torch
        if isinstance(x, torch.Tensor):
            return D.from_torch(x.dtype), tuple(x.shape)
    except ImportError:
        pass
    if allow_numpy:
        import numpy as np
        if isinstance(x, np.ndarray):
            return D.from_numpy(x.dtype), tuple(x.shape)
    return None


def _strides(x) -> tuple:
    """Strides in elements of a torch tensor or numpy array."""
    return tuple(x.stride()) if callable(getattr(x, "stride", None)) else tuple(s // x.itemsize for s in x.strides)


@functools.lru_cache(maxsize=1024)
def _dim_code(expr: str):
    """(names, code) of a dim annotation, code None when it is not plain integer arithmetic;
    cached because every call of a kernel checks its arguments' dims."""
    tree = ast.parse(expr, mode="eval")
    names = frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    allowed = (ast.Expression, ast.BinOp, ast.Name, ast.Constant, ast.Load, ast.Add, ast.Sub,
               ast.Mult, ast.FloorDiv, ast.Mod, ast.UnaryOp, ast.USub, ast.Call)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        return names, None
    return names, compile(tree, "<dim>", "eval")


def _eval_dim(expr: str, env: dict[str, int]):
    """Evaluate a dim annotation such as "D // 128" once its names are known; None if not yet."""
    if expr in env:
        return env[expr]
    names, code = _dim_code(expr)
    if code is None or not names <= env.keys():
        return None
    return eval(code, {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b)}, dict(env))


@naming_the_call
def check_args(kernel: Kernel, kdef, args: tuple, allow_numpy: bool) -> list:
    """Validate a call against the kernel's parameters; returns the arguments in order. Errors
    point at the parameter's declaration (the kernel's `def` line for the argument count) and
    name the user's call that broke it."""
    params = kernel.params
    sig = ", ".join(p.name for p in params)
    if len(args) != len(params):
        raise error(f"kernel `{kernel.name}` takes {len(params)} arguments ({sig}), got {len(args)}",
                    kernel.loc, f"call it as {kernel.name}[target]({sig}); constexprs go by keyword")
    dims: dict[str, int] = {k: v for k, v in kernel.constexprs.items() if isinstance(v, int)}
    pending = []
    for p, a in zip(params, args):
        t = p.value.type
        where = p.loc if p.loc.line else kernel.loc
        what = f"argument `{p.name}` of `{kernel.name}`"
        if isinstance(t, TensorType):
            facts = _array_facts(a, allow_numpy)
            if facts is None:
                kind = "a torch tensor" + (" or numpy array" if allow_numpy else "")
                raise error(f"{what} must be {kind}, got {type(a).__name__}", where,
                            f"pass a {t.dtype.name} tensor of rank {t.rank}")
            dt, shape = facts
            ok = dt is t.dtype or (t.dtype is D.e8m0 and dt is D.u8)
            if not ok:
                raise error(f"{what} has dtype {dt.name if dt else '?'}, the kernel expects {t.dtype.name}",
                            where, f"convert it first, e.g. x.to({D.torch_dtype(t.dtype)})")
            if len(shape) != t.rank:
                raise error(f"{what} has rank {len(shape)} (shape {list(shape)}), the kernel expects rank "
                            f"{t.rank} {list(t.dims)}", where, "reshape or view the tensor to the annotated rank")
            broken = t.align and t.misalignment(shape, _strides(a))
            if broken:
                raise error(f"{what} breaks its k.aligned({t.align}): {broken}", where,
                            f"pass rows that start on {t.align}-byte multiples, e.g. a contiguous tensor whose "
                            f"innermost dim holds a multiple of {t.align} bytes")
            for axis, (expr, size) in enumerate(zip(t.dims, shape)):
                if expr.isidentifier() and expr not in dims:
                    dims[expr] = size
                else:
                    pending.append((p, axis, expr, size))
        else:
            if _array_facts(a, True) is not None and getattr(a, "ndim", 1) != 0:
                raise error(f"{what} is a scalar {t.dtype.name}, got an array", where,
                            "pass a Python number (use .item() on a one-element tensor)")
            if t.dtype.is_int and (isinstance(a, bool) or not hasattr(a, "__index__")):
                raise error(f"{what} must be an integer, got {a!r}"[:200], where, "pass a Python int")
            if t.dtype.is_int:
                bits = t.dtype.bits
                lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if t.dtype.signed else (0, (1 << bits) - 1)
                if not lo <= int(a) <= hi:
                    raise error(f"{what} = {int(a)} does not fit {t.dtype.name}", where, f"pass a value in {lo} .. {hi}")
            if (t.dtype.is_float or t.dtype is D.bool_) and (isinstance(a, str) or not hasattr(a, "__float__")):
                raise error(f"{what} must be a number, got {a!r}"[:200], where, f"pass a Python float for {t.dtype.name}")
    for p, axis, expr, size in pending:
        want = _eval_dim(expr, dims)
        if want is not None and want != size:
            bound = ", ".join(f"{k}={v}" for k, v in dims.items() if k in expr)
            raise error(f"argument `{p.name}` of `{kernel.name}` has size {size} on axis {axis}, "
                        f"but its annotation says {expr} = {want} ({bound})", p.loc if p.loc.line else kernel.loc,
                        "dims with the same name must agree across arguments (and with constexprs)")
    return list(args)


def call_signature(args, kwargs):
    """What a call's validity depends on: each tensor's dtype, shape, strides and device, each
    scalar's type (and an integer's sign and bit width), and the keyword values. None when something is not hashable (no fast path)."""
    sig = []
    for a in args:
        shape = getattr(a, "shape", None)
        if shape is not None and hasattr(a, "get_device"):       # torch (the hot path: keep it lean)
            sig.append((a.dtype, shape, a.stride(), a.device))
        elif shape is not None:
            sig.append((a.dtype, tuple(shape), a.strides, id(a)))   # numpy: no reuse across arrays
        elif isinstance(a, int):     # integer arguments are range-checked: key on sign and width
            sig.append((type(a), a < 0, a.bit_length()))
        else:
            sig.append(type(a))
    try:
        kw = tuple(sorted(kwargs.items()))
        hash(kw)
    except TypeError:
        return None
    return tuple(sig), kw


@naming_the_call
def bind_dtypes(kdef, args, by_keyword: dict, passed: dict, allow_numpy: bool) -> dict:
    """The dtype constexprs of a call: each one not in `passed` is bound from the dtype of the
    tensors whose annotation names it (they must agree); passed ones are checked against them.
    Returns `passed` plus the bound ones. Non-tensor arguments are left to check_args. Errors
    point at the parameter and name the user's call, as check_args' do."""
    sig = kdef.signature()
    out = dict(passed)
    for name, users in sig.dtype_slots.items():
        seen = None                                  # (param, dtype) of the first tensor naming `name`
        for p in users:
            a = args[p.index] if p.index < len(args) else by_keyword.get(p.name)
            facts = _array_facts(a, allow_numpy) if a is not None else None
            if facts is None or facts[0] is None:
                continue
            dt = facts[0]
            if name in passed:
                want = passed[name]
                if isinstance(want, D.DType) and dt is not want and not (want is D.e8m0 and dt is D.u8):
                    raise error(f"argument `{p.name}` of `{kdef.name}` has dtype {dt.name}, but {name}={want.name} "
                                f"was passed (the annotation of `{p.name}` names {name})", p.loc,
                                f"convert it, e.g. {p.name}.to({D.torch_dtype(want)}), or leave {name} out to "
                                "bind it from the tensors")
                continue
            if seen is None:
                seen = (p, dt)
                sig.check_allowed(name, dt, p.loc, f" (the dtype of `{p.name}`)")
                out[name] = dt
            elif dt is not seen[1]:
                q, qdt = seen
                raise error(f"arguments `{q.name}` ({qdt.name}) and `{p.name}` ({dt.name}) of `{kdef.name}` must "
                            f"have the same dtype: both annotations name the dtype constexpr {name}", p.loc,
                            f"convert one, e.g. {p.name}.to({D.torch_dtype(qdt)}), or give `{p.name}` its own "
                            "dtype constexpr")
        if name not in out and sig.constexprs[name].default is EMPTY and not any(name in c for c in kdef.configs):
            p = users[0]
            a = args[p.index] if p.index < len(args) else by_keyword.get(p.name)
            got = "nothing" if a is None else type(a).__name__
            kind = "a torch tensor" + (" or numpy array" if allow_numpy else "")
            raise error(f"argument `{p.name}` of `{kdef.name}` must be {kind}, got {got}; its dtype gives the "
                        f"constexpr {name}", p.loc, f"pass a tensor for `{p.name}`, or pass {name}= explicitly")
    return out


def forced_config() -> int | None:
    """K31_CONFIG=N (an int >= 0): every kernel with configs runs its config number N (mod the
    number the call leaves open) instead of the first, or on a GPU instead of tuning; unset: None.
    Read when a kernel meets a call signature for the first time (later calls of that signature
    take the launcher it chose), so set it before the process runs kernels."""
    import os
    raw = os.environ.get("K31_CONFIG", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise K31Error(f"K31_CONFIG={raw!r}: expected a config number (an int >= 0)")
    return int(raw)


class CompiledKernel:
    """A kernel bound to a target. Call it with the kernel's parameters (torch tensors, numbers);
    constexprs may be passed by keyword and select a specialisation. Dtype constexprs that are not
    passed are bound from the tensors' dtypes (so a new dtype is a new specialisation)."""

    allow_numpy = False

    def __init__(self, kdef, target: str, build: Callable[[Kernel], Callable], **options):
        self.kdef, self.target, self.build, self.options = kdef, target, build, options
        self._ir: dict = {}
        self._launch: dict = {}
        self._fast: dict = {}      # call signature -> launcher, once the signature has been checked

    def ir(self, **constexprs) -> Kernel:
        key = tuple(sorted(constexprs.items()))
        if key not in self._ir:
            from k31dsl.lowering.pipeline import run_pipeline
            # verified, and for compiled targets checked for power-of-two tiles and dots >= 16
            self._ir[key] = run_pipeline(self.kdef.ir(**constexprs), self.target)
        return self._ir[key]

    def _split(self, args, kwargs: dict[str, Any]):
        """(constexprs of the call's specialisation: those passed plus the dtype constexprs bound
        from its tensors, parameters passed by keyword)."""
        sig = self.kdef.signature()
        cx = {k: v for k, v in kwargs.items() if k in sig.constexprs}
        rest = {k: v for k, v in kwargs.items() if k not in sig.constexprs}
        if sig.dtype_slots:
            cx = bind_dtypes(self.kdef, args, rest, cx, self.allow_numpy)
        return cx, rest

    def _candidates(self, passed: dict) -> list[dict]:
        """The configs a call leaves open: those agreeing with every constexpr and launch key the
        call fixed (passed, or a dtype bound from a tensor), each once. A kernel whose tile size is
        fixed by its caller (chunk_kda's BT) still has the rest of each matching config open."""
        out, seen = [], set()
        for cfg in self.kdef.configs:
            if all(passed.get(k, v) == v for k, v in cfg.items()):
                merged = tuple(sorted({**passed, **cfg}.items(), key=lambda kv: kv[0]))
                if merged not in seen:             # configs the call makes identical count once
                    seen.add(merged)
                    out.append(cfg)
        return out

    def _forced(self, cx: dict, launch_keys=()) -> list[dict]:
        """The configs to try for a call under K31_CONFIG=N, in order: cx with config number N (mod
        the configs the call leaves open) merged in, then N + 1, ... round the list, for a target
        that cannot build N (CapacityError: AscendC's Unified Buffer; a GPU tuner skips such configs
        too, and on such a target the config can never run). [cx] without the switch or without
        configs. Off the GPU a call takes the first config and on it the tuner's pick: the switch
        runs the others anywhere, so a check on the CPU meets what a GPU tuner may choose
        (`k31dsl check --config N`)."""
        n = forced_config()
        open_ = self._candidates(cx) if n is not None else []
        if not open_:
            return [cx]
        keep = set(self.kdef.signature().constexprs) | set(launch_keys)
        turn = [open_[(n + i) % len(open_)] for i in range(len(open_))]
        return [{**cx, **{k: v for k, v in cfg.items() if k in keep}} for cfg in turn]

    def __call__(self, *args, **kwargs):
        key = call_signature(args, kwargs)
        launch = self._fast.get(key) if key is not None else None
        if launch is not None:
            return launch(*args)
        cx, rest = self._split(args, kwargs)
        tries = self._forced(cx)
        for i, cx in enumerate(tries):
            try:
                if rest:                            # parameters by keyword: always the checked path
                    return self._call_checked(args, rest, cx)
                launch = self._checked_launcher(args, cx)
                break
            except CapacityError:
                if i == len(tries) - 1:
                    raise
        if key is not None:
            self._fast[key] = launch
        return launch(*args)

    def _checked_launcher(self, args, cx: dict) -> Callable:
        kernel = self.ir(**cx)
        check_args(kernel, self.kdef, tuple(args), self.allow_numpy)
        key = tuple(sorted(cx.items()))
        if key not in self._launch:
            self._launch[key] = self.build(kernel)
        return self._launch[key]

    def _with_keywords(self, args, rest: dict, cx: dict) -> list:
        """The positional arguments with the parameters passed by keyword appended in order."""
        if not rest:
            return list(args)
        kernel = self.ir(**cx)
        names = [p.name for p in kernel.params]
        unknown = set(rest) - set(names)
        if unknown:
            raise error(f"kernel `{kernel.name}` has no parameter {', '.join(sorted(unknown))}", kernel.loc,
                        f"parameters: {', '.join(names)}; constexprs: {', '.join(kernel.constexprs) or 'none'}")
        return list(args) + [rest[n] for n in names[len(args):] if n in rest]

    def _call_checked(self, args, rest: dict, cx: dict):
        bound = self._with_keywords(args, rest, cx)
        return self._checked_launcher(bound, cx)(*bound)

    def source(self, **constexprs) -> str:
        from k31dsl.targets import emit_source
        files = emit_source(self.ir(**constexprs), self.target, **self.options)
        return "\n".join(files.values())

"""A kernel's signature, read from its parameter annotations: the runtime parameters (tensors and
scalars) in order, the constexprs with their defaults and allowed values, and which tensors take
their dtype from a dtype constexpr (`x: k.Tensor["XT", "M", "D"]` with `XT: k.constexpr`).

The frontend builds each specialisation's IR from it; the targets use it at a call to bind each
dtype constexpr that was not passed from the dtype of the tensors naming it (`dtype_slots`), the
way Triton specialises on pointer dtypes. The IR itself stays concrete: one specialisation, one
dtype per tensor.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any

from . import dtypes as D
from . import lang
from .errors import K31Error, Loc, error

EMPTY = inspect.Parameter.empty


@dataclass
class ParamSig:
    name: str
    annot: Any                  # lang.TensorAnnot, a DType (scalar) or lang.ConstexprAnnot
    loc: Loc
    node: ast.arg
    default: Any = EMPTY
    index: int = -1             # position among the runtime parameters (the call's arguments)

    @property
    def is_constexpr(self) -> bool:
        return isinstance(self.annot, lang.ConstexprAnnot)

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.annot, lang.TensorAnnot)

    @property
    def allowed(self) -> tuple | None:
        return self.annot.allowed if self.is_constexpr else None


@dataclass
class Signature:
    kernel: str
    loc: Loc
    params: list[ParamSig]                                   # every parameter, in order
    constexprs: dict[str, ParamSig] = field(default_factory=dict)
    runtime: list[ParamSig] = field(default_factory=list)    # tensors and scalars, in call order
    dtype_slots: dict[str, list[ParamSig]] = field(default_factory=dict)   # dtype constexpr -> tensors

    def allowed_text(self, name: str) -> str:
        return ", ".join(getattr(v, "name", repr(v)) for v in self.constexprs[name].allowed)

    def check_allowed(self, name: str, value, loc: Loc | None = None, why: str = "") -> None:
        """A K31Error unless `value` is one of the values `k.constexpr[...]` allows for `name`."""
        allowed = self.constexprs[name].allowed
        if allowed is None or lang.is_one_of(value, allowed):
            return
        shown = getattr(value, "name", repr(value))
        slots = self.dtype_slots.get(name)
        hint = (f"convert {' and '.join(f'`{p.name}`' for p in slots)} to one of them" if slots and why
                else f"pass {name}= one of them, or widen k.constexpr[...] in the kernel")
        raise error(f"constexpr `{name}` of `{self.kernel}` is {shown}{why}, which is not allowed: "
                    f"it must be one of {self.allowed_text(name)}", loc or self.constexprs[name].loc, hint)


def eval_annotation(src, fn, name: str, anode):
    """The annotation object of parameter `name` (string annotations evaluated in the kernel's
    scope, so `from __future__ import annotations` works)."""
    raw = fn.__annotations__.get(name)
    if not isinstance(raw, str):
        return raw
    try:
        return eval(raw, dict(src.scope))  # noqa: S307 - the user's own annotation text
    except K31Error as e:
        raise error(e.message, src.loc(anode.annotation), e.hint or "fix the annotation") from None
    except Exception as e:  # noqa: BLE001 - any failure is the user's annotation
        raise error(f"cannot evaluate the annotation of `{name}`: {e}", src.loc(anode.annotation),
                    "annotate with k.Tensor[dtype, dims...], a dtype such as k.f32, or k.constexpr") from None


def check_dim_expr(src, d: str, a: ast.arg) -> None:
    allowed = (ast.Expression, ast.BinOp, ast.Name, ast.Constant, ast.Load, ast.Add, ast.Sub,
               ast.Mult, ast.FloorDiv, ast.Mod, ast.UnaryOp, ast.USub, ast.Call)
    try:
        tree = ast.parse(d, mode="eval")
    except SyntaxError:
        tree = None
    ok = tree is not None and all(isinstance(n, allowed) for n in ast.walk(tree)) and all(
        isinstance(n.func, ast.Name) and n.func.id == "cdiv" for n in ast.walk(tree) if isinstance(n, ast.Call))
    if not ok:
        raise error(f"dim annotation \"{d}\" of `{a.arg}` is not a dim expression", src.loc(a),
                    "dims are names, integers, or + - * // % and cdiv(a, b) of them, e.g. \"D // 128\"")


def read_signature(kdef, src) -> Signature:
    """Classify the parameters of kdef's `def` (parsed in `src`); K31Errors at the parameter."""
    fn, fdef = kdef.fn, src.fdef
    args = fdef.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise error("kernels take plain positional parameters only", src.loc(fdef),
                    "remove *args, **kwargs, `/` and keyword-only parameters")
    nodes = args.args
    default_nodes = dict(zip([a.arg for a in nodes[len(nodes) - len(args.defaults):]], args.defaults))
    py_sig = inspect.signature(fn)
    anns = {a.arg: eval_annotation(src, fn, a.arg, a) for a in nodes if a.annotation is not None}
    sig = Signature(kdef.name, src.loc(fdef), [])
    for a in nodes:
        name, ann = a.arg, anns.get(a.arg)
        p = ParamSig(name, ann, src.loc(a), a, py_sig.parameters[name].default)
        sig.params.append(p)
        if p.is_constexpr:
            sig.constexprs[name] = p
            continue
        if name in default_nodes and isinstance(ann, (lang.TensorAnnot, D.DType)):
            raise error(f"only constexpr parameters may have defaults (`{name}`)", src.loc(default_nodes[name]),
                        "remove the default, or annotate the parameter k.constexpr")
        if isinstance(ann, lang.TensorAnnot):
            for d in ann.dims:
                check_dim_expr(src, d, a)
        elif isinstance(ann, D.DType):
            if ann.is_storage_only:
                raise error(f"scalar parameter `{name}` cannot be {ann.name}", p.loc,
                            "pass scalars as k.f32 (or an integer type) and convert inside")
        elif ann is None:
            raise error(f"parameter `{name}` needs an annotation", p.loc,
                        "use k.Tensor[dtype, dims...], a dtype such as k.f32, or k.constexpr")
        else:
            what = "k.Tensor needs [dtype, dims...]" if ann is lang.TensorAnnot else repr(ann)[:60]
            raise error(f"parameter `{name}` has an unsupported annotation ({what})", p.loc,
                        "use k.Tensor[dtype, dims...], a dtype such as k.f32, or k.constexpr")
        p.index = len(sig.runtime)
        sig.runtime.append(p)
    for p in sig.runtime:
        slot = p.annot.dtype_param if p.is_tensor else None
        if slot is None:
            continue
        if slot not in sig.constexprs:
            what = "a runtime parameter" if any(q.name == slot for q in sig.params) else "no parameter"
            raise error(f"the dtype of `{p.name}` is \"{slot}\", which is {what} of `{kdef.name}`; a tensor's "
                        "dtype is a dtype (k.bf16) or the name of a dtype constexpr", p.loc,
                        f"add a parameter `{slot}: k.constexpr` (bound from the dtype of `{p.name}` at each "
                        f"call), or write a dtype, e.g. k.Tensor[k.f32, {', '.join(map(repr, p.annot.dims))}]")
        sig.dtype_slots.setdefault(slot, []).append(p)
    for name, users in sig.dtype_slots.items():
        bad = [v for v in (sig.constexprs[name].allowed or ()) if not isinstance(v, D.DType)]
        if bad:
            raise error(f"constexpr `{name}` gives the dtype of `{users[0].name}`, but k.constexpr[...] "
                        f"allows {bad[0]!r}, which is not a dtype", sig.constexprs[name].loc,
                        "list dtypes only, e.g. k.constexpr[k.bf16, k.f16, k.f32]")
    return sig

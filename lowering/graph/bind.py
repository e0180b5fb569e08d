"""Binding a `p.call(kernel, ...)` to the kernel's signature: runtime parameters from positional
and keyword arguments, constexprs from the other keywords, dtype constexprs from the tensors, the
specialised kernel IR, and which tensor parameters it stores to. Also dim-annotation checking
against the program's static shapes (shared with the graph verifier)."""
from __future__ import annotations

import ast

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error, error
from k31dsl.dsl.ir import TensorType, all_ops


def _accessed(kernel, op_name: str) -> list[str]:
    """Names of the tensor parameters the kernel `load`s or `store`s, in parameter order. Kernel
    IR is never edited after it is built (passes make new kernels), so the answer is kept on the
    kernel: graph passes ask it for every call each time they rebuild a program."""
    cache = kernel.__dict__.setdefault("_k31_accessed", {})
    if op_name not in cache:
        uids = {op.operands[0].uid for op in all_ops(kernel) if op.name == op_name}
        cache[op_name] = [p.name for p in kernel.params if p.is_tensor and p.value.uid in uids]
    return cache[op_name]


def stored_params(kernel) -> list[str]:
    """Names of the tensor parameters the kernel stores to, in parameter order."""
    return list(_accessed(kernel, "store"))


def loaded_params(kernel) -> list[str]:
    return list(_accessed(kernel, "load"))


def bind_call(program, kdef, args, kwargs, where=None, call_name: str | None = None):
    """(kernel IR, constexprs, {param: tensor id or scalar}, [written params]). Output tensors left
    out are allocated (allocate_outputs). Errors point at `where` (the user's p.call line)."""
    from k31dsl.lowering.graph.ir import TensorRef
    if not hasattr(kdef, "signature"):
        raise K31Error(f"p.call expects a @k.kernel, got {type(kdef).__name__}")
    sig = kdef.signature()
    names = [p.name for p in sig.runtime]
    cx = {k: v for k, v in kwargs.items() if k in sig.constexprs}
    by_kw = {k: v for k, v in kwargs.items() if k not in sig.constexprs}
    unknown = set(by_kw) - set(names)
    if unknown:
        raise error(f"`{kdef.name}` has no parameter {', '.join(sorted(unknown))}", where or kdef.loc,
                    f"parameters: {', '.join(names)}; constexprs: {', '.join(sig.constexprs) or 'none'}")
    if len(args) > len(names):
        raise error(f"`{kdef.name}` takes {len(names)} arguments ({', '.join(names)}), got {len(args)}", where or kdef.loc)
    values = dict(zip(names, args))
    for k, v in by_kw.items():
        if k in values:
            raise error(f"parameter `{k}` of `{kdef.name}` is given twice", where or kdef.loc)
        values[k] = v
    missing = [n for n in names if n not in values]
    scalars_missing = [p.name for p in sig.runtime if p.name in missing and not p.is_tensor]
    if scalars_missing:
        raise error(f"`{kdef.name}`: missing argument(s) {', '.join(scalars_missing)}", where or kdef.loc,
                    f"call it as p.call({kdef.name}, {', '.join(names)}, CONSTEXPR=...)")
    bound = {}
    for p in sig.runtime:
        if p.name in missing:
            continue
        v = values[p.name]
        if p.is_tensor:
            if not isinstance(v, TensorRef) or v.program is not program:
                raise error(f"argument `{p.name}` of `{kdef.name}` must be a tensor of program "
                            f"`{program.name}` (from p.input/p.weight/p.tensor or a p.call result), got "
                            f"{type(v).__name__}", where or p.loc)
            if v.id != program.latest[v.storage]:
                raise error(f"argument `{p.name}` of `{kdef.name}` is {v.id}, an old version of `{v.storage}` "
                            f"(now {program.latest[v.storage]})", where or p.loc,
                            "use the handle the writing p.call returned")
            bound[p.name] = v.id
        else:
            if isinstance(v, TensorRef) or not isinstance(v, (int, float, bool)):
                raise error(f"argument `{p.name}` of `{kdef.name}` is a scalar, got {type(v).__name__}", where or p.loc,
                            "pass a Python number")
            bound[p.name] = v
    for slot, users in sig.dtype_slots.items():
        users = [u for u in users if u.name in bound]
        if slot in cx or not users:
            continue
        dts = {program.tensor_node(bound[u.name]).dtype for u in users}
        cx[slot] = program.tensor_node(bound[users[0].name]).dtype
        if len(dts) > 1:
            raise error(f"tensors {', '.join(u.name for u in users)} of `{kdef.name}` share the dtype "
                        f"constexpr {slot} but have dtypes {', '.join(sorted(d.name for d in dts))}", where or users[0].loc)
    kernel = kdef.ir(**cx)
    if missing:
        allocate_outputs(program, kernel, bound, missing, call_name or kdef.name, where)
    check_binding(program, kernel, bound, where)
    written = stored_params(kernel)
    return kernel, cx, bound, written


def allocate_outputs(program, kernel, bound: dict, missing: list[str], call_name: str, where) -> None:
    """Tensor parameters left out of a p.call that the kernel only stores to become new temps
    named `<call>_<param>`, their shapes from the dims the other arguments bind."""
    written = set(stored_params(kernel)) - set(loaded_params(kernel))
    env = {k: v for k, v in kernel.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}
    for p in kernel.params:
        if p.name in bound and isinstance(bound[p.name], str):
            for expr, size in zip(p.value.type.dims, program.tensor_node(bound[p.name]).shape):
                if expr.isidentifier():
                    env.setdefault(expr, size)
    for name in missing:
        p = next(q for q in kernel.params if q.name == name)
        if name not in written:
            raise error(f"`{kernel.name}`: missing argument `{name}` (the kernel reads it, so it cannot be "
                        "made for you)", where or p.loc, "pass a tensor for it")
        shape = [_eval_dim(d, env) for d in p.value.type.dims]
        if any(s is None for s in shape):
            raise error(f"`{kernel.name}`: cannot size the output `{name}` {list(p.value.type.dims)} from the "
                        "other arguments", where or p.loc, f"declare it with p.tensor(...) and pass it as {name}=")
        base, n, tname = f"{call_name}_{name}", 0, f"{call_name}_{name}"
        while tname in program.latest:
            n += 1
            tname = f"{base}_{n}"
        bound[name] = program.tensor(tname, tuple(shape), p.value.type.dtype).id


def _eval_dim(expr: str, env: dict):
    if expr in env:
        return env[expr]
    tree = ast.parse(expr, mode="eval")
    if not {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id != "cdiv"} <= env.keys():
        return None
    return eval(compile(tree, "<dim>", "eval"),  # noqa: S307 - checked dim annotation text
                {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b)}, dict(env))


def check_binding(program, kernel, bound: dict, where=None) -> None:
    """Dtypes, ranks and named dims of the bound tensors agree with the kernel's parameters."""
    env = {k: v for k, v in kernel.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}
    pending = []
    for p in kernel.params:
        if p.name not in bound:
            raise error(f"parameter `{p.name}` of `{kernel.name}` is not bound", where or kernel.loc)
        val = bound[p.name]
        t = p.value.type
        if isinstance(t, TensorType):
            if not isinstance(val, str):
                raise error(f"parameter `{p.name}` of `{kernel.name}` is a tensor, bound to {val!r}", where or p.loc)
            node = program.tensor_node(val)
            ok = node.dtype is t.dtype or (t.dtype is D.e8m0 and node.dtype is D.u8)
            if not ok:
                raise error(f"`{kernel.name}`: parameter `{p.name}` is {t.dtype.name}, bound to {val} of dtype "
                            f"{node.dtype.name}", where or p.loc, "declare the tensor with the kernel's dtype")
            if len(node.shape) != t.rank:
                raise error(f"`{kernel.name}`: parameter `{p.name}` has rank {t.rank} {list(t.dims)}, bound to "
                            f"{val} of shape {list(node.shape)}", where or p.loc)
            broken = t.misalignment(node.shape)
            if broken:                      # a graph's tensors are contiguous (execute.py makes them so)
                raise error(f"`{kernel.name}`: parameter `{p.name}` bound to {val} breaks its k.aligned({t.align}): "
                            f"{broken}", where or p.loc, f"give {val} rows of a multiple of {t.align} bytes")
            for expr, size in zip(t.dims, node.shape):
                if expr.isidentifier() and expr not in env:
                    env[expr] = size
                else:
                    pending.append((p, expr, size, val))
        elif isinstance(val, str):
            raise error(f"parameter `{p.name}` of `{kernel.name}` is a scalar, bound to tensor {val}", where or p.loc)
    for p, expr, size, val in pending:
        want = _eval_dim(expr, env)
        if want is not None and want != size:
            raise error(f"`{kernel.name}`: parameter `{p.name}` bound to {val} has size {size} where its "
                        f"annotation says {expr} = {want}", where or p.loc,
                        "dims with the same name must agree across arguments")

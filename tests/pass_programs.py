"""Row kernels and small programs shared by the graph-pass tests (test_passes.py and
test_superkernel.py), and the comparison they all make: a program's outputs with the passes under
test and with `verify` alone."""
import torch

import k31dsl as k
from k31dsl.lowering.graph import Program, run

TARGETS = ["numpy", "triton"]


@k.kernel
def row_scale(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], a: k.f32, BD: k.constexpr = 64):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] * a


@k.kernel
def row_shift(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = 64):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t + 1, k.span(0, BD, other=0.0)]


@k.kernel
def row_add(x: k.Tensor[k.f32, "T", "D"], z: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"],
            BD: k.constexpr = 64):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] + z[t, k.span(0, BD, other=0.0)]


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def on_off(p, passes, inputs, target):
    """Outputs with the passes and without them."""
    off = run(p, {n: v.clone() for n, v in inputs.items()}, target=target, passes=["verify"])
    on = run(p, {n: v.clone() for n, v in inputs.items()}, target=target, passes=["verify", *passes])
    return on, off


def assert_same(on, off, tol=0.0):
    assert on.keys() == off.keys()
    for n in on:
        torch.testing.assert_close(on[n].float(), off[n].float(), rtol=tol, atol=tol, msg=n)


def two_rows(consumer, T=5, D=40, **cx):
    p = Program("two")
    x = p.input("x", (T, D), k.f32)
    h = p.tensor("h", (T, D), k.f32)
    y = p.tensor("y", (T, D), k.f32)
    h = p.call(row_scale, x, h, 3.0)
    y = p.call(consumer, h, y, **cx)
    p.output(y)
    return p

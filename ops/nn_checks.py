"""Registry entries of the model's dense ops (ops/nn.py) with their checks against the fp64 oracle
tests/oracles/nn.py: ragged shapes, every input dtype, the small cases the AscendC emulator builds."""
from __future__ import annotations

from k31dsl.ops.nn import (CONV, embedding, embedding_rows, head_norm_gate, head_norm_gate_rows, linear, linear_rows,
                           linear_rows_splitk, linear_splitk_reduce, short_conv, short_conv_commit,
                           short_conv_commit_rows, short_conv_rows, swiglu, swiglu_rows)
from k31dsl.ops.registry import OpSpec, register
from k31dsl.ops.testing import device_for, dtype_names, for_target, load_oracle, rand, result, to_f64


def _check_linear(target: str, seed: int = 0):
    import torch
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    bf, f32 = torch.bfloat16, torch.float32
    cases = [((7, 70), 33, bf, bf, None, "none", 1), ((2, 3, 100), 65, f32, f32, None, "silu", 1),
             ((70, 24), 130, bf, bf, f32, "silu", 1), ((1, 40), 20, torch.float16, torch.float16, None, "sigmoid", 1),
             ((5, 48), 17, f32, bf, bf, "none", 1), ((3, 300), 40, bf, bf, None, "sigmoid", 3),
             ((2, 200), 20, f32, f32, None, "none", 4)]
    out = []
    for xs, n, xdt, wdt, ydt, act, split in for_target(target, cases, (0, 1)):
        x, w = rand(xs, g, xdt), rand((n, xs[-1]), g, wdt, xs[-1] ** -0.5)
        y = linear(x.to(dev), w.to(dev), act, ydt, split_k=split, target=target)
        want = ref.linear(to_f64(x), to_f64(w), act)
        out.append(result(f"x={list(xs)} w=[{n}, {xs[-1]}] {dtype_names(xdt, wdt, y.dtype)} act={act} split_k={split}",
                          y, want, y.dtype))
    return out


def _check_swiglu(target: str, seed: int = 0):
    import torch
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    for xs, xdt, ydt in for_target(target, (((7, 300), torch.bfloat16, None), ((2, 3, 74), torch.float32, None),
                                            ((70, 40), torch.float16, torch.float32))):
        x = rand(xs, g, xdt, 2.0)
        y = swiglu(x.to(dev), ydt, target=target)
        out.append(result(f"x={list(xs)} {dtype_names(xdt, y.dtype)}", y, ref.swiglu(to_f64(x)), y.dtype))
    return out


def _check_embedding(target: str, seed: int = 0):
    import torch
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    for ids_shape, v, d, dt in for_target(target, (((3, 5), 300, 70, torch.bfloat16), ((40,), 256, 600, torch.float32))):
        ids = torch.randint(0, v, ids_shape, generator=g)
        ids.view(-1)[0], ids.view(-1)[-1] = 0, v - 1
        table = rand((v, d), g, dt)
        y = embedding(ids.to(dev), table.to(dev), target=target)
        out.append(result(f"ids={list(ids_shape)} table=[{v}, {d}] {dtype_names(dt)}", y,
                          ref.embedding(ids.numpy(), to_f64(table)), dt, "max abs err / max |want| (a copy: 0)"))
    return out


def _conv_case(n, s, g):
    import torch
    slots = torch.randperm(s, generator=g)[:n].to(torch.int32)
    slots[n // 2] = -1                                          # a sequence without state
    return slots


def _check_short_conv(target: str, seed: int = 0):
    import torch
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    # (N, T, C, slots, update, dtype): prefill chunk, decode, the long (parallel + commit) path, verify
    cases = ((3, 5, 70, 6, True, torch.bfloat16), (2, 1, 40, 4, True, torch.float32),
             (2, 70, 20, 3, True, torch.float32), (3, 2, 33, 5, False, torch.bfloat16))
    for n, t, c, s, update, dt in for_target(target, cases, (0, 3)):
        x, w = rand((n, t, c), g, dt), rand((c, CONV), g, dt, 0.5)
        state = torch.randn(s, CONV - 1, c, generator=g)
        slots = _conv_case(n, s, g)
        st = state.clone().to(dev)
        y = short_conv(x.to(dev), w.to(dev), st, slots.to(dev), update=update, target=target)
        want_y, want_s = ref.short_conv(to_f64(x), to_f64(w), state.double().numpy(), slots.numpy(), update)
        name = f"x=[{n}, {t}, {c}] {dtype_names(dt)} update={update}"
        out.append(result(name + ": y", y, want_y, dt))
        out.append(result(name + ": state pool", st, want_s, torch.float32))
    return out


def _check_short_conv_commit(target: str, seed: int = 0):
    import torch
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    for n, t, c, s, dt in for_target(target, ((4, 4, 40, 6, torch.bfloat16), (3, 2, 300, 3, torch.float32))):
        x = rand((n, t, c), g, dt)
        state = torch.randn(s, CONV - 1, c, generator=g)
        slots = _conv_case(n, s, g)
        accepted = torch.randint(0, t + 1, (n,), generator=g, dtype=torch.int32)
        accepted[0] = 0
        st = state.clone().to(dev)
        short_conv_commit(x.to(dev), st, slots.to(dev), accepted.to(dev), target=target)
        want = ref.short_conv_commit(to_f64(x), state.double().numpy(), slots.numpy(), accepted.numpy())
        out.append(result(f"x=[{n}, {t}, {c}] {dtype_names(dt)} accepted={accepted.tolist()}", st, want, torch.float32))
    return out


def _check_head_norm_gate(target: str, seed: int = 0):
    import torch
    ref, dev, g = load_oracle("nn"), device_for(target), torch.Generator().manual_seed(seed)
    out = []
    cases = (((7,), 4, 32, torch.bfloat16, None), ((2, 3), 2, 20, torch.float32, None),
             ((70,), 3, 16, torch.float16, torch.float32))
    for lead, hv, v, dt, ydt in for_target(target, cases):
        o = rand(lead + (hv, v), g, dt, 3.0)
        w = (1 + 0.5 * torch.randn(v, generator=g)).to(dt)
        gate = rand(lead + (hv * v,), g, dt, 2.0)
        y = head_norm_gate(o.to(dev), w.to(dev), gate.to(dev), 1e-6, ydt, target=target)
        m = int(torch.tensor(lead).prod())
        want = ref.head_norm_gate(to_f64(o).reshape(m, hv, v), to_f64(w), to_f64(gate).reshape(m, hv * v), 1e-6)
        out.append(result(f"o={list(lead) + [hv, v]} {dtype_names(dt, y.dtype)}", y, want.reshape(lead + (hv * v,)),
                          y.dtype))
    return out


register(OpSpec("linear", "nn", linear, [linear_rows, linear_rows_splitk, linear_splitk_reduce],
                "y = act(x @ w^T), torch Linear layout, act none/sigmoid/silu (fp32 accumulate, k.dot tiles)",
                _check_linear, tags=["nn", "gemm"]))
register(OpSpec("swiglu", "nn", swiglu, [swiglu_rows], "silu(x[..., :F]) * x[..., F:]", _check_swiglu, tags=["nn"]))
register(OpSpec("embedding", "nn", embedding, [embedding_rows], "token embedding: the table row of each token id (ids checked on the host)",
                _check_embedding, tags=["nn"]))
register(OpSpec("short_conv", "nn", short_conv, [short_conv_rows],
                "KDA causal depthwise conv1d (kernel 4) + SiLU with a per-slot fp32 state pool (update in place)",
                _check_short_conv, tags=["nn", "kda"]))
register(OpSpec("short_conv_commit", "nn", short_conv_commit, [short_conv_commit_rows],
                "conv state after the first accepted[n] tokens of a verify step (speculative rollback)",
                _check_short_conv_commit, tags=["nn", "kda"]))
register(OpSpec("head_norm_gate", "nn", head_norm_gate, [head_norm_gate_rows],
                "KDA output: per-head RMSNorm * w * sigmoid(gate)", _check_head_norm_gate, tags=["nn", "kda"]))

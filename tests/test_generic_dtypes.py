"""Dtype-generic kernels: `k.Tensor["T", ...]` names a dtype constexpr that a call binds from the
tensor's dtype (explicitly passed values are checked against the tensors), `k.constexpr[...]`
restricts the values, the bound dtype selects its own specialisation, and the text form carries
dtype constexprs. Results are checked against fp64 NumPy written from the math."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.cli import main
from k31dsl.dsl.ir import all_ops
from k31dsl.dsl.parse import parse_kernel
from k31dsl.dsl.text import print_kernel
from k31dsl.dsl.verify import verify
from k31dsl.targets import compile_kernel

FLOATS = (k.bf16, k.f16, k.f32)
TORCH = {k.bf16: torch.bfloat16, k.f16: torch.float16, k.f32: torch.float32, k.f64: torch.float64}
TOL = {k.bf16: 1e-2, k.f16: 2e-3, k.f32: 1e-5}       # relative, a few ulps of the output dtype


@k.kernel
def axpy_any(x: k.Tensor["T", "N"], y: k.Tensor["T", "N"], out: k.Tensor["OT", "N"], a: k.f32,
             T: k.constexpr[k.bf16, k.f16, k.f32] = k.f32, OT: k.constexpr = k.f32, B: k.constexpr = 32):
    for i in k.grid(k.cdiv(x.shape[0], B)):
        xt = x[k.span(i * B, B, other=0.0)]
        yt = y[k.span(i * B, B, other=0.0)]
        if T is k.f32:
            acc = xt * a + yt
        else:
            acc = xt.to(k.f32) * a + yt.to(k.f32)
        acc = acc + k.zeros((B,), T).to(k.f32)
        out[k.span(i * B, B)] = acc.to(OT)


@k.kernel(configs=[{"B": 32}, {"B": 64}])
def scale_tuned(x: k.Tensor["T", "N"], y: k.Tensor["T", "N"], a: k.f32, T: k.constexpr,
                NEG: k.constexpr = False, B: k.constexpr = 16):
    for i in k.grid(k.cdiv(x.shape[0], B)):
        t = x[k.span(i * B, B, other=0.0)].to(k.f32) * a
        if NEG:
            t = -t
        y[k.span(i * B, B)] = t.to(T)


@k.kernel
def slot_not_a_constexpr(x: k.Tensor["Q", "N"], n: k.i32):
    for i in k.grid(1):
        pass


@k.kernel
def slot_of_runtime_param(x: k.Tensor["n", "N"], n: k.i32):
    for i in k.grid(1):
        pass


@k.kernel
def slot_allows_non_dtypes(x: k.Tensor["T", "N"], T: k.constexpr[k.f32, 4] = k.f32):
    for i in k.grid(1):
        pass


@k.kernel
def empty_allowed(x: k.Tensor[k.f32, "N"], M: k.constexpr[()] = 1):
    for i in k.grid(1):
        pass


@k.kernel
def mode_choice(x: k.Tensor[k.f32, "N"], MODE: k.constexpr["sum", "max"] = "sum"):
    for i in k.grid(1):
        t = x[k.span(0, 16, other=0.0)]
        x[0] = k.sum(t) if MODE == "sum" else k.max(t)


def _inputs(n: int, dt, out_dt, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=g) * 4).to(TORCH[dt])
    y = torch.randn(n, generator=g).to(TORCH[dt])
    return x, y, torch.empty(n, dtype=TORCH[out_dt])


def _oracle(x, y, a: float, out_dt):
    want = x.double().numpy() * a + y.double().numpy()
    return want, TOL[out_dt] * max(1.0, float(np.abs(want).max()))


# ---------------------------------------------------------------- binding rules

def test_default_gives_the_ir_and_tensor_dtypes_follow_the_constexpr():
    ir = axpy_any.ir()
    assert ir.constexprs["T"] is k.f32 and ir.constexprs["OT"] is k.f32
    assert [p.value.type.dtype for p in ir.params[:3]] == [k.f32, k.f32, k.f32]
    assert "cast" not in [op.name for op in all_ops(ir)]          # the `if T is k.f32` branch
    ir16 = axpy_any.ir(T=k.f16, OT=k.bf16)
    assert [p.value.type.dtype for p in ir16.params[:3]] == [k.f16, k.f16, k.bf16]
    casts = [op.attrs["dtype"] for op in all_ops(ir16) if op.name == "cast"]
    assert casts.count(k.f32) >= 2 and k.bf16 in casts          # the `else` branch, .to(OT)
    zeros = [op for op in all_ops(ir16) if op.name == "full"]
    assert any(op.attrs["dtype"] is k.f16 for op in zeros)       # k.zeros(..., T)


def test_a_dtype_constexpr_without_default_needs_a_value_for_the_ir_only():
    with pytest.raises(K31Error, match="constexpr `T` has no value") as e:
        scale_tuned.ir(B=16)
    assert "bound from the dtype of `x`" in e.value.hint
    assert scale_tuned.ir(T=k.bf16).params[1].value.type.dtype is k.bf16
    x = torch.randn(40)
    y = torch.empty(40)
    scale_tuned["numpy"](x, y, -1.5)                     # bound from x and y at the call
    np.testing.assert_allclose(y.numpy(), x.double().numpy() * -1.5, rtol=1e-6)


@pytest.mark.parametrize("dt,out_dt", [(k.bf16, k.bf16), (k.f16, k.f32), (k.f32, k.f32), (k.bf16, k.f32),
                                       (k.f16, k.f16)])
def test_inferred_dtypes_numpy(dt, out_dt):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    x, y, out = _inputs(77, dt, out_dt, seed)
    axpy_any["numpy"](x, y, out, 0.75)
    want, atol = _oracle(x, y, 0.75, out_dt)
    np.testing.assert_allclose(out.double().numpy(), want, rtol=TOL[out_dt], atol=atol, err_msg=f"seed={seed}")


def test_each_bound_dtype_is_its_own_specialisation_and_the_fast_path_keeps_it():
    kern = compile_kernel(axpy_any, "numpy")              # a fresh callable (k.compile caches one)
    outs = {}
    for dt in FLOATS:
        x, y, out = _inputs(50, dt, dt, 1)
        kern(x, y, out, 2.0)
        kern(x, y, out, 2.0)                            # served by the call-signature fast path
        outs[dt] = (x, y, out)
    keys = {dict(key)["T"] for key in kern._launch}
    assert keys == set(FLOATS) and len(kern._fast) == 3
    for dt, (x, y, out) in outs.items():
        want, atol = _oracle(x, y, 2.0, dt)
        np.testing.assert_allclose(out.double().numpy(), want, rtol=TOL[dt], atol=atol)


def test_numpy_arrays_bind_too():
    rng = np.random.default_rng()
    x = rng.standard_normal(40).astype(ml_dtypes.bfloat16)
    y = rng.standard_normal(40).astype(ml_dtypes.bfloat16)
    out = np.zeros(40, np.float32)
    axpy_any["numpy"](x, y, out, 3.0)
    want = x.astype(np.float64) * 3.0 + y.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_explicit_dtype_constexpr_is_checked_against_the_tensors():
    x, y, out = _inputs(20, k.f16, k.f32, 2)
    axpy_any["numpy"](x, y, out, 1.0, T=k.f16)          # agrees: fine
    want, atol = _oracle(x, y, 1.0, k.f32)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=atol)
    with pytest.raises(K31Error, match=r"argument `x` of `axpy_any` has dtype f16, but T=bf16 was passed") as e:
        axpy_any["numpy"](x, y, out, 1.0, T=k.bf16)
    assert e.value.loc.line == axpy_any.first_line + 1
    with pytest.raises(K31Error, match="must be a dtype"):
        axpy_any["numpy"](x, y, out, 1.0, OT="f32")


def test_two_tensors_naming_one_constexpr_must_agree():
    x, _, out = _inputs(20, k.bf16, k.f32, 3)
    y = torch.randn(20).half()
    for target in ("numpy", "triton"):
        with pytest.raises(K31Error) as e:
            axpy_any[target](x, y, out, 1.0)
        msg = str(e.value)
        assert "`x` (bf16)" in msg and "`y` (f16)" in msg and "dtype constexpr T" in msg, msg


def test_a_disallowed_dtype_lists_the_allowed_ones():
    x, y, out = (torch.randn(20, dtype=torch.float64) for _ in range(3))
    with pytest.raises(K31Error) as e:
        axpy_any["numpy"](x, y, out.float(), 1.0)
    msg = str(e.value)
    assert "f64" in msg and "the dtype of `x`" in msg and "must be one of bf16, f16, f32" in msg, msg
    with pytest.raises(K31Error, match="must be one of bf16, f16, f32"):
        axpy_any.ir(T=k.f64)


def test_non_dtype_restrictions():
    x = torch.randn(16)
    y = x.clone()
    mode_choice["numpy"](y, MODE="max")
    assert y[0].item() == x.max().item()
    with pytest.raises(K31Error, match=r"`MODE` of `mode_choice` is 'mean', which is not allowed: it must be one of "
                       r"'sum', 'max'"):
        mode_choice["numpy"](x.clone(), MODE="mean")
    y = x.clone()
    mode_choice["numpy"](y)
    assert y[0].item() == pytest.approx(x.double().sum().item(), rel=1e-5, abs=1e-5)


def test_bad_declarations_are_reported_at_the_parameter():
    with pytest.raises(K31Error, match="the dtype of `x` is \"Q\", which is no parameter") as e:
        slot_not_a_constexpr.ir()
    assert e.value.loc.line == slot_not_a_constexpr.first_line + 1 and "Q: k.constexpr" in e.value.hint
    with pytest.raises(K31Error, match="which is a runtime parameter"):
        slot_of_runtime_param.ir()
    with pytest.raises(K31Error, match="allows 4, which is not a dtype"):
        slot_allows_non_dtypes.ir()
    with pytest.raises(K31Error, match="needs at least one"):
        empty_allowed.ir()


def test_a_missing_tensor_for_an_unbound_dtype_is_named():
    with pytest.raises(K31Error, match=r"argument `x` of `scale_tuned` must be a torch tensor or numpy array, "
                       r"got float; its dtype gives the constexpr T"):
        scale_tuned["numpy"](3.0, 4.0, 1.0)
    with pytest.raises(K31Error, match=r"argument `x` of `scale_tuned` must be a torch tensor or numpy array, "
                       r"got float") as e:                  # T bound from y: the usual argument check
        scale_tuned["numpy"](3.0, torch.empty(4), 1.0)
    assert e.value.hint == "pass a f32 tensor of rank 1"


# ---------------------------------------------------------------- text form and CLI

@pytest.mark.parametrize("dt", FLOATS)
def test_text_form_round_trips_dtype_constexprs(dt):
    ir = axpy_any.ir(T=dt, OT=k.bf16)
    text = print_kernel(ir)
    assert f"constexpr T = {dt.name}" in text and "constexpr OT = bf16" in text
    parsed = parse_kernel(text)
    verify(parsed)
    assert parsed.constexprs["T"] is dt and parsed.params[0].value.type.dtype is dt
    assert print_kernel(parsed) == text


def test_cli_compile_accepts_dtype_names(tmp_path, capsys):
    from pathlib import Path
    src = Path(__file__)
    assert main(["compile", f"{src}::axpy_any", "--target", "numpy", "--constexpr", "T=bf16",
                 "--constexpr", "OT=k.f16", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "axpy_any.k31").read_text()
    assert "constexpr T = bf16" in text and 'param %out : tensor<f16>["N"]' in text
    assert main(["compile", str(tmp_path / "axpy_any.k31"), "--target", "triton", "--print"]) == 0
    capsys.readouterr()
    assert main(["compile", f"{src}::axpy_any", "--target", "numpy", "--constexpr", "T=f64", "--print"]) == 1
    assert "must be one of bf16, f16, f32" in capsys.readouterr().err


# ---------------------------------------------------------------- Triton

@pytest.mark.parametrize("dt,out_dt", [(k.bf16, k.bf16), (k.f16, k.f32), (k.f32, k.f16)])
def test_generic_kernel_on_triton(dt, out_dt):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    x, y, out = _inputs(100, dt, out_dt, seed)
    ref = out.clone()
    axpy_any["triton"](x, y, out, -0.5)
    axpy_any["numpy"](x, y, ref, -0.5)
    want, atol = _oracle(x, y, -0.5, out_dt)
    np.testing.assert_allclose(out.double().numpy(), want, rtol=TOL[out_dt], atol=atol, err_msg=f"seed={seed}")
    np.testing.assert_allclose(out.double().numpy(), ref.double().numpy(), rtol=TOL[out_dt], atol=atol)


def test_triton_autotunes_with_the_call_constexprs_merged(monkeypatch):
    """The tuning decision and cache, as on a GPU (the timing itself needs one): a call that fixes
    constexprs no config sets (bound dtypes included) is tuned per (shapes, fixed constexprs); a
    call fixing a constexpr some config sets is not."""
    pytest.importorskip("triton")
    from k31dsl.targets.triton import runtime as rt
    kern = rt.TritonKernel(scale_tuned, mode="interpret")
    kern.mode = "gpu"
    kern.build = lambda kernel: rt.build(kernel, scale_tuned, mode="interpret")
    monkeypatch.setattr(rt, "_check_devices", lambda *a: None)
    tuned = []

    def fake_autotune(args, rest, passed, key=None):
        tuned.append(dict(passed))
        return {"B": 64}
    monkeypatch.setattr(kern, "_autotune", fake_autotune)
    x = torch.randn(150)
    for dt, kw in [(k.f32, {}), (k.f32, {}), (k.bf16, {}), (k.bf16, {"NEG": True}), (k.f32, {"B": 32})]:
        xs, y = x.to(TORCH[dt]), torch.empty(150, dtype=TORCH[dt])
        kern(xs, y, 2.0, **kw)
        sign = -1.0 if kw.get("NEG") else 1.0
        np.testing.assert_allclose(y.double().numpy(), sign * 2.0 * xs.double().numpy(), rtol=TOL[dt], atol=1e-6)
    assert tuned == [{"T": k.f32}, {"T": k.bf16}, {"T": k.bf16, "NEG": True}]
    assert len(kern._tuned) == 3
    assert {dict(key).get("B") for key in kern._launch} == {64, 32}
    assert not kern._tunable({"B": 16}) and kern._tunable({"T": k.f32, "NEG": False})


def test_triton_autotune_logs_every_config(monkeypatch):
    """The tuner keeps each config's time (None for one that cannot run) next to its choice, so a
    benchmark can report the configs that lost. Timing is faked (it needs a GPU): the configs run
    in the interpreter and do_bench returns a time per config."""
    pytest.importorskip("triton")
    import triton.testing
    from k31dsl.targets.triton import runtime as rt
    kern = rt.TritonKernel(scale_tuned, mode="interpret")
    fake = {32: 2.0, 64: 1.5}

    def do_bench(fn):
        fn()                                     # the config really runs (on clones of the arguments)
        b = scale_tuned.configs[len(calls)]["B"]
        calls.append(b)
        if b not in fake:
            raise RuntimeError("out of resources")
        return fake[b]
    calls: list = []
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    x, y = torch.randn(100), torch.empty(100)
    assert kern._autotune((x, y, 2.0), {}, {"T": k.f32}, key="k") == {"B": 64}
    assert kern.tune_log["k"] == [({"B": 32}, 2.0), ({"B": 64}, 1.5)]
    calls.clear()
    fake.pop(32)
    assert kern._autotune((x, y, 2.0), {}, {"T": k.f32}, key="k2") == {"B": 64}
    assert kern.tune_log["k2"] == [({"B": 32}, None), ({"B": 64}, 1.5)]
    # the benchmarks' table of it (benchmarks/harness.py): fastest first, ratio to the chosen one
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import harness
    kern.tune_log = {((((100,), "torch.float32"), ((100,), "torch.float32"), "float"), (("T", k.f32),)):
                     [({"B": 32}, 2.0), ({"B": 16}, None), ({"B": 64}, 1.5)]}
    rows = harness.tuning_rows("scale", kern)
    assert [(r["config"], r["ms"], r["vs chosen"]) for r in rows] == \
        [("B=64", 1.5, 1.0), ("B=32", 2.0, 2.0 / 1.5), ("B=16", "failed", "")]
    assert rows[0]["call"] == "100 100 T=k.f32"


# scale_tuned's body under configs that also set launch keys and a second constexpr
scale_tiles = k.kernel(configs=[{"B": 32, "num_warps": 4}, {"B": 64, "num_warps": 4}, {"B": 32, "num_warps": 2},
                                {"B": 64, "NEG": True}])(scale_tuned.fn)


def test_triton_autotune_keeps_to_the_configs_a_call_fixes(monkeypatch):
    """A call that fixes a tile size (chunk_kda's BT) tunes the rest among the configs that agree
    with it; one that leaves a single config (or none) is not tuned."""
    pytest.importorskip("triton")
    import triton.testing
    from k31dsl.targets.triton import runtime as rt
    kern = rt.TritonKernel(scale_tiles, mode="interpret")
    assert kern._candidates({"B": 32, "T": k.f32}) == [{"B": 32, "num_warps": 4}, {"B": 32, "num_warps": 2}]
    assert kern._tunable({"B": 32}) and kern._tunable({})
    assert kern._tunable({"B": 64}) and not kern._tunable({"B": 64, "NEG": False})
    assert not kern._tunable({"B": 16}) and len(kern._candidates({"NEG": True})) == 4   # unset keys do not filter
    assert not kern._tunable({"B": 32, "num_warps": 2})
    # configs the call's keys make identical are one candidate (timed once, or not tuned at all)
    assert kern._candidates({"B": 64, "NEG": True, "num_warps": 4}) == [{"B": 64, "num_warps": 4}]
    timed = []

    def do_bench(fn):
        fn()
        timed.append(1)
        return {1: 3.0, 2: 1.0}[len(timed)]
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    x, y = torch.randn(100), torch.empty(100)
    best = kern._autotune((x, y, -2.0), {}, {"B": 32, "T": k.f32}, key="k")
    assert best == {"B": 32, "num_warps": 2} and len(timed) == 2
    assert [c for c, _ in kern.tune_log["k"]] == [{"B": 32, "num_warps": 4}, {"B": 32, "num_warps": 2}]


# ---------------------------------------------------------------- the op library

def _variants(kdef):
    """Every allowed value of each k.constexpr[...] and both values of each bool constexpr."""
    sig = kdef.signature()
    names = [n for n, p in sig.constexprs.items() if p.allowed or isinstance(p.default, bool)]
    choices = [sig.constexprs[n].allowed or (False, True) for n in names]
    return [dict(zip(names, c)) for c in itertools.product(*choices)]


def test_op_library_kernels_are_generic_and_every_dtype_variant_round_trips():
    """Every kernel of the library, in every allowed dtype/bool variant (up to 48 per kernel, a
    fresh random sample beyond that), verifies and round-trips through the text form; the
    quantizer and norm kernels are each one generic kernel over bf16/f16/f32."""
    from k31dsl.ops.registry import all_ops as library
    specs = library()
    kdefs = list({id(kd): kd for spec in specs.values() for kd in spec.kernels}.values())
    for spec in specs.values():
        if spec.module in ("quant", "common"):
            assert len(spec.kernels) == 1, spec.name
            slots = spec.kernels[0].signature().dtype_slots
            assert slots and all(spec.kernels[0].signature().constexprs[s].allowed == FLOATS for s in slots)
    rng = np.random.default_rng()
    n = 0
    for kdef in kdefs:
        variants = _variants(kdef)
        if len(variants) > 48:
            variants = [variants[i] for i in rng.choice(len(variants), 48, replace=False)]
        for cx in variants:
            ir = kdef.ir(**cx)
            verify(ir)
            text = print_kernel(ir)
            assert print_kernel(parse_kernel(text)) == text, (kdef.name, cx)
            n += 1
    assert n >= 70

"""The `k31dsl` command line, run in-process through `main(argv)` (plus one real subprocess):
compile → files that import and compute the right thing, .k31 input, --print, --dump-after,
`ops`, `check` passing and failing, and user errors that exit 1 cleanly and write nothing."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from k31dsl.cli import main
from k31dsl.dsl.text import VERSION_LINE
from k31dsl.ops import registry

SCALE_BIAS = '''\
import k31dsl as k


@k.kernel
def scale_bias(x: k.Tensor[k.f32, "N", "D"], b: k.Tensor[k.f32, "D"], y: k.Tensor[k.f32, "N", "D"],
               a: k.f32, BD: k.constexpr = 32):
    for n, j in k.grid(x.shape[0], k.cdiv(x.shape[1], BD)):
        y[n, k.span(j * BD, BD)] = x[n, k.span(j * BD, BD, other=0.0)] * a + b[k.span(j * BD, BD)]


@k.kernel
def row_sum(x: k.Tensor[k.f32, "N", "D"], s: k.Tensor[k.f32, "N"], BD: k.constexpr = 16):
    for n in k.grid(x.shape[0]):
        acc = k.zeros((BD,), k.f32)
        for j in range(k.cdiv(x.shape[1], BD)):
            acc += x[n, k.span(j * BD, BD, other=0.0)]
        s[n] = k.sum(acc)
'''

BROKEN_LINE = ("        y[n, k.span(j * BD, BD)] = x[n, k.span(j * BD, BD, other=0.0)] * a + "
               "b[k.span(j * BD, BD)] + undefined_name")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _import_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"written_{path.stem}_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check_scale_bias(fn, rng):
    n, d = int(rng.integers(3, 9)), int(rng.integers(33, 100))     # ragged: not a multiple of BD
    x = rng.standard_normal((n, d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    a = float(rng.uniform(0.5, 2.0))
    y = np.full((n, d), np.nan, np.float32)
    fn(x, b, y, np.float32(a))
    ref = x.astype(np.float64) * a + b.astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- compile

def test_help_runs_as_a_real_process():
    r = subprocess.run([sys.executable, "-m", "k31dsl", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for word in ("compile", "check", "ops", "examples:"):
        assert word in r.stdout


@pytest.mark.parametrize("command", ["compile", "check", "ops"])
def test_subcommand_help_has_examples(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"k31dsl {command}" in out


def test_compile_writes_numpy_module_that_computes(tmp_path, rng, capsys):
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    out = tmp_path / "out"
    assert main(["compile", str(src), "--target", "numpy", "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["row_sum.k31", "row_sum.py", "scale_bias.k31", "scale_bias.py"]
    ir_text = (out / "scale_bias.k31").read_text()
    assert ir_text.startswith(VERSION_LINE) and "kernel scale_bias" in ir_text
    mod = _import_file(out / "scale_bias.py")
    _check_scale_bias(mod.scale_bias, rng)
    # the second kernel carries a loop; a row sum over a ragged width
    rs = _import_file(out / "row_sum.py")
    x = rng.standard_normal((5, 37)).astype(np.float32)
    s = np.zeros(5, np.float32)
    rs.row_sum(x, s)
    np.testing.assert_allclose(s, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_compile_one_kernel_with_constexpr_and_print(tmp_path, capsys):
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    assert main(["compile", f"{src}::scale_bias", "--target", "numpy", "--print",
                 "--constexpr", "BD=8"]) == 0
    out = capsys.readouterr().out
    assert "# ===== scale_bias.py =====" in out and "# ===== scale_bias.k31 =====" in out
    assert "row_sum" not in out
    assert "constexprs: BD=8" in out and "constexpr BD = 8" in out
    assert "# src: kernels.py:" in out and "def scale_bias(x, b, y, a)" in out
    assert not (tmp_path / "out").exists()           # --print alone writes nothing


def test_compile_unknown_constexpr_and_kernel(tmp_path, capsys):
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    assert main(["compile", str(src), "--target", "numpy", "--print", "--constexpr", "BX=8"]) == 1
    assert "no selected kernel has a constexpr named BX" in capsys.readouterr().err
    assert main(["compile", f"{src}::nope", "--target", "numpy", "--print"]) == 1
    err = capsys.readouterr().err
    assert "no @k.kernel named `nope`" in err and "scale_bias" in err


def test_compile_the_op_library_folder(tmp_path, capsys):
    """`k31dsl compile ops/` writes every kernel the registered ops launch."""
    ops_dir = Path(__file__).resolve().parent.parent / "ops"
    out = tmp_path / "ops"
    assert main(["compile", str(ops_dir), "--target", "numpy", "-o", str(out)]) == 0
    written = {p.name for p in out.iterdir()}
    kernels = {kd.name for spec in registry.all_ops().values() for kd in spec.kernels}
    assert kernels and all(f"{n}.py" in written and f"{n}.k31" in written for n in kernels)
    assert f"wrote {len(written)} files" in capsys.readouterr().err


def test_compile_from_k31_text(tmp_path, rng, capsys):
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    first = tmp_path / "first"
    assert main(["compile", f"{src}::scale_bias", "--target", "numpy", "-o", str(first)]) == 0
    second = tmp_path / "second"
    assert main(["compile", str(first / "scale_bias.k31"), "--target", "numpy", "-o", str(second)]) == 0
    assert (second / "scale_bias.k31").read_text() == (first / "scale_bias.k31").read_text()
    _check_scale_bias(_import_file(second / "scale_bias.py").scale_bias, rng)
    assert main(["compile", str(first / "scale_bias.k31"), "--target", "numpy", "--print",
                 "--constexpr", "BD=8"]) == 1
    assert "already specialised" in capsys.readouterr().err
    # a hand-edited .k31 with a type that breaks the op rules: a clean K31Error, exit 1
    text = (first / "scale_bias.k31").read_text()
    broken = tmp_path / "broken.k31"
    broken.write_text(text.replace(": f32[32]", ": i32[32]", 1))
    assert broken.read_text() != text
    assert main(["compile", str(broken), "--target", "numpy", "-o", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err
    assert not (tmp_path / "b").exists()


def test_dump_after(tmp_path, capsys):
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    for name in ("frontend", "verify"):
        assert main(["compile", f"{src}::row_sum", "--target", "numpy", "--dump-after", name]) == 0
        out = capsys.readouterr().out
        assert f"IR of `row_sum` after pass `{name}`" in out
        assert "kernel row_sum" in out and "for(" in out
    assert main(["compile", str(src), "--target", "numpy", "--dump-after", "fusion"]) == 1
    err = capsys.readouterr().err
    assert "no such pass" in err and "frontend" in err and "verify" in err


def test_user_error_exits_1_with_location_and_writes_nothing(tmp_path, capsys):
    # the second kernel is fine, the first is broken: no file may be written at all
    text = SCALE_BIAS.replace(BROKEN_LINE.replace(" + undefined_name", ""), BROKEN_LINE)
    assert text != SCALE_BIAS
    src = _write(tmp_path, "bad.py", text)
    line = text.splitlines().index(BROKEN_LINE) + 1
    out = tmp_path / "out"
    assert main(["compile", str(src), "--target", "numpy", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src}:{line}:" in err and "undefined_name" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_import_time_errors_are_clean(tmp_path, capsys):
    src = _write(tmp_path, "syn.py", "import k31dsl as k\n\ndef f(:\n    pass\n")
    assert main(["compile", str(src), "--target", "numpy", "--print"]) == 1
    err = capsys.readouterr().err
    assert f"{src}:3:" in err and "syntax error" in err and "Traceback" not in err
    src = _write(tmp_path, "ann.py", "import k31dsl as k\n\n\n@k.kernel\n"
                 "def f(x: k.Tensor[\"N\"]):\n    pass\n")
    assert main(["compile", str(src), "--target", "numpy", "--print"]) == 1
    err = capsys.readouterr().err
    assert f"{src}:5" in err and "starts with a dtype" in err and "Traceback" not in err
    assert main(["compile", str(tmp_path / "missing.py"), "--target", "numpy"]) == 1
    assert "no such file" in capsys.readouterr().err
    src = _write(tmp_path, "none.py", "x = 1\n")
    assert main(["compile", str(src), "--target", "numpy"]) == 1
    assert "no @k.kernel functions" in capsys.readouterr().err


def test_bad_command_lines_exit_2(tmp_path, capsys):
    assert main(["compile", "x.py"]) == 2                    # --target missing
    assert main(["compile", "x.py", "--target", "cuda"]) == 2
    assert main([]) == 2
    capsys.readouterr()


def test_ascendc_not_built_yet(tmp_path, capsys):
    if importlib.util.find_spec("k31dsl.targets.ascendc.runtime") is not None:
        pytest.skip("the AscendC target exists now")
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    assert main(["compile", str(src), "--target", "ascendc", "-o", str(tmp_path / "o")]) == 2
    assert "AscendC target is not built yet" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compile_triton_module_runs_in_interpreter(tmp_path, rng, capsys):
    import torch
    src = _write(tmp_path, "kernels.py", SCALE_BIAS)
    out = tmp_path / "out"
    assert main(["compile", f"{src}::scale_bias", "--target", "triton", "-o", str(out)]) == 0
    py = [p for p in out.iterdir() if p.suffix == ".py"]
    assert len(py) == 1
    text = py[0].read_text()
    assert "@triton.jit" in text and "# src: kernels.py:" in text
    mod = _import_file(py[0])

    def run(x, b, y, a):
        tx, tb, ty = (torch.from_numpy(v) for v in (x, b, y))
        mod.scale_bias(tx, tb, ty, float(a))
        y[...] = ty.numpy()
    _check_scale_bias(run, rng)


# ---------------------------------------------------------------- ops and check

EXTRA_OP = '''\
import numpy as np
import torch

import k31dsl as k
from k31dsl.ops.registry import CaseResult, OpSpec, register


@k.kernel
def {name}_kernel(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], a: k.f32, BLOCK: k.constexpr = 64):
    for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
        t = x[k.span(i * BLOCK, BLOCK, other=0.0)]
        y[k.span(i * BLOCK, BLOCK)] = {expr}


def {name}(x, a, target="numpy"):
    y = torch.empty_like(x)
    {name}_kernel[target](x, y, a)
    return y


def check(target, seed):
    rng = np.random.default_rng(seed)
    results = []
    for n in (37, 130):
        x = rng.standard_normal(n).astype(np.float32)
        a = float(rng.uniform(0.5, 2.0))
        got = {name}(torch.from_numpy(x), a, target).numpy().astype(np.float64)
        want = x.astype(np.float64) * a                     # the true oracle: y = a * x
        err = float(np.max(np.abs(got - want) / (np.abs(want) + 1e-6)))
        results.append(CaseResult(f"x=[{{n}}] f32", err, 1e-5, err <= 1e-5))
    return results


register(OpSpec(name="{name}", module="extra", fn={name}, kernels=[{name}_kernel],
                summary="y = a * x (test op)", check=check))
'''


def _extra(tmp_path, name, expr) -> Path:
    return _write(tmp_path, f"{name}_ops.py", EXTRA_OP.format(name=name, expr=expr))


def test_ops_lists_the_library(scratch_registry, capsys):
    assert main(["ops", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name.keys() == registry.all_ops().keys() and rows
    for r in rows:
        assert r["module"] and r["summary"] and r["kernels"]
    assert main(["ops"]) == 0
    table = capsys.readouterr().out
    for name in by_name:
        assert name in table


def test_check_good_op_passes_and_wrong_op_fails(tmp_path, scratch_registry, capsys):
    good = _extra(tmp_path, "good_scale", "t * a")
    wrong = _extra(tmp_path, "wrong_scale", "t * a + 0.01")      # a plausible slip
    assert main(["check", "good_scale", "--target", "numpy", "--extra", str(good), "--json"]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    assert report["passed"] and len(report["results"]) == 2
    assert "[1/1] numpy: good_scale: 2 cases, all passed (" in cap.err      # the log line without a terminal
    assert all(r["max_err"] < 1e-5 for r in report["results"])

    assert main(["check", "wrong_scale", "good_scale", "--target", "numpy",
                 "--extra", str(wrong)]) == 1
    cap = capsys.readouterr()
    out = cap.out
    assert "FAIL" in out and "wrong_scale" in out
    assert "[1/2] numpy: wrong_scale: 2 cases, 2 FAILED (" in cap.err
    assert "2 ops, 4 cases on numpy: 2 failed" in out      # both cases of the wrong op, only those

    assert main(["ops", "--json"]) == 0
    names = {r["name"] for r in json.loads(capsys.readouterr().out)}
    assert {"good_scale", "wrong_scale"} <= names


def test_check_wrong_op_from_env_and_crashing_check(tmp_path, scratch_registry, monkeypatch, capsys):
    wrong = _extra(tmp_path, "env_wrong", "t * (a * 1.001)")
    monkeypatch.setenv("K31_EXTRA_OPS", str(wrong))
    assert main(["check", "env_wrong", "--target", "numpy", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["passed"] and all(not r["passed"] for r in report["results"])
    # a check that raises counts as a failure, it does not stop the run
    crash = _extra(tmp_path, "crashing", "t * a")
    crash.write_text(crash.read_text().replace("rng = np.random", "raise RuntimeError('boom')\n    rng = np.random"))
    assert main(["check", "crashing", "--target", "numpy", "--extra", str(crash), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert "boom" in report["results"][0]["detail"]


def test_check_unknown_op_and_extra(scratch_registry, capsys):
    assert main(["check", "no_such_op", "--target", "numpy"]) == 1
    assert "unknown op no_such_op" in capsys.readouterr().err
    assert main(["check", "--target", "numpy", "--extra", "no.such.module"]) == 1
    assert "cannot import" in capsys.readouterr().err


def test_check_library_on_numpy(scratch_registry, capsys):
    """The main job of the README: every op of the library against its oracle."""
    ops = registry.all_ops()
    if not ops:
        pytest.fail("the op library registered no ops")
    assert main(["check", "--target", "numpy", "--seed", "1", "--json"]) == 0, capsys.readouterr().out
    report = json.loads(capsys.readouterr().out)
    assert {r["op"] for r in report["results"]} == set(ops)


def test_selftest_compiles_and_checks(tmp_path, scratch_registry, capsys):
    ops = registry.all_ops()
    n_kernels = len({id(kd) for spec in ops.values() for kd in spec.kernels})
    out = tmp_path / "gen"
    assert main(["selftest", "--target", "numpy", "-o", str(out)]) == 0, capsys.readouterr().out
    text = capsys.readouterr().out
    assert f"{n_kernels}/{n_kernels}" in text and "selftest passed" in text
    assert len(list((out / "numpy").glob("*.py"))) == n_kernels
    # one wrong op among the library makes the whole selftest fail
    wrong = _extra(tmp_path, "slightly_wrong", "t * a * 1.0001")
    assert main(["selftest", "--target", "numpy", "--extra", str(wrong)]) == 1
    text = capsys.readouterr().out
    assert "selftest FAILED" in text and "numpy: slightly_wrong" in text


def test_version(capsys):
    from k31dsl import __version__
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"k31dsl {__version__}"
    assert main(["version", "-v"]) == 0
    assert "target numpy: available" in capsys.readouterr().out

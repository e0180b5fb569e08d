"""A K31Error without a place in kernel source names the user's call into k31dsl (file:line:col,
the line and a caret); one with a kernel-source place keeps it; the `k31dsl` command, whose
frames are all the library's, prints no location; pickling keeps the error as raised."""
from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl.dsl.errors import K31Error, Loc, caller_loc


def test_bad_op_argument_names_the_callers_line():
    from k31dsl.ops.dsa import topk
    scores = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 37)).astype(np.float32))
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(K31Error) as info:
        topk(scores, 0, target="numpy")
    err = info.value
    assert err.loc is None
    assert err.called_at == Loc(__file__, line, 8)
    text = str(err)
    assert text.startswith(f"{__file__}:{line}:8: topk: k=0")
    assert "        topk(scores, 0, target=\"numpy\")\n" + " " * 12 + "^" in text


def test_unknown_target_from_a_kernel_call_names_the_callers_line():
    @k.kernel
    def copy(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 64):
        for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
            y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)]

    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(K31Error) as info:
        copy["cuda"]
    assert info.value.called_at is not None and info.value.called_at.line == line
    assert str(info.value).startswith(f"{__file__}:{line}:")


def test_an_error_in_kernel_source_keeps_its_place():
    with pytest.raises(K31Error) as info:
        @k.kernel
        def bad(x: k.Tensor[k.f32, "N"]):
            for i in k.grid(x.shape[0]):
                x[i] = undefined_name  # noqa: F821 - the mistake under test
        bad["numpy"](torch.zeros(4))        # kernels are built at their first call
    err = info.value
    assert err.loc is not None and err.loc.line > 0 and err.called_at is None
    assert str(err).startswith(f"{err.loc.file}:{err.loc.line}:")


def test_pickling_keeps_the_error_as_raised():
    from k31dsl.ops.dsa import topk
    with pytest.raises(K31Error) as info:
        topk(torch.zeros(2, 5), 9999, target="numpy")
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is type(info.value)
    assert str(back) == str(info.value) and back.called_at == info.value.called_at and back.hint == info.value.hint


def test_library_and_installation_frames_are_skipped():
    here = caller_loc()                 # called from this test: the test file itself
    assert here is not None and here.file == __file__ and here.line == inspect.currentframe().f_lineno - 1
    # from code compiled out of a string the search goes on to its caller, this test
    namespace: dict = {"caller_loc": caller_loc}
    exec("def probe():\n    return caller_loc()\n", namespace)
    line = inspect.currentframe().f_lineno + 1
    found = namespace["probe"]()
    assert found.file == __file__ and found.line == line


def test_the_command_prints_no_location():
    out = subprocess.run([sys.executable, "-m", "k31dsl", "check", "no_such_op", "--target", "numpy"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert out.stderr.startswith("error: unknown op no_such_op"), out.stderr[:300]


@pytest.mark.parametrize("target", ["numpy", "triton"])
def test_a_broken_parameter_promise_names_the_parameter_and_the_call(target):
    @k.kernel
    def add(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 64):
        for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
            y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)] + 1.0

    y = torch.full((9,), 7.0)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(K31Error) as info:
        add[target](torch.zeros(8), y)
    err = info.value
    assert err.loc.file == __file__ and err.loc.line == line - 7           # the parameter `y`
    assert err.called_at == Loc(__file__, line, 8)
    assert f"\n  in the call at {__file__}:{line}:8\n" in str(err)
    assert torch.equal(y, torch.full((9,), 7.0))                           # nothing ran


def test_a_tensor_on_the_wrong_device_or_read_only_names_the_parameter_and_the_call():
    @k.kernel
    def fill(y: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 64):
        for i in k.grid(k.cdiv(y.shape[0], BLOCK)):
            y[k.span(i * BLOCK, BLOCK)] = k.full((BLOCK,), 1.0, k.f32)

    frozen = np.zeros(5, np.float32)
    frozen.flags.writeable = False
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(K31Error, match="read-only array") as info:
        fill["numpy"](frozen)
    assert info.value.loc.line == line - 8 and info.value.called_at == Loc(__file__, line, 8)
    assert not frozen.any()
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(K31Error, match="is on meta") as info:
        fill["triton"](torch.empty(5, device="meta"))
    assert info.value.loc.line == line - 13 and info.value.called_at == Loc(__file__, line, 8)
    assert str(info.value).count(__file__) == 2          # the parameter, then the call; no doubled prefix


def test_an_error_placed_in_a_file_is_shown_there_once(tmp_path):
    from k31dsl.model.config import K31Config
    bad = tmp_path / "cfg.json"
    bad.write_text('{\n  "d_model": 64,\n  "n_layers" 4\n}\n')
    with pytest.raises(K31Error, match="invalid JSON in the config") as info:
        K31Config.load(str(bad))
    text = str(info.value)
    assert text.startswith(f"{bad}:3:") and text.count(str(bad)) == 1 and __file__ not in text

"""Programmatic dependent launch in the Triton target's gpu-mode code: every kernel first waits for
the previous kernel of its stream (griddepcontrol) before any memory access, then lets the next
one launch, and its launcher asks for the launch attribute. Off in the interpreter, before
sm_90 and when K31_PDL / the emit option says "off" (targets/triton/emit.py, pdl_mode)."""
from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import pytest

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.targets.triton.emit import PDL_DEFAULT, emit, pdl_mode
from hopper import run_compiler_script


@k.kernel
def shifted_copy(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], BN: k.constexpr = 64):
    for i in k.grid(k.cdiv(x.shape[0], BN)):
        y[k.span(i * BN, BN)] = x[k.span(i * BN, BN)] + 1.0


def _body(src: str) -> list[str]:
    """The kernel function's statements, in order."""
    lines = src.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("def shifted_copy_kernel("))
    body = []
    for ln in lines[start + 1:]:
        if ln.startswith("def "):
            break
        if ln.startswith("    ") and not ln.startswith("        "):
            body.append(ln.strip())
    return [b for b in body if b and not b.startswith("#") and not b.startswith(")")]


def test_gpu_kernels_wait_for_the_previous_kernel_before_touching_memory():
    body = _body(emit(shifted_copy.ir(), mode="gpu", pdl="start"))
    assert body[0].startswith("tl.extra.cuda.gdc_wait()")
    assert body[1] == "tl.extra.cuda.gdc_launch_dependents()"
    assert next(i for i, s in enumerate(body) if "tl.load" in s or "tl.store" in s) > 1


def test_end_mode_lets_the_next_kernel_launch_after_the_last_store():
    src = emit(shifted_copy.ir(), mode="gpu", pdl="end")
    body = _body(src)
    assert body[0].startswith("tl.extra.cuda.gdc_wait()")
    assert body[-1].startswith("tl.extra.cuda.gdc_launch_dependents()")
    assert max(i for i, s in enumerate(body) if "tl.store" in s) < len(body) - 1
    assert "launch_pdl=True" in src and "pdl: end" in src


def test_auto_mode_decides_per_launch_by_the_grid_against_the_sm_count(tmp_path, monkeypatch):
    """auto: both placements in the kernel behind a constexpr the launcher sets to "fewer programs
    than SMs"; the launcher's decision is checked with a stand-in device of 132 SMs."""
    src = emit(shifted_copy.ir(), mode="gpu", pdl="auto")
    body = _body(src)
    assert body[0].startswith("tl.extra.cuda.gdc_wait()") and body[1].startswith("if K31_PDL_EARLY:")
    assert body[-1] == "if not K31_PDL_EARLY:"
    assert src.count("tl.extra.cuda.gdc_launch_dependents()") == 2 and "launch_pdl=True" in src
    assert "K31_PDL_EARLY=_fewer_programs_than_sms(grid, x)" in src
    path = tmp_path / "auto_module.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("auto_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Device:
        multi_processor_count = 132
    monkeypatch.setattr(module.torch.cuda, "get_device_properties", lambda dev: Device())
    x = types.SimpleNamespace(device="gpu0")
    assert module._fewer_programs_than_sms((131,), x) is True
    assert module._fewer_programs_than_sms((132,), x) is False
    assert module._fewer_programs_than_sms((4, 33), x) is False
    assert module._fewer_programs_than_sms((2, 3, 21), x) is True


@pytest.mark.parametrize("mode, pdl", [("gpu", "off"), ("interpret", "start"), ("interpret", "end"),
                                       ("interpret", "auto")])
def test_no_dependent_launch_when_off_or_in_the_interpreter(mode, pdl):
    src = emit(shifted_copy.ir(), mode=mode, pdl=pdl)
    assert "gdc_" not in src and "launch_pdl" not in src


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="pdl='early'"):
        emit(shifted_copy.ir(), mode="gpu", pdl="early")


@pytest.mark.parametrize("env, want", [(None, PDL_DEFAULT), ("0", "off"), ("off", "off"), ("1", "start"),
                                       ("start", "start"), ("end", "end"), ("Auto", "auto"), ("", PDL_DEFAULT)])
def test_the_switch_needs_hopper_and_honours_the_environment(monkeypatch, env, want):
    if env is None:
        monkeypatch.delenv("K31_PDL", raising=False)
    else:
        monkeypatch.setenv("K31_PDL", env)
    assert pdl_mode(True) == want and pdl_mode(False) == "off"


def test_an_unknown_environment_setting_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv("K31_PDL", "early")
    with pytest.raises(K31Error, match="K31_PDL='early'.*off, start, end, auto"):
        pdl_mode(True)
    assert pdl_mode(False) == "off"        # no Hopper: the setting is never read


def test_sm90_code_carries_griddepcontrol_and_sm80_code_does_not(tmp_path):
    """Triton's real compiler: the sm_90 PTX orders wait, launch_dependents, then the first global
    load; the sm_80 build (no griddepcontrol there) has neither instruction."""
    script = (
        "import pathlib, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_pdl import shifted_copy\n"
        "from k31dsl.targets.triton.aot import compile_for_gpu\n"
        f"folder = pathlib.Path({str(tmp_path)!r})\n"
        "for arch in (90, 80):\n"
        "    ptx = compile_for_gpu(shifted_copy.ir(), folder, arch=arch).asm['ptx']\n"
        "    (folder / f'sm{arch}.ptx').write_text(ptx)\n"
        "import os\n"
        "os.environ['K31_PDL'] = 'auto'\n"
        "(folder / 'auto.ptx').write_text(compile_for_gpu(shifted_copy.ir(), folder / 'auto', arch=90).asm['ptx'])\n")
    (tmp_path / "auto").mkdir()
    run_compiler_script(script, K31_PDL="start")
    sm90 = (tmp_path / "sm90.ptx").read_text()
    order = [m.group(0) for m in re.finditer(r"griddepcontrol\.launch_dependents|griddepcontrol\.wait|ld\.global", sm90)]
    assert order[:3] == ["griddepcontrol.wait", "griddepcontrol.launch_dependents", "ld.global"], order[:4]
    assert "griddepcontrol" not in (tmp_path / "sm80.ptx").read_text()
    # auto, built as for a grid that fills the GPU: the launch_dependents comes after the last store
    auto = (tmp_path / "auto.ptx").read_text()
    order = [m.group(0) for m in re.finditer(r"griddepcontrol\.launch_dependents|griddepcontrol\.wait|ld\.global|st\.global", auto)]
    assert order[0] == "griddepcontrol.wait" and order[-1] == "griddepcontrol.launch_dependents", order
    assert order.count("griddepcontrol.launch_dependents") == 1

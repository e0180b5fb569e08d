"""Every config of every library kernel against the oracles, on the CPU. Off the GPU a call runs a
kernel's first config; on a GPU the tuner may pick any, so a tile size that is wrong in one
config only showed up there (short_conv at BT 1 without the state update: 0.51 off on an H200,
results/gpu_check_h200_dec3.md). `k31dsl check --config N` runs config N mod each call's count
everywhere; here on numpy (a few seconds per run), one process per N, for the ops whose kernels
have more than N configs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from k31dsl import K31Error
from k31dsl.ops.registry import all_ops
from k31dsl.targets.common import forced_config


def config_counts() -> dict[str, int]:
    return {name: spec.config_count for name, spec in all_ops().items()}


MOST = max(config_counts().values())


@pytest.mark.parametrize("n", range(1, MOST))
def test_config_n_of_every_kernel_matches_the_oracle(n):
    ops = sorted(name for name, count in config_counts().items() if count > n)
    r = subprocess.run([sys.executable, "-m", "k31dsl", "check", *ops, "--target", "numpy", "--config", str(n),
                        "--seed", str(n), "--json"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "K31_CONFIG": ""})
    assert r.stdout, r.stderr[-2000:]
    failed = [row for row in json.loads(r.stdout)["results"] if not row["passed"]]
    assert r.returncode == 0 and not failed, failed


def test_the_switch_reads_numbers_only(monkeypatch):
    monkeypatch.delenv("K31_CONFIG", raising=False)
    assert forced_config() is None
    monkeypatch.setenv("K31_CONFIG", "3")
    assert forced_config() == 3
    monkeypatch.setenv("K31_CONFIG", "-1")
    with pytest.raises(K31Error, match="K31_CONFIG"):
        forced_config()


def test_a_forced_config_reaches_the_kernel(monkeypatch):
    """short_conv_rows with K31_CONFIG=4 runs its fifth config (BT 1): the order in which its
    programs are launched is not visible, but the config a call takes is."""
    import torch
    from k31dsl.ops import nn
    seen = []
    kern = nn.short_conv_rows["numpy"]
    real = type(kern)._checked_launcher
    monkeypatch.setattr(type(kern), "_checked_launcher", lambda self, args, cx: seen.append(cx) or real(self, args, cx))
    monkeypatch.setenv("K31_CONFIG", "4")
    x = torch.randn(1, 3, 8)
    nn.short_conv(x, torch.randn(8, 4), torch.zeros(1, 3, 8), torch.tensor([0], dtype=torch.int32), target="numpy")
    assert seen and seen[-1]["BT"] == nn.CONV_CONFIGS[4]["BT"] and seen[-1]["BC"] == nn.CONV_CONFIGS[4]["BC"]


TILED_OP = '''\
import numpy as np
import torch

import k31dsl as k
from k31dsl.ops.registry import CaseResult, OpSpec, register


@k.kernel(configs=[{"BLOCK": 64}, {"BLOCK": 32}, {"BLOCK": 16}])
def tiled_scale_kernel(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], a: k.f32, BLOCK: k.constexpr = 64):
    # the slip under test: programs step by 32 whatever the tile, so BLOCK 16 leaves gaps
    for i in k.grid(k.cdiv(x.shape[0], 32)):
        y[k.span(i * 32, BLOCK)] = x[k.span(i * 32, BLOCK, other=0.0)] * a


def tiled_scale(x, a, target="numpy"):
    y = torch.zeros_like(x)
    tiled_scale_kernel[target](x, y, a)
    return y


def check(target, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(70).astype(np.float32)
    got = tiled_scale(torch.from_numpy(x), 1.5, target).numpy().astype(np.float64)
    err = float(np.max(np.abs(got - x.astype(np.float64) * 1.5)))
    return [CaseResult("x=[70] f32", err, 1e-6, err <= 1e-6)]


register(OpSpec(name="tiled_scale", module="extra", fn=tiled_scale, kernels=[tiled_scale_kernel],
                summary="y = a * x over tiles (test op)", check=check))
'''


def test_config_all_finds_the_one_wrong_config(tmp_path, scratch_registry, capsys, monkeypatch):
    """`check --config all` runs each config number in its own process: the op's first two
    configs pass, its third (BLOCK 16, which leaves gaps) fails and names itself; the library op
    beside it has fewer configs than 3 and runs only at the numbers it has."""
    from k31dsl.cli import main
    monkeypatch.delenv("K31_CONFIG", raising=False)
    extra = tmp_path / "tiled_ops.py"
    extra.write_text(TILED_OP)
    code = main(["check", "tiled_scale", "swiglu", "--target", "numpy", "--extra", str(extra),
                 "--config", "all", "--json"])
    report = json.loads(capsys.readouterr().out)
    verdicts = {}
    for row in report["results"]:
        verdicts[row["op"]] = verdicts.get(row["op"], True) and row["passed"]
    assert verdicts == {"tiled_scale@0": True, "tiled_scale@1": True, "tiled_scale@2": False,
                        **{f"swiglu@{n}": True for n in range(all_ops()["swiglu"].config_count)}}
    assert code == 1 and not report["passed"]
    assert main(["check", "tiled_scale", "--target", "numpy", "--extra", str(extra), "--config", "1"]) == 0
    assert "K31_CONFIG" not in os.environ                # the switch is the command's, not the caller's
    assert main(["check", "tiled_scale", "--target", "numpy", "--config", "some"]) == 2
    assert "or 'all'" in capsys.readouterr().err


def test_a_forced_config_the_target_cannot_build_gives_way_to_the_next(monkeypatch):
    """AscendC cannot build a tile larger than its Unified Buffer (CapacityError): under
    K31_CONFIG=N such a config gives way to N + 1 (as a GPU tuner skips configs that do not
    compile), and the call still computes the right values; a kernel whose every config is too
    large still raises."""
    import numpy as np
    import torch
    import k31dsl as k
    from k31dsl.dsl.errors import CapacityError

    @k.kernel(configs=[{"BLOCK": 64}, {"BLOCK": 1 << 17}])
    def scale_some(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 64):
        for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
            y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)] * 3.0

    @k.kernel(configs=[{"BLOCK": 1 << 17}, {"BLOCK": 1 << 18}])
    def scale_none(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], BLOCK: k.constexpr = 64):
        for i in k.grid(k.cdiv(x.shape[0], BLOCK)):
            y[k.span(i * BLOCK, BLOCK)] = x[k.span(i * BLOCK, BLOCK, other=0.0)] * 3.0

    x = torch.randn(100)
    y = torch.zeros(100)
    monkeypatch.setenv("K31_CONFIG", "1")
    scale_some["ascendc"](x, y)
    np.testing.assert_allclose(y.numpy(), x.numpy() * 3.0, rtol=1e-6)
    with pytest.raises(CapacityError, match="Unified|UB"):
        scale_none["ascendc"](x, y)

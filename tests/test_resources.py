"""`k31dsl resources`: a kernel built for sm_90 on this machine as the GPU's JIT would build it
for the given argument shapes, with its registers, shared memory, programs per SM, instruction
counts and global load widths; bad command lines are K31Errors that change nothing."""
import json

import pytest

from k31dsl.cli import main

KERNELS = '''
import k31dsl as k


@k.kernel(configs=[{"num_warps": 1}, {"num_warps": 4}])
def gather(x: k.Tensor[k.bf16, "S", "R"], idx: k.Tensor[k.i32, "N"], y: k.Tensor[k.bf16, "N", "C"],
           C: k.constexpr = 256, OFF: k.constexpr = 8):
    for n in k.grid(y.shape[0]):
        y[n, k.span(0, C)] = x[idx[n], k.span(OFF, C, other=0.0)]


@k.kernel
def gather_aligned(x: k.Tensor[k.bf16, "S", "R", k.aligned(16)], idx: k.Tensor[k.i32, "N"],
                   y: k.Tensor[k.bf16, "N", "C"], C: k.constexpr = 256, OFF: k.constexpr = 8):
    for n in k.grid(y.shape[0]):
        y[n, k.span(0, C)] = x[idx[n], k.span(OFF, C, other=0.0)]
'''
ARGS = ["--arg", "x=4096x328:bf16", "--arg", "idx=64:i32", "--arg", "y=64x256:bf16"]


@pytest.fixture
def kernels(tmp_path):
    path = tmp_path / "gathers.py"
    path.write_text(KERNELS)
    return path


def run_json(capsys, *argv):
    capsys.readouterr()
    rc = main(["resources", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_every_config_is_built_with_its_occupancy(kernels, capsys):
    rc, rep = run_json(capsys, f"{kernels}::gather", *ARGS)
    assert rc == 0 and rep["arch"] == 90
    rows = {r["config"]: r for r in rep["rows"]}
    assert set(rows) == {"num_warps=1", "num_warps=4"}          # the autotuner's candidates
    four = rows["num_warps=4"]
    assert four["warps"] == 4 and 0 < four["regs"] <= 64 and four["spill loads"] == 0 and four["smem KB"] == 0
    assert four["per SM"] == 64 // 4 and four["limit"] == "warps"   # few registers, no shared memory
    assert four["offsets"] == "int32" and four["SASS"] > 0 and four["MMA"] == 0


def test_load_widths_and_blind_spots_show_the_alignment_triton_cannot_see(kernels, capsys):
    """Rows of 328 bf16 (656 bytes, 16-byte aligned): 2-byte gathers and a blind-spot line without
    k.aligned, 16-byte gathers and none with it."""
    rc, plain = run_json(capsys, f"{kernels}::gather", *ARGS, "--num-warps", "1")
    assert rc == 0 and len(plain["rows"]) == 1
    assert "LDG 16b" in plain["rows"][0]["global loads"] and "LDG 128b" not in plain["rows"][0]["global loads"]
    [spot] = plain["blind_spots"]
    assert spot.startswith("`x` [4096, 328]") and "k.aligned(16)" in spot
    rc, aligned = run_json(capsys, f"{kernels}::gather_aligned", *ARGS, "--num-warps", "1")
    assert rc == 0 and aligned["blind_spots"] == []
    assert "LDG 128b" in aligned["rows"][0]["global loads"] and "16b" not in aligned["rows"][0]["global loads"]


def test_table_output(kernels, capsys):
    assert main(["resources", f"{kernels}::gather_aligned", *ARGS, "--num-warps", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "gather_aligned on sm_90" in out and "per SM" in out and "LDG 128b" in out and "built by Triton" in out


@pytest.mark.parametrize("extra, needle", [
    ([], "missing: idx: i32 [N]"),
    (["--arg", "idx=64:i32", "--arg", "y=64x256:f16"], "dtype f16"),
    (["--arg", "idx=64:i32", "--arg", "y=64x100:bf16"], "C = 256"),
    (["--arg", "idx=64:i32", "--arg", "y=64x256:bf16", "--arg", "z=3"], "no runtime parameter z"),
    (["--arg", "idx=64:int"], "unknown dtype 'int'"),
    (["--arg", "idx=64x:i32"], "integers joined by 'x'"),
    (["--arg", "idx=64:i32:1x1"], "2 strides for a shape of rank 1"),
    (["--arg", "idx"], "expected NAME=SHAPE:DTYPE"),
    (["--arg", "idx=64:i32", "--arg", "y=64x256:bf16", "--arch", "75"], "--arch 75"),
])
def test_bad_command_lines_are_k31errors(kernels, capsys, extra, needle):
    rc = main(["resources", f"{kernels}::gather", "--arg", "x=4096x328:bf16", *extra])
    err = capsys.readouterr().err
    assert rc == 1 and needle in " ".join(err.split()), err


def test_one_kernel_must_be_picked(kernels, capsys):
    assert main(["resources", str(kernels), *ARGS]) == 1
    assert "pick one" in capsys.readouterr().err

"""Graph IR: the builder, the verifier's rules, the text dump and `run` on every target against
fp64 oracles."""
import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl import K31Error
from k31dsl.lowering.graph import Program, dump, problems, run, verify
from k31dsl.lowering.graph.ir import TensorNode
from k31dsl.ops.common import rmsnorm_rows
from k31dsl.ops.testing import load_oracle

TARGETS = ["numpy", "triton"]
norm = load_oracle("norm")


@k.kernel
def scale_add(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"], out: k.Tensor[k.f32, "N"], a: k.f32,
              B: k.constexpr = 16):
    for i in k.grid(k.cdiv(x.shape[0], B)):
        out[k.span(i * B, B)] = x[k.span(i * B, B, other=0.0)] * a + y[k.span(i * B, B, other=0.0)]


@k.kernel
def accumulate(acc: k.Tensor[k.f32, "N"], x: k.Tensor[k.f32, "N"], B: k.constexpr = 16):
    for i in k.grid(k.cdiv(x.shape[0], B)):
        acc[k.span(i * B, B)] = acc[k.span(i * B, B, other=0.0)] + x[k.span(i * B, B, other=0.0)]


def norm_twice(m, d):
    p = Program("norm_twice")
    x = p.input("x", (m, d), k.f32)
    w = p.weight("w", (d,), k.f32)
    h = p.tensor("h", (m, d), k.f32)
    y = p.tensor("y", (m, d), k.f32)
    bd = 1 << (d - 1).bit_length()
    h = p.call(rmsnorm_rows, x, w, h, 1e-6, BM=2, BD=bd, ONE_TILE=True)
    y = p.call(rmsnorm_rows, h, w, y, 1e-6, BM=2, BD=bd, ONE_TILE=True)
    p.output(y)
    return p


@pytest.mark.parametrize("target", TARGETS)
def test_run_matches_oracle(target):
    rng = np.random.default_rng()
    m, d = int(rng.integers(3, 9)), int(rng.integers(17, 60))
    x, w = rng.standard_normal((m, d)), rng.standard_normal(d)
    p = norm_twice(m, d)
    verify(p)
    out = run(p, {"x": torch.tensor(x, dtype=torch.float32), "w": torch.tensor(w, dtype=torch.float32)},
              target=target, passes=["verify"])
    want = norm.rmsnorm(norm.rmsnorm(x, w, 1e-6), w, 1e-6)
    np.testing.assert_allclose(out["y"].numpy(), want, rtol=1e-4, atol=1e-5)


def test_in_place_update_makes_versions_and_orders_readers_first():
    p = Program("inplace")
    acc = p.input("acc", (40,), k.f32)
    x = p.input("x", (40,), k.f32)
    out = p.tensor("out", (40,), k.f32)
    out = p.call(scale_add, acc, x, out, 2.0)          # reads acc (version 0)
    acc2 = p.call(accumulate, acc, x)                   # then overwrites acc in place
    p.output(out, acc2)
    verify(p)
    assert acc2.id == "%acc.1" and p.writer("%acc.1") == "accumulate"
    assert "scale_add" in p.op_deps("accumulate")      # write after read
    assert p.ops() == ["scale_add", "accumulate"]
    rng = np.random.default_rng()
    a0, x0 = rng.standard_normal(40), rng.standard_normal(40)
    got = run(p, {"acc": torch.tensor(a0, dtype=torch.float32), "x": torch.tensor(x0, dtype=torch.float32)})
    np.testing.assert_allclose(got["out"].numpy(), 2 * a0 + x0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["acc"].numpy(), a0 + x0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_one_tensor_bound_to_two_parameters(target, rng):
    # the same version as both operands, and as the operand of its own in-place update: one read
    # edge names both parameters (the builder once kept only the last; tests/graph_fuzz.py, seed 1)
    p = Program("twice")
    x = p.input("x", (40,), k.f32)
    h = p.tensor("h", (40,), k.f32)
    h = p.call(scale_add, x, x, h, 3.0)                 # h = 3x + x
    h2 = p.call(accumulate, h, h)                       # h += h
    p.output(h2)
    verify(p)
    assert sorted(p.g.edges["%x", "scale_add"]["params"]) == ["x", "y"]
    x0 = rng.standard_normal(40).astype(np.float32)
    for passes in (["verify"], None):
        got = run(p, {"x": torch.from_numpy(x0)}, target=target, passes=passes)
        np.testing.assert_allclose(got["h"].numpy(), 8 * x0, rtol=1e-6)

def test_dump_names_every_tensor_and_call():
    text = dump(norm_twice(4, 32))
    assert text.startswith("program norm_twice {")
    for frag in ("input  %x : f32[4, 32]", "weight %w : f32[32]", "%h.1 = rmsnorm_rows(x=%x, w=%w, y=%h",
                 "%y.1 = rmsnorm_rows_1(x=%h.1", "output %y.1", "ONE_TILE=true"):
        assert frag in text, frag


def test_builder_errors_name_the_problem():
    p = Program("bad")
    x = p.input("x", (8,), k.f32)
    y = p.input("y", (8,), k.f32)
    o = p.tensor("o", (9,), k.f32)
    with pytest.raises(K31Error, match="size 9") as err:
        p.call(scale_add, x, y, o, 1.0)
    assert "test_graph.py:" in str(err.value) and "p.call(scale_add, x, y, o, 1.0)" in str(err.value)
    o16 = p.tensor("o16", (8,), k.bf16)
    with pytest.raises(K31Error, match="bf16"):
        p.call(scale_add, x, y, o16, 1.0)
    o2 = p.tensor("o2", (8,), k.f32)
    p.call(scale_add, x, y, o2, 1.0)
    with pytest.raises(K31Error, match="old version"):
        p.call(scale_add, x, y, o2, 1.0)
    with pytest.raises(K31Error, match="missing"):
        p.call(scale_add, x, y)
    w = p.weight("w", (8,), k.f32)
    with pytest.raises(K31Error, match="weight"):
        p.call(accumulate, w, x)
    with pytest.raises(K31Error, match="already has"):
        p.input("x", (8,), k.f32)


def test_verifier_rules_catch_malformed_graphs():
    p = norm_twice(4, 32)
    assert problems(p) == []
    bad = p.copy()                                           # an unwritten temp read
    bad.g.remove_node("rmsnorm_rows")
    bad.order.remove("rmsnorm_rows")
    assert any(m.startswith("[single_writer]") for m in problems(bad))
    bad = p.copy()
    t = bad.tensor_node("%h.1")
    bad.g.add_edge("rmsnorm_rows", "%y.1", role="write", param="y")      # a second writer
    assert any("2 writers" in m for m in problems(bad))
    bad = p.copy()
    bad.g.add_edge("%y.1", "rmsnorm_rows", role="read", param="x")      # a cycle
    assert problems(bad)[0].startswith("[acyclic]")
    bad = p.copy()
    bad.g.nodes["%h"]["node"] = TensorNode("h", 0, (4, 33), k.f32, "temp")
    assert any(m.startswith("[signatures]") and "33" in m for m in problems(bad))
    with pytest.raises(K31Error, match="malformed"):
        verify(bad)
    assert t.shape == (4, 32)


def test_run_checks_inputs():
    p = norm_twice(4, 32)
    with pytest.raises(K31Error, match="missing input"):
        run(p, {"x": torch.zeros(4, 32)})
    with pytest.raises(K31Error, match="must be f32"):
        run(p, {"x": torch.zeros(4, 31), "w": torch.zeros(32)})


@pytest.mark.parametrize("target", TARGETS)
def test_order_ties_views_of_one_buffer(target):
    """`buf` and `view` are two inputs over the same bytes: a kernel writes through `buf`, another
    reads through `view`. Nothing else ties the read to the write (a pass that reorders independent
    ops, such as streams, could run it first); the `order` host op makes the view's new version
    depend on the write."""
    p = Program("views")
    buf = p.input("buf", (40,), k.f32)
    view = p.input("view", (40,), k.f32)
    x = p.input("x", (40,), k.f32)
    out = p.tensor("out", (40,), k.f32)
    buf = p.call(accumulate, buf, x)                     # buf += x
    view = p.host("order", [buf], [view])
    out = p.call(scale_add, view, x, out, 1.0)         # out = buf + x, read through the view
    p.output(out)
    verify(p)
    assert p.ops() == ["accumulate", "order", "scale_add"]
    assert "order" in p.op_deps("scale_add") and "accumulate" in p.op_deps("order")
    rng = np.random.default_rng()
    a0, x0 = rng.standard_normal(40), rng.standard_normal(40)
    storage = torch.tensor(a0, dtype=torch.float32)
    got = run(p, {"buf": storage, "view": storage.view(40), "x": torch.tensor(x0, dtype=torch.float32)},
              target=target)
    np.testing.assert_allclose(got["out"].numpy(), a0 + 2 * x0, rtol=1e-5, atol=1e-6)


def test_collectives_on_one_process():
    p = Program("gather")
    a = p.input("a", (2, 3), k.f32)
    b = p.input("b", (2, 3), k.f32)
    g = p.tensor("g", (4, 3), k.f32)
    s = p.tensor("s", (2, 3), k.f32)
    g = p.all_gather([a, b], g, axis=0)
    s = p.all_reduce([a, b], s)
    p.output(g, s)
    verify(p)
    ta, tb = torch.randn(2, 3), torch.randn(2, 3)
    out = run(p, {"a": ta, "b": tb})
    assert torch.equal(out["g"], torch.cat([ta, tb]))
    torch.testing.assert_close(out["s"], ta + tb)


def test_graphs_doc_runs(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from test_docs import run_markdown
    doc = Path(__file__).resolve().parent.parent / "docs" / "graphs.md"
    assert run_markdown(doc, tmp_path, capsys, monkeypatch) >= 4


EXPLAIN_SRC = '''
import k31dsl as k
from k31dsl.lowering.graph import Program, program
from k31dsl.ops.common import rmsnorm_rows

@k.kernel
def row_scale(x: k.Tensor[k.f32, "T", "D"], y: k.Tensor[k.f32, "T", "D"], a: k.f32, BD: k.constexpr = 64):
    for t in k.grid(x.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)] * a

@program
def branches():
    p = Program("branches")
    x = p.input("x", (4, 40), k.f32)
    a, b, c = (p.tensor(n, (4, 40), k.f32) for n in "abc")
    a = p.call(row_scale, x, a, 2.0)
    b = p.call(row_scale, x, b, 3.0)
    b = p.call(row_scale, a, b, 1.0)
    c = p.call(row_scale, b, c, 0.5)
    p.output(c)
    return p

single = Program("single")
_x = single.input("x", (4, 40), k.f32)
_y = single.tensor("y", (4, 40), k.f32)
single.output(single.call(row_scale, _x, _y, 2.0))
'''


def test_explain_prints_every_pass_and_draws(tmp_path, capsys):
    from k31dsl.cli import main
    src = tmp_path / "progs.py"
    src.write_text(EXPLAIN_SRC)
    assert main(["explain", str(src), "--target", "triton"]) == 0
    out = capsys.readouterr().out
    for name in ("build", "verify", "superkernel", "streams", "memory_plan"):
        assert f"program `branches` after pass `{name}` (triton)" in out
        assert f"program `single` after pass `{name}` (triton)" in out
    assert "# memory_plan:" in out and "# superkernel:" in out
    assert main(["explain", f"{src}::single", "--target", "ascendc"]) == 0
    out = capsys.readouterr().out
    assert "program `single`: single_host.cpp" in out and "k31_program_single(void* const* bufs, uint8_t* arena" in out
    png = tmp_path / "g.png"
    assert main(["explain", f"{src}::branches", "--target", "ascendc", "--dump-after", "streams",
                 "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.count("after pass") == 1 and "single" not in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    mem = tmp_path / "m.png"
    assert main(["explain", f"{src}::branches", "--target", "triton", "--memory-png", str(mem)]) == 0
    assert mem.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and mem.stat().st_size > 5000
    capsys.readouterr()
    assert main(["explain", f"{src}::branches", "--target", "triton", "--dump-after", "streams",
                 "--memory-png", str(mem)]) == 1                   # no plan yet after `streams`
    assert "has no memory plan to draw" in capsys.readouterr().err


def test_explain_errors(tmp_path, capsys):
    from k31dsl.cli import main
    src = tmp_path / "progs.py"
    src.write_text(EXPLAIN_SRC)
    assert main(["explain", f"{src}::nope", "--target", "numpy"]) == 1
    assert "no program named `nope`" in capsys.readouterr().err
    assert main(["explain", str(src), "--target", "numpy", "--dump-after", "fuse"]) == 1
    assert "the passes are: build, verify, superkernel" in capsys.readouterr().err
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert main(["explain", str(empty), "--target", "numpy"]) == 1
    assert "@k31dsl.lowering.graph.program" in capsys.readouterr().err


def test_non_contiguous_input_updated_in_place_is_written_back():
    p = Program("inplace_view")
    acc = p.input("acc", (40,), k.f32)
    x = p.input("x", (40,), k.f32)
    p.output(p.call(accumulate, acc, x))
    base = torch.randn(80)
    view, x0 = base[::2], torch.randn(40)
    want = view + x0
    run(p, {"acc": view, "x": x0})
    torch.testing.assert_close(base[::2], want)


def test_persistent_intermediates_are_reused_but_outputs_are_fresh():
    from k31dsl.lowering.graph import compile_program
    ex = compile_program(norm_twice(4, 32), "numpy", passes=["verify"])
    ex.persistent_temps = True
    ins = {"x": torch.randn(4, 32), "w": torch.randn(32)}
    first = ex(ins)["y"]
    h1 = ex._kept[("t", "h")]
    second = ex(ins)["y"]
    assert ex._kept[("t", "h")] is h1 and first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, second)


def test_left_out_outputs_are_allocated():
    p = Program("auto")
    x = p.input("x", (5, 48), k.f32)
    w = p.weight("w", (48,), k.f32)
    y = p.call(rmsnorm_rows, x, w, eps=1e-6, BM=2, BD=64, ONE_TILE=True)      # YT: its default, bf16
    assert y.id == "%rmsnorm_rows_y.1" and y.shape == (5, 48) and y.dtype is k.bf16
    z = p.call(rmsnorm_rows, y, w, eps=1e-6, BM=2, BD=64, ONE_TILE=True, YT=k.f32)
    assert z.dtype is k.f32 and z.shape == (5, 48)
    p.output(z)
    verify(p)
    xt, wt = torch.randn(5, 48), torch.randn(48)
    want = norm.rmsnorm(norm.rmsnorm(xt.double().numpy(), wt.double().numpy(), 1e-6), wt.double().numpy(), 1e-6)
    got = run(p, {"x": xt, "w": wt})["rmsnorm_rows_1_y"]
    np.testing.assert_allclose(got.float().numpy(), want, rtol=2e-2, atol=2e-2)
    with pytest.raises(K31Error, match="missing argument `acc`"):
        p.call(accumulate, x=x)
    with pytest.raises(K31Error, match="missing argument"):
        p.call(scale_add, x, x, x)

"""Graph passes other than superkernel (tests/test_superkernel.py): each preserves results (pass
on vs off, numpy and the Triton interpreter) and does what it claims: streams splits independent
chains; memory_plan never aliases live buffers; nz_layout round trips and keeps matmuls equal.
Then the passes together: the AscendC program's host code, the kernels the passes build (compiled
for sm_90, verified, round-tripped as text), and every program's whole pipeline on vs off."""
import numpy as np
import pytest
import torch

import k31dsl as k
from k31dsl.lowering.graph import Program, compile_program, run
from k31dsl.lowering.passes.superkernel import superkernel
from k31dsl.ops.attnres import attnres_update_rows, rmsnorm_row
from k31dsl.ops.common import rmsnorm_rows
from pass_programs import TARGETS, assert_same, on_off, rand, row_add, row_scale, row_shift, two_rows


# ---------------------------------------------------------------- streams

def indexer_prolog_shaped(T=4, D=40):
    """Three independent chains from one input joining at the end (the DSA indexer prolog's
    shape: Q projection+quant is the longest, K norm+quant and the head weights run beside it)."""
    p = Program("prolog")
    x = p.input("x", (T, D), k.f32)
    q1, q2, q3, k1, k2, w1, j, out = (p.tensor(n, (T, D), k.f32) for n in ("q1", "q2", "q3", "k1", "k2", "w1", "j", "out"))
    q1 = p.call(row_scale, x, q1, 2.0)
    k1 = p.call(row_scale, x, k1, -1.0)
    w1 = p.call(row_scale, x, w1, 0.5)
    q2 = p.call(row_scale, q1, q2, 3.0)
    k2 = p.call(row_scale, k1, k2, 1.5)
    q3 = p.call(row_scale, q2, q3, -2.0)
    j = p.call(row_add, q3, k2, j)
    out = p.call(row_add, j, w1, out)
    p.output(out)
    return p


@pytest.mark.parametrize("target", TARGETS)
def test_streams_put_the_indexer_prolog_chains_on_three_streams(target):
    from k31dsl.lowering.passes.streams import streams
    p = indexer_prolog_shaped()
    s = streams(p)
    stream = {n: s.node(n).attrs["stream"] for n in s.ops()}
    assert s.meta["streams"]["count"] == 3
    q_chain = ["row_scale", "row_scale_3", "row_scale_5", "row_add", "row_add_1"]
    assert s.meta["streams"]["critical_path"] == q_chain and all(stream[n] == 0 for n in q_chain)
    assert stream["row_scale_1"] == stream["row_scale_4"] != stream["row_scale_2"]
    assert {stream["row_scale_1"], stream["row_scale_2"]} == {1, 2}
    # exactly the two cross-stream edges carry events, recorded by the producer, awaited by the consumer
    assert [(prod, cons) for _, prod, cons in s.meta["streams"]["events"]] == [("row_scale_4", "row_add"),
                                                                                 ("row_scale_2", "row_add_1")]
    for name, prod, cons in s.meta["streams"]["events"]:
        assert name in s.node(prod).attrs["record"] and name in s.node(cons).attrs["wait"]
    on, off = on_off(p, ["streams"], {"x": rand(4, 40)}, target)
    assert_same(on, off)


def test_streams_limit_and_single_chain():
    from k31dsl.lowering.passes.streams import streams, with_max_streams
    s = with_max_streams(2)(indexer_prolog_shaped())
    assert s.meta["streams"]["count"] == 2
    chain = streams(two_rows(row_scale, a=1.0))
    assert chain.meta["streams"] == {"count": 1, "critical_path": ["row_scale", "row_scale_1"], "events": []}


def test_stream_limit_from_the_environment(monkeypatch):
    from k31dsl.lowering.passes.streams import streams
    monkeypatch.setenv("K31_MAX_STREAMS", "1")
    s = streams(indexer_prolog_shaped())
    assert s.meta["streams"]["count"] == 1 and s.meta["streams"]["events"] == []


# ---------------------------------------------------------------- memory plan

def random_program(rng, n_ops: int):
    """A random DAG of row kernels over temps of a few sizes; outputs are a random subset."""
    p = Program("rand")
    widths = [16, 24, 40]
    live = {}
    for i, d in enumerate(widths):
        live.setdefault(d, []).append(p.input(f"x{i}", (3, d), k.f32))
    made = []
    for i in range(n_ops):
        d = int(rng.choice(widths))
        srcs = live[d]
        out = p.tensor(f"t{i}", (3, d), k.f32)
        if len(srcs) >= 2 and rng.random() < 0.5:
            a, b = rng.choice(len(srcs), 2, replace=False)
            out = p.call(row_add, srcs[a], srcs[b], out)
        else:
            out = p.call(row_scale, srcs[int(rng.integers(len(srcs)))], out, float(rng.uniform(-2, 2)))
        live[d].append(out)
        made.append(out)
    p.output(*[made[i] for i in rng.choice(len(made), max(1, n_ops // 4), replace=False)])
    return p


@pytest.mark.parametrize("seed", range(6))
def test_memory_plan_never_aliases_live_buffers(seed):
    import networkx as nx
    from k31dsl.lowering.passes.memory_plan import ALIGN, memory_plan, uses
    from k31dsl.lowering.passes.streams import streams
    rng = np.random.default_rng(np.random.SeedSequence().entropy + seed)
    p = random_program(rng, int(rng.integers(5, 14)))
    planned = memory_plan(streams(p))
    plan = planned.meta["memory_plan"]
    use, dag = uses(planned), nx.DiGraph()
    dag.add_nodes_from(planned.ops())
    dag.add_edges_from((d, n) for n in planned.ops() for d in planned.op_deps(n))
    by_stream: dict = {}                # run-time order: the dependencies and each stream's own order
    for n in planned.ops():
        by_stream.setdefault(planned.node(n).attrs.get("stream", 0), []).append(n)
    for ops in by_stream.values():
        dag.add_edges_from(zip(ops, ops[1:]))
    anc = {n: nx.ancestors(dag, n) for n in dag}
    sizes = {s: planned.storages()[s].nbytes for s in plan["offsets"]}
    for s, at in plan["offsets"].items():
        assert s not in planned.outputs and at % ALIGN == 0 and at + sizes[s] <= plan["arena_bytes"]
    placed = [s for s in plan["offsets"] if s not in plan["alias"]]
    for i, s in enumerate(placed):
        for o in placed[:i]:            # bytes shared: one lifetime ends before the other starts
            if plan["offsets"][o] < plan["offsets"][s] + sizes[s] and plan["offsets"][s] < plan["offsets"][o] + sizes[o]:
                first, second = (o, s) if all(use[o] <= anc[n] for n in use[s]) else (s, o)
                assert all(use[first] <= anc[n] for n in use[second]), (o, s)
    for b, a in plan["alias"].items():
        assert plan["offsets"][b] == plan["offsets"][a] and sizes[b] == sizes[a]
    rounded = sum(-(-n // ALIGN) * ALIGN for s, n in sizes.items() if s not in plan["alias"])
    assert plan["peak_live"] <= plan["bytes_after"] == plan["arena_bytes"] <= rounded
    inputs = {f"x{i}": rand(3, d) for i, d in enumerate([16, 24, 40])}
    on, off = on_off(p, ["streams", "memory_plan"], inputs, "numpy")
    assert_same(on, off)


def test_memory_plan_reuses_a_chain_and_reports_bytes():
    from k31dsl.lowering.passes.memory_plan import memory_plan
    p = Program("chain")
    x = p.input("x", (4, 40), k.f32)
    ts = [p.tensor(f"t{i}", (4, 40), k.f32) for i in range(5)]
    cur = x
    for t in ts:
        cur = p.call(row_scale, cur, t, 1.5)
    p.output(cur)
    planned = memory_plan(p)
    plan = planned.meta["memory_plan"]
    assert plan["bytes_before"] == 4 * 4 * 40 * 4 and plan["bytes_after"] == 2 * 4 * 40 * 4
    assert sorted(plan["offsets"].values()) == [0, 0, 640, 640] and plan["peak_live"] == 1280
    assert "2560 bytes -> 1280 bytes" in planned.report[-1]
    on, off = on_off(p, ["memory_plan"], {"x": rand(4, 40)}, "triton")
    assert_same(on, off)


@k.kernel
def first_rows(x: k.Tensor[k.f32, "T2", "D"], y: k.Tensor[k.f32, "T", "D"], BD: k.constexpr = 64):
    for t in k.grid(y.shape[0]):
        y[t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)]


def test_memory_plan_packs_two_tensors_into_a_dead_larger_one():
    """a (1280 B) dies once b is written; c and d (640 B each) then share a's bytes while b lives.
    A plan that hands out whole buffers puts c in a's buffer and needs a third one for d."""
    from k31dsl.lowering.passes.memory_plan import memory_plan
    p = Program("halves")
    x = p.input("x", (8, 40), k.f32)
    a, b, c, d, e = (p.tensor(n, shape, k.f32) for n, shape in
                     [("a", (8, 40)), ("b", (4, 40)), ("c", (4, 40)), ("d", (4, 40)), ("e", (4, 40))])
    a = p.call(row_scale, x, a, 2.0)
    b = p.call(first_rows, a, b)
    c = p.call(row_scale, b, c, -1.5)
    d = p.call(row_add, b, c, d)
    p.output(p.call(row_add, c, d, e))
    plan = memory_plan(p).meta["memory_plan"]
    assert plan["arena_bytes"] == plan["peak_live"] == 1280 + 640
    assert plan["offsets"]["a"] == 0 and {plan["offsets"]["c"], plan["offsets"]["d"]} == {0, 640}
    on, off = on_off(p, ["memory_plan"], {"x": rand(8, 40)}, "triton")
    assert_same(on, off)


# ---------------------------------------------------------------- nz layout

@k.kernel
def matmul_w(a: k.Tensor[k.f32, "M", "K"], b: k.Tensor["BT", "K", "N"], c: k.Tensor[k.f32, "M", "N"],
             BT: k.constexpr = k.f32, BM: k.constexpr = 16, BN: k.constexpr = 16, BK: k.constexpr = 16):
    for i, j in k.grid(k.cdiv(a.shape[0], BM), k.cdiv(b.shape[1], BN)):
        acc = k.zeros((BM, BN), k.f32)
        for kk in range(k.cdiv(a.shape[1], BK)):
            x = a[k.span(i * BM, BM, other=0.0), k.span(kk * BK, BK, other=0.0)]
            acc += k.dot(x, b[k.span(kk * BK, BK, other=0.0), k.span(j * BN, BN, other=0.0)].to(k.f32))
        c[k.span(i * BM, BM), k.span(j * BN, BN)] = acc


NZ_DTYPES = [(k.f32, torch.float32, 8), (k.bf16, torch.bfloat16, 16), (k.f16, torch.float16, 16),
             (k.f8e4m3, torch.float8_e4m3fn, 32), (k.i32, torch.int32, 8), (k.u8, torch.uint8, 32)]


@pytest.mark.parametrize("kdt,tdt,n0", NZ_DTYPES, ids=[d[0].name for d in NZ_DTYPES])
def test_nz_round_trip_and_fractal_index(kdt, tdt, n0):
    from k31dsl.lowering.passes.nz_layout import nd_to_nz, nz_shape, nz_to_nd
    rng = np.random.default_rng()
    K, N = int(rng.integers(1, 50)), int(rng.integers(1, 70))
    nd = torch.tensor(rng.integers(1, 100, (K, N))).to(tdt)
    nz = nd_to_nz(nd)
    n1, k1 = -(-N // n0), -(-K // 16)
    assert tuple(nz.shape) == nz_shape(K, N, kdt) == (n1, k1, 16, n0) and nz.dtype == tdt
    back = nz_to_nd(nz, (K, N))
    assert torch.equal(back.view(torch.uint8), nd.view(torch.uint8))
    raw, want = nz.view(torch.uint8).reshape(n1, k1, 16, -1), nd.view(torch.uint8)
    size = nd.element_size()
    for _ in range(20):       # NZ[n1, k1, k0, n0] = ND[k1*16 + k0, n1*N0 + n0]; padding is zero
        a, b, c, d = (int(rng.integers(s)) for s in (n1, k1, 16, n0))
        r, col = b * 16 + c, a * n0 + d
        got = raw[a, b, c, d * size:(d + 1) * size]
        assert torch.equal(got, want[r, col * size:(col + 1) * size] if r < K and col < N else torch.zeros_like(got))


def nz_program(M, K, N, dt):
    p = Program("mm")
    a = p.input("a", (M, K), k.f32)
    b = p.weight("b", (K, N), dt)
    c = p.tensor("c", (M, N), k.f32)
    c = p.call(matmul_w, a, b, c)
    p.output(c)
    return p


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kdt,tdt", [(k.f32, torch.float32), (k.bf16, torch.bfloat16)], ids=["f32", "bf16"])
def test_nz_matmul_equals_nd(target, kdt, tdt):
    from k31dsl.lowering.passes.nz_layout import nz_layout
    rng = np.random.default_rng()
    M, K, N = int(rng.integers(1, 20)), int(rng.integers(1, 50)), int(rng.integers(1, 40))
    p = nz_program(M, K, N, kdt)
    q = nz_layout(p)
    assert "%b_nz" in q.g and q.node("to_nz_b").op == "to_nz" and "matmul_w.b <- b" in q.report[-1]
    assert q.tensor_node("%b_nz").layout == "NZ"
    a, b = rand(M, K), rand(K, N, dtype=tdt)
    ex = compile_program(p, target, passes=["verify", "nz_layout"])
    on = ex({"a": a, "b": b})["c"].clone()
    off = run(p, {"a": a, "b": b}, target=target, passes=["verify"])["c"]
    torch.testing.assert_close(on, off, rtol=0, atol=0)
    want = a.double() @ b.double()
    torch.testing.assert_close(on.double(), want, rtol=1e-4, atol=1e-4)
    converted = ex._static["b_nz"]
    ex({"a": rand(M, K), "b": b})                       # same weight: converted once, reused
    assert ex._static["b_nz"] is converted
    ex({"a": a, "b": b.clone()})                         # a new weight tensor: converted again
    assert ex._static["b_nz"] is not converted


def test_nz_layout_leaves_weights_not_feeding_dot():
    from k31dsl.lowering.passes.nz_layout import nz_layout
    p = Program("rows")
    x = p.input("x", (4, 40), k.f32)
    w = p.weight("w", (40,), k.f32)
    y = p.tensor("y", (4, 40), k.f32)
    y = p.call(rmsnorm_rows, x, w, y, 1e-6, BM=2, BD=64, ONE_TILE=True)
    p.output(y)
    q = nz_layout(p)
    assert "%w_nz" not in q.g and len(q.ops()) == 1


def test_weight_conversions_take_no_stream():
    from k31dsl.lowering.passes.nz_layout import nz_layout
    from k31dsl.lowering.passes.streams import streams
    s = streams(nz_layout(nz_program(5, 40, 24, k.f32)))
    assert s.is_static("to_nz_b") and "stream" not in s.node("to_nz_b").attrs
    assert s.meta["streams"] == {"count": 1, "critical_path": ["matmul_w"], "events": []}


def test_nz_matmul_on_the_ascendc_emulator():
    """AscendC is the target whose default pipeline converts dot weights to NZ."""
    p = nz_program(5, 40, 24, k.f32)
    a, b = rand(5, 40), rand(40, 24)
    ex = compile_program(p, "ascendc")
    assert "%b_nz" in ex.p.g
    on = ex({"a": a, "b": b})["c"]
    off = run(p, {"a": a, "b": b}, target="numpy", passes=["verify"])["c"]
    torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the AscendC program: host code

def test_ascendc_host_code_has_streams_events_and_group_entries():
    from k31dsl.targets.ascendc.program import host_files
    p = compile_program(indexer_prolog_shaped(), "ascendc", passes=["verify", "streams", "memory_plan"]).p
    host = host_files(p)["prolog_host.cpp"]
    assert host.count("aclrtCreateStream(&s[") == 2 and "aclrtStream s[3] = {stream0};" in host
    assert host.count("<<<") == 8 and "row_add<<<static_cast<uint32_t>(td6.blockDim), nullptr, s[0]>>>" in host
    for name, prod, cons in p.meta["streams"]["events"]:      # record after the producer's launch, wait before the consumer's
        rec, wait = host.index(f"aclrtRecordEvent({name}, s["), host.index(f"aclrtStreamWaitEvent(s[0], {name})")
        assert host.index(f"// {prod}\n") < rec < host.index(f"// {cons}\n") < wait
    assert "aclrtStreamWaitEvent(stream0, join1)" in host and host.rstrip().endswith("}")
    assert "//   arena + 0 = temp " in host and "arena: one device allocation of" in host   # the memory plan
    assert "(GM_ADDR)(arena + " in host and "k31_program_prolog(void* const* bufs, uint8_t* arena," in host
    g = compile_program(two_rows(row_shift), "ascendc").p
    files = host_files(g)
    entry = files["two_groups.cpp"]
    assert entry.index("K31Kernel_row_scale") < entry.index("AscendC::SyncAll();") < entry.index("K31Kernel_row_shift")
    assert "k31_group_two_g0<<<static_cast<uint32_t>(std::max<int64_t>({td0.blockDim, td1.blockDim}))" in files["two_host.cpp"]


# ---------------------------------------------------------------- kernels the passes make compile for sm_90

class PassKernel:
    """A KernelDef stand-in (hopper.compile_gpu_module calls `.ir()`) for a kernel a pass built."""

    def __init__(self, make):
        self.make = make

    def ir(self):
        return self.make()


def _fused_update_kernel():
    p = Program("u")
    T, D = 4, 40
    part = p.input("partial", (T, D), k.f32)
    args = [p.input(n, (T, D), k.bf16) if n == "delta" else p.input(n, (D,) if n == "q" else (T,) if n in "ml" else (T, D), k.f32)
            for n in ("delta", "q", "o", "m", "l")]
    h, y = p.tensor("h", (T, D), k.bf16), p.tensor("y", (T, D), k.bf16)
    part, h = p.call(attnres_update_rows, part, *args, h, 1e-6, BD=64)
    y = p.call(rmsnorm_row, h, p.weight("w", (D,), k.f32), y, 1e-6, BD=64)
    p.output(y)
    s = superkernel(p)
    return s.node(s.calls()[0]).kernel


def _nz_matmul_kernel():
    from k31dsl.lowering.passes.nz_layout import nz_layout
    s = nz_layout(nz_program(20, 40, 24, k.bf16))
    return s.node(s.calls()[0]).kernel


FUSED_UPDATE_NORM = PassKernel(_fused_update_kernel)
NZ_MATMUL = PassKernel(_nz_matmul_kernel)


def test_pass_kernels_compile_for_hopper(tmp_path):
    from hopper import assert_compiles_for_hopper
    assert_compiles_for_hopper(__file__, ["FUSED_UPDATE_NORM", "NZ_MATMUL"], tmp_path, index_types=("int32",))


# ---------------------------------------------------------------- every program: the whole pipeline on vs off

def _update_program():
    T, D = 3, 24
    p = Program("update_norm")
    part = p.input("partial", (T, D), k.f32)
    delta = p.input("delta", (T, D), k.bf16)
    q, o = p.weight("q", (D,), k.f32), p.input("o", (T, D), k.f32)
    m, l = p.input("m", (T,), k.f32), p.input("l", (T,), k.f32)
    h, y = p.tensor("h", (T, D), k.bf16), p.tensor("y", (T, D), k.bf16)
    part, h = p.call(attnres_update_rows, part, delta, q, o, m, l, h, 1e-6, BD=32)
    y = p.call(rmsnorm_row, h, p.weight("w", (D,), k.f32), y, 1e-6, BD=32)
    p.output(y, part)
    return p


def _inputs(p):
    from k31dsl.dsl import dtypes as D
    out = {}
    for st, t in p.storages().items():
        if t.kind in ("input", "weight"):
            v = torch.randn(t.shape)
            out[st] = (v.abs() + 1.0 if st == "l" else v).to(D.torch_dtype(t.dtype))
    return out


PROGRAMS = {"update_norm": _update_program, "prolog": indexer_prolog_shaped,
            "shifted": lambda: two_rows(row_shift), "matmul": lambda: nz_program(5, 40, 24, k.bf16),
            "fan": lambda: random_program(np.random.default_rng(), 8)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_full_pipeline_on_vs_off(name, target):
    from k31dsl.lowering.graph.pipeline import GRAPH_PIPELINES
    p = PROGRAMS[name]()
    passes = GRAPH_PIPELINES[target] + ["nz_layout"]          # NZ too, though only ascendc lists it
    inputs = _inputs(p)
    on = run(p, {n: v.clone() for n, v in inputs.items()}, target=target, passes=passes)
    off = run(p, {n: v.clone() for n, v in inputs.items()}, target="numpy", passes=["verify"])
    assert_same(on, off, 1e-5 if target == "numpy" else 2e-2)


def test_pass_built_kernels_verify_and_round_trip_as_text():
    from k31dsl.dsl.parse import parse_kernel
    from k31dsl.dsl.text import print_kernel
    from k31dsl.dsl.verify import verify
    for make in (_fused_update_kernel, _nz_matmul_kernel):
        kern = make()
        verify(kern)
        text = print_kernel(kern)
        assert print_kernel(parse_kernel(text)) == text

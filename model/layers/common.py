"""The step graph under construction: one lowering.graph Program per step kind and shape class,
with the names every layer builder shares (step inputs, runner-owned states, weights).

Names in the program are what `runner.explain()` prints, so they say what they are:
  step inputs   tokens, positions, slot_mapping, block_table, state_slots, ks, ke, ...
  states        kda{l}_pool, kda{l}_conv_{q,k,v}, dsa{l}_mla_{codes,scales,rope}, dsa{l}_index_cache
  weights       the model's names with '.' -> '_' (layers_3_attn_q_proj), plus derived ones
  temps         l{l}_<what> (per layer), b{b}_<what> (per AttnRes block)
"""
from __future__ import annotations

from dataclasses import dataclass

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.lowering.graph import Program
from k31dsl.lowering.graph.ir import TensorRef
from k31dsl.ops.dsa.mla import rope_table_rows
from k31dsl.ops.common import next_pow2
from k31dsl.ops.nn import gpu_linear_tiles, linear_rows as _linear_rows, linear_rows_splitk as _linear_rows_splitk, \
    linear_splitk_reduce as _linear_splitk_reduce


class MemoKernel:
    """A @k.kernel whose specialisations (kernel IR per constexpr set) are built once per process:
    a step graph makes ~100 calls of ~25 distinct specialisations, each ~50 ms to build, and every
    shape class repeats them. Kernel IR is never edited in place (passes build new kernels), so
    calls may share it. Everything else is the wrapped KernelDef's."""

    _built: dict = {}

    def __init__(self, kdef):
        self._kdef = kdef

    def __getattr__(self, name):
        return getattr(self._kdef, name)

    def ir(self, **constexprs):
        key = (self._kdef.name, id(self._kdef), tuple(sorted((n, repr(v)) for n, v in constexprs.items())))
        hit = self._built.get(key)
        if hit is None or hit[0] is not self._kdef:
            hit = self._built[key] = (self._kdef, self._kdef.ir(**constexprs))
        return hit[1]


def memo(*kdefs):
    out = tuple(MemoKernel(kd) for kd in kdefs)
    return out[0] if len(out) == 1 else out


linear_rows, linear_rows_splitk, linear_splitk_reduce = memo(_linear_rows, _linear_rows_splitk, _linear_splitk_reduce)


def prefill_bucket(n: int) -> int:
    """Prefill chunk buckets: 16, 32, 64, ... tokens (one compiled program serves every prompt
    length up to the bucket; the padding rows come last, write no cache and are dropped from the
    logits)."""
    return max(16, next_pow2(n))


def prefill_min_tokens(q_len: int) -> int:
    """The fewest real tokens a prefill program of q_len rows serves (prefill_bucket's inverse)."""
    return 1 if q_len <= 16 else q_len // 2 + 1


@dataclass(frozen=True)
class ShapeClass:
    """What a compiled step program is specialised for: the step kind, sequences (a decode batch
    bucket), query tokens per sequence, and cache pages per sequence (a power of two), and for a
    context-parallel prefill (kind "cp_prefill": q_len = the rank's tokens, max_pages = the whole
    sequence's pages) the number of ranks."""
    kind: str
    n_seqs: int
    q_len: int
    max_pages: int
    ranks: int = 1
    blocks: tuple = ()      # cp_prefill: the rank's DSA query blocks (first row, rows, key width)

    @property
    def n_tokens(self) -> int:
        return self.n_seqs * self.q_len

    @property
    def name(self) -> str:
        cp = f"_r{self.ranks}_q{len(self.blocks)}" if self.kind == "cp_prefill" else ""
        return f"{self.kind}_b{self.n_seqs}_t{self.q_len}_p{self.max_pages}{cp}"


def weight_key(name: str) -> str:
    """The program name of a model weight ('layers.0.attn.q_proj' -> 'layers_0_attn_q_proj')."""
    return name.replace(".", "_")


class StepGraph:
    """A Program plus the runner's weight table (program name -> prepared torch tensor) so a
    layer asks for a weight by its model name and gets a handle of the right shape and dtype."""

    def __init__(self, config, shape: ShapeClass, weights: dict, states: dict, act_dtype, target: str):
        self.cfg, self.shape, self.weights, self.runner_states = config, shape, weights, states
        self.target = target
        # a CUDA GPU runs this program: graph calls get the GPU tiles (they are not autotuned)
        self.gpu = target == "triton" and any(getattr(t, "is_cuda", False) for t in weights.values())
        self.act = act_dtype                         # DSL dtype of activations (config.dtype)
        self.p = Program(shape.name)
        self._w: dict = {}
        self._in: dict = {}
        T, B = shape.n_tokens, shape.n_seqs
        p = self.p
        self.tokens = p.input("tokens", (T,), k.i32)
        self.positions = p.input("positions", (T,), k.i32)
        self.slot_mapping = p.input("slot_mapping", (T,), k.i32)   # cache slot of each token (-1: padding)
        self.block_table = p.input("block_table", (B, shape.max_pages), k.i32)
        self.state_slots = p.input("state_slots", (B,), k.i32)    # KDA/conv state row (spare row: padding)
        self.ks = p.input("ks", (T,), k.i32)                       # key range [ks, ke) of each query token
        self.ke = p.input("ke", (T,), k.i32)

    @property
    def T(self) -> int:
        return self.shape.n_tokens

    def rope_tables(self):
        """cos/sin fp32 [T, 32] at each token's position (MLA and the indexer share them)."""
        cos = self.tensor("cos", (self.T, 32), k.f32)
        sin = self.tensor("sin", (self.T, 32), k.f32)
        self.cos, self.sin = self.p.call(rope_table_rows, self.positions, cos, sin, float(self.cfg.rope_theta),
                                         BT=max(16, min(64, next_pow2(self.T))))

    def weight(self, name: str):
        """The prepared weight `name` (a model name or a derived one) as a static tensor."""
        key = weight_key(name)
        if key not in self._w:
            t = self.weights[key]
            self._w[key] = self.p.weight(key, tuple(t.shape), D.from_torch(t.dtype))
        return self._w[key]

    def state(self, name: str, tensor):
        """A runner-owned tensor the step reads and updates in place (caches, state pools): the
        handle of its newest version."""
        if name not in self._in:
            self._in[name] = self.p.input(name, tuple(tensor.shape), D.from_torch(tensor.dtype))
        return TensorRef(self.p, self.p.latest[name])

    def input(self, name: str, shape, dtype):
        """A further per-step input (chunk maps, replay buffers)."""
        if name not in self._in:
            self._in[name] = self.p.input(name, tuple(shape), dtype)
        return self._in[name]

    def tensor(self, name: str, shape, dtype=None):
        return self.p.tensor(name, tuple(shape), dtype or self.act)

    def reshape(self, x, shape, name: str, into=None):
        """x's elements in another shape (a host copy; see lowering/graph/hostops.py)."""
        out = into if into is not None else self.tensor(name, shape, x.dtype)
        return self.p.host("reshape", [x], [out])

    def linear(self, x, wname: str, name: str, act: str = "none", out_dtype=None):
        """x @ W^T (+ activation) -> [rows, out] in out_dtype (default the activation dtype)."""
        w = self.weight(wname)
        y = self.tensor(name, (x.shape[0], w.shape[0]), out_dtype)
        tiles = linear_tiles(x.shape[0], w.shape[0], x.shape[1], self.gpu)
        split = tiles.pop("SPLIT")
        if split == 1:
            return self.p.call(linear_rows, x, w, y, ACT=act, **tiles)
        # split-K (decode on a GPU): fp32 partials per K chunk, then their sum (+ activation)
        part = self.tensor(name + "_splitk", (split, x.shape[0], w.shape[0]), k.f32)
        part = self.p.call(linear_rows_splitk, x, w, part, **tiles)
        return self.p.call(linear_splitk_reduce, part, y, 1.0, ACT=act, BM=16 if x.shape[0] <= 16 else 64, BN=128)


def linear_tiles(m: int, n: int, kdim: int, gpu: bool = False) -> dict:
    """Tiles for a graph call of linear_rows (no autotuner in a graph program), with SPLIT, the
    number of K chunks (1: one linear_rows call). On a GPU: ops/nn.py gpu_linear_tiles (decode
    streams the weight through >= ~4 programs per SM, split-K where N blocks alone are too
    few; prefill 128 x 128 x 64). Elsewhere (the interpreter pays per program) small M gets
    BM 16 and tiles never exceed the problem much."""
    if gpu:
        return gpu_linear_tiles(m, n, kdim)
    bm = 16 if m <= 16 else 64
    return {"BM": bm, "BN": max(16, min(64, next_pow2(n))), "BK": max(16, min(64, next_pow2(kdim))), "SPLIT": 1}

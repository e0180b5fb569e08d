"""The assembler: the K31 model (docs/model.md) as graph programs of generated ops, one program per
step kind and shape class, behind the Runner protocol of model/step.py.

    runner = ModelRunner(config, weights, "numpy", num_pages=16, num_slots=4)
    logits = runner.forward(Step("prefill", [prompt], [0], [slot], [pages]))     # fp32 [T, vocab]

A step program (model/layers/): embedding -> per layer [AttnRes input -> KDA or DSA sublayer,
AttnRes input -> MoE (ops/moe.add_moe)] -> final AttnRes + norm -> LM head, every stage a
`p.call` of an op-library kernel, compiled with `compile_program(prog, target, passes=...)` (the
target's pipeline: superkernel, streams, memory plan; ascendc adds nz_layout) once per shape
class and cached. Shape classes:
  prefill  one sequence, its chunk padded to a bucket of 16, 32, 64, ... tokens (a step with several
           sequences runs them one by one); pages per sequence rounded up to a power of two
  decode   the batch padded to a bucket 1, 2, 4, 8, ... (padding rows: token 0, cache slot -1 so
           nothing is written, key range empty, the spare state row), pages as above
  verify   the same buckets x (gamma + 1) tokens; KDA/conv states stay untouched until `commit`,
           which runs a small commit program (replay of the accepted prefix)
On CUDA (target triton with a GPU) each decode and verify program is captured as one
torch.cuda.CUDAGraph after a warm-up run and replayed (graph mode): the step's inputs are copied
into static buffers.

State the runner owns: per DSA layer the paged MLA latent cache and the paged indexer cache
(physical slot = page * 64 + pos % 64 from the Step's block tables); per KDA layer the fp32 state
pool [num_slots + 1, HV, K, V] and conv states [num_slots + 1, 3, C] for q, k, v (row num_slots
is the spare row of padding sequences).
"""
from __future__ import annotations

import torch

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.graph import compile_program, program
from k31dsl.lowering.graph.pipeline import graph_pipeline, run_graph_pipeline
from k31dsl.model.config import PAGE, K31Config, pages_for
from k31dsl.model.layers import dsa as dsa_layer
from k31dsl.model.layers import kda as kda_layer
from k31dsl.model.layers.attnres import AttnResStream, block_queries
from k31dsl.model.layers.common import ShapeClass, StepGraph, prefill_bucket, weight_key
from k31dsl.model.layers.kda_cp import add_kda_cp, cp_buffers as kda_cp_buffers
from k31dsl.model.step import Step
from k31dsl.ops.common import next_pow2, resolve_target
from k31dsl.ops.moe import add_moe
from k31dsl.ops.nn import embedding_rows
from k31dsl.model.layers.common import memo

embedding_rows = memo(embedding_rows)

FOLDED = (".attn_res.query", ".attn_res.norm", ".mlp_res.query", ".mlp_res.norm", "final_res.query",
          "final_res.norm", ".A_log", ".dt_bias", ".idx_k_norm_w", ".idx_k_norm_b")


_PASSED: dict = {}        # (flavour, shape class, pass names so far) -> program after those passes
_EXECUTABLES: dict = {}   # (flavour, shape class, pass names, target, device) -> executable


def bucket(n: int) -> int:
    """Decode batch buckets: 1, 2, 4, 8, ..."""
    return next_pow2(max(1, n))


def build_step_program(g: StepGraph):
    """The whole model over the step's tokens into `g.p`; output `logits` fp32 [T, vocab]."""
    cfg, p = g.cfg, g.p
    T = g.T
    if cfg.dsa_layers:
        g.rope_tables()
    e = g.tensor("embedding", (T, cfg.d_model), D.f32)   # fp32: the first AttnRes source
    e = p.call(embedding_rows, g.tokens, g.weight("embed"), e, BM=max(1, min(16, next_pow2(T))),
               BD=max(16, min(256, next_pow2(cfg.d_model))))
    stream = AttnResStream(g, e)
    delta = None
    for l, kind in enumerate(cfg.layer_kinds):
        x = stream.next_input(delta, f"l{l}_attn")
        if kind == "D":
            delta = dsa_layer.add_dsa(g, l, x)
        elif g.shape.kind == "prefill":
            delta = kda_layer.add_kda_prefill(g, l, x)
        elif g.shape.kind == "cp_prefill":
            delta = add_kda_cp(g, l, x)
        else:
            delta = kda_layer.add_kda_decode(g, l, x, verify=g.shape.kind == "verify")
        x = stream.next_input(delta, f"l{l}_mlp")
        m = f"layers.{l}.moe."
        delta = add_moe(p, x, {n: g.weight(m + n) for n in ("router", "gate_up", "down", "shared_gate_up",
                                                             "shared_down")},
                        cfg.n_experts_per_tok, name=f"l{l}_moe", target=g.target)
    x = stream.next_input(delta, "final")
    logits = g.linear(x, "lm_head", "logits", out_dtype=D.f32)
    p.output(logits)
    return p


def build_commit_program(g: StepGraph):
    for l in g.cfg.kda_layers:
        kda_layer.add_commit(g, l)
    g.p.output(*[g.state(f"kda{l}_pool", g.runner_states[f"kda{l}_pool"]) for l in g.cfg.kda_layers])
    return g.p


class ModelRunner:
    """Runner (model/step.py) of the K31 model on generated ops; see the module docstring."""

    def __init__(self, config: K31Config, weights: dict, target: str | None = None, *, num_pages: int,
                 num_slots: int, passes=None, graph_mode: bool | None = None, device=None):
        from k31dsl.model.weights import check_weights
        check_weights(config, weights, origin="ModelRunner")
        self.config, self.target, self.passes = config, resolve_target(target), passes
        if device is None:
            device = "cuda" if self.target == "triton" and torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if not (isinstance(num_pages, int) and num_pages > 0 and isinstance(num_slots, int) and num_slots > 0):
            raise K31Error(f"ModelRunner: num_pages and num_slots must be positive ints, got {num_pages!r}, "
                           f"{num_slots!r}")
        self.num_pages, self.num_slots = num_pages, num_slots
        self.dtype = torch.float32 if config.dtype == "float32" else torch.bfloat16
        self.act = D.from_torch(self.dtype)
        self.weights = self._prepare_weights(weights)
        self.states = {**kda_layer.new_states(config, num_slots, self.device),
                       **dsa_layer.new_caches(config, num_pages, self.device)}
        self.graph_mode = (self.target == "triton" and self.device.type == "cuda") if graph_mode is None \
            else bool(graph_mode)
        # what the step programs depend on besides the shape class: the config, the sizes of the
        # caches and state pools (their shapes are in the program), and the target only where a
        # builder asks it (DSA heads per program on ascendc; the GPU tiles and split forms when
        # the weights are on CUDA, model/layers/common.py StepGraph.gpu)
        self._flavour = (config.digest(), self.dtype, num_pages, num_slots,
                         "ascendc" if self.target == "ascendc" else "gpu" if self.device.type == "cuda" else "any")
        self._graphs: dict = {}         # ShapeClass -> (CUDAGraph, static inputs, logits)
        self._replay: dict = {}         # (n_seqs, n) -> verify buffers
        self._cp: dict = {}             # cp_prefill ShapeClass -> its buffers (model/distributed.py)
        self._const: dict = {}          # (name, shape) -> constant inputs (zeros, chunk maps)
        self._pending: tuple | None = None

    # ------------------------------------------------------------------ weights
    def _prepare_weights(self, weights: dict) -> dict:
        """Program name -> tensor on the device: model weights in config.dtype, and the derived
        fp32 ones (folded AttnRes queries, KDA gate parameters, indexer key norm, Hadamard)."""
        cfg = self.config
        out = {}
        for name, t in weights.items():
            if not any(name.endswith(f) for f in FOLDED):
                out[weight_key(name)] = t.to(device=self.device, dtype=self.dtype).contiguous()
        derived = {**block_queries(cfg, weights), **kda_layer.prepared_weights(cfg, weights),
                   **dsa_layer.prepared_weights(cfg, weights)}
        out.update({n: t.to(device=self.device, dtype=torch.float32).contiguous() for n, t in derived.items()})
        return out

    # ------------------------------------------------------------------ programs
    def _graph(self, shape: ShapeClass) -> StepGraph:
        states = {**self.states, **self._shape_buffers(shape)}
        return StepGraph(self.config, shape, self.weights, states, self.act, self.target)

    def build(self, shape: ShapeClass):
        """The step program of a shape class (before the passes)."""
        g = self._graph(shape)
        return build_commit_program(g) if shape.kind == "commit" else build_step_program(g)

    def executable(self, shape: ShapeClass):
        """The compiled program of a shape class. Programs depend on the config and shape only
        (weights, caches and states are inputs), so compiled programs are shared by every runner
        of this process with the same config, target and passes; and since each graph pass is a
        pure function Program -> Program, the program after each prefix of the pass list is kept
        too (another pass list, or another target with the same passes, starts from there)."""
        key = (self._flavour, shape, tuple(n for n, _ in graph_pipeline(self.target, self.passes)), self.target,
               str(self.device))
        exe = _EXECUTABLES.get(key)
        if exe is None:
            prog = self._after_passes(shape)
            exe = _EXECUTABLES[key] = compile_program(prog, self.target, passes=[])
        return exe

    def _after_passes(self, shape: ShapeClass):
        prefix = (self._flavour, shape)
        prog = _PASSED.get(prefix)
        if prog is None:
            prog = _PASSED[prefix] = self.build(shape)
        for name, fn in graph_pipeline(self.target, self.passes):
            prefix = prefix + (name,)
            if prefix not in _PASSED:
                _PASSED[prefix] = run_graph_pipeline(prog, self.target, passes=[(name, fn)])
            prog = _PASSED[prefix]
        return prog

    def explain(self, kind: str = "decode", n_seqs: int = 1, q_len: int | None = None, max_pages: int = 1) -> str:
        """The step graph of a shape class as text after each pass of the target's pipeline."""
        if kind not in ("prefill", "decode", "verify", "commit"):
            raise K31Error(f"ModelRunner.explain: kind must be prefill, decode, verify or commit, got {kind!r}")
        q_len = q_len or {"prefill": 16, "decode": 1}.get(kind, 2)
        shape = ShapeClass(kind, n_seqs, q_len, max_pages)
        parts = []
        compile_program(self.build(shape), self.target, passes=self.passes,
                        after_pass=lambda name, prog: parts.append(
                            f"# ---- after `{name}` ({self.target})\n{prog}"))
        return "\n".join(parts)

    # ------------------------------------------------------------------ step inputs
    def _const_tensor(self, name: str, shape, dtype, fill=0, unread: bool = False):
        """A constant input; `unread` (a parameter no kernel of the program reads): one element
        broadcast to the shape, so e.g. a [T, L] placeholder costs no memory."""
        key = (name, tuple(shape), dtype)
        if key not in self._const:
            if unread:
                self._const[key] = torch.full((1,) * len(shape), fill, dtype=dtype, device=self.device).expand(shape)
            else:
                self._const[key] = torch.full(tuple(shape), fill, dtype=dtype, device=self.device)
        return self._const[key]

    def _shape_buffers(self, shape: ShapeClass) -> dict:
        """Runner-owned tensors a shape class's program reads besides the caches and states:
        a verify's / commit's replay buffers, a context-parallel step's buffers."""
        if shape.kind in ("verify", "commit"):
            return self._replay_buffers(shape.n_seqs, shape.q_len)
        if shape.kind == "cp_prefill":
            return self.cp_buffers(shape)
        return {}

    def cp_buffers(self, shape: ShapeClass) -> dict:
        """A context-parallel step's own buffers (model/layers/kda_cp.py, dsa.cp_buffers): KDA
        constants and merged states, the staging and gathered DSA caches. Kept per shape class."""
        if shape not in self._cp:
            self._cp[shape] = {**kda_cp_buffers(self.config, shape.ranks, shape.q_len, self.dtype, self.device),
                                 **dsa_layer.cp_buffers(self.config, shape.ranks, shape.q_len, self.device)}
        return self._cp[shape]

    def _replay_buffers(self, n_seqs: int, n: int) -> dict:
        if (n_seqs, n) not in self._replay:
            self._replay[(n_seqs, n)] = kda_layer.replay_buffers(self.config, n_seqs, n, self.dtype, self.device)
        return self._replay[(n_seqs, n)]

    def _shape_of(self, step: Step, seqs: list[int]) -> ShapeClass:
        pages = max(pages_for(step.context_lens[i] + step.query_lens[i]) for i in seqs)
        mp = next_pow2(pages)
        if step.kind == "prefill":
            return ShapeClass("prefill", 1, prefill_bucket(step.query_lens[seqs[0]]), mp)
        return ShapeClass(step.kind, bucket(len(seqs)), step.query_lens[0], mp)

    def _step_inputs(self, step: Step, seqs: list[int], shape: ShapeClass) -> dict:
        """Host-side tensors of one step program: tokens, positions, cache slots, block tables,
        key ranges, state rows (padding sequences: token 0, no cache slot, empty range, spare row)."""
        B, n, mp = shape.n_seqs, shape.q_len, shape.max_pages
        tokens, pos, slot_map, ke, bt, rows = [], [], [], [], [], []
        for j in range(B):
            if j < len(seqs):
                i = seqs[j]
                ctx, table = step.context_lens[i], list(step.block_tables[i])
                m = len(step.tokens[i])          # < n: a prefill padded to its bucket
                if m != n and shape.kind != "prefill":
                    raise K31Error("ModelRunner: sequences of one decode/verify step need the same token count")
                ps = list(range(ctx, ctx + m))
                tokens += step.tokens[i] + [0] * (n - m)
                pos += ps + [0] * (n - m)
                slot_map += [table[q // PAGE] * PAGE + q % PAGE for q in ps] + [-1] * (n - m)
                ke += [q + 1 for q in ps] + [0] * (n - m)
                bt.append((table + [0] * mp)[:mp])
                rows.append(step.state_slots[i])
            else:
                tokens += [0] * n
                pos += [0] * n
                slot_map += [-1] * n
                ke += [0] * n
                bt.append([0] * mp)
                rows.append(self.num_slots)
        i32 = dict(dtype=torch.int32, device=self.device)
        T = B * n
        out = {"tokens": torch.tensor(tokens, **i32), "positions": torch.tensor(pos, **i32),
               "slot_mapping": torch.tensor(slot_map, **i32), "block_table": torch.tensor(bt, **i32),
               "state_slots": torch.tensor(rows, **i32), "ks": torch.zeros(T, **i32), "ke": torch.tensor(ke, **i32)}
        return out

    def _constants(self, shape: ShapeClass) -> dict:
        """Constant inputs (a row index, the replay buffers a decode never reads); inputs named
        `unread_*` (parameters no kernel of the program reads) are fed by `_run` from their shape."""
        return {"row_zero": self._const_tensor("row_zero", (1,), torch.int32),
                "no_replay": self._const_tensor("no_replay", (1, 1, 1, 1), torch.float32)}

    def _prefill_inputs(self, t_real: int, t_pad: int, slot: int) -> dict:
        """The KDA chunk map of a padded prefill (model/layers/kda.py) and the state rows it uses."""
        i32 = dict(dtype=torch.int32, device=self.device)
        info, seq_chunks, cu = kda_layer.prefill_chunk_map(t_real, t_pad)
        return {"kda_chunk_info": torch.tensor(info, **i32), "kda_seq_chunks": torch.tensor(seq_chunks, **i32),
                "kda_cu": torch.tensor(cu, **i32), "prefill_len": torch.tensor([t_real], **i32),
                "h0_rows": torch.tensor([slot, self.num_slots], **i32), "h0_dst": torch.tensor([0, 1], **i32)}

    def _run(self, shape: ShapeClass, step_inputs: dict) -> dict:
        exe = self.executable(shape)
        feed = {}
        extra = {**self.states, **self._constants(shape), **self._shape_buffers(shape)}
        for name, t in exe.p.storages().items():
            if t.kind == "weight" and name in self.weights:
                feed[name] = self.weights[name]
            elif t.kind == "input" and name.startswith("unread_"):     # a parameter no kernel reads
                feed[name] = self._const_tensor(name, t.shape, D.torch_dtype(t.dtype), unread=True)
            elif t.kind == "input":
                feed[name] = step_inputs[name] if name in step_inputs else extra[name]
        if shape.kind in ("decode", "verify"):
            # captured in graph mode, so their intermediates stay at fixed addresses; executables
            # are shared between runners, so one without graph mode must not release them either
            return self._run_captured(shape, exe, feed, step_inputs) if self.graph_mode else exe(feed)
        # never captured: a prefill's arena (tens of GB for long prompts) goes back to the
        # allocator after each step instead of staying with its shape class's executable (a
        # chunked prefill has one class per row width)
        exe.keep_temps(False)
        return exe(feed)

    def _run_captured(self, shape, exe, feed: dict, step_inputs: dict) -> dict:
        """Graph mode: capture the whole decode (or verify) program once per shape class (after a warm-up run
        that compiles every kernel and allocates the executable's buffers), then copy the step's
        inputs into the captured static buffers and replay."""
        hit = self._graphs.get(shape)
        if hit is None:
            static = {n: t.clone() for n, t in step_inputs.items()}
            feed = {**feed, **static}
            # the executable's own launch groups would capture graphs of their own; inside this
            # capture they run as plain launches
            exe._run_group = lambda group, unit, env: [exe.run_op(nid, env) for nid in unit]
            # warm-up (compiles every kernel, allocates the executable's buffers): it runs the
            # step for real, so the KDA/conv states it advances are put back (the cache writes
            # repeat identically in the replay)
            saved = {n: t.clone() for n, t in self.states.items() if n.startswith("kda")}
            exe(feed)
            for n, t in saved.items():
                self.states[n].copy_(t)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = exe(feed)
            self._graphs[shape] = hit = (graph, static, out)
        graph, static, out = hit
        for n, t in step_inputs.items():
            static[n].copy_(t)
        graph.replay()
        return out

    # ------------------------------------------------------------------ Runner protocol
    def reset_slot(self, slot: int) -> None:
        self._check_slots([slot])
        for name, t in self.states.items():
            if name.startswith("kda"):
                t[slot] = 0

    def forward(self, step: Step):
        """Logits fp32 [step.n_tokens, vocab]; see model/step.py."""
        if self._pending is not None:
            raise K31Error("ModelRunner: a verify step is pending; call commit(step, accepted) first")
        self._check_step(step)
        if step.kind == "prefill":
            parts = []
            for i in range(step.n_seqs):
                shape = self._shape_of(step, [i])
                inputs = self._step_inputs(step, [i], shape)
                inputs.update(self._prefill_inputs(step.query_lens[i], shape.q_len, step.state_slots[i]))
                parts.append(self._run(shape, inputs)["logits"][: step.query_lens[i]].clone())
            return torch.cat(parts)
        shape = self._shape_of(step, list(range(step.n_seqs)))
        inputs = self._step_inputs(step, list(range(step.n_seqs)), shape)
        logits = self._run(shape, inputs)["logits"][: step.n_tokens].clone()
        if step.kind == "verify":
            self._pending = (step, shape, inputs)
        return logits

    def commit(self, step: Step, accepted: list[int]) -> None:
        """After a verify: the KDA and conv states of sequence i become those after its first
        accepted[i] tokens (replay of the verify's (k, u, g) and pre-conv inputs)."""
        if self._pending is None or self._pending[0].state_slots != step.state_slots:
            raise K31Error("ModelRunner.commit: no pending verify step for these state slots")
        n = step.query_lens[0]
        if len(accepted) != step.n_seqs or any(not 1 <= a <= n for a in accepted):
            raise K31Error(f"ModelRunner.commit: accepted must give 1..{n} per sequence, got {accepted}")
        _, vshape, inputs = self._pending
        shape = ShapeClass("commit", vshape.n_seqs, vshape.q_len, 1)
        acc = list(accepted) + [0] * (vshape.n_seqs - step.n_seqs)      # padding rows keep their state
        feed = {"state_slots": inputs["state_slots"], "checkpoint_rows": inputs["state_slots"],
                "accepted": torch.tensor(acc, dtype=torch.int32, device=self.device)}
        self._run_commit(shape, feed)
        self._pending = None

    def _run_commit(self, shape, feed):
        exe = self.executable(shape)
        extra = {**self.states, **self._shape_buffers(shape)}
        args = {}
        for name, t in exe.p.storages().items():
            if t.kind == "input":
                args[name] = feed[name] if name in feed else extra[name] if name in extra else \
                    self._step_dummy(name, t)
            elif t.kind == "weight":
                args[name] = self.weights[name]
        exe(args)

    def _step_dummy(self, name, t):
        """Step inputs a commit program declares but no commit kernel reads (tokens, ranges)."""
        return self._const_tensor("commit_" + name, t.shape, D.torch_dtype(t.dtype))

    def save_states(self, slots: list[int]):
        self._check_slots(slots)
        idx = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        return {"slots": list(slots),
                "states": {n: t[idx].clone() for n, t in self.states.items() if n.startswith("kda")}}

    def load_states(self, slots: list[int], saved) -> None:
        if list(slots) != saved["slots"]:
            raise K31Error(f"ModelRunner.load_states: states were saved for slots {saved['slots']}, not {list(slots)}")
        idx = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        for n, t in saved["states"].items():
            self.states[n][idx] = t

    # ------------------------------------------------------------------ checks
    def _check_slots(self, slots) -> None:
        bad = [s for s in slots if not (isinstance(s, int) and 0 <= s < self.num_slots)]
        if bad:
            raise K31Error(f"ModelRunner: state slot(s) {bad} out of range [0, {self.num_slots})")

    def _check_step(self, step: Step) -> None:
        if not isinstance(step, Step):
            raise K31Error(f"ModelRunner.forward: expected a Step, got {type(step).__name__}")
        self._check_slots(step.state_slots)
        V = self.config.vocab_size
        for seq in step.tokens:
            if any(not 0 <= t < V for t in seq):
                raise K31Error(f"ModelRunner: token ids must be in [0, {V})")
        for table in step.block_tables:
            if any(not 0 <= pg < self.num_pages for pg in table):
                raise K31Error(f"ModelRunner: block table page out of range [0, {self.num_pages})")


# ---------------------------------------------------------------- `k31dsl explain model/assembler.py`

def _tiny_step(kind: str, q_len: int):
    from k31dsl.model.config import TINY
    from k31dsl.model.weights import init_weights
    runner = ModelRunner(TINY, init_weights(TINY, 0), "numpy", num_pages=1, num_slots=1)
    return runner.build(ShapeClass(kind, 1, q_len, 1))


@program
def tiny_decode_step():
    """The tiny preset's decode step, batch 1 (`k31dsl explain model/assembler.py::tiny_decode_step`)."""
    return _tiny_step("decode", 1)


@program
def tiny_prefill_step():
    """The tiny preset's prefill step, one chunk of 16 tokens."""
    return _tiny_step("prefill", 16)

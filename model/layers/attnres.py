"""Block Attention Residuals in a step graph, two-phase form (docs/model.md, K3 convention).

Per AttnRes block b the committed sources are b + 1 rows [T, D] fp32 (the embedding, then each
finished block's sum). At the block's start the cached prepare (ops/attnres_cached.py) scores the
newest source against every pseudo-query from this block's on into the step's logit cache
[blocks, Q, T] (`attnres_block_logits`, or `attnres_block_logits_rows` for decode-sized steps),
then ONE `attnres_prepare_cached_rows` call sums the sources for the block's S queries — both
sublayers of each of its layers, and the final aggregation after the last block — with their
logits from the cache, reading the sources once: O [S, T, D], M, L [S, T]. Each sublayer then
runs `attnres_slot_update_rows` (below: ops/attnres.py's merge_partial, but indexing O/M/L at
slot s and the query table at the slot's row, because the graph IR has no views to hand it O[s])
followed by ops/attnres.py's `rmsnorm_row` with the sublayer's norm; the superkernel pass fuses
the two into one kernel (the row h stays in registers). The block's first sublayer has no partial
sum yet: its h is O[s] / L[s] (softmax over the committed blocks alone, i.e. the full attnres),
and it zeroes the partial.
The sources live in one buffer [blocks, T, D] of the step: `attnres_put_embedding` writes the
embedding into row 0 and, at each block boundary, `attnres_put_source` the finished block
(partial + last output) into row b; the prepare kernels read rows 0 .. b only.
Key-norm gains are folded into the queries at load time (`block_queries`: one [Q, D] table of
every pseudo-query in order; block b's are rows first_b .. first_b + S_b - 1).
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.ops.attnres import ROW_CONFIGS, merge_partial, rmsnorm_row, row_block, row_warps
from k31dsl.ops import attnres_cached
from k31dsl.ops.attnres_cached import attnres_prepare_cached_rows, cached_constexprs, form_constexprs, logit_form
from k31dsl.ops.common import FLOAT_INPUTS
from k31dsl.model.layers.common import memo


@k.kernel(configs=ROW_CONFIGS)
def attnres_slot_update_rows(partial: k.Tensor[k.f32, "T", "D"], delta: k.Tensor["DT", "T", "D"],
                             q: k.Tensor[k.f32, "Q", "D"], o: k.Tensor[k.f32, "S", "T", "D"],
                             m: k.Tensor[k.f32, "S", "T"], l: k.Tensor[k.f32, "S", "T"],
                             h: k.Tensor["HT", "T", "D"], eps: k.f32, s: k.i32, qs: k.i32,
                             DT: k.constexpr[FLOAT_INPUTS] = k.f32, HT: k.constexpr[FLOAT_INPUTS] = k.f32,
                             FIRST: k.constexpr = False, BD: k.constexpr = 128, WARPS: k.constexpr = 4):
    # FIRST: the block's first sublayer (no partial yet): h = O[s] / L[s], partial = 0.
    # Else partial += delta, the partial's logit (query row qs of the table) merged into slot s's
    # statistics (online softmax).
    for t in k.grid(partial.shape[0]):
        num = o[s, t, k.span(0, BD, other=0.0)]
        m_old = m[s, t]
        l_old = l[s, t]
        if FIRST:
            partial[t, k.span(0, BD)] = k.zeros((BD,), k.f32)
            h[t, k.span(0, BD)] = (num / l_old).to(HT)
        else:
            p = partial[t, k.span(0, BD, other=0.0)] + delta[t, k.span(0, BD, other=0.0)].to(k.f32)
            partial[t, k.span(0, BD)] = p
            hv = merge_partial(p, q[qs, k.span(0, BD, other=0.0)], num, m_old, l_old,
                               partial.shape[1].to(k.f32), eps)
            h[t, k.span(0, BD)] = hv.to(HT)


@k.kernel
def attnres_put_source(src: k.Tensor[k.f32, "N", "T", "D"], x: k.Tensor["XT", "T", "D"],
                       delta: k.Tensor["DT", "T", "D"], i: k.i32, XT: k.constexpr[FLOAT_INPUTS] = k.f32,
                       DT: k.constexpr[FLOAT_INPUTS] = k.f32, BD: k.constexpr = 128):
    # src[i] = x + delta: a finished block committed in place into the step's source buffer, whose
    # earlier rows stay as they are (one row per block instead of a copy of all of them).
    for t in k.grid(x.shape[0]):
        src[i, t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)].to(k.f32) + \
            delta[t, k.span(0, BD, other=0.0)].to(k.f32)


@k.kernel
def attnres_put_embedding(src: k.Tensor[k.f32, "N", "T", "D"], x: k.Tensor[k.f32, "T", "D"],
                          BD: k.constexpr = 128):
    # src[0] = x: the embedding, the first source
    for t in k.grid(x.shape[0]):
        src[0, t, k.span(0, BD)] = x[t, k.span(0, BD, other=0.0)]


(attnres_slot_update_rows, attnres_put_source, attnres_put_embedding, attnres_prepare_cached_rows,
 rmsnorm_row) = memo(attnres_slot_update_rows, attnres_put_source, attnres_put_embedding, attnres_prepare_cached_rows,
                     rmsnorm_row)
LOGIT_KERNELS = dict(zip(attnres_cached.LOGIT_KERNELS, memo(*attnres_cached.LOGIT_KERNELS.values())))


def sublayer_plan(config) -> list[list[tuple[str, str | None]]]:
    """Per AttnRes block, its pseudo-queries in order: (weight prefix, norm weight), e.g.
    ('layers.0.attn_res', 'layers.0.attn_norm'); the last block ends with ('final_res', 'final_norm')."""
    blocks = []
    for l in range(config.n_layers):
        if l % config.attnres_block == 0:
            blocks.append([])
        blocks[-1] += [(f"layers.{l}.attn_res", f"layers.{l}.attn_norm"), (f"layers.{l}.mlp_res", f"layers.{l}.mlp_norm")]
    blocks[-1].append(("final_res", "final_norm"))
    return blocks


def block_queries(config, weights: dict) -> dict:
    """The derived weight `attnres_queries` fp32 [Q, D]: every pseudo-query in sublayer_plan's
    order, each = query * norm (the key RMSNorm's gain folded in)."""
    import torch
    subs = [pre for block in sublayer_plan(config) for pre, _ in block]
    return {"attnres_queries": torch.stack([weights[f"{pre}.query"].float() * weights[f"{pre}.norm"].float()
                                            for pre in subs]).contiguous()}


class AttnResStream:
    """Walks a step graph through the model's sublayers: `next_input(delta)` takes the previous
    sublayer's output (None before the first) and returns the normalised input of the next one."""

    def __init__(self, g, embedding):
        self.g, self.cfg = g, g.cfg
        self.plan = sublayer_plan(self.cfg)
        self.block, self.slot = -1, 0
        T, D = embedding.shape
        self.embedding = embedding
        self.bd = row_block(D)
        # sources: the embedding, then each finished block, written row by row (block b reads 0..b)
        self.src = g.tensor("attnres_sources", (len(self.plan), T, D), k.f32)
        self.src = g.p.call(attnres_put_embedding, self.src, embedding, BD=self.bd)
        self.partial = None
        self.queries = g.weight("attnres_queries")
        self.firsts = [0]                               # block b's first row in the query table
        for block in self.plan:
            self.firsts.append(self.firsts[-1] + len(block))
        self.logits = g.tensor("attnres_logits", (len(self.plan), self.firsts[-1], T), k.f32)

    def _start_block(self, delta):
        g, p, b = self.g, self.g.p, self.block + 1
        T, D = self.src.shape[1], self.src.shape[2]
        if delta is not None:              # the finished block (partial + its last output) is committed
            self.src = p.call(attnres_put_source, self.src, self.partial, delta, b, BD=self.bd)
        first, S, n = self.firsts[b], len(self.plan[b]), b + 1
        self.O = g.tensor(f"b{b}_attnres_O", (S, T, D), k.f32)
        self.M = g.tensor(f"b{b}_attnres_M", (S, T), k.f32)
        self.L = g.tensor(f"b{b}_attnres_L", (S, T), k.f32)
        form = logit_form(T)                # decode: one program per row and 16 queries; prefill: the GEMM
        self.logits = p.call(LOGIT_KERNELS[form], self.src, self.queries, self.logits, self.cfg.attnres_eps, first,
                             n, **form_constexprs(form, self.firsts[-1] - first, D))
        self.O, self.M, self.L = p.call(attnres_prepare_cached_rows, self.src, self.logits, self.O, self.M, self.L,
                                        first, n, **cached_constexprs(n, S))
        self.partial = g.tensor(f"b{b}_partial", (T, D), k.f32)
        self.block, self.slot = b, 0

    def next_input(self, delta, name: str):
        """The next sublayer's input rmsnorm(attnres(...)) [T, D] in the activation dtype."""
        g, p = self.g, self.g.p
        if self.block < 0 or self.slot == len(self.plan[self.block]):
            self._start_block(delta)
            first = True
        else:
            first = False
        s = self.slot
        _, norm = self.plan[self.block][s]
        T, D = self.partial.shape
        h = g.tensor(f"{name}_h", (T, D), k.f32)
        y = g.tensor(f"{name}_x", (T, D))
        # FIRST loads no delta, but every parameter is bound: the embedding is a written [T, D] tensor
        d = self.embedding if first else delta
        self.partial, h = p.call(attnres_slot_update_rows, self.partial, d, self.queries, self.O, self.M, self.L, h,
                                 self.cfg.attnres_eps, s, self.firsts[self.block] + s, FIRST=first, BD=self.bd,
                                 WARPS=row_warps(self.bd))
        y = p.call(rmsnorm_row, h, g.weight(norm), y, self.cfg.rms_eps, BD=self.bd, WARPS=row_warps(self.bd))
        self.slot += 1
        return y


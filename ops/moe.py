"""The MoE FFN of docs/model.md as generated ops: softmax router with top-k renormalised routing,
SwiGLU experts through grouped GEMMs over expert-sorted rows, and one shared expert.

Static shapes throughout (a graph program has fixed tensor sizes; on a GPU the decode step is
captured as a CUDA graph, so no host sync and no data-dependent sizes). For M tokens, E experts,
top-k routing and BM rows per GEMM block:

  moe_router        x, router -> ids [M, k] i32, wgt [M, k] f32: logits (fp32 MMA), softmax,
                    top-k (ties: lower expert), renormalised; per chunk of CH tokens also the
                    pairs per expert (chunk_cnt [G, EP]) for the sort — one kernel.
  moe_align         a counting sort of the M*k (token, slot) pairs by expert into a padded row
                    list of R = NB * BM rows, NB = cdiv(M*k, BM) + E - 1 (each expert's rows
                    padded to a multiple of BM; sum_e cdiv(c_e, BM) <= NB): row -> token (-1 on
                    padding rows), block -> expert (-1 past the last used block) and (token,
                    slot) -> row. Within an expert, pairs keep their (token, slot) order. G
                    programs, one per chunk: its prefix from the whole count table (one [G, EP]
                    tile), its pairs' rows, a share of the padding rows and blocks.
  moe_gate_up       grouped GEMM 1: each BM-row block (one expert) gathers its token rows of x,
                    times G_e and U_e, SwiGLU epilogue -> act [R, F]; unused blocks run no K loop.
  moe_down          grouped GEMM 2: act @ down[e]^T -> y [R, D].
  moe_shared_gate_up  the shared expert's SwiGLU up-projection, dense tiles -> act_s [M, Fs].
  moe_combine       out = act_s @ shared_down^T + sum_j wgt[t, j] * y[row(t, j)]: the shared
                    expert's down-projection with the routed rows gathered in its epilogue (no
                    scatter, no atomics).

Public API: `moe(x, router, gate_up, down, shared_gate_up, shared_down, top_k, target=)`, the
graph builder `add_moe(p, x, weights, top_k, out=, name=, target=)` that appends the same calls
(same tiles: `MoEPlan`) to a Program, and `moe_program()` (one MoE as a Program, for explain).
"""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, next_pow2, require_tensor, resolve_target
from k31dsl.ops.registry import CaseResult, OpSpec, register

# The GEMM grids put the N tiles first (program_id(0), launched fastest): the programs in flight
# share a few row blocks (the gathered x rows, 512 KB per 128-row block at D = 2048, read from L2
# by every N tile) and the weights of one or two experts (8 MB gate_up), all within the H200's
# 50 MB L2; row blocks first would keep ~130 blocks of x in flight and re-read x per N tile.
# Tile configs. BM (rows per block) is fixed by the call (align and the grouped GEMMs must agree),
# so configs choose BN / BK / warps / stages only. WARPS tags each config so that a graph-program
# call (which passes constexprs, not launch options) finds its launch options in the list.
# H200 (bf16, D = 2048, F = 1024): prefill blocks of BM = 128 rows want wide N tiles and 8 warps
# (two fp32 accumulators in gate_up); decode (BM = 16) streams weights, so narrow N tiles spread
# one expert over more SMs. On sm_90 (BM 128) none of these spills (BN 128 / BK 32 / 4 warps did).
GATE_UP_CONFIGS = [{"BN": 64, "BK": 64, "WARPS": 4, "num_warps": 4, "num_stages": 3},
                   {"BN": 128, "BK": 64, "WARPS": 8, "num_warps": 8, "num_stages": 3},
                   {"BN": 32, "BK": 128, "WARPS": 4, "num_warps": 4, "num_stages": 4},
                   {"BN": 64, "BK": 128, "WARPS": 4, "num_warps": 4, "num_stages": 3},
                   {"BN": 64, "BK": 64, "WARPS": 8, "num_warps": 8, "num_stages": 4}]
DOWN_CONFIGS = [{"BN": 64, "BK": 64, "WARPS": 4, "num_warps": 4, "num_stages": 3},
                {"BN": 128, "BK": 64, "WARPS": 8, "num_warps": 8, "num_stages": 3},
                {"BN": 256, "BK": 64, "WARPS": 8, "num_warps": 8, "num_stages": 3},
                {"BN": 32, "BK": 128, "WARPS": 4, "num_warps": 4, "num_stages": 4},
                {"BN": 64, "BK": 128, "WARPS": 4, "num_warps": 4, "num_stages": 3}]
ROUTER_CONFIGS = [{"BK": 64, "WARPS": 4, "num_warps": 4}, {"BK": 128, "WARPS": 4, "num_warps": 4},
                  {"BK": 64, "WARPS": 8, "num_warps": 8}]      # 256-token chunks: [256, BK] x tiles

# The configs by regime where nothing autotunes: graph programs, the interpreter, numpy, ascendc.
PREFILL_TILES = {"gate_up": GATE_UP_CONFIGS[1], "down": DOWN_CONFIGS[1], "router": ROUTER_CONFIGS[0]}
DECODE_TILES = {"gate_up": GATE_UP_CONFIGS[2], "down": DOWN_CONFIGS[3], "router": ROUTER_CONFIGS[1]}


# ---------------------------------------------------------------- kernels

@k.kernel(configs=ROUTER_CONFIGS)
def moe_router(x: k.Tensor["XT", "M", "D"], router: k.Tensor["XT", "E", "D"], ids: k.Tensor[k.i32, "M", "K"],
               wgt: k.Tensor[k.f32, "M", "K"], chunk_cnt: k.Tensor[k.i32, "G", "EP"],
               XT: k.constexpr[FLOAT_INPUTS] = k.bf16, EP: k.constexpr = 16, KP: k.constexpr = 2,
               CH: k.constexpr = 16, BK: k.constexpr = 64, WARPS: k.constexpr = 4):
    # Program c routes the CH tokens of chunk c: fp32 logits [CH, EP] (experts past E masked to
    # -inf), top-k on the logits (softmax is monotonic), the renormalised weights
    # p_j / sum_sel p = exp(l_j - m) / sum_sel exp(l - m) (the full softmax denominator cancels),
    # and the chunk's pairs per expert for the counting sort (programs past M store zeros).
    for c in k.grid(chunk_cnt.shape[0]):
        acc = k.zeros((CH, EP), k.f32)
        for j in range(k.cdiv(x.shape[1], BK)):
            xt = x[k.span(c * CH, CH), k.span(j * BK, BK, other=0.0)]
            wt = router[k.span(0, EP), k.span(j * BK, BK, other=0.0)]
            acc += k.dot(xt, wt.T)
        lane = k.arange(0, EP)[None, :]
        slot = k.arange(0, KP)[None, :]
        # k rounds of argmax on integer keys ordered like the f32 logits (exact; integer
        # reductions are native everywhere); ties go to the lower expert
        bits = k.where(lane < router.shape[0], acc, float("-inf")).bitcast(k.i32)
        key = k.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        top = k.full((CH, KP), -2147483648, k.i32)
        pos = k.zeros((CH, KP), k.i32)
        for j in range(KP):
            v = k.max(key, axis=1)[:, None]
            p = k.min(k.where(key == v, lane, EP), axis=1)[:, None]
            top = k.where(slot == j, v, top)
            pos = k.where(slot == j, p, pos)
            key = k.where(lane == p, -2147483648, key)
        vals = k.where(top < 0, top ^ 0x7FFFFFFF, top).bitcast(k.f32)
        first = k.sum(k.where(slot == 0, vals, 0.0), axis=1)[:, None]        # the largest
        e = k.where(slot < ids.shape[1], k.exp(vals - first), 0.0)
        ids[k.span(c * CH, CH), k.span(0, KP)] = pos
        wgt[k.span(c * CH, CH), k.span(0, KP)] = e / k.sum(e, axis=1)[:, None]
        real = ((c * CH + k.arange(0, CH))[:, None] < x.shape[0]) & (slot < ids.shape[1])
        flat = k.reshape(k.where(real, pos, -1), (CH * KP,))
        chunk_cnt[c, k.span(0, EP)] = k.sum((flat[:, None] == k.arange(0, EP)[None, :]).to(k.i32), axis=0)


@k.func
def chunk_experts(ids, c, lane_e, CH, KP):
    """One-hot [CH * KP, EP] of the (token, slot) pairs of token chunk c, in (token, slot) order;
    slots past top_k and tokens past M are all-zero rows."""
    e = k.reshape(ids[k.span(c * CH, CH), k.span(0, KP, other=-1)], (CH * KP,))
    return (e[:, None] == lane_e[None, :]).to(k.i32)


ALIGN_CONFIGS = [{"WARPS": 4, "num_warps": 4}, {"WARPS": 8, "num_warps": 8}]   # 8 for 256-token chunks


@k.kernel(configs=ALIGN_CONFIGS)
def moe_align(ids: k.Tensor[k.i32, "M", "K"], chunk_cnt: k.Tensor[k.i32, "G", "EP"], pair_row: k.Tensor[k.i32, "M", "K"],
              row_tok: k.Tensor[k.i32, "R"], blk_exp: k.Tensor[k.i32, "NB"], n_exp: k.i32, EP: k.constexpr = 16,
              KP: k.constexpr = 2, BM: k.constexpr = 16, CH: k.constexpr = 16, GP: k.constexpr = 1,
              CR: k.constexpr = 32, WARPS: k.constexpr = 4):
    # Program c: every segment start and its chunk's prefix from the [G, EP] counts (one tile),
    # then the rows of its chunk's pairs, the padding rows [c*CR, c*CR + CR) and the blocks
    # [c*CR/BM, ...). Real rows (scattered) and padding rows (-1) are disjoint: no ordering needed.
    for c in k.grid(chunk_cnt.shape[0]):
        lane_e = k.arange(0, EP)
        counts = chunk_cnt[k.span(0, GP, other=0), k.span(0, EP)]               # [GP, EP]
        cnt = k.sum(counts, axis=0)
        padded = (cnt + (BM - 1)) // BM * BM
        end = k.cumsum(padded, axis=0)
        start = end - padded
        before = k.cumsum(counts, axis=0) - counts                               # earlier chunks
        mine = k.sum(k.where(k.arange(0, GP)[:, None] == c, before, 0), axis=0)
        oh = chunk_experts(ids, c, lane_e, CH, KP)
        rank = k.cumsum(oh, axis=0) - oh + (start + mine)[None, :]           # the row if expert e
        valid = k.sum(oh, axis=1) > 0
        row = k.where(valid, k.sum(oh * rank, axis=1), -1)
        pair_row[k.span(c * CH, CH), k.span(0, KP)] = k.reshape(row, (CH, KP))
        k.store(row_tok, (row,), c * CH + k.arange(0, CH * KP) // KP, mask=valid)
        # rows that hold no pair (each segment's tail, everything past the last segment): -1
        r = c * CR + k.arange(0, CR)
        real = (r[:, None] >= start[None, :]) & (r[:, None] < (start + cnt)[None, :])
        k.store(row_tok, (r,), k.full((CR,), -1, k.i32), mask=k.sum(real.to(k.i32), axis=1) == 0)
        # block b belongs to the expert whose segment holds row b * BM: count the segments ending
        # at or before it (empty ones included); past the last segment that count reaches EP
        first = (c * (CR // BM) + k.arange(0, CR // BM)) * BM
        ex = k.sum((end[None, :] <= first[:, None]).to(k.i32), axis=1)
        blk_exp[k.span(c * (CR // BM), CR // BM)] = k.where(ex < n_exp, ex, -1)


@k.kernel(configs=GATE_UP_CONFIGS)
def moe_gate_up(x: k.Tensor["XT", "M", "D"], row_tok: k.Tensor[k.i32, "R"], blk_exp: k.Tensor[k.i32, "NB"],
                gate_up: k.Tensor["XT", "E", "F2", "D"], act: k.Tensor["XT", "R", "F"],
                XT: k.constexpr[FLOAT_INPUTS] = k.bf16, BM: k.constexpr = 16, BN: k.constexpr = 64,
                BK: k.constexpr = 64, WARPS: k.constexpr = 4):
    # Block b (BM rows of one expert) x columns [n0, n0 + BN) of G_e and of U_e (rows F + n0 ...).
    # Gate columns past F read U rows, but those act columns are past F and never stored.
    for pn, b in k.grid(k.cdiv(act.shape[1], BN), blk_exp.shape[0]):
        e = blk_exp[b]
        tok = row_tok[k.span(b * BM, BM)]
        f = act.shape[1]
        n0 = pn * BN
        ag = k.zeros((BM, BN), k.f32)
        au = k.zeros((BM, BN), k.f32)
        for j in range(k.where(e >= 0, k.cdiv(x.shape[1], BK), 0)):
            xt = x[tok, k.span(j * BK, BK, other=0.0)]
            wg = gate_up[e, k.span(n0, BN), k.span(j * BK, BK, other=0.0)]
            wu = gate_up[e, k.span(f + n0, BN), k.span(j * BK, BK, other=0.0)]
            ag += k.dot(xt, wg.T)
            au += k.dot(xt, wu.T)
        # padding rows (and unused blocks) read x as 0, so they store silu(0) * 0 = 0
        act[k.span(b * BM, BM), k.span(n0, BN)] = (ag * k.sigmoid(ag) * au).to(XT)


@k.kernel(configs=DOWN_CONFIGS)
def moe_down(act: k.Tensor["XT", "R", "F"], blk_exp: k.Tensor[k.i32, "NB"], down: k.Tensor["XT", "E", "D", "F"],
             y: k.Tensor["XT", "R", "D"], XT: k.constexpr[FLOAT_INPUTS] = k.bf16, BM: k.constexpr = 16,
             BN: k.constexpr = 64, BK: k.constexpr = 64, WARPS: k.constexpr = 4):
    # y rows of block b = act rows @ down[e]^T (0 on padding rows; nobody gathers them).
    for pn, b in k.grid(k.cdiv(y.shape[1], BN), blk_exp.shape[0]):
        e = blk_exp[b]
        n0 = pn * BN
        acc = k.zeros((BM, BN), k.f32)
        for j in range(k.where(e >= 0, k.cdiv(act.shape[1], BK), 0)):
            at = act[k.span(b * BM, BM), k.span(j * BK, BK, other=0.0)]
            wd = down[e, k.span(n0, BN), k.span(j * BK, BK, other=0.0)]
            acc += k.dot(at, wd.T)
        y[k.span(b * BM, BM), k.span(n0, BN)] = acc.to(XT)


@k.kernel(configs=GATE_UP_CONFIGS)
def moe_shared_gate_up(x: k.Tensor["XT", "M", "D"], gate_up: k.Tensor["XT", "F2", "D"], act: k.Tensor["XT", "M", "F"],
                       XT: k.constexpr[FLOAT_INPUTS] = k.bf16, BM: k.constexpr = 16, BN: k.constexpr = 64,
                       BK: k.constexpr = 64, WARPS: k.constexpr = 4):
    # The shared expert's silu(x G^T) * (x U^T) over dense row tiles.
    for pn, pm in k.grid(k.cdiv(act.shape[1], BN), k.cdiv(x.shape[0], BM)):
        f = act.shape[1]
        n0 = pn * BN
        ag = k.zeros((BM, BN), k.f32)
        au = k.zeros((BM, BN), k.f32)
        for j in range(k.cdiv(x.shape[1], BK)):
            xt = x[k.span(pm * BM, BM), k.span(j * BK, BK, other=0.0)]
            wg = gate_up[k.span(n0, BN), k.span(j * BK, BK, other=0.0)]
            wu = gate_up[k.span(f + n0, BN), k.span(j * BK, BK, other=0.0)]
            ag += k.dot(xt, wg.T)
            au += k.dot(xt, wu.T)
        act[k.span(pm * BM, BM), k.span(n0, BN)] = (ag * k.sigmoid(ag) * au).to(XT)


@k.kernel(configs=DOWN_CONFIGS)
def moe_combine(act: k.Tensor["XT", "M", "F"], shared_down: k.Tensor["XT", "D", "F"], y: k.Tensor["XT", "R", "D"],
                pair_row: k.Tensor[k.i32, "M", "K"], wgt: k.Tensor[k.f32, "M", "K"], out: k.Tensor["XT", "M", "D"],
                XT: k.constexpr[FLOAT_INPUTS] = k.bf16, BM: k.constexpr = 16, BN: k.constexpr = 64, BK: k.constexpr = 64, WARPS: k.constexpr = 4):
    # out = shared expert (act @ shared_down^T) + the routed expert rows, weighted, gathered.
    for pn, pm in k.grid(k.cdiv(out.shape[1], BN), k.cdiv(act.shape[0], BM)):
        n0 = pn * BN
        acc = k.zeros((BM, BN), k.f32)
        for j in range(k.cdiv(act.shape[1], BK)):
            at = act[k.span(pm * BM, BM), k.span(j * BK, BK, other=0.0)]
            wd = shared_down[k.span(n0, BN), k.span(j * BK, BK, other=0.0)]
            acc += k.dot(at, wd.T)
        for s in range(pair_row.shape[1]):
            r = pair_row[k.span(pm * BM, BM, other=-1), s]            # -1 past M: gathers 0
            ws = wgt[k.span(pm * BM, BM, other=0.0), s]
            acc += ws[:, None] * y[r, k.span(n0, BN, other=0.0)].to(k.f32)
        out[k.span(pm * BM, BM), k.span(n0, BN)] = acc.to(XT)


# ---------------------------------------------------------------- sizes shared by moe and add_moe

class MoEPlan:
    """Every static size and tile of one MoE call: M tokens, D model dim, E experts of F, the
    shared expert of Fs, top-k. Pure shape arithmetic (no tensors), the same for the direct
    function and the graph builder."""

    def __init__(self, m: int, d: int, e: int, f: int, fs: int, top_k: int, tiles: dict | None = None,
                 target: str | None = None):
        self.m, self.d, self.e, self.f, self.fs, self.top_k = m, d, e, f, fs, top_k
        self.pairs = m * top_k
        per_expert = self.pairs / e
        # rows per grouped-GEMM block: small blocks when experts see few rows (decode), else
        # large ones (prefill); padding costs at most E * (BM - 1) rows
        self.bm = 16 if per_expert <= 24 else 64 if per_expert <= 256 else 128
        small_chip = target == "ascendc"           # 192 KB of UB per vector core: 64-row tiles at most
        if small_chip:
            self.bm = min(self.bm, 64)
        self.nb = -(-self.pairs // self.bm) + e - 1
        self.rows = self.nb * self.bm
        self.dense_bm = min(64 if small_chip else 128, max(16, next_pow2(m)))   # shared expert / combine rows
        # router and counting sort: G programs, each CH tokens (CH * top_k pairs) and CR padded
        # rows; CH keeps G <= ~128 at prefill (the count table is one [G, EP] tile; ascendc: 512
        # with 64-token router tiles) and is small enough at decode that several chunks run
        self.ch = min(64 if small_chip else 256, max(16, next_pow2(-(-m // 8))))
        self.cr = max(self.bm, next_pow2(self.ch * top_k))
        self.g = max(-(-m // self.ch), -(-self.rows // self.cr))
        self.gp = next_pow2(self.g)
        self.ep = max(16, next_pow2(e))
        self.kp = max(1, next_pow2(top_k))
        base = DECODE_TILES if self.bm == 16 or small_chip else PREFILL_TILES
        self.tiles = {**base, **(tiles or {})}

    def router_cx(self) -> dict:
        """The router's constexprs other than its dtype (tile config included)."""
        return {"EP": self.ep, "KP": self.kp, "CH": self.ch, **self.tile("router")}

    def align_cx(self) -> dict:
        # 256-token chunks: [512, EP] one-hot tiles and their cumsum need 8 warps' registers
        return {"EP": self.ep, "KP": self.kp, "BM": self.bm, "CH": self.ch, "GP": self.gp, "CR": self.cr,
                "WARPS": 8 if self.ch >= 128 else 4}

    def tile(self, which: str) -> dict:
        """The constexprs of one kernel's tile config (BN/BK/WARPS, launch options dropped)."""
        return {n: v for n, v in self.tiles[which].items() if n not in ("num_warps", "num_stages")}


def _check(x, router, gate_up, down, shared_gate_up, shared_down, top_k, target) -> MoEPlan:
    op = "moe"
    require_tensor(op, "x", x)
    if x.dim() != 2:
        raise K31Error(f"{op}: `x` must be [M, D] (tokens, model dim), got shape {list(x.shape)}",
                       hint="flatten leading dims first: x.reshape(-1, x.shape[-1])")
    m, d = x.shape
    for name, t in (("router", router), ("gate_up", gate_up), ("down", down),
                    ("shared_gate_up", shared_gate_up), ("shared_down", shared_down)):
        require_tensor(op, name, t)
        if t.dtype != x.dtype:
            raise K31Error(f"{op}: `{name}` has dtype {t.dtype}, but x is {x.dtype}; the MoE runs in one dtype",
                           hint=f"convert it: {name}.to({x.dtype})")
    if router.dim() != 2 or router.shape[1] != d:
        raise K31Error(f"{op}: `router` must be [E, {d}] (experts, model dim), got {list(router.shape)}")
    e = router.shape[0]
    if gate_up.dim() != 3 or gate_up.shape[0] != e or gate_up.shape[2] != d or gate_up.shape[1] % 2:
        raise K31Error(f"{op}: `gate_up` must be [{e}, 2F, {d}] ([G_e; U_e] per expert), got {list(gate_up.shape)}")
    f = gate_up.shape[1] // 2
    if tuple(down.shape) != (e, d, f):
        raise K31Error(f"{op}: `down` must be [{e}, {d}, {f}] (experts, model dim, F), got {list(down.shape)}")
    if shared_gate_up.dim() != 2 or shared_gate_up.shape[1] != d or shared_gate_up.shape[0] % 2:
        raise K31Error(f"{op}: `shared_gate_up` must be [2Fs, {d}], got {list(shared_gate_up.shape)}")
    fs = shared_gate_up.shape[0] // 2
    if tuple(shared_down.shape) != (d, fs):
        raise K31Error(f"{op}: `shared_down` must be [{d}, {fs}], got {list(shared_down.shape)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise K31Error(f"{op}: top_k must be an int in [1, {e}] (the number of experts), got {top_k!r}")
    if min(d, f, fs) < 1:
        raise K31Error(f"{op}: empty model dim or expert width (D={d}, F={f}, Fs={fs})")
    return MoEPlan(m, d, e, f, fs, top_k, target=target)


def _contig(t):
    return t if t.is_contiguous() else t.contiguous()


# ---------------------------------------------------------------- public function

def moe(x, router, gate_up, down, shared_gate_up, shared_down, top_k: int, *, target: str | None = None):
    """The MoE FFN of docs/model.md: out[t] = sum_j wgt_j expert_{top_j}(x_t) + shared(x_t).

    x [M, D]; router [E, D]; gate_up [E, 2F, D] (per expert [G_e; U_e]); down [E, D, F];
    shared_gate_up [2Fs, D]; shared_down [D, Fs] (torch Linear layout [out, in]), all one dtype
    (bf16/f16/f32). Routing: p = softmax(x router^T) in fp32, the top_k largest (ties: lower
    expert), weights p / sum(selected p). Returns [M, D] in x's dtype."""
    import torch
    target = resolve_target(target)
    plan = _check(x, router, gate_up, down, shared_gate_up, shared_down, top_k, target)
    out = torch.empty((plan.m, plan.d), dtype=x.dtype, device=x.device)
    if plan.m == 0:
        return out
    x, router, gate_up, down = _contig(x), _contig(router), _contig(gate_up), _contig(down)
    shared_gate_up, shared_down = _contig(shared_gate_up), _contig(shared_down)
    dev, K = x.device, plan.top_k
    ids = torch.empty((plan.m, K), dtype=torch.int32, device=dev)
    wgt = torch.empty((plan.m, K), dtype=torch.float32, device=dev)
    pair_row = torch.empty((plan.m, K), dtype=torch.int32, device=dev)
    row_tok = torch.empty((plan.rows,), dtype=torch.int32, device=dev)
    blk_exp = torch.empty((plan.nb,), dtype=torch.int32, device=dev)
    act = torch.empty((plan.rows, plan.f), dtype=x.dtype, device=dev)
    y = torch.empty((plan.rows, plan.d), dtype=x.dtype, device=dev)
    act_s = torch.empty((plan.m, plan.fs), dtype=x.dtype, device=dev)
    auto = target == "triton" and dev.type == "cuda"       # autotune BN/BK/warps on a GPU
    tiles = (lambda which: {}) if auto else plan.tile
    chunk_cnt = torch.empty((plan.g, plan.ep), dtype=torch.int32, device=dev)
    moe_router[target](x, router, ids, wgt, chunk_cnt, EP=plan.ep, KP=plan.kp, CH=plan.ch, **tiles("router"))
    moe_align[target](ids, chunk_cnt, pair_row, row_tok, blk_exp, plan.e, **plan.align_cx())
    moe_shared_gate_up[target](x, shared_gate_up, act_s, BM=plan.dense_bm, **tiles("gate_up"))
    moe_gate_up[target](x, row_tok, blk_exp, gate_up, act, BM=plan.bm, **tiles("gate_up"))
    moe_down[target](act, blk_exp, down, y, BM=plan.bm, **tiles("down"))
    moe_combine[target](act_s, shared_down, y, pair_row, wgt, out, BM=plan.dense_bm, **tiles("down"))
    return out


# ---------------------------------------------------------------- graph builder

MOE_WEIGHTS = ("router", "gate_up", "down", "shared_gate_up", "shared_down")


def add_moe(p, x, weights: dict, top_k: int, *, out=None, name: str | None = None, tiles: dict | None = None,
            target: str | None = None):
    """Append the MoE FFN of `x` (a TensorRef [M, D]) to the graph Program `p`: the calls `moe`
    makes, with their intermediates as temps named `<name>_...` (default: a fresh `moe<i>`).
    `weights` maps router, gate_up, down, shared_gate_up, shared_down to TensorRefs of the shapes
    `moe` takes (all in x's dtype). Writes `out` (a TensorRef [M, D] in x's dtype; default a new
    temp `<name>_out`) and returns its new version. `tiles` overrides tile configs by kernel
    ("router", "gate_up", "down": {"BN", "BK", "WARPS"}). `target`: the target the program will
    be compiled for, when known; "ascendc" caps the tiles to fit its 192 KB Unified Buffer (the
    default tiles are the GPU's, which `moe(..., target=T)` also picks for T)."""
    from k31dsl.lowering.graph.ir import TensorRef
    op = "add_moe"
    if not isinstance(x, TensorRef) or len(x.shape) != 2:
        raise K31Error(f"{op}: `x` must be a TensorRef [M, D] of the program, got {x!r}")
    if not isinstance(weights, dict) or set(weights) != set(MOE_WEIGHTS):
        got = sorted(weights) if isinstance(weights, dict) else type(weights).__name__
        raise K31Error(f"{op}: `weights` must be a dict with exactly the keys {', '.join(MOE_WEIGHTS)}, got {got}")
    for wname, ref in weights.items():
        if not isinstance(ref, TensorRef):
            raise K31Error(f"{op}: weights[{wname!r}] must be a TensorRef of the program, got {type(ref).__name__}")
    m, d = x.shape
    dt = x.dtype
    for wname, ref in weights.items():
        if ref.dtype is not dt:
            raise K31Error(f"{op}: weights[{wname!r}] is {ref.dtype.name}, x is {dt.name}; the MoE runs in one dtype")
    w = weights
    e = w["router"].shape[0] if len(w["router"].shape) == 2 else -1
    shapes_ok = (len(w["router"].shape) == 2 and w["router"].shape[1] == d and len(w["gate_up"].shape) == 3
                 and w["gate_up"].shape[0] == e and w["gate_up"].shape[2] == d and w["gate_up"].shape[1] % 2 == 0
                 and len(w["shared_gate_up"].shape) == 2 and w["shared_gate_up"].shape[1] == d
                 and w["shared_gate_up"].shape[0] % 2 == 0)
    f = w["gate_up"].shape[1] // 2 if shapes_ok else -1
    fs = w["shared_gate_up"].shape[0] // 2 if shapes_ok else -1
    if not shapes_ok or tuple(w["down"].shape) != (e, d, f) or tuple(w["shared_down"].shape) != (d, fs):
        raise K31Error(f"{op}: weight shapes do not fit x [{m}, {d}]: " + ", ".join(
            f"{n} {list(w[n].shape)}" for n in MOE_WEIGHTS),
            hint="router [E, D], gate_up [E, 2F, D], down [E, D, F], shared_gate_up [2Fs, D], shared_down [D, Fs]")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise K31Error(f"{op}: top_k must be an int in [1, {e}], got {top_k!r}")
    if m == 0:
        raise K31Error(f"{op}: x has no rows; a graph program needs M >= 1")
    plan = MoEPlan(m, d, e, f, fs, top_k, tiles, target)
    if name is None:
        i = 0
        while any(s.startswith(f"moe{i}_") for s in p.latest):
            i += 1
        name = f"moe{i}"
    K = top_k
    ids = p.tensor(f"{name}_ids", (m, K), k.i32)
    wgt = p.tensor(f"{name}_wgt", (m, K), k.f32)
    chunk_cnt = p.tensor(f"{name}_chunk_cnt", (plan.g, plan.ep), k.i32)
    pair_row = p.tensor(f"{name}_pair_row", (m, K), k.i32)
    row_tok = p.tensor(f"{name}_row_tok", (plan.rows,), k.i32)
    blk_exp = p.tensor(f"{name}_blk_exp", (plan.nb,), k.i32)
    act = p.tensor(f"{name}_act", (plan.rows, f), dt)
    y = p.tensor(f"{name}_y", (plan.rows, d), dt)
    act_s = p.tensor(f"{name}_act_s", (m, fs), dt)
    if out is None:
        out = p.tensor(f"{name}_out", (m, d), dt)
    elif not isinstance(out, TensorRef) or tuple(out.shape) != (m, d) or out.dtype is not dt:
        raise K31Error(f"{op}: `out` must be a TensorRef {dt.name}[{m}, {d}], got {out!r}")
    ids, wgt, chunk_cnt = p.call(moe_router, x, w["router"], ids, wgt, chunk_cnt, **plan.router_cx())
    pair_row, row_tok, blk_exp = p.call(moe_align, ids, chunk_cnt, pair_row, row_tok, blk_exp, e, **plan.align_cx())
    act_s = p.call(moe_shared_gate_up, x, w["shared_gate_up"], act_s, BM=plan.dense_bm, **plan.tile("gate_up"))
    act = p.call(moe_gate_up, x, row_tok, blk_exp, w["gate_up"], act, BM=plan.bm, **plan.tile("gate_up"))
    y = p.call(moe_down, act, blk_exp, w["down"], y, BM=plan.bm, **plan.tile("down"))
    return p.call(moe_combine, act_s, w["shared_down"], y, pair_row, wgt, out, BM=plan.dense_bm, **plan.tile("down"))


def moe_program(m: int = 64, d: int = 2048, e: int = 8, f: int = 1024, fs: int = 1024, top_k: int = 2,
                dtype=k.bf16, target: str | None = None):
    """One MoE FFN as a whole Program (input x, the five weights, output out); defaults: the
    `small` preset at a decode batch of 64. `k31dsl explain ops/moe.py --target T` shows it."""
    from k31dsl.lowering.graph import Program
    p = Program("moe_ffn")
    x = p.input("x", (m, d), dtype)
    shapes = {"router": (e, d), "gate_up": (e, 2 * f, d), "down": (e, d, f),
              "shared_gate_up": (2 * fs, d), "shared_down": (d, fs)}
    refs = {n: p.weight(n, s, dtype) for n, s in shapes.items()}
    out = p.input("out", (m, d), dtype)
    p.output(add_moe(p, x, refs, top_k, out=out, target=target))
    return p


def _explained():
    return moe_program()


_explained.__k31_program__ = True      # what `k31dsl explain ops/moe.py` shows (lowering.graph.program)


MOE_KERNELS = [moe_router, moe_align, moe_gate_up, moe_down, moe_shared_gate_up, moe_combine]


# ---------------------------------------------------------------- checks against the oracle

# (M, D, F, Fs, E, top_k, dtype, routing): "random", or "skewed" (expert 0 takes every token,
# expert E-1 none). M * top_k / E > 24 takes the BM = 64 blocks of the prefill regime.
CHECK_CASES = [(13, 40, 24, 20, 5, 2, "f32", "random"),
               (37, 28, 30, 16, 4, 2, "bf16", "skewed"),
               (1, 32, 16, 24, 3, 3, "f32", "random"),
               (52, 24, 20, 12, 2, 2, "bf16", "random"),
               (6, 20, 17, 9, 6, 1, "f32", "skewed")]
# AscendC builds each specialisation with g++ (seconds each): there the check runs the cases that
# cover both dtypes, both block sizes and an empty expert; top_k 1 and 3 differ only in KP.
ASCENDC_CASES = (0, 1, 3)


def moe_inputs(m, d, f, fs, e, top_k, dtype, routing, gen):
    """x, router, gate_up, down, shared_gate_up, shared_down (torch, CPU) with O(1) logits and
    outputs; "skewed": a large x[:, 0] and router[:, 0] of +4 for expert 0, -4 for expert E-1."""
    import torch
    x = torch.randn(m, d, generator=gen, dtype=torch.float64)
    router = torch.randn(e, d, generator=gen, dtype=torch.float64) / d ** 0.5
    if routing == "skewed":
        x[:, 0] = 2 + x[:, 0].abs()
        router[:, 0] = 0.0
        router[0, 0], router[-1, 0] = 4.0, -4.0
    gate_up = torch.randn(e, 2 * f, d, generator=gen, dtype=torch.float64) / d ** 0.5
    down = torch.randn(e, d, f, generator=gen, dtype=torch.float64) / f ** 0.5
    sgu = torch.randn(2 * fs, d, generator=gen, dtype=torch.float64) / d ** 0.5
    sdn = torch.randn(d, fs, generator=gen, dtype=torch.float64) / fs ** 0.5
    dt = D.torch_dtype(D.from_name(dtype))
    return [t.to(dt) for t in (x, router, gate_up, down, sgu, sdn)]


def _check_moe(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import TOL, device_for, load_oracle, to_f64
    ref = load_oracle("moe")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    cases = [CHECK_CASES[i] for i in ASCENDC_CASES] if target == "ascendc" else CHECK_CASES
    for m, d, f, fs, e, top_k, dt, routing in cases:
        args = moe_inputs(m, d, f, fs, e, top_k, dt, routing, g)
        want = ref.moe(*(to_f64(a) for a in args), top_k)
        got = to_f64(moe(*(a.to(dev) for a in args), top_k, target=target))
        err = float(np.abs(got - want).max() / np.abs(want).max()) if got.shape == want.shape else float("inf")
        top, _ = ref.route(to_f64(args[0]), to_f64(args[1]), top_k)
        counts = np.bincount(top.ravel(), minlength=e)
        detail = f"rows per expert {counts.tolist()}"
        tol = TOL[str(args[0].dtype).removeprefix("torch.")]   # the shared table, of max |oracle|
        ok = err <= tol
        if routing == "skewed" and not (counts[0] == m and counts[-1] == 0):
            ok, detail = False, "skewed routing did not give expert 0 every token and expert E-1 none: " + detail
        out.append(CaseResult(f"x=[{m}, {d}] {dt}, E={e} F={f} Fs={fs} top_k={top_k} ({routing})",
                              err, tol, ok, detail))
    return out


register(OpSpec("moe", "moe", moe, MOE_KERNELS,
                "MoE FFN: softmax top-k router, expert-sorted grouped SwiGLU GEMMs, shared expert, gathered combine",
                _check_moe, tags=["moe", "ffn"]))

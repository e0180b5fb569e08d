"""Context-parallel (CP) prefill of one long sequence over P ranks of a torch.distributed group
(gloo on CPU, NCCL on GPUs; research/kda.md 3, research/dsa.md 6).

Layout (zigzag): the prompt, padded to 2P chunks of `chunk` tokens (a multiple of the 64-token
page), is cut into chunks 0 .. 2P-1; rank r owns chunks r and 2P-1-r, so every rank scores about
the same number of causal (query, key) pairs in the indexer, the O(T^2) part.

Every rank runs the same step program (ShapeClass "cp_prefill", model/assembler.py) over its two
chunks; rank-specific facts are inputs (positions, key ranges, chunk maps). Per layer:
  KDA     conv halos and the chunks' affine summaries (M, E) are all-gathered and composed in
          sequence order into each chunk's initial state (model/layers/kda_cp.py)
  DSA     each rank writes its tokens into a staging cache; the staging caches are all-gathered
          into the sequence's caches, which every local query reads over its global causal
          range through a block table of the gathered pages; top-k and attention stay local
  AttnRes, MoE, norms, projections, LM head: token-local
The all-gathers are `dist_all_gather` host ops of the program, run through a `Communicator`.

    comm = Communicator()                              # the default group, or Communicator(group)
    res = cp_prefill(runner, prompt, comm)            # every rank; logits the same on every rank
    hand_off(res, runner, slot, block_table)          # rank 0: states and caches into its runner,
                                                      # which then decodes as after a normal prefill

Launching P ranks: model/cp_launch.py (`k31dsl run --cp P`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.graph.comm import communicator
from k31dsl.model.config import PAGE, pages_for
from k31dsl.model.layers.common import ShapeClass
from k31dsl.model.layers.dsa import block_rows
from k31dsl.model.layers.kda import CONV_NAMES
from k31dsl.model.layers.kda_cp import PIECES, cp_chunk_map


# ---------------------------------------------------------------- layout

@dataclass(frozen=True)
class CPLayout:
    """Zigzag ownership of a prompt of `n_tokens` over `ranks` ranks, chunks of `chunk` tokens."""
    n_tokens: int
    ranks: int
    chunk: int

    @property
    def n_chunks(self) -> int:
        return 2 * self.ranks

    @property
    def padded(self) -> int:
        return self.n_chunks * self.chunk

    def chunks_of(self, rank: int) -> tuple[int, int]:
        return rank, self.n_chunks - 1 - rank

    def owner(self, i: int) -> tuple[int, int]:
        """(rank, local index 0 or 1) of global chunk i."""
        return (i, 0) if i < self.ranks else (self.n_chunks - 1 - i, 1)

    def real(self, i: int) -> int:
        """Prompt tokens in chunk i (the rest is padding)."""
        return max(0, min(self.chunk, self.n_tokens - i * self.chunk))

    def positions(self, rank: int) -> list[int]:
        """Global positions of the rank's 2 x chunk rows (padding rows: positions >= n_tokens)."""
        return [i * self.chunk + j for i in self.chunks_of(rank) for j in range(self.chunk)]

    def indexer_work(self, rank: int) -> int:
        """Causal (query, key) pairs the rank's prompt tokens score: sum of (position + 1)."""
        return sum(p + 1 for p in self.positions(rank) if p < self.n_tokens)

    def balance(self) -> float:
        """max / min indexer work over the ranks (1.0 = perfect)."""
        w = [self.indexer_work(r) for r in range(self.ranks)]
        return max(w) / max(1, min(w))

    @property
    def last(self) -> tuple[int, int, int]:
        """(rank, local chunk, row within the chunk) of the prompt's last token."""
        i = (self.n_tokens - 1) // self.chunk
        rank, j = self.owner(i)
        return rank, j, (self.n_tokens - 1) % self.chunk

    def gathered_page(self, q: int) -> int:
        """Page of the gathered caches (rank-major staging pages) holding the sequence's page q."""
        per = self.chunk // PAGE
        rank, j = self.owner(q // per)
        return rank * 2 * per + j * per + q % per


def zigzag_layout(n_tokens: int, ranks: int) -> CPLayout:
    """The zigzag layout of a prompt: 2 x ranks chunks of ceil(n / 2P) tokens rounded up to a page."""
    if not (isinstance(ranks, int) and ranks >= 1):
        raise K31Error(f"context parallel: ranks must be an int >= 1, got {ranks!r}")
    if not (isinstance(n_tokens, int) and n_tokens >= 1):
        raise K31Error(f"context parallel: the prompt must have >= 1 token, got {n_tokens!r}")
    per = -(-n_tokens // (2 * ranks))
    return CPLayout(n_tokens, ranks, -(-per // PAGE) * PAGE)


def contiguous_work(n_tokens: int, ranks: int) -> list[int]:
    """Indexer work per rank if the prompt were cut into `ranks` contiguous pieces (for comparison)."""
    cuts = [n_tokens * r // ranks for r in range(ranks + 1)]
    return [sum(p + 1 for p in range(cuts[r], cuts[r + 1])) for r in range(ranks)]


# ---------------------------------------------------------------- communication

class Communicator:
    """The program's all-gathers over a torch.distributed group (the default one when `group` is
    None; a single rank when torch.distributed is not initialised). `stats` records each gather:
    {"name", "bytes" (received by this rank), "seconds"}; with `timed` the GPU is synchronised
    around each gather so its time is its own."""

    def __init__(self, group=None, *, timed: bool = False):
        import torch.distributed as dist
        self.group, self.timed = group, timed
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world = dist.get_world_size(group) if self.distributed else 1
        self.stats: list[dict] = []
        self._into_tensor = True

    def all_gather(self, out, inp, name: str = "") -> None:
        import torch.distributed as dist
        src = inp.contiguous().view(-1).view(torch.uint8)
        dst = out.view(-1).view(torch.uint8)
        if dst.numel() != src.numel() * self.world:
            raise K31Error(f"all-gather {name}: output holds {dst.numel()} bytes, expected {self.world} x {src.numel()}")
        sync = self.timed and out.is_cuda
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if self.world == 1:
            dst.copy_(src)
        elif self._into_tensor:
            try:
                dist.all_gather_into_tensor(dst, src, group=self.group)
            except (RuntimeError, NotImplementedError, AttributeError):
                self._into_tensor = False        # a backend without it (gloo on some versions)
        if self.world > 1 and not self._into_tensor:
            dist.all_gather(list(dst.chunk(self.world)), src, group=self.group)
        if sync:
            torch.cuda.synchronize()
        self.stats.append({"name": name, "bytes": int(dst.numel()), "seconds": time.perf_counter() - t0})

    def gather_rows(self, x) -> torch.Tensor:
        """Every rank's x stacked in rank order (a helper for results outside the program)."""
        out = torch.empty((self.world,) + tuple(x.shape), dtype=x.dtype, device=x.device)
        self.all_gather(out, x, "result")
        return out


# ---------------------------------------------------------------- the prefill

@dataclass
class CPResult:
    logits: torch.Tensor               # fp32 [T, vocab] in prompt order, or [1, vocab] (the last token)
    layout: CPLayout
    kda_states: dict                   # KDA layer -> fp32 [HV, K, V] state after the prompt
    conv_states: dict                  # (KDA layer, "q"|"k"|"v") -> fp32 [3, C]
    caches: dict                       # DSA layer -> (MLA cache pages, indexer cache pages), gathered order
    stats: dict = field(default_factory=dict)


def query_blocks(layout: CPLayout, rank: int, most: int | None = None) -> tuple:
    """The rank's DSA query blocks (first local row, rows, key width): each local chunk in pieces
    of at most `most` rows (whole pages; default `block_rows` of the sequence: QUERY_BLOCK, fewer for
    long prompts so that a block's scores stay within SCORE_ELEMENTS), each scoring keys [0, its last position + 1)
    only, so a block's scores and top-k scan cover its causal range, not the whole sequence. A
    block of padding only (no prompt token) gets the smallest width. The blocks run one after
    another and share one score buffer (model/layers/dsa.py)."""
    c, out = layout.chunk, []
    most = block_rows(layout.padded, most)
    for j, i in enumerate(layout.chunks_of(rank)):
        for s in range(0, c, most):
            rows = min(most, c - s)
            first = i * c + s                      # global position of the block's first row
            width = first + rows if first < layout.n_tokens else PAGE
            out.append((j * c + s, rows, width))
    return tuple(out)


def cp_shape(runner, layout: CPLayout, rank: int) -> ShapeClass:
    return ShapeClass("cp_prefill", 1, 2 * layout.chunk, layout.padded // PAGE, layout.ranks,
                      query_blocks(layout, rank))


def cp_inputs(runner, layout: CPLayout, rank: int, tokens: list[int]) -> dict:
    """The step inputs of `rank`: its tokens, global positions, staging slots, the block table of
    the gathered pages, global causal key ranges, the conv-halo and summary bookkeeping."""
    c, P = layout.chunk, layout.ranks
    pos = layout.positions(rank)
    real_row = [p < layout.n_tokens for p in pos]
    ia, ib = layout.chunks_of(rank)
    info, firsts, bounds = cp_chunk_map(c, (layout.real(ia), layout.real(ib)))

    def tail_row(i):
        if i == 0:
            return -1
        r, j = layout.owner(i - 1)
        return 2 * r + j

    i32 = dict(dtype=torch.int32, device=runner.device)
    t = lambda v: torch.tensor(v, **i32)       # noqa: E731
    return {
        "tokens": t([tokens[p] if ok else 0 for p, ok in zip(pos, real_row)]),
        "positions": t(pos),
        "slot_mapping": t([j if ok else -1 for j, ok in enumerate(real_row)]),
        "block_table": t([[layout.gathered_page(q) for q in range(layout.padded // PAGE)]]),
        "state_slots": t([0]),
        "ks": t([0] * len(pos)),
        "ke": t([p + 1 if ok else 0 for p, ok in zip(pos, real_row)]),
        "cp_pair": t([0, 1]),
        "cp_real": t([layout.real(ia), layout.real(ib)]),
        "cp_halo_src": t([tail_row(ia), tail_row(ib)]),
        "cp_chunk_order": t([PIECES * r + 2 * j for r, j in map(layout.owner, range(2 * P))]),
        "cp_h0_rows": t([ia, 0, ib, 0]),
        "cp_pieces": t(list(range(PIECES))),
        "kda_cp_info": t(info),
        "kda_cp_seq_chunks": t(firsts),
        "kda_cp_cu": t(bounds),
    }


def cp_prefill(runner, tokens: list[int], comm: Communicator | None = None, *, logits: str = "all") -> CPResult:
    """Prefill `tokens` (one fresh sequence) with context parallelism over `comm`'s ranks. Every
    rank calls it with the same tokens and a runner of the same config and weights. Returns the
    logits (all prompt tokens, or only the last with logits="last"), the sequence's final KDA and
    conv states, its DSA caches and the step's statistics, the same on every rank."""
    comm = comm or Communicator()
    if logits not in ("all", "last"):
        raise K31Error(f"cp_prefill: logits must be 'all' or 'last', got {logits!r}")
    V = runner.config.vocab_size
    if not tokens or any(not (isinstance(x, int) and 0 <= x < V) for x in tokens):
        raise K31Error(f"cp_prefill: tokens must be a non-empty list of ids in [0, {V})")
    layout = zigzag_layout(len(tokens), comm.world)
    shape = cp_shape(runner, layout, comm.rank)
    start = len(comm.stats)
    t0 = time.perf_counter()
    with communicator(comm):
        out = runner._run(shape, cp_inputs(runner, layout, comm.rank, tokens))
    t_program = time.perf_counter() - t0
    cfg = runner.config
    last_rank, last_j, last_row = layout.last
    # the sequence's final states live on the rank with the last prompt token: one gather of
    # every rank's candidates (flat fp32), the owner's row taken
    parts = []
    for l in cfg.kda_layers:
        parts.append(out[f"l{l}_kda_ht"][2 * last_j].reshape(-1))
        parts += [out[f"l{l}_{c}_conv_after"][last_j].reshape(-1) for c in CONV_NAMES]
    kda_states, conv_states = {}, {}
    if parts:
        flat = comm.gather_rows(torch.cat(parts))[last_rank]
        off = 0
        for l in cfg.kda_layers:
            ht = out[f"l{l}_kda_ht"][0]
            kda_states[l] = flat[off: off + ht.numel()].view(ht.shape).clone()
            off += ht.numel()
            for c in CONV_NAMES:
                cs = out[f"l{l}_{c}_conv_after"][0]
                conv_states[(l, c)] = flat[off: off + cs.numel()].view(cs.shape).clone()
                off += cs.numel()
    lg = out["logits"]
    if logits == "last":
        cand = lg[layout.chunk * last_j + last_row] if comm.rank == last_rank else torch.zeros_like(lg[0])
        result_logits = comm.gather_rows(cand.contiguous())[last_rank][None].clone()
    else:
        every = comm.gather_rows(lg.contiguous())                # [P, 2 chunk, V]
        order = [layout.owner(p // layout.chunk) for p in range(layout.n_tokens)]
        idx = torch.tensor([r * 2 * layout.chunk + j * layout.chunk + p % layout.chunk
                            for p, (r, j) in enumerate(order)], device=lg.device)
        result_logits = every.reshape(-1, V)[idx].clone()
    bufs = runner.cp_buffers(shape)
    caches = {l: (bufs[f"dsa{l}_mla"], bufs[f"dsa{l}_index_cache"]) for l in cfg.dsa_layers}
    gathers = comm.stats[start:]
    stats = {"ranks": layout.ranks, "rank": comm.rank, "tokens": layout.n_tokens, "chunk": layout.chunk,
             "program_s": t_program,
             "indexer_work": [layout.indexer_work(r) for r in range(layout.ranks)],
             "indexer_balance": layout.balance(),
             "contiguous_work": contiguous_work(layout.n_tokens, layout.ranks),
             "gathers": gathers,
             "gather_bytes": sum(g["bytes"] for g in gathers), "gather_s": sum(g["seconds"] for g in gathers)}
    return CPResult(result_logits, layout, kda_states, conv_states, caches, stats)


def hand_off(result: CPResult, runner, slot: int, block_table: list[int]) -> None:
    """Put a CP prefill's sequence into `runner` (normally rank 0's): its KDA and conv states into
    state slot `slot`, its DSA cache pages into the pages of `block_table`; the runner then
    decodes the sequence as after a single-rank prefill (context = the prompt's length)."""
    layout = result.layout
    need = pages_for(layout.n_tokens)
    runner._check_slots([slot])
    if len(block_table) < need or any(not 0 <= pg < runner.num_pages for pg in block_table[:need]):
        raise K31Error(f"hand_off: the block table needs {need} pages in [0, {runner.num_pages}), got {block_table}")
    cfg = runner.config
    missing = [l for l in cfg.kda_layers if l not in result.kda_states] + \
              [l for l in cfg.dsa_layers if l not in result.caches]
    if missing:
        raise K31Error(f"hand_off: the CP result has no states for layer(s) {missing}; was it made with this config?")
    for l in cfg.kda_layers:
        runner.states[f"kda{l}_pool"][slot].copy_(result.kda_states[l].transpose(-1, -2))    # [K,V] -> pool [V,K]
        for c in CONV_NAMES:
            runner.states[f"kda{l}_conv_{c}"][slot].copy_(result.conv_states[(l, c)])
    dst = torch.tensor(block_table[:need], dtype=torch.long, device=runner.device)
    src = torch.tensor([layout.gathered_page(q) for q in range(need)], dtype=torch.long, device=runner.device)
    for l in cfg.dsa_layers:
        mla, index = result.caches[l]
        runner.states[f"dsa{l}_mla"][dst] = mla[src]
        pages = runner.states[f"dsa{l}_index_cache"].view(runner.num_pages, -1)
        pages[dst] = index.view(-1, pages.shape[1])[src]

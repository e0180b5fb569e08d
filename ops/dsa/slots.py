"""Logical key positions -> physical slots of the paged MLA cache (slot = block_table[sequence,
pos // 64] * 64 + pos % 64), for the selected keys of a step (`slots_of_positions`) and for the
step that needs no selection (`slots_of_range`: every query has at most top-k keys in range, so
its top-k is all of them; research/dsa.md §2.3). Query t belongs to sequence t // next_n."""
from __future__ import annotations

import k31dsl as k
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import int32_tensor, resolve_target


@k.func
def slots_in_pages(block_table, row, p, ok):
    """Physical slots of logical positions p of block-table row `row` where ok, else -1."""
    page = block_table[row, k.where(ok, p // 64, 0)]
    return k.where(ok, page * 64 + p % 64, -1)


@k.kernel
def slots_of_positions_rows(pos: k.Tensor[k.i32, "T", "K"], block_table: k.Tensor[k.i32, "B", "MP"],
                            slots: k.Tensor[k.i32, "T", "K"], next_n: k.i32, BK: k.constexpr = 128):
    # Logical positions of query t (sequence t // next_n) -> physical slots; -1 stays -1.
    for t, j in k.grid(pos.shape[0], k.cdiv(pos.shape[1], BK)):
        p = pos[t, k.span(j * BK, BK, other=-1)]
        slots[t, k.span(j * BK, BK)] = slots_in_pages(block_table, t // next_n, p, p >= 0)


@k.kernel
def slots_of_range_rows(ks: k.Tensor[k.i32, "T"], ke: k.Tensor[k.i32, "T"], block_table: k.Tensor[k.i32, "B", "MP"],
                        pos: k.Tensor[k.i32, "T", "K"], slots: k.Tensor[k.i32, "T", "K"], next_n: k.i32, width: k.i32,
                        BK: k.constexpr = 128):
    # The top-k of a query with at most K valid keys is all of them: positions max(ks, 0) ..
    # min(ke, width) - 1 in order, then -1 (topk(sorted=False)'s row), and their slots as
    # slots_of_positions_rows maps them. The caller knows every range fits K (longer ones are cut).
    for t, j in k.grid(pos.shape[0], k.cdiv(pos.shape[1], BK)):
        hi = k.minimum(ke[t], width)
        p = k.maximum(ks[t], 0) + j * BK + k.arange(0, BK)
        ok = p < hi
        pos[t, k.span(j * BK, BK)] = k.where(ok, p, -1)
        slots[t, k.span(j * BK, BK)] = slots_in_pages(block_table, t // next_n, p, ok)


def slots_of_positions(positions, block_table, next_n: int = 1, *, target: str | None = None):
    """Logical key positions [T, K] (-1 = none) of query t, which belongs to sequence t // next_n,
    -> physical slots block_table[t // next_n, pos // 64] * 64 + pos % 64 (int32, -1 kept)."""
    import torch
    target = resolve_target(target)
    op = "slots_of_positions"
    pos = int32_tensor(op, "positions", positions, 2)
    bt = int32_tensor(op, "block_table", block_table, 2)
    if not (isinstance(next_n, int) and next_n >= 1) or pos.shape[0] != bt.shape[0] * next_n:
        raise K31Error(f"{op}: positions has {pos.shape[0]} rows but block_table has {bt.shape[0]} sequences "
                       f"x next_n={next_n!r}", hint="rows of positions = sequences x queries per sequence")
    out = torch.empty_like(pos)
    if pos.numel():
        slots_of_positions_rows[target](pos, bt, out, next_n)
    return out


def short_ranges() -> str:
    """What a step does when no query has more than topk keys in range (K31_SHORT_RANGES): "all",
    the default, attends every key without scoring; "score" runs the indexer and the top-k anyway
    (the same lists; for A/B runs, benchmarks/switch_ab.py). Another value is refused."""
    import os
    raw = os.environ.get("K31_SHORT_RANGES", "").strip().lower() or "all"
    if raw not in ("all", "score"):
        raise K31Error(f"K31_SHORT_RANGES={raw!r}: expected 'all' (attend every key) or 'score'")
    return raw


def slots_of_range(ks32, ke32, block_table, next_n: int, topk: int, width: int, *, target: str | None = None):
    """(positions, slots) int32 [T, topk] of every key of each query's range [ks, ke) cut to
    [0, width): what topk(sorted=False) and slots_of_positions give when no range holds more
    than topk keys, which the caller has established (longer ranges are cut at topk)."""
    import torch
    target = resolve_target(target)
    pos = torch.empty((ks32.shape[0], topk), dtype=torch.int32, device=ks32.device)
    slots = torch.empty_like(pos)
    if pos.numel():
        slots_of_range_rows[target](ks32, ke32, block_table.contiguous(), pos, slots, next_n, width)
    return pos, slots

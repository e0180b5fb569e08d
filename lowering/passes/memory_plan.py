"""The `memory_plan` graph pass: intermediate tensors share one arena by liveness.

Candidates are the program's temps that are not returned. Two of them may overlap in the arena
only when every use (read or write, any version) of one *happens before* every use of the other
— through the dependencies (which the streams pass's events enforce) and each stream's own order,
so the plan is safe on several streams too. Placement is greedy by size: the largest tensor
first, each at the best-fitting gap between the already placed tensors whose lifetimes clash with
its own (else on top of them).
Offsets are multiples of ALIGN bytes. A whole-buffer plan (a tensor may only take over a buffer
whose holders are all dead) left half the arena idle on the model's prefill: a 32 MB tensor
could not use the free half of a 64 MB buffer.
`program.meta["memory_plan"]` = {"offsets": storage -> byte offset, "arena_bytes", "alias",
"bytes_before", "bytes_after" (= arena_bytes), "peak_live"}; the executors allocate the arena
once and view each planned tensor at its offset.
"""
from __future__ import annotations

ALIGN = 128          # bytes: an L2 line, so a tensor's rows start where coalesced accesses expect


def happens_before(p) -> dict[str, int]:
    """op -> bitmask (bit i = the op at schedule position i) of the ops that finish before it
    starts at run time: its dependencies, which the streams pass's events enforce, and the ops
    before it on its own stream (a stream runs its ops one after another; without the streams pass
    every op is on stream 0, so the schedule is a total order), transitively. Load-time
    conversions run once before everything and order nothing."""
    topo = p.ops()
    bit = {n: 1 << i for i, n in enumerate(topo)}
    before: dict[str, int] = {}
    last: dict = {}
    for n in topo:                      # every edge goes forward in the schedule
        preds = list(p.op_deps(n))
        if not p.is_static(n):
            stream = p.node(n).attrs.get("stream", 0)
            if stream in last:
                preds.append(last[stream])
            last[stream] = n
        mask = 0
        for d in preds:
            if d in before:
                mask |= before[d] | bit[d]
        before[n] = mask
    return before


def uses(p) -> dict[str, set]:
    """storage -> the call/host nodes that read or write any of its versions."""
    out: dict[str, set] = {}
    for n in p.order:
        for t in p.reads_of(n) + p.writes_of(n):
            out.setdefault(p.tensor_node(t).storage, set()).add(n)
        for u, _, r in p.g.in_edges(n, data="role"):
            if r == "prev":
                out.setdefault(p.tensor_node(u).storage, set()).add(n)
    return out


def peak_live(sizes: dict[str, int], span: dict[str, tuple[int, int]]) -> int:
    """Largest sum of candidate bytes live at one op in schedule order (a lower bound)."""
    change: dict[int, int] = {}
    for s, (lo, hi) in span.items():
        change[lo] = change.get(lo, 0) + sizes[s]
        change[hi + 1] = change.get(hi + 1, 0) - sizes[s]
    live = peak = 0
    for i in sorted(change):
        live += change[i]
        peak = max(peak, live)
    return peak


def reshape_aliases(p, candidates: list[str], storages: dict) -> dict[str, str]:
    """{b: a} for each `reshape` host op from temp a to temp b that may be a view instead of a
    copy: neither is written after it (it reads a's final version and is b's only writer), so
    b in a's buffer (same bytes, same offset) holds exactly the reshaped elements. Chains map to
    their first source. The executors skip these ops."""
    cand = set(candidates)
    alias: dict[str, str] = {}
    for n in p.order:
        node = p.node(n)
        if node.kind != "host" or node.op != "reshape":
            continue
        src, dst = p.tensor_node(node.inputs[0]), p.tensor_node(node.outputs[0])
        a, b = src.storage, dst.storage
        if a in cand and b in cand and a != b and p.final(a) == src.id and p.final(b) == dst.id \
                and dst.version == 1 and storages[a].nbytes == storages[b].nbytes:
            alias[b] = alias.get(a, a)
    return alias


def clashes(candidates: list[str], use: dict, before: dict, pos: dict, span: dict) -> dict[str, set]:
    """storage -> the candidates whose lifetime clashes with its own (neither happens before the
    other). Overlapping spans in schedule order always clash; disjoint ones clash unless every
    use of the earlier one happens before every use of the later one (not so across streams)."""
    used = {s: sum(1 << pos[n] for n in use[s]) for s in candidates}
    full = (1 << len(pos)) - 1
    before_each = {}                            # s -> ops that happen before every use of s
    for s in candidates:
        common = full
        for n in use[s]:
            common &= before[n]
        before_each[s] = common
    out = {s: set() for s in candidates}
    order = sorted(candidates, key=lambda s: span[s])
    for i, a in enumerate(order):
        end, mine = span[a][1], used[a]
        for b in order[i + 1:]:
            if span[b][0] <= end or mine & ~before_each[b]:
                out[a].add(b)
                out[b].add(a)
    return out


def place(sizes: dict[str, int], clash: dict[str, set]) -> dict[str, int]:
    """Byte offsets, largest tensor first, each at the smallest gap (among the placed tensors it
    clashes with) that holds it, else above them all."""
    offsets: dict[str, int] = {}
    for s in sorted(sizes, key=lambda s: (-sizes[s], s)):
        need = -(-sizes[s] // ALIGN) * ALIGN
        taken = sorted((offsets[o], offsets[o] + sizes[o]) for o in clash[s] if o in offsets)
        best, cursor = None, 0
        for lo, hi in taken:
            gap = lo - cursor
            if gap >= need and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, -(-hi // ALIGN) * ALIGN)
        offsets[s] = best[1] if best else cursor
    return offsets


def memory_plan(program):
    p = program.copy()
    storages = p.storages()
    use = uses(p)
    candidates = [s for s, t in storages.items()
                  if t.kind == "temp" and s not in p.outputs and s in use]
    alias = reshape_aliases(p, candidates, storages)
    for b, a in alias.items():                 # b lives in a's buffer: a's uses extend over b's
        use[a] = use[a] | use[b]
    candidates = [s for s in candidates if s not in alias]
    before = happens_before(p)
    pos = {n: i for i, n in enumerate(before)}
    span = {s: (min(pos[n] for n in use[s]), max(pos[n] for n in use[s])) for s in candidates}
    sizes = {s: storages[s].nbytes for s in candidates}
    offsets = place(sizes, clashes(candidates, use, before, pos, span))
    for b, a in alias.items():
        offsets[b] = offsets[a]
    arena = max((offsets[s] + storages[s].nbytes for s in candidates), default=0)
    unplanned = sum(storages[s].nbytes for s in candidates) + sum(storages[b].nbytes for b in alias)
    live = peak_live(sizes, span)
    p.meta["memory_plan"] = {"offsets": offsets, "alias": alias, "arena_bytes": arena, "bytes_before": unplanned,
                             "bytes_after": arena, "peak_live": live}
    if candidates:
        p.report.append(f"memory_plan: {len(candidates)} intermediates in one arena; "
                        f"{unplanned} bytes -> {arena} bytes (peak live {live})"
                        + (f"; {len(alias)} reshape results share their source's buffer (no copy)" if alias else ""))
    return p

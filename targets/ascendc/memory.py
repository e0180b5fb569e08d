"""GM <-> UB moves of tile loads and stores.

A tile access whose last tensor axis is a span (the tile's rows) moves by DMA: one DataCopyPad
per row block (blockCount = rows in bounds, blockLen = lanes in bounds in bytes, GM stride from
the tensor's stride), or a plain DataCopy when the whole tile is in bounds and 32-byte blocks
line up. Lanes out of bounds read `other`: the tile is first filled with it (Duplicate) and
DataCopyPad pads each row with it (isPad, rightPadding). Rows shorter than 32 bytes travel
through a pitched staging buffer (each row 32-byte aligned, as DataCopyPad lays them out) and
are (un)packed on the scalar unit. At run time a tile whose last axis is not contiguous, starts
at a negative index, or whose row stride is smaller than its row falls back to the scalar unit
(GetValue/SetValue per lane), as do gathers and masked stores."""
from __future__ import annotations

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.ir import Op, parse_index_kind
from k31dsl.targets.ascendc import cexpr
from k31dsl.targets.ascendc.plan import ceil32, row_aligned
from k31dsl.targets.ascendc.vector import sh4, strides4, _fill

NULL_MASK = "static_cast<const AscendC::LocalTensor<uint8_t>*>(nullptr)"


def _parts(em, op: Op, has_value: bool):
    kinds = op.attrs["index"]
    tensor = op.operands[0]
    idx = op.operands[1:1 + len(kinds)]
    rest = op.operands[1 + len(kinds):]
    value = rest[0] if has_value else None
    mask = rest[-1] if op.attrs["mask"] else None
    return tensor, kinds, idx, value, mask


def _access(em, tensor, kinds, idx) -> str:
    """A k31::Access describing every lane's GM offset (also used by the DMA path's bounds)."""
    t = em.n(tensor)
    R = len(kinds)
    rank = sum(parse_index_kind(k)[0] != "scalar" for k in kinds)
    starts, axes, gathers, ta = [], [], [], 4 - rank       # tile axes are padded to rank 4
    for kind, v in zip(kinds, idx):
        k, _ = parse_index_kind(kind)
        if k == "scalar":
            starts.append(f"int64_t({em.n(v)})")
            axes.append("-1")
            gathers.append("nullptr")
        elif k == "span":
            starts.append(f"int64_t({em.n(v)})")
            axes.append(str(ta))
            gathers.append("nullptr")
            ta += 1
        else:
            starts.append("0")
            axes.append(str(ta))
            gathers.append(f"&{em.n(v)}")
            ta += 1
    pad = 4 - R
    sizes = ", ".join([f"td.{t}_size[{a}]" for a in range(R)] + ["1"] * pad)
    strides = ", ".join([f"td.{t}_stride[{a}]" for a in range(R)] + ["0"] * pad)
    return (f"k31::Access ac{{{R}, {{{sizes}}}, {{{strides}}}, {{{', '.join(starts + ['0'] * pad)}}}, "
            f"{{{', '.join(axes + ['-1'] * pad)}}}, {{{', '.join(gathers + ['nullptr'] * pad)}}}}};")


def _dma_geometry(kinds, shape):
    """(row tensor axis or None, outer tile axes as (tensor axis, lanes)) for a span-only access
    whose last tensor axis is a span; None when the DMA path does not apply."""
    parsed = [parse_index_kind(k) for k in kinds]
    if any(k == "gather" for k, _ in parsed) or parsed[-1][0] != "span":
        return None
    tile_axes = [a for a, (k, _) in enumerate(parsed) if k == "span"]
    row_axis = tile_axes[-2] if len(tile_axes) >= 2 else None
    outer = [(a, parsed[a][1]) for a in tile_axes[:-2]]
    return row_axis, outer


def _gather_rows(kinds, shape, dt):
    """The tensor axis of a row gather/scatter `t[idx_tile, ..., k.span(c, L)]` (one index-tile
    axis, the last axis a span of 32-byte aligned rows, the others scalar), else None."""
    parsed = [parse_index_kind(k)[0] for k in kinds]
    if parsed.count("gather") != 1 or parsed[-1] != "span" or len(shape) != 2:
        return None
    if any(k not in ("gather", "scalar") for k in parsed[:-1]):
        return None
    if (shape[-1] * cexpr.itemsize(dt)) % 32:
        return None
    return parsed.index("gather")


def _row_dma(em, kinds, shape) -> str:
    """The prologue of a per-row DMA over a gathered axis (c0, len, sc_ok, fast); returns the GM
    offset of a row's first lane without the gathered axis."""
    R = len(kinds)
    L = shape[-1]
    em.pre(f"  const int64_t c0 = ac.start[{R - 1}];")
    em.pre(f"  const int64_t len = c0 >= ac.size[{R - 1}] ? 0 : (ac.size[{R - 1}] - c0 < {L} ? ac.size[{R - 1}] - c0 : {L});")
    sc = [f"ac.start[{a}] >= 0 && ac.start[{a}] < ac.size[{a}]" for a, kd in enumerate(kinds) if kd == "scalar"]
    em.pre(f"  const bool sc_ok = {' && '.join(sc) if sc else 'true'};")
    em.pre(f"  const bool fast = ac.stride[{R - 1}] == 1 && c0 >= 0;")
    base = " + ".join([f"ac.start[{a}] * ac.stride[{a}]" for a, kd in enumerate(kinds) if kd == "scalar"] + ["c0"])
    return base


def _dma_prologue(em, kinds, shape, rows_axis, outer):
    """Lines computing c0/len/fast/sc_ok/rlo/rhi/full from `ac`."""
    R = len(kinds)
    L = shape[-1]
    last = R - 1
    em.pre(f"  const int64_t c0 = ac.start[{last}];")
    em.pre(f"  const int64_t len = c0 >= ac.size[{last}] ? 0 : (ac.size[{last}] - c0 < {L} ? ac.size[{last}] - c0 : {L});")
    fast = f"ac.stride[{last}] == 1 && c0 >= 0"
    if rows_axis is not None:
        fast += f" && ac.stride[{rows_axis}] >= len"
    em.pre(f"  const bool fast = {fast};")
    sc = [f"ac.start[{a}] >= 0 && ac.start[{a}] < ac.size[{a}]" for a, kd in enumerate(kinds) if kd == "scalar"]
    em.pre(f"  const bool sc_ok = {' && '.join(sc) if sc else 'true'};")
    if rows_axis is not None:
        nr = shape[-2]
        em.pre(f"  const int64_t r0 = ac.start[{rows_axis}];")
        em.pre("  const int64_t rlo = r0 < 0 ? -r0 : 0;")
        em.pre(f"  const int64_t rhi_ = ac.size[{rows_axis}] - r0 < {nr} ? ac.size[{rows_axis}] - r0 : {nr};")
        em.pre("  const int64_t rhi = rhi_ < rlo ? rlo : rhi_;")
    else:
        em.pre("  const int64_t rlo = 0, rhi = 1;")
    full = f"sc_ok && len == {L} && rlo == 0 && rhi == {shape[-2] if rows_axis is not None else 1}"
    for a, n in outer:
        full += f" && ac.start[{a}] >= 0 && ac.start[{a}] + {n} <= ac.size[{a}]"
    em.pre(f"  const bool full = {full};")


def _outer_loops(em, outer, shape, body):
    """Nested loops over the outer tile axes (rank > 2), skipping lanes out of bounds; `body`
    receives (GM offset expr, UB row index expr of the block's first row)."""
    rows_per = shape[-2] if len(shape) >= 2 else 1
    depth = 0
    lin = "0"
    goff = []
    for k, (a, n) in enumerate(outer):
        v = f"o{k}"
        em.pre("  " * (depth + 1) + f"for (int32_t {v} = 0; {v} < {n}; ++{v}) {{")
        depth += 1
        em.pre("  " * (depth + 1) + f"if (ac.start[{a}] + {v} < 0 || ac.start[{a}] + {v} >= ac.size[{a}]) continue;")
        lin = f"({lin}) * {n} + {v}"
        goff.append(f"(ac.start[{a}] + {v}) * ac.stride[{a}]")
    body(" + ".join(goff) if goff else "0", f"({lin}) * {rows_per}", "  " * (depth + 1))
    for _ in outer:
        depth -= 1
        em.pre("  " * (depth + 1) + "}")


def _base_offset(kinds, rows_axis, outer) -> str:
    """GM offset of the first in-bounds row's first lane, without the outer axes."""
    parts = []
    skip = {a for a, _ in outer}
    for a, kd in enumerate(kinds):
        if a in skip:
            continue
        if a == rows_axis:
            parts.append(f"(r0 + rlo) * ac.stride[{a}]")
        elif a == len(kinds) - 1:
            parts.append("c0")
        else:
            parts.append(f"ac.start[{a}] * ac.stride[{a}]")
    return " + ".join(parts)


# ---------------------------------------------------------------- loads

def load(em, op: Op):
    tensor, kinds, idx, _, mask = _parts(em, op, False)
    r = op.result
    dt = tensor.type.dtype
    S, tag = cexpr.storage(dt), cexpr.tag(dt)
    other = op.attrs["other"]
    if not em.is_tile(r):
        return _scalar_load(em, op, tensor, kinds, idx, mask)
    name = em.name(r)
    shape = r.type.shape
    n = r.type.numel
    fillv = cexpr.fill_value(0 if other is None else other, dt)
    root = em.plan.roots[r.uid]
    geo = _dma_geometry(kinds, shape)
    isz = cexpr.itemsize(dt)
    L = shape[-1]
    aligned = row_aligned(r.type)
    rows_total = n // L
    P = L if aligned else ceil32(L * isz) // isz
    q = None
    if root.kind == "in":
        q = em.queue(("in", r.uid), "VECIN", root.bytes, f"{name}: {r.type}", op.loc)
        em.pre(f"AscendC::LocalTensor<{S}> {name} = {q}.AllocTensor<{S}>();")
    else:
        em.pre(f"AscendC::LocalTensor<{S}> {name} = calc.GetWithOffset<{S}>({n}, {root.offset});")
    em.pre("{")
    em.pre("  " + _access(em, tensor, kinds, idx))
    gaxis = _gather_rows(kinds, shape, dt) if geo is None else None
    if gaxis is not None:
        base = _row_dma(em, kinds, shape)
        gidx = em.n(idx[gaxis])
        em.pre("  if (fast) {   // one DataCopyPad per gathered row; the index is read on the scalar unit")
        _fill_lines(em, name, dt, fillv, n, "    ")
        em.pre(f"    for (int32_t row = 0; row < {shape[0]}; ++row) {{")
        em.pre(f"      const int64_t gi = {gidx}.GetValue(row);")
        em.pre(f"      if (!sc_ok || len <= 0 || gi < 0 || gi >= ac.size[{gaxis}]) continue;")
        em.pre("      const uint32_t bytes = static_cast<uint32_t>(len * %d);" % isz)
        em.vector_ops.add("DataCopyPad")
        em.pre(f"      AscendC::DataCopyPad({name}[row * {L}], {em.n(tensor)}Gm[{base} + gi * ac.stride[{gaxis}]], "
               f"AscendC::DataCopyExtParams(1, bytes, 0, 0, 0), AscendC::DataCopyPadExtParams<{S}>(true, 0, "
               f"static_cast<uint8_t>(((bytes + 31) / 32 * 32 - bytes) / {isz}), {fillv}));")
        em.pre("    }")
        if mask is not None:
            _mask_fill(em, name, mask, shape, fillv, "    ")
        em.pre("  } else {")
        em.scalar_unit.add("load")
        em.pre("    // scalar unit: strided rows, lane by lane")
        _generic_load(em, f"{em.n(tensor)}Gm", name, tag, shape, mask, fillv, "    ")
        em.pre("  }")
    elif geo is None:
        em.scalar_unit.add("load")
        em.pre("  // scalar unit: gather / non-row access, lane by lane")
        _generic_load(em, f"{em.n(tensor)}Gm", name, tag, shape, mask, fillv)
    else:
        rows_axis, outer = geo
        _dma_prologue(em, kinds, shape, rows_axis, outer)
        em.pre("  if (fast) {")
        if aligned:
            stage = name
        else:
            stage = em.fresh(f"{name}_rows")
            sbytes = rows_total * P * isz
            if root.kind == "in" or em.mode == "pool":
                em.pre(f"    AscendC::LocalTensor<{S}> {stage} = {em.scratch(S, rows_total * P)};")
            else:
                sq = em.queue(("stage", r.uid), "VECIN", sbytes, f"{name} rows (pitched)", op.loc)
                em.pre(f"    AscendC::LocalTensor<{S}> {stage} = {sq}.AllocTensor<{S}>();")
        em.pre("    if (!full) {")
        _fill_lines(em, stage, dt, fillv, rows_total * P, "      ")
        em.pre("    }")
        em.pre("    if (sc_ok && len > 0 && rhi > rlo) {")
        base = _base_offset(kinds, rows_axis, outer)
        gap_ok = f"((ac.stride[{rows_axis}] - {L}) * {isz}) % 32 == 0" if rows_axis is not None else "true"

        def body(goff, row0, ind):
            g = f"{base} + {goff}" if goff != "0" else base
            u = f"({row0} + rlo) * {P}"
            em.vector_ops.add("DataCopyPad")
            em.pre(f"{ind}    const int64_t g = {g};")
            em.pre(f"{ind}    const uint32_t u = static_cast<uint32_t>({u});")
            if aligned:
                em.vector_ops.add("DataCopy")
                gap = f"static_cast<uint16_t>((ac.stride[{rows_axis}] - {L}) * {isz} / 32)" if rows_axis is not None else "0"
                em.pre(f"{ind}    if (full && {gap_ok}) {{  // whole 32 B blocks: plain DataCopy")
                em.pre(f"{ind}      AscendC::DataCopy({stage}[u], {em.n(tensor)}Gm[g], AscendC::DataCopyParams("
                       f"static_cast<uint16_t>(rhi - rlo), {L * isz // 32}, {gap}, 0));")
                em.pre(f"{ind}    }} else {{")
            em.pre(f"{ind}      const uint32_t bytes = static_cast<uint32_t>(len * {isz});")
            em.pre(f"{ind}      AscendC::DataCopyPad({stage}[u], {em.n(tensor)}Gm[g], AscendC::DataCopyExtParams("
                   f"static_cast<uint16_t>(rhi - rlo), bytes, static_cast<uint32_t>(({_row_stride(rows_axis)} - len) * {isz}), "
                   f"({P * isz} - (bytes + 31) / 32 * 32) / 32, 0), AscendC::DataCopyPadExtParams<{S}>(true, 0, "
                   f"static_cast<uint8_t>(((bytes + 31) / 32 * 32 - bytes) / {isz}), {fillv}));")
            if aligned:
                em.pre(f"{ind}    }}")
        _outer_loops(em, outer, shape, body)
        em.pre("    }")
        if not aligned:
            em.scalar_unit.add("load")
            sq = em.queue_of.get(("stage", r.uid))
            if sq is not None:
                em.pre(f"    {sq}.EnQue({stage});")
                em.pre(f"    {stage} = {sq}.DeQue<{S}>();")
            em.pre(f"    k31::Unpitch({name}, {stage}, {rows_total}, {L}, {P});  // scalar unit: rows below 32 B")
            if sq is not None:
                em.pre(f"    {sq}.FreeTensor({stage});")
        if mask is not None:
            _mask_fill(em, name, mask, shape, fillv, "    ")
        em.pre("  } else {")
        em.scalar_unit.add("load")
        em.pre("    // scalar unit: strided or negative-start access, lane by lane")
        _generic_load(em, f"{em.n(tensor)}Gm", name, tag, shape, mask, fillv, "    ")
        em.pre("  }")
    em.pre("}")
    if q is not None:
        em.pre(f"{q}.EnQue({name});")
        em.pre(f"{name} = {q}.DeQue<{S}>();")


def _row_stride(rows_axis):
    return f"ac.stride[{rows_axis}]" if rows_axis is not None else "len"


def _fill_lines(em, name, dt, fillv, count, ind):
    size = cexpr.itemsize(dt)
    S = cexpr.storage(dt)
    if size in (2, 4) and dt is not D.bool_:
        em.vector_ops.add("Duplicate")
        em.pre(f"{ind}AscendC::Duplicate<{S}>({name}, {fillv}, {count});")
    else:
        em.pre(f"{ind}for (int32_t l = 0; l < {count}; ++l) {name}.SetValue(l, {fillv});  // scalar unit: 1/8-byte fill")


def _mask_fill(em, name, mask, shape, fillv, ind):
    em.scalar_unit.add("load")
    if em.is_tile(mask):
        em.pre(f"{ind}k31::MaskFill({name}, {em.n(mask)}, {strides4(mask.type.shape, shape)}, {sh4(shape)}, {fillv});"
               "  // scalar unit: mask")
    else:
        n = 1
        for d in shape:
            n *= d
        em.pre(f"{ind}if (!({em.n(mask)})) for (int32_t l = 0; l < {n}; ++l) {name}.SetValue(l, {fillv});")


def _generic_load(em, gm, name, tag, shape, mask, fillv, ind="  "):
    if mask is not None and em.is_tile(mask):
        m, sm = f"&{em.n(mask)}", strides4(mask.type.shape, shape)
    else:
        m, sm = NULL_MASK, "k31::St{{0, 0, 0, 0}}"
    em.pre(f"{ind}k31::LoadLanes<{tag}>({name}, {gm}, ac, {sh4(shape)}, {m}, {sm}, {fillv});")
    if mask is not None and not em.is_tile(mask):
        _mask_fill(em, name, mask, shape, fillv, ind)


def _scalar_load(em, op, tensor, kinds, idx, mask):
    r = op.result
    dt = tensor.type.dtype
    other = op.attrs["other"]
    name = em.name(r)
    t = em.n(tensor)
    fill = cexpr.literal(0 if other is None else other, dt) if not dt.is_storage_only else \
        cexpr.fill_value(0 if other is None else other, dt)
    conds, offs = [], []
    for a, v in enumerate(idx):
        conds.append(f"int64_t({em.n(v)}) >= 0 && int64_t({em.n(v)}) < td.{t}_size[{a}]")
        offs.append(f"int64_t({em.n(v)}) * td.{t}_stride[{a}]")
    if mask is not None:
        conds.append(f"({em.n(mask)})")
    em.pre(f"{em.C(r)} {name} = {fill};  // scalar unit: one element")
    em.pre(f"if ({' && '.join(conds) or 'true'}) {name} = {cexpr.tag(dt)}::ld({t}Gm.GetValue({' + '.join(offs) or '0'}));")


# ---------------------------------------------------------------- stores

def store(em, op: Op):
    tensor, kinds, idx, value, mask = _parts(em, op, True)
    dt = tensor.type.dtype
    S, tag = cexpr.storage(dt), cexpr.tag(dt)
    t = em.n(tensor)
    tile_axes = [k for k in kinds if k != "scalar"]
    if not tile_axes:
        conds, offs = [], []
        for a, v in enumerate(idx):
            conds.append(f"int64_t({em.n(v)}) >= 0 && int64_t({em.n(v)}) < td.{t}_size[{a}]")
            offs.append(f"int64_t({em.n(v)}) * td.{t}_stride[{a}]")
        if mask is not None:
            conds.append(f"({em.n(mask)})")
        em.pre(f"if ({' && '.join(conds) or 'true'}) {t}Gm.SetValue({' + '.join(offs) or '0'}, "
               f"{tag}::st({em.n(value)}));  // scalar unit: one element")
        return
    shape = tuple(parse_index_kind(k)[1] if parse_index_kind(k)[0] == "span" else None for k in tile_axes)
    gshape = []
    gi = iter(idx)
    for k, v in zip(kinds, idx):
        kk, size = parse_index_kind(k)
        if kk == "span":
            gshape.append(size)
        elif kk == "gather":
            gshape.append(v.type.shape[0])
    shape = tuple(gshape)
    del gi
    n = 1
    for d in shape:
        n *= d
    vname = em.n(value) if em.is_tile(value) else None
    root = em.plan.root_of(value) if em.is_tile(value) else None
    out_kind = root is not None and root.kind == "out"
    if not em.is_tile(value) or value.type.shape != shape:
        from k31dsl.dsl.ir import TileType, Value
        tmp = Value(TileType(dt, shape))
        vname = em.fresh("bcast")
        em.pre(f"AscendC::LocalTensor<{S}> {vname} = {em.scratch(S, n)};")
        if em.is_tile(value):
            em.scalar_unit.add("store")
            em.pre(f"k31::Map1<{tag}, {tag}>({vname}, {em.n(value)}, {sh4(shape)}, {strides4(value.type.shape, shape)}, "
                   f"[=]({cexpr.compute(dt)} v) {{ return v; }});  // scalar unit: broadcast the stored value")
        else:
            _fill(em, vname, tmp, em.n(value), n)
    geo = None if mask is not None else _dma_geometry(kinds, shape)
    gaxis = _gather_rows(kinds, shape, dt) if geo is None and mask is None else None
    em.pre("{")
    em.pre("  " + _access(em, tensor, kinds, idx))
    if gaxis is not None:
        _scatter_rows(em, tensor, kinds, idx, shape, gaxis, vname, out_kind, root, S, tag, n, op)
        em.pre("}")
        return
    if geo is None:
        em.scalar_unit.add("store")
        m, sm = (f"&{em.n(mask)}", strides4(mask.type.shape, shape)) if mask is not None and em.is_tile(mask) else \
            (NULL_MASK, "k31::St{{0, 0, 0, 0}}")
        cond = f"if ({em.n(mask)}) " if mask is not None and not em.is_tile(mask) else ""
        em.pre("  // scalar unit: scatter / masked store, lane by lane")
        em.pre(f"  {cond}k31::StoreLanes<{tag}>({t}Gm, {vname}, ac, {sh4(shape)}, {m}, {sm});")
        if out_kind:
            em.pre(f"  {em.queue_of[('out', root.uid)]}.FreeTensor({vname});")
        em.pre("}")
        return
    rows_axis, outer = geo
    isz = cexpr.itemsize(dt)
    L = shape[-1]
    aligned = (L * isz) % 32 == 0
    P = L if aligned else ceil32(L * isz) // isz
    rows_total = n // L
    _dma_prologue(em, kinds, shape, rows_axis, outer)
    em.pre("  if (fast) {")
    staged = em.fresh("st")
    if out_kind:
        q = em.queue_of[("out", root.uid)]
        em.pre(f"    {q}.EnQue({vname});")
        em.pre(f"    AscendC::LocalTensor<{S}> {staged} = {q}.DeQue<{S}>();")
    elif em.mode == "pool":
        em.pre(f"    AscendC::LocalTensor<{S}> {staged} = {em.scratch(S, rows_total * P)};")
        q = None
    else:
        q = em.queue(("out", id(op)), "VECOUT", rows_total * P * isz, f"store to {t} (staging)", op.loc)
        em.pre(f"    AscendC::LocalTensor<{S}> {staged} = {q}.AllocTensor<{S}>();")
    if not out_kind:
        if aligned:
            if (n * isz) % 32 == 0:
                em.pre(f"    AscendC::DataCopy({staged}, {vname}, {n});")
            else:
                em.pre(f"    k31::Copy({staged}, {vname}, {n});")
        else:
            em.scalar_unit.add("store")
            em.pre(f"    k31::Pitch({staged}, {vname}, {rows_total}, {L}, {P});  // scalar unit: rows below 32 B")
        if q is not None:
            em.pre(f"    {q}.EnQue({staged});")
            em.pre(f"    {staged} = {q}.DeQue<{S}>();")
    em.pre("    if (sc_ok && len > 0 && rhi > rlo) {")
    base = _base_offset(kinds, rows_axis, outer)

    def body(goff, row0, ind):
        g = f"{base} + {goff}" if goff != "0" else base
        em.vector_ops.add("DataCopyPad")
        em.pre(f"{ind}    const int64_t g = {g};")
        em.pre(f"{ind}    const uint32_t u = static_cast<uint32_t>(({row0} + rlo) * {P});")
        em.pre(f"{ind}    const uint32_t bytes = static_cast<uint32_t>(len * {isz});")
        em.pre(f"{ind}    AscendC::DataCopyPad({t}Gm[g], {staged}[u], AscendC::DataCopyExtParams("
               f"static_cast<uint16_t>(rhi - rlo), bytes, ({P * isz} - (bytes + 31) / 32 * 32) / 32, "
               f"static_cast<uint32_t>(({_row_stride(rows_axis)} - len) * {isz}), 0));")
    _outer_loops(em, outer, shape, body)
    em.pre("    }")
    if out_kind or q is not None:
        qq = em.queue_of[("out", root.uid)] if out_kind else q
        em.pre(f"    {qq}.FreeTensor({staged});")
    _lane_store_fallback(em, t, vname, shape, tag, out_kind, root, "strided or negative-start access")
    em.pre("}")


def _scatter_rows(em, tensor, kinds, idx, shape, gaxis, vname, out_kind, root, S, tag, n, op):
    """One DataCopyPad per scattered row (rows in index order: a repeated index keeps the last)."""
    t = em.n(tensor)
    dt = tensor.type.dtype
    isz = cexpr.itemsize(dt)
    L = shape[-1]
    base = _row_dma(em, kinds, shape)
    em.pre("  if (fast) {   // one DataCopyPad per scattered row; the index is read on the scalar unit")
    if out_kind:
        q = em.queue_of[("out", root.uid)]
        staged = em.fresh("st")
        em.pre(f"    {q}.EnQue({vname});")
        em.pre(f"    AscendC::LocalTensor<{S}> {staged} = {q}.DeQue<{S}>();")
    else:
        staged = vname
    em.vector_ops.add("DataCopyPad")
    em.pre(f"    for (int32_t row = 0; row < {shape[0]}; ++row) {{")
    em.pre(f"      const int64_t gi = {em.n(idx[gaxis])}.GetValue(row);")
    em.pre(f"      if (!sc_ok || len <= 0 || gi < 0 || gi >= ac.size[{gaxis}]) continue;")
    em.pre(f"      AscendC::DataCopyPad({t}Gm[{base} + gi * ac.stride[{gaxis}]], {staged}[row * {L}], "
           f"AscendC::DataCopyExtParams(1, static_cast<uint32_t>(len * {isz}), 0, 0, 0));")
    em.pre("    }")
    if out_kind:
        em.pre(f"    {em.queue_of[('out', root.uid)]}.FreeTensor({staged});")
    _lane_store_fallback(em, t, vname, shape, tag, out_kind, root, "strided rows")


def _lane_store_fallback(em, t, vname, shape, tag, out_kind, root, why: str):
    """The `else` arm of a DMA store: the tile goes out lane by lane on the scalar unit."""
    em.pre("  } else {")
    em.scalar_unit.add("store")
    em.pre(f"    // scalar unit: {why}, lane by lane")
    em.pre(f"    k31::StoreLanes<{tag}>({t}Gm, {vname}, ac, {sh4(shape)}, {NULL_MASK}, k31::St{{{{0, 0, 0, 0}}}});")
    if out_kind:
        em.pre(f"    {em.queue_of[('out', root.uid)]}.FreeTensor({vname});")
    em.pre("  }")


RULES = {"load": load, "store": store}

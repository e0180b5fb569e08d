"""Warp- and CTA-wide instructions: shuffles, votes, reductions, ldmatrix / stmatrix, mma, barriers."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .parse import Instr
from .scalar_ops import instr_type
from .values import Unsupported, dests, gather, imm, is_reg, scatter, to_bits, to_typed

if TYPE_CHECKING:
    from .machine import _CTA


def _shfl(cta: _CTA, ins: Instr):
    mode = ins.parts[2]
    dests = ins.args[0].split("|")
    a = cta.bits(ins.args[1]) if is_reg(ins.args[1]) else to_bits(imm(ins.args[1], "b32", cta.n), "b32")
    b = cta.val(ins.args[2], "u32").astype(np.int64)
    c = cta.val(ins.args[3], "u32").astype(np.int64)
    lane = np.arange(cta.n) % 32
    warp0 = np.arange(cta.n) - lane
    bval, cval, seg = b & 0x1F, c & 0x1F, (c >> 8) & 0x1F
    max_lane = (lane & seg) | (cval & ~seg)
    min_lane = lane & seg
    if mode == "up":
        j, ok = lane - bval, lane - bval >= max_lane
    elif mode == "down":
        j, ok = lane + bval, lane + bval <= max_lane
    elif mode == "bfly":
        j, ok = lane ^ bval, (lane ^ bval) <= max_lane
    elif mode == "idx":
        j = min_lane | (bval & ~seg)
        ok = j <= max_lane
    else:
        raise Unsupported(f"shfl mode {mode}")
    j = np.where(ok, j, lane)
    cta.set(dests[0], a[warp0 + j], "b64")
    if len(dests) > 1:
        cta.set(dests[1], ok, "pred")


def _vote(cta: _CTA, ins: Instr):
    mode, ty = ins.parts[2], instr_type(ins)
    p = cta.val(ins.args[1], "pred") & cta.active
    warp = np.arange(cta.n) // 32
    if mode == "ballot":
        out = np.zeros(cta.n, np.uint64)
        for w_ in np.unique(warp):
            lanes = np.nonzero(warp == w_)[0]
            out[lanes] = sum(1 << int(i % 32) for i in lanes if p[i])
        cta.set(ins.args[0], out, "b64")
        return
    res = np.zeros(cta.n, bool)
    for w_ in np.unique(warp):
        lanes = (warp == w_) & cta.active
        res[warp == w_] = p[lanes].any() if mode == "any" else p[lanes].all()
    cta.set(ins.args[0], res, "pred")
    del ty


def _redux(cta: _CTA, ins: Instr):
    """redux.sync.op.type d, a, membermask: the op over the warp's active lanes, to each of them."""
    op, ty = ins.parts[2], instr_type(ins)
    a = cta.val(ins.args[1], ty if ty != "b32" else "u32").astype(np.int64)
    f = {"add": np.sum, "min": np.min, "max": np.max, "and": np.bitwise_and.reduce,
         "or": np.bitwise_or.reduce, "xor": np.bitwise_xor.reduce}[op]
    out = np.zeros(cta.n, np.int64)
    for w0 in range(0, cta.n, 32):
        lanes = np.zeros(cta.n, bool)
        lanes[w0:w0 + 32] = True
        lanes &= cta.active
        if lanes.any():
            out[lanes] = f(a[lanes])
    cta.set(ins.args[0], (out & 0xFFFFFFFF).astype(np.uint64), "b64")


def _matrix_cells(lane: int, trans: bool) -> list[tuple[int, int]]:
    """The two (row, col) cells of an 8x8 b16 matrix that `lane` holds in ldmatrix / stmatrix
    (first = the register's low half)."""
    r, c = lane // 4, 2 * (lane % 4)
    return [(c, r), (c + 1, r)] if trans else [(r, c), (r, c + 1)]


def _ldst_matrix(cta: _CTA, ins: Instr):
    """ldmatrix / stmatrix .m8n8.x{1,2,4}[.trans].shared.b16: per warp, matrix i's eight row
    addresses come from lanes 8i..8i+7; each lane holds two b16 cells of each matrix."""
    parts = ins.parts
    count = int(next(p for p in parts if p.startswith("x"))[1:])
    trans = "trans" in parts
    load = parts[0] == "ldmatrix"
    regs = dests(ins.args[0] if load else ins.args[1])
    addr = cta.address(ins.args[1] if load else ins.args[0])
    values = {r: cta.bits(r).copy() for r in regs} if not load else {r: np.zeros(cta.n, np.uint64) for r in regs}
    for w0 in range(0, cta.n, 32):
        if not cta.active[w0:w0 + 32].any():
            continue
        for i, r in enumerate(regs[:count]):
            rows = addr[w0 + 8 * i: w0 + 8 * i + 8]
            for lane in range(32):
                for half, (row, col) in enumerate(_matrix_cells(lane, trans)):
                    where = np.array([rows[row] + 2 * col], np.int64)
                    if load:
                        cta.touch_shared(where, 2, np.array([w0 + lane]), False, ins.op)
                        cell = gather(cta.shared, where, 2)[0]
                        values[r][w0 + lane] |= cell << np.uint64(16 * half)
                    else:
                        cell = (values[r][w0 + lane] >> np.uint64(16 * half)) & np.uint64(0xFFFF)
                        cta.touch_shared(where, 2, np.array([w0 + lane]), True, ins.op, np.array([cell], np.uint64))
                        scatter(cta.shared, where, 2, np.array([cell], np.uint64))
    if load:
        for r in regs:
            cta.set(r, values[r], "b64")


def _mma(cta: _CTA, ins: Instr):
    """mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, per warp: D = A B + C with
    the fragment layout of the PTX manual (lane = 4 * group + t). Products and sums in f64, one
    rounding to f32 (the tensor core's own summation order is not specified)."""
    parts = ins.parts
    if "m16n8k16" not in parts or parts[-4] != "f32":
        raise Unsupported(f"mma shape / types {ins.op}")
    ab = parts[-3]
    if ab not in ("f16", "bf16") or parts[-1] != "f32":
        raise Unsupported(f"mma types {ins.op}")
    d, a, b, c = (dests(x) for x in ins.args)
    halves = lambda reg, h: to_typed(cta.bits(reg) >> np.uint64(16 * h), ab).astype(np.float64)  # noqa: E731
    cvals = [cta.val(x, "f32").astype(np.float64) for x in c]
    out = [np.zeros(cta.n, np.float64) for _ in range(4)]
    for w0 in range(0, cta.n, 32):
        A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
        for lane in range(32):
            g, t, i = lane // 4, lane % 4, w0 + lane
            for r, (row, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
                A[row, col], A[row, col + 1] = halves(a[r], 0)[i], halves(a[r], 1)[i]
            for r, k0 in enumerate([2 * t, 2 * t + 8]):
                B[k0, g], B[k0 + 1, g] = halves(b[r], 0)[i], halves(b[r], 1)[i]
            for r, (row, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                C[row, col] = cvals[r][i]
        D = A @ B + C
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for r, (row, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                out[r][w0 + lane] = D[row, col]
    for reg, v in zip(d, out):
        cta.set(reg, v.astype(np.float32), "f32")


def _barrier(cta: _CTA, ins: Instr):
    if "warp" not in ins.parts:                   # bar.sync / barrier.sync: the whole CTA
        cta.epoch += 1


def _activemask(cta: _CTA, ins: Instr):
    _vote(cta, Instr("vote.sync.ballot.b32", [ins.args[0], "1"]))



WARP_OPS = {"shfl": _shfl, "vote": _vote, "redux": _redux, "ldmatrix": _ldst_matrix, "stmatrix": _ldst_matrix,
            "mma": _mma, "bar": _barrier, "barrier": _barrier, "activemask": _activemask}

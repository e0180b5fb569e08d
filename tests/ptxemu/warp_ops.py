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
    mode = ins.parts[2]
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


def _tf32(bits: np.ndarray) -> np.ndarray:
    """A tf32 operand: the f32 in the register with its low 13 mantissa bits ignored."""
    return (bits.astype(np.uint64) & np.uint64(0xFFFFE000)).astype(np.uint32).view(np.float32).astype(np.float64)


def _mma(cta: _CTA, ins: Instr):
    """mma.sync.aligned m16n8k16 (f16 / bf16) and m16n8k8 (tf32), row.col, f32 accumulators, per
    warp: D = A B + C with the fragment layout of the PTX manual (lane = 4 group + t). Products
    and sums in f64, one rounding to f32 (the tensor core's summation order is not specified)."""
    parts = ins.parts
    ab = parts[-3]
    shape = "m16n8k16" if "m16n8k16" in parts else "m16n8k8" if "m16n8k8" in parts else None
    if parts[-4] != "f32" or parts[-1] != "f32" or (shape, ab) not in (
            ("m16n8k16", "f16"), ("m16n8k16", "bf16"), ("m16n8k8", "tf32")):
        raise Unsupported(f"mma form {ins.op}")
    d, a, b, c = (dests(x) for x in ins.args)
    cvals = [cta.val(x, "f32").astype(np.float64) for x in c]
    out = [np.zeros(cta.n, np.float64) for _ in range(4)]
    kdim = 16 if shape == "m16n8k16" else 8

    def cells(lane):
        """(A cells per register, B cells per register) as lists of (row, col) / (k, n)."""
        g, t = lane // 4, lane % 4
        if ab == "tf32":
            return ([[(g, t)], [(g + 8, t)], [(g, t + 4)], [(g + 8, t + 4)]], [[(t, g)], [(t + 4, g)]])
        return ([[(g, 2 * t), (g, 2 * t + 1)], [(g + 8, 2 * t), (g + 8, 2 * t + 1)],
                 [(g, 2 * t + 8), (g, 2 * t + 9)], [(g + 8, 2 * t + 8), (g + 8, 2 * t + 9)]],
                [[(2 * t, g), (2 * t + 1, g)], [(2 * t + 8, g), (2 * t + 9, g)]])

    def value(reg, h):
        if ab == "tf32":
            return _tf32(cta.bits(reg))
        return to_typed(cta.bits(reg) >> np.uint64(16 * h), ab).astype(np.float64)
    a_vals = [[value(r, h) for h in range(2)] for r in a]
    b_vals = [[value(r, h) for h in range(2)] for r in b]
    for w0 in range(0, cta.n, 32):
        A, B, C = np.zeros((16, kdim)), np.zeros((kdim, 8)), np.zeros((16, 8))
        for lane in range(32):
            i = w0 + lane
            a_cells, b_cells = cells(lane)
            for r, cs in enumerate(a_cells):
                for h, (row, col) in enumerate(cs):
                    A[row, col] = a_vals[r][h][i]
            for r, cs in enumerate(b_cells):
                for h, (k, n) in enumerate(cs):
                    B[k, n] = b_vals[r][h][i]
            g, t = lane // 4, lane % 4
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




# ---------------------------------------------------------------- wgmma (sm_90 warpgroup MMA)

_SWIZZLE_BYTES = {1: 128, 2: 64, 3: 32}


def _descriptor_addresses(desc: int, mn: int, k: int, esize: int, mn_major: bool) -> np.ndarray:
    """Shared byte addresses [mn, k] of a wgmma operand from its 64-bit matrix descriptor: start
    (bits 0-13, x16), leading (16-29) and stride (32-45) byte offsets, swizzle mode (62-63).
    Swizzled layouts: rows of T bytes (128 / 64 / 32), eight to an atom; the stride offset steps
    between atoms along the 8-row dimension, the leading offset between atoms along the T-byte one;
    the address's 16-byte chunk bits are XORed with its bits 7 and up, as the hardware does."""
    start, lbo, sbo = (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4
    mode, base = (desc >> 62) & 3, (desc >> 49) & 7
    if base or mode == 0:
        raise Unsupported(f"wgmma descriptor without swizzle or with a base offset ({desc:#x})")
    t = _SWIZZLE_BYTES[mode]
    per = t // esize
    m = np.arange(mn)[:, None]
    kk = np.arange(k)[None, :]
    if mn_major:                                     # MN contiguous: rows of T bytes along MN
        addr = start + (kk // 8) * sbo + (kk % 8) * t + (m // per) * lbo + (m % per) * esize
    else:                                            # K contiguous
        addr = start + (m // 8) * sbo + (m % 8) * t + (kk // per) * lbo + (kk % per) * esize
    return addr ^ (((addr >> 7) & (t // 16 - 1)) << 4)


def _element_values(raw: np.ndarray, ty: str) -> np.ndarray:
    """Elements of PTX type `ty` (16-bit or fp8) from their raw bits, as float64."""
    if ty in ("e4m3", "e5m2"):
        import ml_dtypes
        f8 = ml_dtypes.float8_e4m3fn if ty == "e4m3" else ml_dtypes.float8_e5m2
        return (raw.astype(np.uint64) & np.uint64(0xFF)).astype(np.uint8).view(f8).astype(np.float64)
    return to_typed(raw, ty).astype(np.float64)


def _wgmma(cta: _CTA, ins: Instr):
    """wgmma.mma_async m64nNk16 ({f16, bf16}) and m64nNk32 ({e4m3, e5m2}) with f32 accumulators,
    A from registers or a descriptor, B from a descriptor; done at issue (fence / commit_group /
    wait_group only order it)."""
    parts = ins.parts
    if parts[1] in ("fence", "commit_group", "wait_group"):
        return
    shape = next((p for p in parts if p.startswith("m64n")), "")
    n, kdim = (int(v) for v in shape[4:].split("k")) if shape else (0, 0)
    dty, aty, bty = parts[-3:]
    esize = 2 if aty in ("f16", "bf16") else 1
    if dty != "f32" or not ((aty == bty and aty in ("f16", "bf16") and kdim == 16) or
                            (aty in ("e4m3", "e5m2") and bty in ("e4m3", "e5m2") and kdim == 32)):
        raise Unsupported(f"wgmma form {ins.op}")
    d_regs = dests(ins.args[0])
    a_in_regs = ins.args[1].strip().startswith("{")
    rest = ins.args[3:]
    accumulate = cta.val(rest[0], "pred") if is_reg(rest[0]) else np.full(cta.n, int(rest[0], 0) != 0)
    scale_a, scale_b = int(rest[1], 0), int(rest[2], 0)
    trans_a = 0 if a_in_regs or esize == 1 else int(rest[3], 0)
    trans_b = 0 if esize == 1 else int(rest[-1], 0)
    per_reg = 4 // esize                         # elements of A in one 32-bit register
    for g0 in range(0, cta.n, 128):
        lanes = slice(g0, g0 + 128)
        if not cta.active[lanes].any():
            continue
        first = g0 + int(np.argmax(cta.active[lanes]))
        bdesc = int(cta.bits(ins.args[2])[first])
        addr_b = _descriptor_addresses(bdesc, n, kdim, esize, bool(trans_b))       # [n, k]
        B = _element_values(gather(cta.shared, addr_b.ravel(), esize), bty).reshape(n, kdim).T
        A = np.zeros((64, kdim))
        if a_in_regs:
            a_regs = dests(ins.args[1])
            for lane in range(128):
                w, g, t = lane // 32, (lane % 32) // 4, lane % 4
                step = per_reg * t
                for r, (row, col) in enumerate([(g, step), (g + 8, step), (g, step + kdim // 2),
                                                (g + 8, step + kdim // 2)]):
                    word = cta.bits(a_regs[r])[g0 + lane:g0 + lane + 1]
                    for e in range(per_reg):
                        A[16 * w + row, col + e] = _element_values(word >> np.uint64(8 * esize * e), aty)[0]
        else:
            adesc = int(cta.bits(ins.args[1])[first])
            addr_a = _descriptor_addresses(adesc, 64, kdim, esize, bool(trans_a))
            A = _element_values(gather(cta.shared, addr_a.ravel(), esize), aty).reshape(64, kdim)
        D = scale_a * A @ (scale_b * B)
        lane = np.arange(128)
        w, g, t = lane // 32, (lane % 32) // 4, lane % 4
        act = cta.active[lanes]
        for j in range(n // 8):
            for r, (row, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                reg = d_regs[4 * j + r]
                bits = cta.bits(reg).copy()
                old = np.where(accumulate[lanes], to_typed(bits[lanes], "f32").astype(np.float64), 0.0)
                value = (D[16 * w + row, 8 * j + col] + old).astype(np.float32)
                bits[lanes] = np.where(act, value.view(np.uint32).astype(np.uint64), bits[lanes])
                cta.regs[reg] = bits


WARP_OPS = {"shfl": _shfl, "vote": _vote, "redux": _redux, "ldmatrix": _ldst_matrix, "stmatrix": _ldst_matrix,
            "mma": _mma, "bar": _barrier, "barrier": _barrier, "activemask": _activemask,
            "wgmma": _wgmma}

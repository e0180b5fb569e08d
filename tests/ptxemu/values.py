"""PTX values: typed views of raw register bits, literals, and global memory at fake addresses."""
from __future__ import annotations

import re

import numpy as np


class Unsupported(Exception):
    """An instruction or operand form the emulator does not model."""


class SharedMemoryRace(Exception):
    """Warps touched the same shared-memory bytes with no barrier between (a write and a read or
    two writes): on the GPU the result depends on warp timing."""



WIDTH = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16,
         "b32": 32, "u32": 32, "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64, "f64": 64,
         "pred": 1, "f16x2": 32, "bf16x2": 32, "s16x2": 32, "u16x2": 32, "e4m3x2": 16, "e5m2x2": 16}
NUMPY = {"u8": np.uint8, "s8": np.int8, "b8": np.uint8, "u16": np.uint16, "s16": np.int16, "b16": np.uint16,
         "u32": np.uint32, "s32": np.int32, "b32": np.uint32, "u64": np.uint64, "s64": np.int64,
         "b64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64}
UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def bf16_type():
    import ml_dtypes
    return ml_dtypes.bfloat16


def to_typed(bits: np.ndarray, ty: str) -> np.ndarray:
    """Raw bits (uint64 per thread) as numpy values of PTX type `ty`."""
    w = WIDTH[ty]
    raw = (bits & np.uint64((1 << w) - 1)).astype(UINT[w]) if w < 64 else bits.astype(np.uint64)
    if ty == "bf16":
        return raw.view(bf16_type())
    return raw.view(NUMPY[ty])


def to_bits(values: np.ndarray, ty: str) -> np.ndarray:
    w = WIDTH[ty]
    if ty == "bf16":
        values = np.asarray(values).astype(bf16_type())
    else:
        values = np.asarray(values).astype(NUMPY[ty], copy=False) if ty in NUMPY else values
    return values.view(UINT[w]).astype(np.uint64)


def imm(tok: str, ty: str, n: int) -> np.ndarray:
    t = tok.strip()
    if t.startswith("0f"):
        bits = int(t[2:], 16)
        if not ty.startswith("f"):
            return to_typed(np.full(n, bits, dtype=np.uint64), ty)
        return np.full(n, np.array([bits], np.uint32).view(np.float32)[0], dtype=np.float32).astype(
            NUMPY[ty] if ty in NUMPY else np.float32)
    if t.startswith("0d"):
        bits = int(t[2:], 16)
        if not ty.startswith("f"):                  # mov.b64 of a double literal: its bits
            return to_typed(np.full(n, bits, dtype=np.uint64), ty)
        return np.full(n, np.array([bits], np.uint64).view(np.float64)[0], dtype=np.float64)
    t = t.rstrip("U")
    if ty.startswith("f"):
        return np.full(n, float(t), dtype=NUMPY[ty] if ty != "bf16" else np.float32)
    v = int(t, 0)
    w = WIDTH[ty]
    v &= (1 << w) - 1
    return to_typed(np.full(n, v, dtype=np.uint64), ty)


# ------------------------------------------------------------------------ memory

class Memory:
    """Global memory: byte buffers at fake 64-bit addresses (numpy uint8 views, written in place)."""

    def __init__(self):
        self.regions: list[tuple[int, np.ndarray]] = []
        self._next = 1 << 32

    def add(self, buf: np.ndarray) -> int:
        base = self._next
        self.regions.append((base, buf))
        self._next += ((buf.nbytes >> 12) + 2) << 12
        return base

    def _locate(self, addr: np.ndarray, nbytes: int):
        for base, buf in self.regions:
            inside = (addr >= base) & (addr + nbytes <= base + buf.nbytes)
            if inside.all():
                return buf, (addr - base).astype(np.int64)
        raise Unsupported(f"global access outside every buffer: {[hex(int(a)) for a in addr[:4]]}")

    def read(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        if addr.size == 0:
            return np.zeros(0, np.uint64)
        buf, off = self._locate(addr, nbytes)
        return gather(buf, off, nbytes)

    def write(self, addr: np.ndarray, nbytes: int, bits: np.ndarray):
        if addr.size == 0:
            return
        buf, off = self._locate(addr, nbytes)
        scatter(buf, off, nbytes, bits)


def gather(buf: np.ndarray, off: np.ndarray, nbytes: int) -> np.ndarray:
    out = np.zeros(off.shape, np.uint64)
    for b in range(nbytes):
        out |= buf[off + b].astype(np.uint64) << np.uint64(8 * b)
    return out


def scatter(buf: np.ndarray, off: np.ndarray, nbytes: int, bits: np.ndarray):
    for b in range(nbytes):                         # repeated addresses: the highest thread wins
        buf[off + b] = ((bits >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.uint8)



def is_reg(tok: str) -> bool:
    """%-names, and the bare names inline asm declares (`.reg .s64 t;`); not numbers."""
    return bool(re.match(r"^(%[\w.$]+|[A-Za-z_$][\w$]*)$", tok))


def dests(tok: str) -> list[str]:
    tok = tok.strip()
    return [t.strip() for t in tok[1:-1].split(",")] if tok.startswith("{") else [tok]


def is_signed(ty: str) -> bool:
    return ty.startswith("s")


def is_float(ty: str) -> bool:
    return ty.startswith(("f", "bf"))


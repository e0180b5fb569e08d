"""One CTA's state (registers, shared memory and its race record) and the SIMT scheduler."""
from __future__ import annotations

import re
from collections import Counter

import numpy as np

from .parse import Entry, Instr, parse
from .scalar_ops import SCALAR_OPS
from .values import WIDTH, Memory, SharedMemoryRace, Unsupported, imm, is_reg, to_bits, to_typed
from .warp_ops import WARP_OPS

OPS = {**SCALAR_OPS, **WARP_OPS}


SPECIAL = ("%tid.", "%ctaid.", "%ntid.", "%nctaid.", "%laneid", "%warpid")
NO_OPS = ("griddepcontrol", "membar", "fence", "prefetch", "discard", "nanosleep")
SHARED_BYTES = 232448                     # the H200's per-CTA maximum


class _CTA:
    def __init__(self, entry: Entry, ctaid, grid, params: dict, memory: Memory, shared: np.ndarray):
        n = entry.threads
        self.entry, self.n, self.params, self.memory, self.shared = entry, n, params, memory, shared
        tid = np.arange(n, dtype=np.uint64)
        self.special = {"%tid.x": tid, "%tid.y": np.zeros(n, np.uint64), "%tid.z": np.zeros(n, np.uint64),
                        "%laneid": tid % np.uint64(32), "%warpid": tid // np.uint64(32),
                        "%ntid.x": np.full(n, n, np.uint64), "%ntid.y": np.ones(n, np.uint64),
                        "%ntid.z": np.ones(n, np.uint64)}
        for axis, c, g in zip("xyz", ctaid, grid):
            self.special[f"%ctaid.{axis}"] = np.full(n, c, np.uint64)
            self.special[f"%nctaid.{axis}"] = np.full(n, g, np.uint64)
        self.regs: dict[str, np.ndarray] = {}
        self.active = np.ones(n, bool)
        # shared-memory hazards between warps: a byte written and then read or written by another
        # warp with no bar.sync in between is a race on the GPU, where warps run apart
        self.epoch = 0
        self.written_in = np.full(SHARED_BYTES, -1, np.int32)      # epoch of the last write
        self.writer = np.full(SHARED_BYTES, -1, np.int32)          # its warp
        self.read_in = np.full(SHARED_BYTES, -1, np.int32)         # epoch of the last reads
        self.readers = np.zeros(SHARED_BYTES, np.uint64)           # their warps, one bit each
        self.races: list[str] = []

    def touch_shared(self, start: np.ndarray, nbytes: int, threads: np.ndarray, write: bool, what: str,
                     values: np.ndarray | None = None):
        """Record an access by `threads` (indices) to [start, start + nbytes) and note races. A
        write of the value a byte already holds (warps storing copies of one tile) is benign."""
        warp = (threads // 32).astype(np.int32)
        for b in range(nbytes):
            at = (start + b).astype(np.int64)
            other_writer = (self.written_in[at] == self.epoch) & (self.writer[at] != warp)
            if write:
                same = ((values >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.uint8) == self.shared[at]
                other_writer &= ~same
                bits = np.left_shift(np.uint64(1), warp.astype(np.uint64))
                other_reader = (self.read_in[at] == self.epoch) & ((self.readers[at] & ~bits) != 0) & ~same
                bad = other_writer | other_reader
            else:
                bad = other_writer
            if bad.any() and len(self.races) < 8:
                i = int(np.nonzero(bad)[0][0])
                kind = ("write after another warp's " + ("write" if other_writer[i] else "read")) if write \
                    else "read of another warp's write"
                self.races.append(f"{what}: {kind} at shared byte {int(at[i])} (warp {int(warp[i])}, "
                                  f"no bar.sync between)")
            if write:
                self.written_in[at], self.writer[at] = self.epoch, warp
            else:
                fresh = self.read_in[at] != self.epoch
                self.readers[at[fresh]] = 0
                self.read_in[at] = self.epoch
                np.bitwise_or.at(self.readers, at, np.left_shift(np.uint64(1), warp.astype(np.uint64)))

    # ---- operands
    def bits(self, tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in self.regs:
            return self.regs[tok]
        if tok.startswith(SPECIAL):
            return self.special[tok]
        if tok == "global_smem":
            return np.zeros(self.n, np.uint64)
        if is_reg(tok):                           # never written: reads as zeros
            return np.zeros(self.n, np.uint64)
        raise Unsupported(f"operand {tok!r}")

    def val(self, tok: str, ty: str) -> np.ndarray:
        tok = tok.strip()
        if ty == "pred":
            if tok.startswith("!"):
                return ~self.val(tok[1:], ty)
            if not is_reg(tok):
                return np.full(self.n, int(tok, 0) != 0)
            return self.bits(tok) != 0
        if is_reg(tok):
            return to_typed(self.bits(tok), ty)
        return imm(tok, ty, self.n)

    def set(self, dst: str, values: np.ndarray, ty: str):
        dst = dst.strip()
        if dst == "_":
            return
        new = np.asarray(values).astype(np.uint64) if ty == "pred" else to_bits(values, ty)
        old = self.regs.get(dst)
        self.regs[dst] = new if old is None else np.where(self.active, new, old)

    def address(self, tok: str) -> np.ndarray:
        inner = tok.strip()[1:-1].replace(" ", "")
        m = re.match(r"^([%\w$.]+)?([+-]?-?\d+)?$", inner)
        if not m:
            raise Unsupported(f"address {tok!r}")
        base, off = m.group(1), int(m.group(2) or 0)
        if base is None:
            return np.full(self.n, off, np.int64)
        if base in self.params:
            raise Unsupported("address of a parameter")
        return self.bits(base).astype(np.int64) + off



class Emulator:
    """One PTX kernel: `launch(grid, params, memory)` runs every CTA of the grid in order."""

    def __init__(self, ptx: str):
        self.entry = parse(ptx)
        self.races: list[str] = []
        self.issued: Counter = Counter()              # op -> warp-level issues (a profile)
        self.ctas = 0

    def launch(self, grid, params: list, memory: Memory, max_steps: int = 2_000_000):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if len(params) != len(self.entry.params):
            raise Unsupported(f"{len(params)} parameter values for {len(self.entry.params)} parameters")
        named = {name: int(v) for (name, _), v in zip(self.entry.params, params)}
        for cz in range(grid[2]):
            for cy in range(grid[1]):
                for cx in range(grid[0]):
                    cta = _CTA(self.entry, (cx, cy, cz), grid, named, memory, np.zeros(SHARED_BYTES, np.uint8))
                    with np.errstate(all="ignore"):
                        self._run(cta, max_steps)
                    self.ctas += 1
                    self.races += [f"CTA {(cx, cy, cz)}: {r}" for r in cta.races]
        if self.races:                                 # the outputs are written all the same
            raise SharedMemoryRace("; ".join(self.races[:3]))

    def _run(self, cta: _CTA, max_steps: int):
        """SIMT with one program counter per thread: the threads at the lowest counter run the
        next instruction together, so divergent branches and loops reconverge where the counters
        meet. A barrier (bar.sync: the CTA; shfl / vote / ldmatrix / mma .sync: the warp) holds the
        threads that reach it until every live thread of its scope is there: LLVM places cold
        blocks after the barrier in the text and jumps back from them."""
        body, labels = self.entry.body, self.entry.labels
        end = len(body)
        pcs = np.zeros(cta.n, np.int64)
        held = np.zeros(cta.n, bool)
        warp = np.arange(cta.n) // 32
        checked: set[int] = set()
        for _ in range(max_steps):
            live = pcs < end
            if not live.any():
                return
            free = live & ~held
            if not free.any():
                raise Unsupported(f"threads wait at different barriers (PTX statements "
                                  f"{sorted(set(body[p].line for p in pcs[live]))[:4]})")
            pc = int(pcs[free].min())
            ins = body[pc]
            if pc not in checked:
                check_modifiers(ins)
                checked.add(pc)
            here = live & (pcs == pc)
            scope = _sync_scope(ins)
            if scope is not None:
                missing = live & ~here
                if scope == "cta":
                    ready = here if not missing.any() else np.zeros(cta.n, bool)
                else:
                    ready = here & ~np.isin(warp, warp[missing])
                held |= here & ~ready
                if not ready.any():
                    continue
                held &= ~ready
                here = ready
            cta.active = here & cta.val(ins.pred, "pred") if ins.pred else here
            head = ins.parts[0]
            if head == "bra":
                pcs[cta.active] = labels[ins.args[0]]
                pcs[here & ~cta.active] = pc + 1
                continue
            if head in ("ret", "exit"):
                pcs[cta.active] = end
                pcs[here & ~cta.active] = pc + 1
                continue
            try:
                if head in OPS:                        # check_modifiers refused all but these and NO_OPS
                    OPS[head](cta, ins)
            except Exception as e:                     # noqa: BLE001 - name the instruction
                why = str(e) if isinstance(e, Unsupported) else f"{type(e).__name__}: {e}"
                raise Unsupported(f"{why} (in `{ins.op} {', '.join(ins.args)}`)") from None
            pcs[here] = pc + 1
            self.issued[ins.op] += int(np.count_nonzero(np.bincount(warp[here])))
        raise Unsupported("step limit reached (a loop that does not end?)")


# the modifiers each instruction's semantics handle (types aside); any other is refused, since an
# ignored one is a silent wrong answer (max.relu.s32 was one)
_MEMORY = {"global", "shared", "shared::cta", "param", "const", "nc", "v2", "v4", "volatile", "relaxed", "weak",
           "acquire", "release", "gpu", "cta", "sys", "ca", "cg", "cs", "lu", "cv", "wb", "wt"}
_CMPS = {"eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu",
         "num", "nan"}
_FTZ = ("add", "sub", "mul", "mad", "fma", "div", "min", "max", "neg", "abs", "rcp", "sqrt", "rsqrt", "ex2",
        "lg2", "sin", "cos", "tanh", "setp", "cvt")
MODIFIERS = {
    "ld": _MEMORY, "st": _MEMORY, "mov": set(), "selp": set(), "and": set(), "or": set(), "xor": set(),
    "not": set(), "shl": set(), "shr": set(), "bfe": set(), "bfi": set(), "prmt": set(), "popc": set(),
    "clz": set(), "brev": set(), "add": {"rn", "sat"}, "sub": {"rn", "sat"}, "mul": {"rn", "lo", "hi", "wide"},
    "mad": {"rn", "lo", "hi", "wide"}, "fma": {"rn"}, "div": {"rn", "full", "approx"}, "rem": set(),
    "neg": set(), "abs": set(), "min": {"NaN", "relu"}, "max": {"NaN", "relu"}, "copysign": set(),
    "rcp": {"rn", "approx"}, "sqrt": {"rn", "approx"}, "rsqrt": {"approx"}, "ex2": {"approx"},
    "lg2": {"approx"}, "sin": {"approx"}, "cos": {"approx"}, "tanh": {"approx"},
    "setp": _CMPS | {"and", "or", "xor"}, "cvt": {"rn", "rzi", "rni", "rmi", "rpi", "sat", "satfinite"},
    "shfl": {"sync", "up", "down", "bfly", "idx"}, "vote": {"sync", "any", "all", "ballot", "uni"},
    "redux": {"sync", "add", "min", "max", "and", "or", "xor"}, "activemask": set(),
    "bar": {"sync", "warp", "aligned"}, "barrier": {"sync", "aligned", "warp"},
    "ldmatrix": {"sync", "aligned", "m8n8", "x1", "x2", "x4", "trans", "shared", "shared::cta"},
    "stmatrix": {"sync", "aligned", "m8n8", "x1", "x2", "x4", "trans", "shared", "shared::cta"},
    "mma": {"sync", "aligned", "m16n8k16", "m16n8k8", "row", "col", "tf32"},
    "cp": {"async", "ca", "cg", "shared", "shared::cta", "global", "commit_group", "wait_group", "wait_all"},
    "wgmma": {"fence", "commit_group", "wait_group", "mma_async", "sync", "aligned", "e4m3", "e5m2"}
    | {f"m64n{n}k{k}" for n in range(8, 257, 8) for k in (16, 32)},
    "createpolicy": None, "bra": {"uni"}, "ret": set(),
    "exit": set(), **{head: None for head in NO_OPS},
}
for _head in _FTZ:                               # flushing subnormals: scalar_ops.flush_subnormals
    MODIFIERS[_head] = MODIFIERS[_head] | {"ftz"}


def check_modifiers(ins: Instr):
    parts = ins.parts
    if parts[0] not in MODIFIERS:
        raise Unsupported(f"instruction {ins.op}")
    allowed = MODIFIERS[parts[0]]
    if allowed is None:
        return
    for p in parts[1:]:
        if p in WIDTH or p in allowed or p.startswith(("L1::", "L2::")) or p == "pred":
            continue
        raise Unsupported(f"modifier .{p} of {parts[0]}")


def _sync_scope(ins: Instr) -> str | None:
    parts = ins.parts
    if parts[0] in ("bar", "barrier") and "warp" not in parts:
        return "cta"
    if "sync" in parts:
        return "warp"
    return None



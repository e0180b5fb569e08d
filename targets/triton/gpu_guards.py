"""Guards in the Triton target's gpu-mode code against faults of Triton 3.6 and its ptxas 12.8
(the H200's toolchain), each found by a random program on the H200 or in the PTX emulator
(tests/ptxemu) and named by its fuzz seed. Each guard applies only where its fault can occur, so
the library's kernels keep their code elsewhere; the interpreter needs none. benchmarks/NOTES.md
has the SASS and the measurements behind each."""
from __future__ import annotations

from k31dsl.dsl import dtypes as D


def int_asm(em, dt: D.DType, text: str, asm: str) -> str:
    """An integer tile through one elementwise PTX snippet (`asm` may name {bits} and {top} =
    bits - 1): 64-bit values in a 64-bit register, the rest in 32 bits (narrower integers widen
    there and come back). Neither LLVM nor ptxas infers anything about the result."""
    bits = 64 if dt.bits == 64 else 32
    wide = "tl.int64" if bits == 64 else "tl.uint32" if dt is D.u32 else "tl.int32"
    arg = text if em.carrier(dt) == wide else f"{text}.to({wide})"
    reg = "l" if bits == 64 else "r"
    out = (f'tl.inline_asm_elementwise("{asm.format(bits=bits, top=bits - 1)}", "={reg},{reg}", [{arg}], '
           f'dtype={wide}, is_pure=True, pack=1)')
    return out if em.carrier(dt) == wide else f"{out}.to({em.carrier(dt)})"


def opaque_int(em, v, text: str) -> str:
    """An integer tile behind an identity byte permute: neither LLVM nor ptxas sees what computed
    it (no-op in the interpreter, for scalars, 64-bit integers and possible constexprs)."""
    dt = v.type.dtype
    if em.interp or not dt.is_int or dt.bits > 32 or v.type.is_scalar or v.uid in em.maybe_cx:
        return text
    return int_asm(em, dt, text, "prmt.b32 $0, $1, 0, 0x3210;")


def minmax_operand(em, v, text: str) -> str:
    """An integer operand of a min / max (binary, relu, reduction) on the GPU, behind the identity
    PRMT where it may be a negation. ptxas (12.8 to 13.3) folds an integer negation into a
    three-input min / max (VIMNMX3) and can drop it: max over axis 0 of -x came back as the max of
    x on the H200 (fuzz seeds 202878, 103512; the SASS shows three operands negated and the fourth
    not; pytorch#190973 reports the same fusion). ptxas does not look through PRMT. Operands that
    hold no negation keep the fused form: the guards on the paged indexer's scale maxima cost it
    1 % on the H200 (benchmarks/NOTES.md, session of 18:36 UTC, 3 Dec)."""
    return opaque_int(em, v, text) if may_be_negation(em, v) else text


# results that are never an integer negation (a sum, scan or extreme of negations may be one:
# LLVM writes -a + -b as -(a + b))
_VALUES = ("load", "arange", "dim", "full", "const", "histogram", "topk", "dot")


def _constant(em, v):
    op = em.defs.get(v.uid)
    return op.attrs["value"] if op is not None and op.name in ("const", "full") else None


def may_be_negation(em, v, depth: int = 8) -> bool:
    """Whether LLVM may write integer tile v as a negation (`0 - x`): some op of the integer chain
    v comes from could be one after LLVM's algebra: a negation, a subtraction of anything but a
    constant (0 - x, a - (a + x)), a bitwise not or xor (~x + 1), a product or quotient with a
    negative constant. Sums, shifts, masks, selects, minima and moves of other values cannot
    (reductions and scans included: of negations, LLVM may write them as one).
    Loop-carried values and chains deeper than `depth`: maybe."""
    op = em.defs.get(v.uid)
    if op is None:                       # a parameter, a program id, a loop's variable or carried value
        return not v.type.is_scalar and v.uid not in em.pids and v.uid not in em.iv_ops
    if depth == 0 or op.name in ("neg", "not", "xor"):
        return True
    if op.name in _VALUES or (op.name in ("cast", "bitcast") and not op.operands[0].type.dtype.is_int):
        return False
    consts = [_constant(em, o) for o in op.operands]
    if op.name == "sub" and consts[1] is None:
        return True
    if op.name in ("mul", "floordiv") and any(c is not None and c < 0 for c in consts):
        return True
    return any(o.type.dtype.is_int and may_be_negation(em, o, depth - 1) for o in op.operands)


_LAYOUT_OPS = ("trans", "broadcast", "reshape", "expand", "cat", "where", "take", "bitcast")


def holds_float_bits(em, v, depth: int = 8) -> bool:
    """Whether integer tile v is a float's bits (a bitcast from a float, through ops that only
    move or select values). ptxas 12.8 (Triton 3.6's) types a register by the instruction that wrote it:
    a truncating byte store of a register written by `selp.f32` became a float-to-u8 conversion
    (F2IP.U8.F32) — the H200 stored 0, 0, 0, 1 for the low bytes of small floats' bits (fuzz seed
    312814: f32 bits as u32, transposed through shared memory, cast to i8). Behind the identity
    PRMT the register is an integer's."""
    op = em.defs.get(v.uid)
    if op is None or depth == 0:
        return False
    if op.name == "bitcast" and op.operands[0].type.dtype.is_float:
        return True
    return op.name in _LAYOUT_OPS and any(
        o.type.dtype is not D.bool_ and holds_float_bits(em, o, depth - 1) for o in op.operands)


def read_before(em, v, store) -> bool:
    """Whether the GPU store `store` of tile v needs a copy: an op before it reads v too (a
    constant is remade in each layout, so it needs none; see stored_copy)."""
    return (not em.interp and bool(v.type.shape) and v.uid not in em.maybe_cx
            and em.first_use[v.uid] < em.position[id(store)]
            and getattr(em.defs.get(v.uid), "name", None) not in ("full", "const", "arange"))


# a float tile's register kind and move width (integers and bools go through int_asm)
_FLOAT_REGS = {"tl.float32": ("r", "b32"), "tl.float16": ("h", "b16"), "tl.bfloat16": ("h", "b16"),
               "tl.float64": ("d", "b64")}


def stored_copy(em, v, text: str) -> str:
    """The value of a GPU store as a copy of `v`, for a `v` that an earlier op also reads.
    Triton 3.6's RemoveLayoutConversions reuses the store's layout conversion of `v` when it
    rematerialises an earlier reader in that layout, above the conversion: the module fails to
    verify ("operand #0 does not dominate this use", fuzz seed 400748; Triton 3.9 builds it).
    The store of a copy converts a value no other op reads. ptxas drops the move."""
    carrier = em.carrier(v.type.dtype)
    if carrier not in _FLOAT_REGS:                        # integers; 8-bit and bool tiles move in 32 bits
        return int_asm(em, v.type.dtype, text, "mov.b{bits} $0, $1;")
    reg, bits = _FLOAT_REGS[carrier]
    return (f'tl.inline_asm_elementwise("mov.{bits} $0, $1;", "={reg},{reg}", [{text}], '
            f'dtype={carrier}, is_pure=True, pack=1)')

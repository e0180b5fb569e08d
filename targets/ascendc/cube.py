"""k.dot on the Cube unit.

The operands are UB tiles (computed by the vector core), and on A2/A3 the Cube unit reads GM or
L1 only, so a dot makes the round trip a mixed kernel makes: UB -> this block's GM workspace
(DataCopy, MTE3) -> L1 with ND->NZ (DataCopy with Nd2NzParams) -> L0A (Zz) / L0B (Zn) with
LoadData -> Mmad into CO1 (L0C, fp32, accumulating over K steps) -> Fixpipe to GM (ND) ->
DataCopy back to UB. B goes ND [K, N] through a transposing LoadData for 2-byte types and through
LoadDataWithTranspose per 16 k-rows for fp32; a B that is `x.T` goes as x = B^T [N, K], whose NZ
fractals are already Zn.
fp8 operands are widened to half first (exact; A2 has no fp8 cube). K is split into steps that
fit L0A/L0B (64 KB each: half of it per operand step, so the next step can load)."""
from __future__ import annotations

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import error

L0_STEP = 32 * 1024          # bytes of one operand step in L0A / L0B
L0C_BYTES = 128 * 1024


def _up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def prepare(em):
    """A dot whose B is `x.T` used nowhere else reads x [N, K] directly as B^T (its NZ fractals
    are L0B's Zn fractals): no transposed copy in UB."""
    from k31dsl.dsl.ir import walk
    extra, skip = [], set()
    for op in walk(em.k.body):
        if op.name != "dot":
            continue
        b = op.operands[1]
        t = em.plan.defs.get(b.uid)
        if t is None or t.name != "trans" or len(em.plan.uses.get(b.uid, [])) != 1:
            continue
        if em.plan.chain[id(t)] != em.plan.chain[id(op)]:
            continue
        em.fused.add(id(t))
        em.b_transposed[id(op)] = t.operands[0]
        extra.append((t.operands[0], op))
        skip.add(b.uid)
    return extra, skip


def dot(em, op):
    a, b = op.operands
    r = op.result
    M, K = a.type.shape
    _, N = b.type.shape
    dt = a.type.dtype
    if dt.kind == "fp8" or dt is D.f16:
        T, isz, widen = "half", 2, dt.kind == "fp8"
    elif dt is D.bf16:
        T, isz, widen = "bfloat16_t", 2, False
    else:
        T, isz, widen = "float", 4, False
    C0 = 32 // isz
    Mp, Np = _up(M, 16), _up(N, 16)
    if Mp * Np * 4 > L0C_BYTES:
        raise error(f"k.dot result [{M},{N}] needs {Mp * Np * 4} B of L0C, more than the {L0C_BYTES} B of an "
                    "A2/A3 cube core", op.loc, "use smaller M/N tiles (e.g. 128 x 128) for the ascendc target")
    tk = K
    while tk > 16 and max(Mp * _up(tk, C0), _up(tk, 16) * _up(N, C0)) * isz > L0_STEP:
        tk //= 2
    steps = (K + tk - 1) // tk
    em.uses_cube = True
    em.vector_ops.update({"Nd2Nz DataCopy", "LoadData", "Mmad", "Fixpipe"})
    if T == "float" and id(op) not in em.b_transposed:
        em.vector_ops.add("LoadDataWithTranspose")
    # this dot's GM workspace layout (reused by every dot of the kernel: they run one by one)
    offA, offB = 0, _up(M * K * isz, 512)
    offC = offB + _up(K * N * isz, 512)
    ws = offC + _up(M * N * 4, 512)
    cb = em.cube_bytes
    cb["ws"] = max(cb.get("ws", 0), ws)
    cb["a1"] = max(cb.get("a1", 512), Mp * _up(tk, C0) * isz)
    cb["b1"] = max(cb.get("b1", 512), _up(tk, 16) * Np * isz, Np * _up(tk, C0) * isz)
    cb["a2"], cb["b2"] = cb["a1"], cb["b1"]
    cb["co1"] = max(cb.get("co1", 1024), Mp * Np * 4)
    out = em.define(r)
    A, B = em.n(a), em.n(b)
    em.pre(f"// k.dot [{M},{K}] @ [{K},{N}] on the Cube unit ({T} operands, fp32 accumulation in CO1)")
    em.pre("{")
    if widen and id(op) in em.b_transposed:
        wa = em.scratch("half", M * K)
        em.scalar_unit.add("dot (fp8 -> half widening)")
        em.pre("  // scalar unit: fp8 -> half (exact; the A2 cube has no fp8 input)")
        em.pre(f"  AscendC::LocalTensor<half> ha = {wa};")
        tag = f"k31::{dt.name}"
        em.pre(f"  k31::Map1<k31::f16, {tag}>(ha, {A}, k31::Sh{{{{1, 1, {M}, {K}}}}}, "
               f"k31::St{{{{0, 0, {K}, 1}}}}, [=](uint8_t v) -> float {{ return k31::to_float<{tag}>(v); }});")
        A = "ha"
    elif widen:
        wa, wb = em.scratch("half", M * K), em.scratch("half", K * N)
        em.scalar_unit.add("dot (fp8 -> half widening)")
        em.pre("  // scalar unit: fp8 -> half (exact; the A2 cube has no fp8 input)")
        em.pre(f"  AscendC::LocalTensor<half> ha = {wa}, hb = {wb};")
        tag = f"k31::{dt.name}"
        for dst, src, rows, cols in (("ha", A, M, K), ("hb", B, K, N)):
            em.pre(f"  k31::Map1<k31::f16, {tag}>({dst}, {src}, k31::Sh{{{{1, 1, {rows}, {cols}}}}}, "
                   f"k31::St{{{{0, 0, {cols}, 1}}}}, [=](uint8_t v) -> float {{ return k31::to_float<{tag}>(v); }});")
        A, B = "ha", "hb"
    bt_route = id(op) in em.b_transposed
    f32_kn = T == "float" and not bt_route           # fp32 B [K, N]: LoadDataWithTranspose
    if id(op) in em.b_transposed:
        x = em.b_transposed[id(op)]              # B = x.T: x [N, K] is B^T already
        B = em.n(x)
        if widen:
            em.pre(f"  AscendC::LocalTensor<half> hbt = {em.scratch('half', K * N)};")
            em.pre(f"  k31::Map1<k31::f16, k31::{dt.name}>(hbt, {B}, k31::Sh{{{{1, 1, {N}, {K}}}}}, "
                   f"k31::St{{{{0, 0, {K}, 1}}}}, [=](uint8_t v) -> float {{ return k31::to_float<k31::{dt.name}>(v); }});")
            B = "hbt"

    em.pre(f"  AscendC::GlobalTensor<{T}> wa, wb;")
    em.pre("  AscendC::GlobalTensor<float> wc;")
    em.pre(f"  wa.SetGlobalBuffer(reinterpret_cast<__gm__ {T}*>(ws + {offA}), {M * K});")
    em.pre(f"  wb.SetGlobalBuffer(reinterpret_cast<__gm__ {T}*>(ws + {offB}), {K * N});")
    em.pre(f"  wc.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(ws + {offC}), {M * N});")
    em.pre(f"  AscendC::DataCopy(wa, {A}, {M * K});   // UB -> GM workspace (MTE3)")
    em.pre(f"  AscendC::DataCopy(wb, {B}, {K * N});")
    em.pre("  AscendC::PipeBarrier<AscendC::PIPE_ALL>();   // the cube reads what the vector side wrote")
    em.pre("  AscendC::LocalTensor<float> c1 = qCO1.AllocTensor<float>();")
    em.pre(f"  for (int32_t k0 = 0; k0 < {K}; k0 += {tk}) {{   // {steps} K step(s) of {tk}")
    K1 = _up(tk, C0) // C0
    M1 = Mp // 16
    N1 = Np // 16
    em.pre(f"    AscendC::LocalTensor<{T}> a1 = qA1.AllocTensor<{T}>();")
    em.pre(f"    AscendC::DataCopy(a1, wa[k0], AscendC::Nd2NzParams(1, {M}, {tk}, 0, {K}, {Mp}, 1, 0));   // ND -> NZ")
    em.pre("    qA1.EnQue(a1);")
    em.pre(f"    AscendC::LocalTensor<{T}> b1 = qB1.AllocTensor<{T}>();")
    if bt_route:
        em.pre(f"    AscendC::DataCopy(b1, wb[k0], AscendC::Nd2NzParams(1, {N}, {tk}, 0, {K}, {Np}, 1, 0));   // B^T: NZ = Zn fractals")
    elif f32_kn:     # per 16 k-rows: the 8-wide chunks of a row group are consecutive fractals
        em.pre(f"    for (int32_t g = 0; g < {tk // 16}; ++g)")
        em.pre(f"      AscendC::DataCopy(b1[g * {16 * Np}], wb[(k0 + g * 16) * {N}], AscendC::Nd2NzParams(1, 16, {N}, 0, {N}, 16, 1, 0));")
    else:
        em.pre(f"    AscendC::DataCopy(b1, wb[k0 * {N}], AscendC::Nd2NzParams(1, {tk}, {N}, 0, {N}, {_up(tk, 16)}, 1, 0));")
    em.pre("    qB1.EnQue(b1);")
    em.pre(f"    a1 = qA1.DeQue<{T}>();")
    em.pre(f"    AscendC::LocalTensor<{T}> a2 = qA2.AllocTensor<{T}>();")
    em.pre(f"    for (int32_t m1 = 0; m1 < {M1}; ++m1)   // NZ -> Zz, one fractal row per LoadData")
    em.pre(f"      AscendC::LoadData(a2[m1 * {K1 * 16 * C0}], a1, AscendC::LoadData2DParams(m1, {K1}, {M1}, 0, 0, false));")
    em.pre("    qA1.FreeTensor(a1);")
    em.pre("    qA2.EnQue(a2);")
    em.pre(f"    b1 = qB1.DeQue<{T}>();")
    em.pre(f"    AscendC::LocalTensor<{T}> b2 = qB2.AllocTensor<{T}>();")
    if bt_route:
        em.pre(f"    AscendC::LoadData(b2, b1, AscendC::LoadData2DParams(0, {K1 * N1}, 1, 0, 0, false));")
    elif f32_kn:     # each 16x16 square of B -> two Zn fractals
        em.pre(f"    for (int32_t g = 0; g < {tk // 16}; ++g)")
        em.pre(f"      AscendC::LoadDataWithTranspose(b2[g * {2 * N1 * 16 * C0}], b1, "
               f"AscendC::LoadData2dTransposeParams(g * {N1}, {N1}, 1, 0, {N1 - 1}));")
    else:
        kp = _up(tk, 16) // 16
        em.pre(f"    for (int32_t k1 = 0; k1 < {kp}; ++k1)   // NZ of B -> Zn: transpose each 16x16 fractal")
        em.pre(f"      AscendC::LoadData(b2[k1 * {N1 * 256}], b1, AscendC::LoadData2DParams(k1, {N1}, {kp}, 0, 0, true));")
    em.pre("    qB1.FreeTensor(b1);")
    em.pre("    qB2.EnQue(b2);")
    em.pre(f"    a2 = qA2.DeQue<{T}>();")
    em.pre(f"    b2 = qB2.DeQue<{T}>();")
    em.pre("    AscendC::MmadParams mp;")
    em.pre(f"    mp.m = {M}; mp.n = {N}; mp.k = {tk}; mp.cmatrixInitVal = (k0 == 0);")
    em.pre("    AscendC::Mmad(c1, a2, b2, mp);")
    em.pre("    qA2.FreeTensor(a2);")
    em.pre("    qB2.FreeTensor(b2);")
    em.pre("  }")
    em.pre("  qCO1.EnQue(c1);")
    em.pre("  c1 = qCO1.DeQue<float>();")
    em.pre(f"  AscendC::Fixpipe(wc, c1, AscendC::FixpipeParamsV220({N}, {M}, {Mp}, {N}, false));   // NZ -> ND, fp32")
    em.pre("  qCO1.FreeTensor(c1);")
    em.pre("  AscendC::PipeBarrier<AscendC::PIPE_ALL>();")
    em.pre(f"  AscendC::DataCopy({out}, wc, {M * N});   // GM workspace -> UB (MTE2)")
    em.pre("}")


RULES = {"dot": dot}

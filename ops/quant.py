"""FP8 quantizers: MXFP8 (groups of 32, E8M0 scale byte) and DeepSeek-style per-tile FP8 (fp32
scale), with their dequantizers.

Layout (all four kernels): the input is viewed as rows [M, D] (leading dims flattened). One
program owns a [BM, BN] tile, BN a whole number of groups; the tile is reshaped to
[BM, BN / group, group] so every group reduces along the last axis, and the group maxima are taken
on the integer bits of |x| (exact and NaN-free on every target; non-finite groups show up as bits
>= 0x7F800000). Ragged edges (D not a multiple of the group or of BN, M not a multiple of BM) are
masked spans; padded lanes read 0.0, which never changes a group maximum.

NaN / Inf rule (both formats): a group holding NaN or +-Inf gets a NaN scale (E8M0 byte 0xFF, or
an fp32 NaN) and every code of the group is 0x7F (E4M3 NaN), so it dequantizes to NaN.
"""

import math

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.ops.common import FLOAT_INPUTS, require_dtype_arg, require_tensor, resolve_target, rows
from k31dsl.ops.registry import CaseResult, OpSpec, register

MX_GROUP = 32
E4M3_MAX = 448.0
SCALE_MODES = ("ceil", "floor")
# BM rows x BN columns per program. The first config is the one used without autotuning (CPU,
# interpreter). On an H200 (bf16 [16384, 7168]) a hand-written Triton twin of the MXFP8 layout
# reached 94% of copy bandwidth at BM=2..8, BN=1024, 4 warps (8 warps: as low as 83%); the
# generated kernel reached ~80% before the target learnt i32 offsets and the bare sm90 fp8 cast.
# A per-element IEEE x / s (div.rn) cost ~7% more, hence the per-tile reciprocal.
QUANT_CONFIGS = [{"BM": 8, "BN": 128, "num_warps": 4}, {"BM": 4, "BN": 1024, "num_warps": 4},
                 {"BM": 8, "BN": 1024, "num_warps": 8}, {"BM": 8, "BN": 512, "num_warps": 4},
                 {"BM": 16, "BN": 256, "num_warps": 8}, {"BM": 2, "BN": 1024, "num_warps": 4}]


# ---------------------------------------------------------------- MXFP8 kernels

# One KernelDef per algorithm. The input/output dtype is a dtype constexpr bound from the tensors
# at each call; FLOOR/TILE/POW2 are passed only when they differ from the default. Configs set
# only BM/BN, so the Triton runtime autotunes every variant (the call's constexprs are merged in).

@k.func
def mxfp8_groups(xg, FLOOR=False):
    """MXFP8 of an f32 tile [BM, G, 32] (groups on the last axis) -> (E4M3 codes [BM, G, 32],
    E8M0 scales [BM, G]); the rules of the module docstring. Other kernels quantize with it too."""
    amax = k.max(xg.bitcast(k.i32) & 0x7FFFFFFF, axis=2)           # |x| bits, ordered like |x|
    biased = amax >> 23
    if FLOOR:       # floor(log2 amax) - 8
        e = biased - 135
    else:           # ceil(log2(amax / 448)): one more when the mantissa exceeds 1.75
        e = biased - 135 + ((amax & 0x7FFFFF) > 0x600000).to(k.i32)
    e = k.maximum(e, -127)                                           # zero/subnormal amax: byte 0
    bad = amax >= 0x7F800000                                         # NaN or Inf in the group
    inv = ((127 - e) << 23).bitcast(k.f32)                           # 2^-e from bits, exact
    y = k.where(bad[:, :, None], float("nan"), xg * inv[:, :, None])
    return y.to(k.f8e4m3), k.where(bad, 255, e + 127).to(k.u8).bitcast(k.e8m0)


@k.kernel(configs=QUANT_CONFIGS)
def mxfp8_quantize_rows(x: k.Tensor["XT", "M", "D"], q: k.Tensor[k.f8e4m3, "M", "D"],
                        s: k.Tensor[k.e8m0, "M", "cdiv(D, 32)"], XT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                        FLOOR: k.constexpr = False, BM: k.constexpr = 8, BN: k.constexpr = 128):
    G = BN // 32
    for pm, pn in k.grid(k.cdiv(x.shape[0], BM), k.cdiv(x.shape[1], BN)):
        xt = x[k.span(pm * BM, BM), k.span(pn * BN, BN, other=0.0)].to(k.f32)
        codes, scales = mxfp8_groups(k.reshape(xt, (BM, G, 32)), FLOOR)
        s[k.span(pm * BM, BM), k.span(pn * G, G)] = scales
        q[k.span(pm * BM, BM), k.span(pn * BN, BN)] = k.reshape(codes, (BM, BN))


@k.kernel(configs=QUANT_CONFIGS)
def mxfp8_dequantize_rows(q: k.Tensor[k.f8e4m3, "M", "D"], s: k.Tensor[k.e8m0, "M", "cdiv(D, 32)"],
                          y: k.Tensor["YT", "M", "D"], YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                          BM: k.constexpr = 8, BN: k.constexpr = 128):
    G = BN // 32
    for pm, pn in k.grid(k.cdiv(q.shape[0], BM), k.cdiv(q.shape[1], BN)):
        c = k.reshape(q[k.span(pm * BM, BM), k.span(pn * BN, BN)].to(k.f32), (BM, G, 32))
        sc = s[k.span(pm * BM, BM), k.span(pn * G, G)].to(k.f32)      # 2^(b-127), 0xFF -> NaN
        y[k.span(pm * BM, BM), k.span(pn * BN, BN)] = k.reshape(c * sc[:, :, None], (BM, BN)).to(YT)


# ---------------------------------------------------------------- per-tile FP8 kernels

@k.kernel(configs=QUANT_CONFIGS)
def fp8_tile_quantize_rows(x: k.Tensor["XT", "M", "D"], q: k.Tensor[k.f8e4m3, "M", "D"],
                           s: k.Tensor[k.f32, "M", "cdiv(D, TILE)"], eps: k.f32,
                           XT: k.constexpr[FLOAT_INPUTS] = k.bf16, TILE: k.constexpr = 128,
                           POW2: k.constexpr = False, BM: k.constexpr = 8, BN: k.constexpr = 128):
    G = max(1, BN // TILE)
    W = G * TILE
    for pm, pn in k.grid(k.cdiv(x.shape[0], BM), k.cdiv(x.shape[1], W)):
        xt = x[k.span(pm * BM, BM), k.span(pn * W, W, other=0.0)].to(k.f32)
        xg = k.reshape(xt, (BM, G, TILE))
        abits = k.max(xg.bitcast(k.i32) & 0x7FFFFFFF, axis=2)
        bad = abits >= 0x7F800000
        sc = k.maximum(abits.bitcast(k.f32), eps) / 448.0
        if POW2:        # 2^ceil(log2 sc) through the exact e8m0 conversion; x * 2^-e is exact
            e8 = sc.to(k.e8m0)
            sc = e8.to(k.f32)
            y = xg * ((254 - e8.bitcast(k.u8).to(k.i32)) << 23).bitcast(k.f32)[:, :, None]
        else:       # one correctly rounded reciprocal per tile, a multiply per element
            y = xg * (1.0 / sc)[:, :, None]
        sc = k.where(bad, float("nan"), sc)
        s[k.span(pm * BM, BM), k.span(pn * G, G)] = sc
        y = k.where(bad[:, :, None], float("nan"), y)
        q[k.span(pm * BM, BM), k.span(pn * W, W)] = k.reshape(y, (BM, W)).to(k.f8e4m3)


@k.kernel(configs=QUANT_CONFIGS)
def fp8_tile_dequantize_rows(q: k.Tensor[k.f8e4m3, "M", "D"], s: k.Tensor[k.f32, "M", "cdiv(D, TILE)"],
                             y: k.Tensor["YT", "M", "D"], YT: k.constexpr[FLOAT_INPUTS] = k.bf16,
                             TILE: k.constexpr = 128, BM: k.constexpr = 8, BN: k.constexpr = 128):
    G = max(1, BN // TILE)
    W = G * TILE
    for pm, pn in k.grid(k.cdiv(q.shape[0], BM), k.cdiv(q.shape[1], W)):
        c = k.reshape(q[k.span(pm * BM, BM), k.span(pn * W, W)].to(k.f32), (BM, G, TILE))
        sc = s[k.span(pm * BM, BM), k.span(pn * G, G)]
        y[k.span(pm * BM, BM), k.span(pn * W, W)] = k.reshape(c * sc[:, :, None], (BM, W)).to(YT)


# ---------------------------------------------------------------- public functions

_MX_MODE_KW = {"ceil": {}, "floor": {"FLOOR": True}}    # constexprs by keyword only off the default


def _tile_kw(tile: int, pow2: bool) -> dict:
    kw = {} if tile == 128 else {"TILE": tile}
    return {**kw, "POW2": True} if pow2 else kw


def _groups(d: int, size: int) -> int:
    return -(-d // size)


def _check_scales(op: str, codes, scales, group: int, scale_dt):
    require_tensor(op, "codes", codes, (k.f8e4m3,))
    require_tensor(op, "scales", scales, (scale_dt,))
    want = tuple(codes.shape[:-1]) + (_groups(codes.shape[-1], group),)
    if tuple(scales.shape) != want:
        raise K31Error(f"{op}: `scales` must have shape {list(want)} for codes of shape {list(codes.shape)} "
                       f"(one per {group} along the last dim), got {list(scales.shape)}")


def mxfp8_quantize(x, scale_mode: str = "ceil", *, target: str | None = None):
    """MXFP8: groups of 32 along the last dim -> (codes float8_e4m3fn like x, scales
    float8_e8m0fnu [..., ceil(D/32)]).

    scale_mode="ceil" (default; NVIDIA RCEIL / DeepSeek ue8m0): scale 2^ceil(log2(amax/448)),
    never overflows. "floor" (OCP MX v1.0): 2^(floor(log2 amax) - 8), values above 448 after
    scaling saturate. Codes are x * 2^-e rounded to nearest even and saturated to +-448. All-zero
    group: byte 0, codes 0. A group with NaN/Inf: byte 0xFF and every code 0x7F."""
    import torch
    target = resolve_target(target)
    require_tensor("mxfp8_quantize", "x", x)
    if scale_mode not in SCALE_MODES:
        raise K31Error(f"mxfp8_quantize: scale_mode={scale_mode!r} is not supported",
                       hint="use \"ceil\" (RCEIL, the default) or \"floor\" (OCP MX)")
    d = x.shape[-1]
    codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(tuple(x.shape[:-1]) + (_groups(d, MX_GROUP),), dtype=torch.float8_e8m0fnu,
                         device=x.device)
    if x.numel():
        mxfp8_quantize_rows[target](rows(x), rows(codes), rows(scales), **_MX_MODE_KW[scale_mode])
    return codes, scales


def mxfp8_dequantize(codes, scales, dtype=None, *, target: str | None = None):
    """codes * 2^(scale byte - 127) per group of 32, in `dtype` (default bfloat16); byte 0xFF -> NaN."""
    import torch
    target = resolve_target(target)
    _check_scales("mxfp8_dequantize", codes, scales, MX_GROUP, k.e8m0)
    y_dt = require_dtype_arg("mxfp8_dequantize", "dtype", torch.bfloat16 if dtype is None else dtype)
    y = torch.empty(codes.shape, dtype=D.torch_dtype(y_dt), device=codes.device)
    if codes.numel():
        mxfp8_dequantize_rows[target](rows(codes), rows(scales), rows(y))
    return y


def _check_tile(op: str, tile):
    if not (isinstance(tile, int) and 16 <= tile <= 1024 and tile & (tile - 1) == 0):
        raise K31Error(f"{op}: tile={tile!r} must be a power of two between 16 and 1024")


def fp8_tile_quantize(x, tile: int = 128, pow2_scale: bool = False, eps: float = 1e-4, *,
                      target: str | None = None):
    """Per-tile FP8 (DeepSeek recipe): tiles of `tile` along the last dim -> (codes
    float8_e4m3fn like x, fp32 scales [..., ceil(D/tile)]).

    scale = max(amax, eps) / 448 in fp32 (pow2_scale: rounded up to a power of two); codes =
    x * fp32(1 / scale) (DeepGEMM's recipe: one reciprocal per tile) rounded to nearest even,
    saturated to +-448. A tile with NaN/Inf: scale NaN and
    every code 0x7F."""
    import torch
    target = resolve_target(target)
    require_tensor("fp8_tile_quantize", "x", x)
    _check_tile("fp8_tile_quantize", tile)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise K31Error(f"fp8_tile_quantize: eps must be a finite number > 0, got {eps!r}",
                       hint="eps floors the tile maximum so that all-zero tiles get a usable scale")
    d = x.shape[-1]
    codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(tuple(x.shape[:-1]) + (_groups(d, tile),), dtype=torch.float32, device=x.device)
    if x.numel():
        fp8_tile_quantize_rows[target](rows(x), rows(codes), rows(scales), float(eps), **_tile_kw(tile, pow2_scale))
    return codes, scales


def fp8_tile_dequantize(codes, scales, dtype=None, tile: int = 128, *, target: str | None = None):
    """fp32(code) * scale per tile, rounded to `dtype` (default bfloat16)."""
    import torch
    target = resolve_target(target)
    _check_tile("fp8_tile_dequantize", tile)
    _check_scales("fp8_tile_dequantize", codes, scales, tile, k.f32)
    y_dt = require_dtype_arg("fp8_tile_dequantize", "dtype", torch.bfloat16 if dtype is None else dtype)
    y = torch.empty(codes.shape, dtype=D.torch_dtype(y_dt), device=codes.device)
    if codes.numel():
        fp8_tile_dequantize_rows[target](rows(codes), rows(scales), rows(y), **_tile_kw(tile, False))
    return y


# ---------------------------------------------------------------- checks against the oracle

QUANT_CASES = [  # (shape, dtype name, variant)
    ((7, 200), "bf16", "ceil"), ((7, 200), "bf16", "floor"), ((3, 5, 96), "f32", "ceil"),
    ((4, 1), "f16", "ceil"), ((2, 1, 45), "f16", "floor"), ((37, 300), "f32", "floor"),
    ((9, 64), "bf16", "ceil"),
]


def _torch_dtype(name: str):
    return D.torch_dtype(D.from_name(name))


def _exact_results(name: str, code_mismatches: int, scale_mismatches: int, scale_what: str) -> list[CaseResult]:
    """Codes and scales of one quantize case: bit-exact against the oracle, so the bound is 0."""
    return [CaseResult(f"{name}: codes", code_mismatches, 0, code_mismatches == 0, "E4M3 bytes vs oracle"),
            CaseResult(f"{name}: scales", scale_mismatches, 0, scale_mismatches == 0, scale_what)]


def _roundtrip_result(name: str, ratio: float, note: str) -> CaseResult:
    return CaseResult(f"{name}: dequant(quant(x)) error / E4M3 bound", ratio, 1.0, ratio <= 1.0, note)


def _roundtrip_ratio(x, xhat, scale, group: int) -> tuple[float, str]:
    """Worst |xhat - x| / bound over finite groups, from the E4M3 format alone (not the oracle):
    |x|/scale in [2^-6, 448] -> bound 2^-4 |x| (RNE, 3 mantissa bits); below 2^-6 -> half the
    subnormal step, 2^-10 * scale; above 448 (floor mode saturation) -> xhat must be +-448*scale.
    Non-finite groups must dequantize to NaN. Returns (ratio, note)."""
    import numpy as np
    d = x.shape[-1]
    s = np.repeat(scale, group, axis=-1)[..., :d]
    with np.errstate(all="ignore"):
        v = np.abs(x) / s
        bound = np.where(v >= 2.0 ** -6, 2.0 ** -4 * np.abs(x), 2.0 ** -10 * s) * (1 + 2.0 ** -20)
        sat = v > 448 * (1 + 2.0 ** -20)
        err = np.abs(xhat - x)
        ratio = np.where(sat, np.where(np.abs(xhat) == 448 * s, 0.0, np.inf), err / bound)
    finite = np.isfinite(s)
    nan_ok = bool(np.isnan(xhat[~finite]).all())
    worst = float(np.nanmax(np.where(finite, ratio, 0.0))) if x.size else 0.0
    if not nan_ok:
        return float("inf"), "non-finite group did not dequantize to NaN"
    return worst, f"{int(sat.sum())} saturated"


def _check_mx_quant(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import bytes_of, device_for, load_oracle, mismatches, quant_input, to_f64
    ref = load_oracle("quant")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dt, mode in QUANT_CASES:
        x = quant_input(shape, _torch_dtype(dt), g, MX_GROUP).to(dev)
        codes, scales = mxfp8_quantize(x, scale_mode=mode, target=target)
        want_c, want_s = ref.mxfp8_quantize(to_f64(x), mode)
        name = f"x={list(shape)} {dt}, scale_mode={mode}"
        n_c, n_s = mismatches(bytes_of(codes), want_c), mismatches(bytes_of(scales), want_s)
        out += _exact_results(name, n_c, n_s, "E8M0 bytes vs oracle")
        xhat = to_f64(mxfp8_dequantize(codes, scales, torch.float32, target=target))
        sc = np.ldexp(1.0, bytes_of(scales).astype(np.int64) - 127)
        sc = np.where(bytes_of(scales) == 255, np.nan, sc)
        ratio, note = _roundtrip_ratio(to_f64(x), xhat, sc, MX_GROUP)
        if mode == "ceil" and "0 saturated" not in note:
            ratio, note = float("inf"), "ceil mode saturated: " + note
        out.append(_roundtrip_result(name, ratio, note))
    return out


def _check_mx_dequant(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, load_oracle, max_rel_err, to_f64
    ref = load_oracle("quant")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dt in (((5, 300), "bf16"), ((2, 3, 64), "f32"), ((6, 33), "f16"), ((1, 1), "bf16")):
        codes = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        sshape = shape[:-1] + (-(-shape[-1] // MX_GROUP),)
        sbytes = torch.randint(100, 150, sshape, generator=g, dtype=torch.uint8)
        flat = sbytes.view(-1)
        for i, b in enumerate((0, 254, 255, 1, 127)[:flat.numel()]):
            flat[-1 - i] = b                     # scale extremes and the NaN byte
        y = mxfp8_dequantize(codes.view(torch.float8_e4m3fn).to(dev), sbytes.view(torch.float8_e8m0fnu).to(dev),
                             dtype=_torch_dtype(dt), target=target)
        want = ref.mxfp8_dequantize(codes.numpy(), sbytes.numpy(), dt)
        err = max_rel_err(to_f64(y), want)
        n_bad = int(np.sum(~((to_f64(y) == want) | (np.isnan(want) & np.isnan(to_f64(y))))))
        out.append(CaseResult(f"codes={list(shape)} -> {dt}", n_bad, 0, n_bad == 0,
                              f"values differing from the oracle (max rel err {err:.3g})"))
    return out


def _check_tile_quant(target: str, seed: int = 0) -> list[CaseResult]:
    import torch
    from k31dsl.ops.testing import (bytes_of, device_for, f32_mismatches, load_oracle, mismatches, quant_input,
                                    to_f64)
    ref = load_oracle("quant")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    cases = [((7, 300), "bf16", 128, False), ((7, 300), "bf16", 128, True), ((3, 2, 256), "f32", 128, False),
             ((4, 1), "f16", 128, True), ((2, 1, 200), "f16", 64, False), ((9, 160), "f32", 32, True),
             ((17, 500), "bf16", 128, False)]
    out = []
    for shape, dt, tile, pow2 in cases:
        x = quant_input(shape, _torch_dtype(dt), g, tile).to(dev)
        codes, scales = fp8_tile_quantize(x, tile=tile, pow2_scale=pow2, target=target)
        want_c, want_s = ref.fp8_tile_quantize(to_f64(x), tile, pow2, 1e-4)
        name = f"x={list(shape)} {dt}, tile={tile}, pow2_scale={pow2}"
        n_c, n_s = mismatches(bytes_of(codes), want_c), f32_mismatches(scales.cpu().numpy(), want_s)
        out += _exact_results(name, n_c, n_s, "fp32 bits vs oracle (NaN == NaN)")
        xhat = to_f64(fp8_tile_dequantize(codes, scales, torch.float32, tile=tile, target=target))
        ratio, note = _roundtrip_ratio(to_f64(x), xhat, to_f64(scales), tile)
        out.append(_roundtrip_result(name, ratio, note))
    return out


def _check_tile_dequant(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, load_oracle, max_rel_err, to_f64
    ref = load_oracle("quant")
    dev = device_for(target)
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dt, tile in (((5, 300), "bf16", 128), ((2, 3, 64), "f32", 32), ((6, 130), "f16", 64)):
        codes = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        sshape = shape[:-1] + (-(-shape[-1] // tile),)
        scales = torch.rand(sshape, generator=g) * torch.exp2(torch.randint(-20, 10, sshape, generator=g).float())
        scales.view(-1)[0] = float("nan")
        y = fp8_tile_dequantize(codes.view(torch.float8_e4m3fn).to(dev), scales.to(dev), dtype=_torch_dtype(dt), tile=tile,
                                target=target)
        want = ref.fp8_tile_dequantize(codes.numpy(), scales.double().numpy(), tile, dt)
        err = max_rel_err(to_f64(y), want)
        n_bad = int(np.sum(~((to_f64(y) == want) | (np.isnan(want) & np.isnan(to_f64(y))))))
        out.append(CaseResult(f"codes={list(shape)}, tile={tile} -> {dt}", n_bad, 0, n_bad == 0,
                              f"values differing from the oracle (max rel err {err:.3g})"))
    return out


register(OpSpec("mxfp8_quantize", "quant", mxfp8_quantize, [mxfp8_quantize_rows],
                "MXFP8 quantize: groups of 32, E4M3 codes, E8M0 scale (RCEIL default, OCP floor option)",
                _check_mx_quant, exact=True, tags=["quant", "fp8"]))
register(OpSpec("mxfp8_dequantize", "quant", mxfp8_dequantize, [mxfp8_dequantize_rows],
                "MXFP8 dequantize: code * 2^(byte - 127) per group of 32", _check_mx_dequant, exact=True,
                tags=["quant", "fp8"]))
register(OpSpec("fp8_tile_quantize", "quant", fp8_tile_quantize, [fp8_tile_quantize_rows],
                "per-tile FP8 quantize (DeepSeek): fp32 scale max(amax, eps)/448, optional power of two",
                _check_tile_quant, exact=True, tags=["quant", "fp8"]))
register(OpSpec("fp8_tile_dequantize", "quant", fp8_tile_dequantize, [fp8_tile_dequantize_rows],
                "per-tile FP8 dequantize: fp32(code) * scale", _check_tile_dequant, exact=True,
                tags=["quant", "fp8"]))

"""Helpers the ops' `check(target, seed)` functions share: loading the fp64 oracles (kept in the
source tree under tests/oracles/, written from the math and independent of the DSL code),
converting tensors, and the error measures used by CaseResult."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from k31dsl.dsl.errors import K31Error

ORACLE_PACKAGE = "k31_oracles"


def oracle_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "tests" / "oracles"


def load_oracle(name: str):
    """The oracle module tests/oracles/<name>.py: from the source checkout (imported as
    k31_oracles.<name>), else from an installed k31dsl (k31dsl.tests.oracles.<name>)."""
    if ORACLE_PACKAGE not in sys.modules:
        root = oracle_dir()
        init = root / "__init__.py"
        if not init.exists():
            try:
                return importlib.import_module(f"k31dsl.tests.oracles.{name}")
            except ImportError:
                raise K31Error(f"the fp64 oracles are not available (looked in {root} and k31dsl.tests.oracles)",
                               hint="`k31dsl check` needs a source checkout or an install that ships "
                                    "k31dsl.tests.oracles") from None
        spec = importlib.util.spec_from_file_location(ORACLE_PACKAGE, init, submodule_search_locations=[str(root)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[ORACLE_PACKAGE] = pkg
        spec.loader.exec_module(pkg)
    return importlib.import_module(f"{ORACLE_PACKAGE}.{name}")


def device_for(target: str) -> str:
    """Where a check's inputs live: CUDA for the Triton target on a GPU, else the CPU."""
    if target == "triton":
        from k31dsl.targets.triton.emit import detect_mode
        if detect_mode() == "gpu":
            return "cuda"
    return "cpu"


def to_f64(t):
    """A torch tensor (any float dtype, fp8 included) as a float64 NumPy array, exactly."""
    import torch
    return t.detach().to("cpu").to(torch.float64).numpy()


def bytes_of(t):
    """The raw bytes of a 1-byte tensor (fp8 codes, e8m0 scales) as uint8 NumPy."""
    import torch
    assert t.element_size() == 1, t.dtype
    return t.detach().to("cpu").contiguous().view(torch.uint8).numpy()


def max_rel_err(got, want, floor: float = 0.0) -> float:
    """max |got - want| / max(|want|, floor); NaN where exactly one side is NaN counts as inf."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    if (nan_g != nan_w).any():
        return float("inf")
    ok = ~nan_w
    with np.errstate(all="ignore"):
        err = np.abs(got[ok] - want[ok]) / np.maximum(np.abs(want[ok]), floor)
    same = got[ok] == want[ok]          # equal infinities count as exact
    err = np.where(same, 0.0, err)
    return float(err.max()) if err.size else 0.0


def mismatches(got, want) -> int:
    """Elements whose bit patterns differ (NumPy arrays of equal dtype and shape)."""
    import numpy as np
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return max(got.size, want.size, 1)
    return int((got != want).sum())


def f32_mismatches(got, want) -> int:
    """fp32 values that differ bitwise, treating any NaN as equal to any NaN."""
    import numpy as np
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    if got.shape != want.shape:
        return max(got.size, want.size, 1)
    both_nan = np.isnan(got) & np.isnan(want)
    return int(((got.view(np.uint32) != want.view(np.uint32)) & ~both_nan).sum())


# ---------------------------------------------------------------- inputs with edge cases

SPECIAL_KINDS = ("nan", "inf", "-inf", "zero", "huge", "tiny", "mant_hi", "edge448", "wide")


def quant_input(shape, dtype, gen, group: int, kinds=SPECIAL_KINDS):
    """Random values with a spread of magnitudes per row, then one group per special kind
    (filled in row-major group order while groups last):
      nan/inf/-inf: one non-finite element;  zero: all zeros (one -0.0);  huge: beyond +-448;
      tiny: subnormal magnitudes of the dtype;  mant_hi: group max with mantissa 1.9 (> 1.75);
      edge448: group max exactly 448 * 2^-3;  wide: 448 next to values that become E4M3
      subnormals or zero."""
    import torch
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    d = shape[-1]
    x2 = x.view(-1, d)
    spread = torch.exp2(torch.randint(-6, 7, (x2.shape[0], 1), generator=gen).double())
    x2 *= spread
    tiny = 2.0 ** -135 if dtype in (torch.float32, torch.bfloat16) else 2.0 ** -20
    slots = [(r, g) for r in range(x2.shape[0]) for g in range(-(-d // group))]
    for kind, (r, g) in zip(kinds, slots):
        lo, hi = g * group, min(d, (g + 1) * group)
        v = x2[r, lo:hi]
        n = hi - lo
        pos = int(torch.randint(0, n, (1,), generator=gen))
        if kind == "nan":
            v[pos] = float("nan")
        elif kind == "inf":
            v[pos] = float("inf")
        elif kind == "-inf":
            v[pos] = float("-inf")
        elif kind == "zero":
            v.zero_()
            v[pos] = -0.0
        elif kind == "huge":
            v.mul_(5e3 / spread[r, 0])
        elif kind == "tiny":
            v.mul_(tiny / spread[r, 0])
        elif kind == "mant_hi":
            v.mul_(0.5 / spread[r, 0])
            v[pos] = -1.9 * 32
        elif kind == "edge448":
            v.clamp_(-50, 50)
            v[pos] = 448.0 / 8
        elif kind == "wide":
            v.mul_(2.0 ** -12 / spread[r, 0])
            v[pos] = 448.0
    return x.to(dtype)


def dtype_name(t) -> str:
    return {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}.get(str(t), str(t))


# ---------------------------------------------------------------- per-dtype checks (nn, mla ops; moe uses TOL)

# tolerance of a checked output by its dtype: max abs error / max |want|
TOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 2e-2}


def rel_err(got, want) -> float:
    """max |got - want| / max |want| (inf on a shape mismatch or a NaN)."""
    import numpy as np
    g = to_f64(got) if not isinstance(got, np.ndarray) else got
    if g.shape != want.shape or np.isnan(g).any():
        return float("inf")
    return float(np.abs(g - want).max() / max(float(np.abs(want).max()), 1e-30)) if want.size else 0.0


def result(case: str, got, want, dtype, detail: str = "max abs err / max |want|"):
    """A CaseResult at the tolerance of the output dtype."""
    from k31dsl.ops.registry import CaseResult
    err, tol = rel_err(got, want), TOL[str(dtype).replace("torch.", "")]
    return CaseResult(case, err, tol, bool(err <= tol), detail)


def for_target(target: str, cases, ascendc=(0,)):
    """The cases to check: all of them, but on ascendc (one g++ build per specialisation, most
    cases differ in dtypes) only those listed."""
    return [cases[i] for i in ascendc] if target == "ascendc" else list(cases)


def rand(shape, g, dtype, scale=1.0):
    """Normal values times `scale` from generator g, as `dtype` (torch)."""
    import torch
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def dtype_names(*dts):
    """"bf16/f32"-style names of torch dtypes, for case labels."""
    return "/".join(dtype_name(d) for d in dts)

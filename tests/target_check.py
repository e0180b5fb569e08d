"""Running one kernel on a target and on the numpy reference target, and comparing the outputs:
bit for bit where the result is exact (integers, one-byte floats, names in `exact`), within
float tolerance elsewhere. Shared by the per-target test files and test_target_semantics.py."""
from __future__ import annotations

import numpy as np
import torch

import k31dsl as k


def device_of(target: str) -> str:
    if target == "triton":
        from k31dsl.targets.triton.emit import detect_mode
        return "cuda" if detect_mode() == "gpu" else "cpu"
    return "cpu"


def run_both(target: str, kern, inputs: dict, outputs: dict, *scalars, **cx) -> dict:
    """`kern` on numpy and on `target`, each with fresh copies of the same outputs: {target: outs}."""
    got = {}
    for t in ("numpy", target):
        dev = device_of(t)
        ins = [x.to(dev) for x in inputs.values()]
        outs = {n: x.clone().to(dev) for n, x in outputs.items()}
        k.compile(kern, target=t)(*ins, *outs.values(), *scalars, **cx)
        got[t] = {n: x.cpu() for n, x in outs.items()}
    return got


def same_bits(a: torch.Tensor, b: torch.Tensor, name: str = ""):
    ua, ub = (t.contiguous().view(torch.uint8) if t.element_size() == 1 else t for t in (a, b))
    if a.dtype.is_floating_point and a.element_size() > 1:
        na, nb = torch.isnan(a), torch.isnan(b)
        assert torch.equal(na, nb), f"{name}: NaN lanes differ"
        # NaN payloads and the sign of a zero from max / min are not part of the contract (dsl/ir.py);
        # everything else is compared as bits
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        ua, ub = a.masked_fill(na | (a == 0), 0).view(bits), b.masked_fill(nb | (b == 0), 0).view(bits)
    assert torch.equal(ua, ub), f"{name}: differs at {torch.nonzero(ua != ub)[:8].tolist()}"


def compare(got: dict, exact=(), rtol=1e-5, atol=1e-6):
    """Every output of the one non-numpy target in `got` against numpy's."""
    target = next(t for t in got if t != "numpy")
    for name, a in got["numpy"].items():
        b = got[target][name]
        if name in exact or not a.dtype.is_floating_point or a.element_size() == 1:
            same_bits(a, b, name)
        else:
            np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), rtol=rtol, atol=atol,
                                       equal_nan=True, err_msg=name)

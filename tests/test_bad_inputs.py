"""Bad input to any public op of the library is a K31Error and changes nothing. Per op: the first
call its own check makes (numpy target, and Triton's on a GPU machine; fresh seed) is recorded, then repeated with one argument
broken at a time — None, a list, float64, int64, an extra leading dimension, one row less, no rows,
a non-contiguous view, one column less. Each call must either work (several of these are valid
inputs: fewer tokens, an optional argument left out) or raise K31Error, which must leave every
tensor argument as it was; any other exception is a crash inside the library. (This found a short
`ke` crashing in torch inside li_sfa_unfused, a 3-D `x` reaching a tuple unpack in
indexer_prolog, and indexer_prolog writing slots past its cache unchecked.)"""
from __future__ import annotations

import sys
import traceback

import pytest
import torch

from k31dsl import K31Error
from k31dsl.ops.registry import all_ops

OPS = all_ops()
# numpy everywhere; Triton's compiler too on a GPU machine (there a tensor on the CPU is one more
# bad input). The interpreter would add minutes on CI's cores for what numpy already covers.
TARGETS = ["numpy"] + (["triton"] if torch.cuda.is_available() else [])


def broken(t) -> list[tuple[str, object]]:
    if not isinstance(t, torch.Tensor):
        return []
    as_i64 = t.view(torch.uint8).long() if t.is_floating_point() and t.element_size() == 1 else t.long()
    out = [("None", None), ("a list", [1, 2]), ("float64", t.double()), ("int64", as_i64),
           ("an extra leading dim", t.unsqueeze(0))]
    if t.is_cuda:
        out.append(("a CPU tensor", t.cpu()))
    if t.dim() >= 1:
        out += [("one row less", t[:-1]), ("no rows", t[:0])]
    if t.dim() >= 2:
        out += [("non-contiguous", t.transpose(0, 1).contiguous().transpose(0, 1)), ("one column less", t[:, :-1])]
    return out


def first_call(spec, target: str, seed: int, monkeypatch):
    """(args, kwargs) of the first call spec.check(target, seed) makes to spec.fn, wherever the
    check's module reaches it from."""
    seen = []

    def recorder(*a, **kw):
        if not seen:
            seen.append((a, kw))
        return spec.fn(*a, **kw)
    for mod in [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("k31dsl")]:
        for attr, value in list(vars(mod).items()):
            if value is spec.fn:
                monkeypatch.setattr(mod, attr, recorder)
    spec.check(target, seed)
    monkeypatch.undo()
    assert seen, f"{spec.name}: its check never called {spec.fn.__name__}"
    return seen[0]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).clone()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_bad_arguments_raise_k31error_and_change_nothing(name, target, rng, monkeypatch):
    spec = OPS[name]
    args, kwargs = first_call(spec, target, int(rng.integers(2 ** 31)), monkeypatch)
    kwargs = {**kwargs, "target": target}
    places = [(i, None) for i in range(len(args))] + [(None, key) for key in kwargs if key != "target"]
    crashes, changed = [], []
    for i, key in places:
        for how, value in broken(args[i] if i is not None else kwargs[key]):
            a, kw = list(args), dict(kwargs)
            if i is not None:
                a[i] = value
            else:
                kw[key] = value
            tensors = [t for t in a + list(kw.values()) if isinstance(t, torch.Tensor)]
            before = [as_bytes(t) for t in tensors]
            what = f"argument {i if i is not None else key} as {how}"
            try:
                spec.fn(*a, **kw)
            except K31Error:
                changed += [what for t, b in zip(tensors, before) if not torch.equal(as_bytes(t), b)]
            except Exception as e:  # noqa: BLE001 - the failure this test looks for
                where = traceback.extract_tb(e.__traceback__)[-1]
                crashes.append(f"{what}: {type(e).__name__}: {e} ({where.filename.split('/')[-1]}:{where.lineno})")
    assert not crashes, crashes
    assert not changed, f"a K31Error after writing into its arguments: {changed}"

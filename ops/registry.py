"""The op library's catalogue: every public op registers an `OpSpec` here so that
`k31dsl ops` can list it and `k31dsl check` can test it against its oracle on any target."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class CaseResult:
    """One checked case: which shape/variant, the worst error seen, the bound it must stay under."""
    case: str                  # e.g. "x=[7, 96] bf16, scale_mode=ceil"
    max_err: float             # max abs error (or mismatching code count for bit-exact checks)
    tol: float
    passed: bool
    detail: str = ""


@dataclass
class OpSpec:
    name: str                          # public name, e.g. "mxfp8_quantize"
    module: str                        # "quant", "common", ...
    fn: Callable                       # the public function over torch tensors, takes target=
    kernels: list                      # the KernelDefs it launches (for `compile`/round trips)
    summary: str                       # one line for `k31dsl ops`
    check: Callable[..., list[CaseResult]]   # check(target, seed) -> results vs the oracle
    exact: bool = False                # bit-exact against the oracle (quantizer codes and scales)
    tags: list[str] = field(default_factory=list)

    @property
    def config_count(self) -> int:
        """The config numbers `--config N` tells apart: the most configs any of its kernels has
        (1 when none has a list)."""
        return max([len(kd.configs) for kd in self.kernels] + [1])


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"op {spec.name} registered twice")
    REGISTRY[spec.name] = spec
    return spec


def all_ops() -> dict[str, OpSpec]:
    """Import the op modules (which register themselves) and return the catalogue."""
    from k31dsl.ops import common, quant  # noqa: F401
    from k31dsl.ops import attnres, attnres_cached  # noqa: F401
    from k31dsl.ops import kda  # noqa: F401
    from k31dsl.ops.dsa import indexer_checks  # noqa: F401
    from k31dsl.ops.dsa import attention_checks, fused  # noqa: F401
    from k31dsl.ops import nn_checks  # noqa: F401
    from k31dsl.ops.dsa import mla  # noqa: F401
    from k31dsl.ops import moe  # noqa: F401
    return dict(REGISTRY)

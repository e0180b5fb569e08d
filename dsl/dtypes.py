"""Element types of the DSL and their facts (width, kind, finite range).

One `DType` object per type; they are singletons, compared by identity, printed by name.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str          # the DSL and text-form spelling, e.g. "bf16"
    bits: int
    kind: str          # "float", "int", "uint", "bool", "fp8", "scale"
    signed: bool = True
    max_finite: float | None = None   # fp8: the saturation bound of a cast

    def __repr__(self) -> str:
        return f"k.{self.name}"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:          # computes like a float (fp8/e8m0 are storage only)
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_storage_only(self) -> bool:   # values exist only to be cast, stored or loaded
        return self.kind in ("fp8", "scale")


bf16 = DType("bf16", 16, "float")
f16 = DType("f16", 16, "float")
f32 = DType("f32", 32, "float")
f64 = DType("f64", 64, "float")
i8 = DType("i8", 8, "int")
i32 = DType("i32", 32, "int")
i64 = DType("i64", 64, "int")
u8 = DType("u8", 8, "uint", signed=False)
u32 = DType("u32", 32, "uint", signed=False)
bool_ = DType("bool", 1, "bool", signed=False)
f8e4m3 = DType("f8e4m3", 8, "fp8", max_finite=448.0)
f8e5m2 = DType("f8e5m2", 8, "fp8", max_finite=57344.0)
e8m0 = DType("e8m0", 8, "scale", signed=False)

ALL = (bf16, f16, f32, f64, i8, i32, i64, u8, u32, bool_, f8e4m3, f8e5m2, e8m0)
BY_NAME = {d.name: d for d in ALL}

# fp8 element formats: (exponent bits, mantissa bits, bias); used by every target's cast helpers.
FP8_FORMAT = {"f8e4m3": (4, 3, 7), "f8e5m2": (5, 2, 15)}


def from_name(name: str) -> DType:
    return BY_NAME[name]


def torch_dtype(dt: DType):
    import torch
    return {
        "bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64,
        "i8": torch.int8, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
        "u32": torch.uint32, "bool": torch.bool, "f8e4m3": torch.float8_e4m3fn,
        "f8e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu,
    }[dt.name]


_FROM_TORCH: dict = {}


def from_torch(tdt) -> DType | None:
    if not _FROM_TORCH:
        for d in ALL:
            _FROM_TORCH[torch_dtype(d)] = d
    return _FROM_TORCH.get(tdt)


def numpy_dtype(dt: DType):
    import ml_dtypes
    import numpy as np
    return {
        "bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32, "f64": np.float64,
        "i8": np.int8, "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u32": np.uint32,
        "bool": np.bool_, "f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2,
        "e8m0": ml_dtypes.float8_e8m0fnu,
    }[dt.name]


def from_numpy(npdt) -> DType | None:
    import numpy as np
    for d in ALL:
        if np.dtype(numpy_dtype(d)) == np.dtype(npdt):
            return d
    return None

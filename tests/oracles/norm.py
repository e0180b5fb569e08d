"""Normalisation layers in fp64."""
from __future__ import annotations

import numpy as np


def rmsnorm(x, w, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2, last dim) + eps) * w."""
    x = np.asarray(x, np.float64)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * np.asarray(w, np.float64)

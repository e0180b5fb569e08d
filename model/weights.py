"""Model weights: deterministic random initialisation, safetensors files, validation.

Every tensor is named and shaped by `K31Config.weight_shapes()`. A model file carries its config
(JSON) and the config's digest in the safetensors metadata, so `load_weights(path)` alone rebuilds
the model; every name, shape and dtype is checked against the config's table before any tensor
is returned, and all problems are reported at once.

Random weights are a function of (seed, tensor name) only: each tensor draws from its own CPU
generator seeded by a hash of both, so the same seed gives bit-identical tensors on every machine
and adding a layer does not shift the other tensors. Scales keep activations O(1) through the
presets and make greedy decoding produce varied tokens (see `_init_one`).
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import K31Config

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
META_CONFIG = "k31.config"
META_DIGEST = "k31.digest"
LOGIT_STD = 3.0          # target std of the logits with random weights (varied greedy tokens)


def _generator(seed: int, name: str) -> torch.Generator:
    h = hashlib.sha256(f"k31:{seed}:{name}".encode()).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))


def _init_one(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    def normal(std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    leaf = name.rsplit(".", 1)[-1]
    if name == "embed":
        return normal(1.0)
    if name == "lm_head":                          # rmsnorm(h) has rms ~1 -> logits std ~LOGIT_STD
        return normal(LOGIT_STD / math.sqrt(shape[1]))
    if leaf == "query":                            # non-zero pseudo-queries: depth attention not uniform
        return normal(shape[0] ** -0.5)
    if leaf in ("norm", "attn_norm", "mlp_norm", "final_norm", "q_a_norm", "kv_a_norm", "o_norm",
                "idx_k_norm_w"):
        return 1.0 + normal(0.1)
    if leaf == "idx_k_norm_b":
        return normal(0.1)
    if leaf == "A_log":                            # fla's init: log U(1, 16)
        return torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen, dtype=torch.float32))
    if leaf == "dt_bias":
        return normal(0.1)
    if leaf in ("q_conv", "k_conv", "v_conv"):
        return normal(0.5)
    if leaf in ("w_uk", "w_uv"):                   # [H, dn|dv, 512]: w_uk contracts dn, w_uv contracts 512
        return normal(shape[1] ** -0.5 if leaf == "w_uk" else shape[2] ** -0.5)
    if leaf in ("gate_up", "down"):                # [E, out, in]
        return normal(shape[2] ** -0.5)
    if len(shape) == 2:                            # every other projection, torch Linear [out, in]
        return normal(shape[1] ** -0.5)
    raise K31Error(f"init_weights: no initialisation rule for weight {name!r} of shape {list(shape)}")


def init_weights(config: K31Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32 CPU tensors for every weight of `config`, deterministic in (seed, name)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise K31Error(f"init_weights: seed must be an int, got {seed!r}")
    return {name: _init_one(name, shape, _generator(seed, name))
            for name, shape in config.weight_shapes().items()}


def cast_weights(weights: dict[str, torch.Tensor], dtype) -> dict[str, torch.Tensor]:
    """A copy of `weights` in `dtype` (a torch dtype or its name: 'float32', 'bfloat16')."""
    if isinstance(dtype, str):
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise K31Error(f"cast_weights: unknown dtype {dtype!r}")
        dtype = dt
    if dtype not in FLOAT_DTYPES:
        raise K31Error(f"cast_weights: dtype must be one of {[str(d) for d in FLOAT_DTYPES]}, got {dtype}")
    return {n: t.to(dtype) for n, t in weights.items()}


def check_weights(config: K31Config, weights: dict, origin: str = "weights") -> None:
    """Raise one K31Error listing every missing, extra, misshapen or non-float tensor."""
    want = config.weight_shapes()
    problems = []
    for name, shape in want.items():
        if name not in weights:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
            continue
        t = weights[name]
        found = list(t.shape) if hasattr(t, "shape") else type(t).__name__
        if found != list(shape):
            problems.append(f"tensor {name!r} has shape {found}, expected {list(shape)}")
        dt = getattr(t, "dtype", None)
        if dt not in FLOAT_DTYPES:
            problems.append(f"tensor {name!r} has dtype {dt}, expected one of float32, bfloat16, float16")
    for name in sorted(set(weights) - set(want)):
        t = weights[name]
        problems.append(f"unexpected tensor {name!r} (shape {list(getattr(t, 'shape', []))}) "
                        f"is not a weight of config {config.name!r}")
    if problems:
        raise K31Error(f"{origin}: {len(problems)} problem(s) with the weights of config {config.name!r} "
                       f"(digest {config.digest()}):\n  " + "\n  ".join(problems),
                       hint="the file must hold exactly the tensors of K31Config.weight_shapes()")


def save_weights(path, config: K31Config, weights: dict[str, torch.Tensor]) -> None:
    """Write a safetensors file holding `weights` and, in its metadata, the config and its digest."""
    from safetensors.torch import save_file
    check_weights(config, weights, origin=f"save_weights({path})")
    meta = {META_CONFIG: json.dumps(config.to_dict(), sort_keys=True), META_DIGEST: config.digest(),
            "format": "pt"}
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in weights.items()}
    try:
        save_file(tensors, str(path), metadata=meta)
    except OSError as e:
        raise K31Error(f"{path}: cannot write the weights file: {e}") from None


_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class _Header:
    """Shapes and dtypes of a safetensors file's tensors, read without loading their data."""

    def __init__(self, path: Path):
        from safetensors import safe_open
        self.path = path
        try:
            with safe_open(str(path), framework="pt") as f:
                self.metadata = f.metadata() or {}
                self.entries = {}
                for name in f.keys():
                    sl = f.get_slice(name)
                    self.entries[name] = (list(sl.get_shape()), _ST_DTYPES.get(sl.get_dtype(), sl.get_dtype()))
        except FileNotFoundError:
            raise K31Error(f"{path}: no such weights file") from None
        except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt or foreign file
            raise K31Error(f"{path}: not a readable safetensors weights file ({type(e).__name__}: {e})",
                           hint="re-create it with k31dsl.model.weights.save_weights") from None


def _config_of(path: Path, meta: dict, config: K31Config | None) -> K31Config:
    text, digest = meta.get(META_CONFIG), meta.get(META_DIGEST)
    if text is None:
        if config is None:
            raise K31Error(f"{path}: the weights file has no K31 config in its metadata",
                           hint="pass the config explicitly (--config tiny|small|FILE)")
        return config
    try:
        stored = K31Config.from_dict(json.loads(text), origin=f"{path} (metadata)")
    except json.JSONDecodeError as e:
        raise K31Error(f"{path}: the config in the file's metadata is not valid JSON: {e.msg}") from None
    if digest is not None and digest != stored.digest():
        raise K31Error(f"{path}: the config digest in the metadata ({digest}) does not match the stored "
                       f"config ({stored.digest()}); the file was altered")
    if config is not None and config.digest() != stored.digest():
        diff = [f"{k}: file {v!r} vs given {getattr(config, k)!r}"
                for k, v in stored.to_dict().items() if getattr(config, k) != v]
        raise K31Error(f"{path}: the weights were saved for config {stored.name!r} (digest {stored.digest()}), "
                       f"not the given config {config.name!r} (digest {config.digest()}): " + "; ".join(diff),
                       hint="load without a config to use the file's own, or pass the matching config")
    return stored


def load_weights(path, config: K31Config | None = None, device=None) -> tuple[K31Config, dict[str, torch.Tensor]]:
    """(config, weights) of a safetensors file written by `save_weights`. The config comes from the
    file's metadata (a given config must have the same digest). Every name, shape and dtype is
    checked before any tensor is loaded; any problem raises K31Error and nothing is returned."""
    path = Path(path)
    header = _Header(path)
    cfg = _config_of(path, header.metadata, config)
    want = cfg.weight_shapes()
    problems = []
    for name, shape in want.items():
        if name not in header.entries:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
            continue
        found, dt = header.entries[name]
        if found != list(shape):
            problems.append(f"tensor {name!r} has shape {found}, expected {list(shape)}")
        if dt not in FLOAT_DTYPES:
            problems.append(f"tensor {name!r} has dtype {dt}, expected one of float32, bfloat16, float16")
    for name in sorted(set(header.entries) - set(want)):
        problems.append(f"unexpected tensor {name!r} (shape {header.entries[name][0]}) "
                        f"is not a weight of config {cfg.name!r}")
    if problems:
        raise K31Error(f"{path}: {len(problems)} problem(s) with the weights for config {cfg.name!r}:\n  "
                       + "\n  ".join(problems),
                       hint="the file must hold exactly the tensors of K31Config.weight_shapes(); nothing was loaded")
    from safetensors.torch import load_file
    try:
        weights = load_file(str(path), device=str(device) if device is not None else "cpu")
    except Exception as e:  # noqa: BLE001 - truncated data after a valid header
        raise K31Error(f"{path}: cannot read the tensor data ({type(e).__name__}: {e})") from None
    return cfg, weights

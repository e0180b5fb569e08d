"""Model weights: deterministic init, safetensors round trip, and refusal of every bad file with the
tensor's (or the file's) name and nothing loaded."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import TINY
from k31dsl.model.weights import cast_weights, check_weights, init_weights, load_weights, save_weights


def _seed(rng) -> int:
    return int(rng.integers(0, 2**31))


def test_init_covers_the_table_deterministically(rng):
    seed = _seed(rng)
    a, b, c = init_weights(TINY, seed), init_weights(TINY, seed), init_weights(TINY, seed + 1)
    shapes = TINY.weight_shapes()
    assert set(a) == set(shapes)
    for name, shape in shapes.items():
        assert tuple(a[name].shape) == shape and a[name].dtype == torch.float32 and a[name].device.type == "cpu"
        assert torch.equal(a[name], b[name]), name
        assert torch.isfinite(a[name]).all(), name
    differ = [n for n in shapes if not torch.equal(a[n], c[n])]
    assert len(differ) == len(shapes)              # every tensor depends on the seed
    # per (seed, name): another config's shared tensors are the same draws
    other = init_weights(TINY.replace(n_layers=5), seed)
    assert torch.equal(other["layers.0.attn.q_proj"], a["layers.0.attn.q_proj"])


def test_init_scales(rng):
    w = init_weights(TINY, _seed(rng))
    assert w["layers.0.attn_res.query"].abs().sum() > 0          # AttnRes must not start uniform
    a_log = w["layers.0.attn.A_log"]
    assert (a_log >= 0).all() and (a_log <= torch.log(torch.tensor(16.0))).all()
    assert abs(w["layers.1.attn.q_proj"].std().item() - TINY.d_model ** -0.5) < 0.03
    assert abs(w["final_norm"].mean().item() - 1.0) < 0.1


def test_round_trip_is_bit_exact(tmp_path, rng):
    w = init_weights(TINY, _seed(rng))
    w["embed"][0, 0] = -0.0                         # signed zero survives too
    path = tmp_path / "m.safetensors"
    save_weights(path, TINY, w)
    cfg, got = load_weights(path)
    assert cfg == TINY
    assert set(got) == set(w)
    for n in w:
        assert got[n].dtype == w[n].dtype and torch.equal(got[n].view(torch.int32), w[n].view(torch.int32)), n
    cfg2, got2 = load_weights(path, TINY)           # with the matching config
    assert cfg2 == TINY and torch.equal(got2["lm_head"], w["lm_head"])
    b = cast_weights(w, "bfloat16")
    save_weights(tmp_path / "b.safetensors", TINY, b)
    _, gb = load_weights(tmp_path / "b.safetensors")
    assert gb["embed"].dtype == torch.bfloat16 and torch.equal(gb["embed"], b["embed"])


def _raw_file(path, tensors, config=TINY):
    meta = {"k31.config": json.dumps(config.to_dict(), sort_keys=True), "k31.digest": config.digest()}
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(path), metadata=meta)


@pytest.mark.parametrize("problem", ["missing", "misshapen", "extra", "int dtype"])
def test_bad_tensor_is_named_and_nothing_loads(tmp_path, rng, problem):
    w = init_weights(TINY, _seed(rng))
    names = sorted(w)
    victim = names[int(rng.integers(len(names)))]
    shape = list(w[victim].shape)
    if problem == "missing":
        del w[victim]
        expect = [victim, str(shape)]
    elif problem == "misshapen":
        bad = shape[:-1] + [shape[-1] + 1]
        w[victim] = torch.zeros(bad)
        expect = [victim, str(bad), str(shape)]
    elif problem == "extra":
        victim = "layers.0.attn.bonus"
        w[victim] = torch.zeros(3, 2)
        expect = [victim, "[3, 2]"]
    else:
        w[victim] = torch.zeros(shape, dtype=torch.int32)
        expect = [victim, "int32"]
    path = tmp_path / "bad.safetensors"
    _raw_file(path, w)
    loaded = None
    with pytest.raises(K31Error) as err:
        loaded = load_weights(path)
    assert loaded is None
    for s in expect + [str(path)]:
        assert s in str(err.value), (s, str(err.value))
    with pytest.raises(K31Error, match="bad.safetensors"):   # saving refuses the same dict up front
        save_weights(tmp_path / "bad.safetensors", TINY, w)


def test_every_problem_is_listed(tmp_path, rng):
    w = init_weights(TINY, _seed(rng))
    del w["embed"]
    w["lm_head"] = torch.zeros(3, 4)
    w["stray"] = torch.zeros(1)
    with pytest.raises(K31Error) as err:
        check_weights(TINY, w)
    msg = str(err.value)
    assert "3 problem(s)" in msg and "'embed'" in msg and "'lm_head'" in msg and "[3, 4]" in msg and "'stray'" in msg


def test_wrong_config_digest_refused(tmp_path, rng):
    w = init_weights(TINY, _seed(rng))
    path = tmp_path / "m.safetensors"
    save_weights(path, TINY, w)
    other = TINY.replace(rms_eps=1e-5)                        # same shapes, different model
    with pytest.raises(K31Error, match="digest") as err:
        load_weights(path, other)
    assert "rms_eps" in str(err.value)
    # metadata whose digest does not belong to its config (an edited file)
    _raw_file(path, w)
    meta_cfg = TINY.replace(attnres_eps=1e-5)
    save_file({n: t.contiguous() for n, t in w.items()}, str(path),
              metadata={"k31.config": json.dumps(meta_cfg.to_dict()), "k31.digest": TINY.digest()})
    with pytest.raises(K31Error, match="altered"):
        load_weights(path)


def test_file_without_config(tmp_path, rng):
    w = init_weights(TINY, _seed(rng))
    path = tmp_path / "plain.safetensors"
    save_file(w, str(path))
    with pytest.raises(K31Error, match="no K31 config"):
        load_weights(path)
    cfg, got = load_weights(path, TINY)
    assert cfg == TINY and torch.equal(got["embed"], w["embed"])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "absent"])
def test_corrupt_file_refused(tmp_path, rng, damage):
    path = tmp_path / "m.safetensors"
    save_weights(path, TINY, init_weights(TINY, _seed(rng)))
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:int(rng.integers(9, len(data) - 1))])
    elif damage == "garbage":
        path.write_bytes(bytes(rng.integers(0, 256, 4096, dtype="uint8")))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path = tmp_path / "nope.safetensors"
    with pytest.raises(K31Error) as err:
        load_weights(path)
    assert str(path) in str(err.value)


def test_cast_weights(rng):
    w = init_weights(TINY, _seed(rng))
    b = cast_weights(w, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in b.values()) and w["embed"].dtype == torch.float32
    with pytest.raises(K31Error, match="dtype"):
        cast_weights(w, "int8")

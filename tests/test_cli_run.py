"""`k31dsl run` (k31dsl/run_cmd.py) in-process through `main(argv)`: the tiny preset on the numpy
target against the torch reference (same greedy tokens), the text report, --json, speculative
decoding (--spec: an acceptance rate, the same tokens as plain greedy), sampling with a batch,
weights saved and loaded back, and user mistakes (bad config, bad weights file, unknown target)
ending in one clean error line and exit code 1, never a traceback.

The numpy target compiles a step program per shape class (seconds each), so only one test runs
it; the rest use the reference target (plain torch, the same model)."""
from __future__ import annotations

import json

import pytest
import torch

from k31dsl.cli import main
from k31dsl.model import tokenizer
from k31dsl.model.config import K31Config


def _run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["run", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json(capsys, *argv) -> dict:
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)          # nothing but the one JSON object on stdout


def _random_prompt(rng, n: int) -> str:
    return "".join(chr(int(c)) for c in rng.integers(33, 127, n))


def _check_result(r: dict, prompt: str, n_new: int, target: str, warmup: bool = True):
    assert r["config"] == "tiny" and r["target"] == target and r["batch"] == 1
    assert r["prompt_tokens"] == [len(prompt.encode())]
    (o,) = r["outputs"]
    assert o["prompt"] == prompt
    assert len(o["tokens"]) == n_new and all(0 <= t < 256 for t in o["tokens"])
    assert o["text"] == tokenizer.decode(o["tokens"])
    assert r["ttft_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
    assert r["acceptance_rate"] is None and r["spec"] is None
    # the warm-up ran on its own engine: the stats count the measured run only
    assert (r["warmup_s"] > 0) if warmup else r["warmup_s"] is None
    assert r["stats"]["generated_tokens"] == n_new and r["stats"]["prefill_tokens"] == len(prompt)


def test_run_numpy_json_matches_the_reference(capsys, rng):
    prompt = _random_prompt(rng, int(rng.integers(3, 9)))
    got = _json(capsys, "--target", "numpy", f"--prompt={prompt}", "-n", "3", "--no-warmup")    # compiles once
    want = _json(capsys, "--target", "reference", f"--prompt={prompt}", "-n", "3")
    _check_result(got, prompt, 3, "numpy", warmup=False)
    _check_result(want, prompt, 3, "reference")
    # tiny is fp32 with random weights: greedy tokens agree between generated ops and the oracle
    assert got["outputs"][0]["tokens"] == want["outputs"][0]["tokens"]


def test_prompt_starting_with_a_dash(capsys, rng):
    prompt = "-" + _random_prompt(rng, 3)           # argparse takes "--prompt -x" for an option; "=" keeps it text
    r = _json(capsys, "--target", "reference", f"--prompt={prompt}", "-n", "2")
    assert r["prompt_tokens"] == [4]


def test_run_text_report(capsys, rng):
    prompt = _random_prompt(rng, 5) + "é"                    # a 2-byte character: 7 bytes, 7 tokens
    rc, out, err = _run(capsys, "--target", "reference", f"--prompt={prompt}", "-n", "4")
    assert rc == 0, err
    assert f"prompt (7 bytes): {prompt}" in out
    assert "generated (4 tokens):" in out
    for measure in ("time to first token (TTFT)", "prefill tokens/s", "decode tokens/s", "building the model",
                    "warm-up (compiling the step programs)"):
        assert measure in out
    assert "acceptance rate" not in out
    assert "tiny (0.59 M parameters, float32) on reference, batch 1, greedy" in out


def test_spec_reports_acceptance_and_keeps_greedy_tokens(capsys, rng):
    prompt = _random_prompt(rng, 4)
    plain = _json(capsys, "--target", "reference", f"--prompt={prompt}", "-n", "5")
    spec = _json(capsys, "--target", "reference", f"--prompt={prompt}", "-n", "5", "--spec", "2")
    assert spec["spec"]["gamma"] == 2
    assert spec["spec"]["draft"]["kind"] == "layer-skip" and spec["spec"]["draft"]["n_layers"] == 2
    rate = spec["acceptance_rate"]
    assert isinstance(rate, float) and 0.0 <= rate <= 1.0
    st = spec["stats"]
    assert st["proposed"] == 2 * st["spec_rounds"] > 0 and rate == pytest.approx(st["accepted"] / st["proposed"])
    assert spec["outputs"][0]["tokens"] == plain["outputs"][0]["tokens"]
    rc, out, err = _run(capsys, "--target", "reference", f"--prompt={prompt}", "-n", "3", "--spec", "1",
                        "--draft-layers", "1")
    assert rc == 0, err
    assert "acceptance rate (γ = 1; draft tiny-draft1, 1 layer, layer-skip)" in out


def test_batch_sampling_and_random_prompts(capsys, rng):
    seed = int(rng.integers(0, 1000))
    args = ("--target", "reference", "--prompt-len", "6", "--batch", "2", "-n", "4", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", str(seed), "--no-warmup")
    r = _json(capsys, *args)
    assert r["warmup_s"] is None
    assert r["batch"] == 2 and r["prompt_tokens"] == [6, 6]
    assert len(r["outputs"]) == 2 and all(len(o["tokens"]) == 4 for o in r["outputs"])
    assert all(len(o["prompt"]) == 6 and o["prompt"].isprintable() for o in r["outputs"])
    assert r["sampling"] == {"temperature": 0.9, "top_p": 0.95}
    again = _json(capsys, *args)                  # seeded: the same prompts and samples again
    assert [o["tokens"] for o in again["outputs"]] == [o["tokens"] for o in r["outputs"]]


def test_saved_weights_load_back(capsys, tmp_path, rng):
    path = tmp_path / "tiny.safetensors"
    seed = str(int(rng.integers(1, 100)))
    first = _json(capsys, "--target", "reference", "--prompt", "Hi", "-n", "3", "--seed", seed,
                  "--save-weights", str(path))
    assert path.is_file()
    # the config comes from the file; --seed no longer decides the weights
    again = _json(capsys, "--target", "reference", "--prompt", "Hi", "-n", "3", "--weights", str(path))
    assert again["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]


# ---------------------------------------------------------------- user mistakes

def _fails(capsys, *argv) -> str:
    rc, out, err = _run(capsys, *argv)
    assert rc == 1, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert err.startswith("error: ")
    return err


def test_bad_config_files(capsys, tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"d_model": 64,,}')
    assert "invalid JSON in the config" in _fails(capsys, "--config", str(bad_json))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"d_modle": 64}))
    assert "unknown config field(s) d_modle" in _fails(capsys, "--config", str(unknown))
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"layer_pattern": "KXD"}))
    assert "layer_pattern" in _fails(capsys, "--config", str(invalid))
    assert "neither a preset" in _fails(capsys, "--config", str(tmp_path / "missing.json"))


def test_bad_weights_files(capsys, tmp_path):
    from safetensors.torch import save_file
    from k31dsl.model.weights import META_CONFIG, META_DIGEST, init_weights
    assert "no such file" in _fails(capsys, "--weights", str(tmp_path / "nope.safetensors"))
    cfg = K31Config.load("tiny")
    w = init_weights(cfg, 0)
    meta = {META_CONFIG: json.dumps(cfg.to_dict(), sort_keys=True), META_DIGEST: cfg.digest()}
    missing = dict(w)
    del missing["layers.2.attn.k_conv"]
    save_file(missing, str(tmp_path / "missing.safetensors"), metadata=meta)
    err = _fails(capsys, "--weights", str(tmp_path / "missing.safetensors"))
    assert "missing tensor 'layers.2.attn.k_conv'" in err
    bent = dict(w, **{"layers.3.moe.router": torch.zeros(3, cfg.d_model)})
    save_file(bent, str(tmp_path / "bent.safetensors"), metadata=meta)
    assert "'layers.3.moe.router' has shape [3, 64]" in _fails(capsys, "--weights", str(tmp_path / "bent.safetensors"))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    assert "not a readable safetensors" in _fails(capsys, "--weights", str(tmp_path / "junk.safetensors"))


def test_bad_arguments(capsys):
    err = _fails(capsys, "--target", "cuda")
    assert "unknown target 'cuda'" in err and "numpy, triton, ascendc, reference" in err
    assert "--max-new-tokens must be >= 1" in _fails(capsys, "-n", "0")
    assert "--top-p must be in (0, 1]" in _fails(capsys, "--top-p", "1.5")
    assert "need --spec" in _fails(capsys, "--draft-layers", "1")
    assert "--draft-layers must be in [1, 4]" in _fails(capsys, "--target", "reference", "--spec", "1",
                                                        "--draft-layers", "9")
    assert "--prompt is empty" in _fails(capsys, "--prompt", "")


def test_help_teaches(capsys):
    rc = main(["run", "--help"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "examples:" in out and "k31dsl run --spec 3" in out and "layer-skip draft" in out

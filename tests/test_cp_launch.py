"""model/cp_launch.py (processes of a context-parallel run) on gloo/CPU with 2-3 ranks, the
engine's admission of a request prefilled outside it (Engine.add_prefilled), and `k31dsl run --cp`.

  * launch returns rank 0's value (tensors included) after real collectives;
  * a rank that raises, or is SIGKILLed mid-prefill (at a random all-gather of the CP step
    program, while its peer waits in it), or hangs while its peer waits (the collective's timeout)
    ends the run with one K31Error naming the rank and its error, in bounded time;
  * handshake: a different config on rank 1 and one changed weight element on rank 2 (3 ranks) ->
    every rank refuses before any work, naming both and how they differ; weights_fingerprint sees a one-element change in any dtype;
  * add_prefilled: the same tokens (greedy and seeded sampling) as add_request;
  * `k31dsl run --cp 2 --target numpy --prompt-len 150 -n 3`: the same greedy tokens as without
    --cp, and its CP statistics agree with the layout's arithmetic.

Every launch has a hard deadline (launch(deadline_s=...)), the CLI a subprocess timeout, so a hang
fails the test instead of stalling CI. Each launch costs ~4-6 s of process start-up (spawn +
import torch) on 2 cores; the CLI test ~20 s (it compiles the CP prefill program on numpy).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from k31dsl.cli import main
from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import K31Config, pages_for
from k31dsl.model.cp_launch import from_env, handshake, launch, tensor_fingerprints, weights_fingerprint
from k31dsl.model.engine import Engine
from k31dsl.model.sampling import SamplingParams
from k31dsl.model.step import Step
from k31dsl.model.weights import init_weights

DEADLINE_S = 60.0          # any launch here ends (or fails the test) within this


def _launch(worker, ranks, *args, timeout_s=30.0):
    return launch(worker, ranks, backend="gloo", timeout_s=timeout_s, args=args, threads=1, deadline_s=DEADLINE_S)


# ---------------------------------------------------------------- workers (module level: pickled into ranks)

def _gather_worker(ctx, base):
    import torch.distributed as dist
    mine = base + ctx.rank * 1000
    out = [torch.empty_like(mine) for _ in range(ctx.world)]
    dist.all_gather(out, mine, group=ctx.group)
    return {"rank": ctx.rank, "world": ctx.world, "device": str(ctx.device), "gathered": torch.stack(out),
            "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"])}


def _raise_worker(ctx, message):
    import torch.distributed as dist
    if ctx.rank == 1:
        time.sleep(0.3)
        raise ValueError(message)
    dist.barrier(group=ctx.group)          # the others wait in a collective for rank 1


def _killed_mid_prefill_worker(ctx, tokens, kill_at):
    """A CP prefill of the tiny model on numpy; rank 1 SIGKILLs itself as it enters its all-gather
    number `kill_at` of the step program, so rank 0 waits in that collective for a dead peer."""
    from k31dsl.model.assembler import ModelRunner
    from k31dsl.model.distributed import Communicator, cp_prefill
    config = K31Config.load("tiny")
    runner = ModelRunner(config, init_weights(config, 0), "numpy", num_pages=pages_for(len(tokens)), num_slots=1)
    comm = Communicator(ctx.group)
    if ctx.rank == 1:
        gather = comm.all_gather

        def dying(out, inp, name=""):
            if len(comm.stats) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return gather(out, inp, name)
        comm.all_gather = dying
    cp_prefill(runner, tokens, comm, logits="last")
    return "finished"


def _hang_worker(ctx):
    import torch.distributed as dist
    if ctx.rank == 1:
        time.sleep(3600)                   # never joins: rank 0's barrier times out
    dist.barrier(group=ctx.group)


def _handshake_worker(ctx, which, element, marker):
    config = K31Config.load("tiny")
    weights = init_weights(config, 0)
    if ctx.rank == 1:                      # another config, the same weights
        config = config.replace(rope_theta=config.rope_theta * 2)
    if ctx.rank == 2:                      # the same config, one weight element changed
        name = sorted(weights)[which % len(weights)]
        t = weights[name].clone()
        t.view(-1)[element % t.numel()] += 1.0
        weights[name] = t
    handshake(config, weights, ctx.group)
    Path(f"{marker}.{ctx.rank}").write_text("worked")     # the work after an agreement
    return "agreed"


# ---------------------------------------------------------------- launch

def test_launch_returns_rank0_value(rng):
    base = torch.from_numpy(rng.standard_normal(5).astype("float32"))
    r = _launch(_gather_worker, 2, base)
    assert r["rank"] == 0 and r["world"] == 2 and r["device"] == "cpu"
    torch.testing.assert_close(r["gathered"], torch.stack([base, base + 1000]), rtol=0, atol=0)
    assert r["env"][:2] == ("0", "2") and int(r["env"][2]) > 0


def test_a_raising_rank_names_itself_and_its_error(rng):
    message = f"boom-{int(rng.integers(1 << 30))}"
    t0 = time.monotonic()
    with pytest.raises(K31Error) as err:
        _launch(_raise_worker, 2, message)
    elapsed = time.monotonic() - t0
    text = str(err.value)
    assert "failed: rank 1 raised ValueError: " + message in text
    assert "Traceback" in text and "_raise_worker" in text          # the failing rank's traceback
    assert elapsed < DEADLINE_S


def test_a_rank_killed_mid_prefill_ends_the_run(rng):
    tokens = [int(t) for t in rng.integers(0, 256, int(rng.integers(70, 128)))]      # both ranks own tokens
    kill_at = int(rng.integers(0, 17))          # tiny: 3 KDA layers x 5 gathers + 1 DSA layer x 2
    t0 = time.monotonic()
    with pytest.raises(K31Error) as err:
        _launch(_killed_mid_prefill_worker, 2, tokens, kill_at)
    text = str(err.value)
    assert "failed: rank 1 died from SIGKILL" in text
    assert "then rank 0 raised" in text                 # its collective broke: a victim, listed after
    assert time.monotonic() - t0 < DEADLINE_S


def test_a_hanging_rank_ends_by_the_collective_timeout():
    t0 = time.monotonic()
    with pytest.raises(K31Error) as err:
        _launch(_hang_worker, 2, timeout_s=2.0)
    text = str(err.value)
    assert "failed: rank 0 raised" in text and "rank 1 was stopped" in text
    assert time.monotonic() - t0 < DEADLINE_S


def test_ranks_launch_argument_errors():
    with pytest.raises(K31Error, match="ranks must be an int >= 1"):
        launch(_gather_worker, 0)
    with pytest.raises(K31Error, match="backend must be one of"):
        launch(_gather_worker, 2, backend="mpi")
    with pytest.raises(K31Error, match="must be picklable"):
        launch(lambda ctx: ctx.rank, 2, deadline_s=DEADLINE_S)
    if torch.cuda.device_count() < 64:
        with pytest.raises(K31Error, match="needs 64 GPUs"):
            launch(_gather_worker, 64, backend="nccl")


# ---------------------------------------------------------------- agreeing on the model

def test_mismatched_ranks_refuse_before_work(tmp_path, rng):
    which, element = int(rng.integers(0, 1000)), int(rng.integers(0, 1 << 30))
    marker = str(tmp_path / "worked")
    with pytest.raises(K31Error) as err:
        _launch(_handshake_worker, 3, which, element, marker)
    text = str(err.value)
    assert "do not run the same model" in text
    names = sorted(init_weights(K31Config.load("tiny"), 0))
    problems = text.split("differing from rank 0: ", 1)[1].splitlines()[0].split(" | ")
    assert len(problems) == 2
    assert problems[0].startswith("rank 1: config digest") and "weights" not in problems[0]
    assert problems[1].startswith("rank 2: weights fingerprint") and "config" not in problems[1]
    assert problems[1].endswith(f"(tensors {names[which % len(names)]})")
    assert "refused the same way" in text                            # every rank raised the K31Error
    assert not list(tmp_path.glob("worked.*"))                      # no rank went on to work


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int32])
def test_weights_fingerprint_sees_one_element(rng, dtype):
    shape = (int(rng.integers(1, 9)), int(rng.integers(1, 40)) * 2 + 1)         # odd sizes: 1-byte pad
    base = torch.from_numpy(rng.standard_normal(shape).astype("float32"))
    weights = {"a.w": (base * 8).to(dtype), "b.w": torch.from_numpy(rng.standard_normal(7).astype("float32"))}
    fp = weights_fingerprint(weights)
    assert weights_fingerprint(dict(reversed(list(weights.items())))) == fp       # order of names: no matter
    assert weights_fingerprint({k: v.clone() for k, v in weights.items()}) == fp
    i = int(rng.integers(0, base.numel()))
    changed = weights["a.w"].clone()
    raw = changed.view(-1).view(torch.uint8) if dtype != torch.int32 else None
    if raw is not None:                                                     # flip one bit of element i
        size = changed.element_size()
        raw[i * size + int(rng.integers(0, size))] ^= 1 << int(rng.integers(0, 8))
    else:
        changed.view(-1)[i] += 1
    assert weights_fingerprint({**weights, "a.w": changed}) != fp
    per = tensor_fingerprints({**weights, "a.w": changed})
    assert per["b.w"] == tensor_fingerprints(weights)["b.w"] and per["a.w"] != tensor_fingerprints(weights)["a.w"]
    assert weights_fingerprint({**weights, "a.w": weights["a.w"].reshape(-1)}) != fp      # shape counts
    assert weights_fingerprint({**weights, "c.w": weights["a.w"]}) != fp                  # names count


def test_from_env_is_a_rank_of_torchrun(monkeypatch):
    import socket
    import torch.distributed as dist
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(K31Error, match="not started by torchrun"):
        from_env("gloo")
    with socket.socket() as s:                 # a free port for the one-rank group's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    ctx = from_env("gloo", timeout_s=20)
    try:
        assert (ctx.rank, ctx.world, ctx.device.type, ctx.backend) == (0, 1, "cpu", "gloo") and dist.is_initialized()
        config = K31Config.load("tiny")
        handshake(config, init_weights(config, 0), ctx.group)      # a world of one agrees
    finally:
        ctx.close()
    assert not dist.is_initialized()


def test_handshake_alone_is_a_no_op():
    config = K31Config.load("tiny")
    handshake(config, init_weights(config, 0))              # no process group: one rank agrees with itself


# ---------------------------------------------------------------- Engine.add_prefilled

def _reference_runner(config, weights, pages, slots=2):
    from k31dsl.model.config import PAGE
    from k31dsl.run_cmd import make_runner
    return make_runner(config, weights, "reference", pages, slots, pages * PAGE)


@pytest.mark.parametrize("sampling", [None, "seeded"])
def test_add_prefilled_continues_like_add_request(rng, sampling):
    config = K31Config.load("tiny")
    weights = init_weights(config, int(rng.integers(0, 100)))
    prompt = [int(t) for t in rng.integers(0, 256, int(rng.integers(3, 30)))]
    n_new = int(rng.integers(2, 6))
    params = None if sampling is None else SamplingParams(temperature=0.8, top_p=0.9, seed=int(rng.integers(1 << 20)))
    pages = pages_for(len(prompt) + n_new)
    want = Engine(_reference_runner(config, weights, pages), num_pages=pages, num_slots=2,
                  max_batch=2).generate([prompt], n_new, sampling=params)[0].tokens
    # the prompt prefilled outside the engine: its last logits from another runner of the same model
    outside = _reference_runner(config, weights, pages)
    last = outside.forward(Step("prefill", [prompt], [0], [0], [list(range(pages_for(len(prompt))))]))[-1]
    runner = _reference_runner(config, weights, pages)
    loads = []

    def load(slot, table):
        loads.append((slot, list(table)))
        runner.forward(Step("prefill", [prompt], [0], [slot], [table]))

    eng = Engine(runner, num_pages=pages, num_slots=2, max_batch=2)
    arrival = time.perf_counter() - 5.0
    rid = eng.add_prefilled(prompt, last, load, n_new, sampling=params, arrival=arrival, prefill_s=0.25)
    assert len(loads) == 1 and len(loads[0][1]) == pages_for(len(prompt))
    res = eng.run()[rid]
    assert res.tokens == want
    assert res.ttft_s >= 5.0                                     # counted from the given arrival
    assert eng.stats.prefill_tokens == len(prompt) and eng.stats.prefill_s == 0.25
    assert eng.slots.num_free == 2 and eng.pages.num_free == pages                  # all given back


def test_add_prefilled_errors(rng):
    config = K31Config.load("tiny")
    weights = init_weights(config, 0)
    prompt = [int(t) for t in rng.integers(0, 256, 10)]
    runner = _reference_runner(config, weights, 2)
    eng = Engine(runner, num_pages=2, num_slots=2, max_batch=1)
    logits = torch.zeros(config.vocab_size)
    with pytest.raises(K31Error, match="last_logits has 3 values"):
        eng.add_prefilled(prompt, torch.zeros(3), lambda s, t: None, 2)

    def broken(slot, table):
        raise RuntimeError("load failed")
    with pytest.raises(RuntimeError, match="load failed"):
        eng.add_prefilled(prompt, logits, broken, 2)
    assert eng.slots.num_free == 2 and eng.pages.num_free == 2       # nothing leaked
    eng.add_prefilled(prompt, logits, lambda s, t: None, 3)
    with pytest.raises(K31Error, match="no free batch place"):       # max_batch 1 is taken
        eng.add_prefilled(prompt, logits, lambda s, t: None, 3)


# ---------------------------------------------------------------- k31dsl run --cp

def _cli_fails(capsys, *argv) -> str:
    capsys.readouterr()
    rc = main(["run", *argv])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_run_cp_argument_errors(capsys):
    assert "needs --batch 1" in _cli_fails(capsys, "--cp", "2", "--batch", "2")
    assert "does not go with --spec" in _cli_fails(capsys, "--cp", "2", "--spec", "1")
    assert "needs a target of generated ops" in _cli_fails(capsys, "--cp", "2", "--target", "reference")
    assert "--cp must be >= 1" in _cli_fails(capsys, "--cp", "-1")
    # what every rank would read is checked once, before any rank starts
    assert "--prompt is empty" in _cli_fails(capsys, "--cp", "2", "--prompt", "")
    assert "no such file" in _cli_fails(capsys, "--cp", "2", "--weights", "/nonexistent/w.safetensors")


def test_run_cp_matches_single_rank_tokens(capsys):
    args = ["--config", "tiny", "--prompt-len", "150", "-n", "3"]
    cmd = [sys.executable, "-m", "k31dsl", "run", "--cp", "2", "--target", "numpy", *args, "--no-warmup", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    cp = json.loads(done.stdout)
    # without --cp: the torch reference (its greedy tokens == the numpy target's, tests/test_cli_run.py)
    capsys.readouterr()
    assert main(["run", "--target", "reference", *args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert cp["outputs"][0]["prompt"] == plain["outputs"][0]["prompt"]
    assert cp["outputs"][0]["tokens"] == plain["outputs"][0]["tokens"]
    s = cp["cp"]
    T = 150
    assert s["ranks"] == 2 and s["tokens"] == T and s["backend"] == "gloo" and s["chunk"] % 64 == 0
    # every causal (query, key) pair is scored by exactly one rank, under either split
    assert sum(s["indexer_work"]) == sum(s["contiguous_work"]) == T * (T + 1) // 2
    assert min(s["indexer_work"]) > 0            # 150 tokens reach both ranks' chunks
    assert s["indexer_balance"] == pytest.approx(max(s["indexer_work"]) / min(s["indexer_work"]))
    layers = {d["layer"]: d for d in s["per_layer"]}
    config = K31Config.load("tiny")
    for l, kind in enumerate(config.layer_kinds):
        assert layers[l]["bytes"] > 0 and layers[l]["gathers"] > 0
        assert layers[l]["kind"] == {"K": "kda", "D": "dsa"}[kind]
    assert sum(d["bytes"] for d in s["per_layer"]) == s["gather_bytes"]
    assert cp["ttft_s"] > 0 and cp["stats"]["prefill_tokens"] == T and cp["stats"]["generated_tokens"] == 3

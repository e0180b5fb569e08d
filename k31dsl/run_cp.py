"""`k31dsl run --cp P`: prefill the prompt with context parallelism over P ranks, then decode on
rank 0 with the single-rank engine.

The parent process checks the arguments and picks the backend (gloo for the numpy target and the
Triton interpreter on the CPU, NCCL for triton on CUDA with one GPU per rank), then
model/cp_launch.launch starts P ranks. Each rank builds the same config and weights (same file
or --seed), agrees on them with the others (cp_launch.handshake), and runs
model/distributed.cp_prefill over its zigzag share of the prompt. Rank 0 then hands the
sequence's states and caches to its runner (distributed.hand_off through
Engine.add_prefilled), samples the first token from the prompt's last logits and decodes; the
other ranks are done after the prefill. Rank 0's result (the same dict as a single-rank run,
plus "cp": the CP statistics) comes back to the parent, which prints it.
"""
from __future__ import annotations

import argparse
import time

from k31dsl.dsl.errors import K31Error

CP_TARGETS = ("numpy", "triton")


def check_cp_args(a) -> None:
    if a.cp < 1:
        raise K31Error(f"--cp must be >= 1 (the ranks of the context-parallel prefill), got {a.cp}")
    if a.batch != 1:
        raise K31Error(f"--cp prefills one sequence over its ranks; it needs --batch 1, got --batch {a.batch}")
    if a.spec:
        raise K31Error("--cp does not go with --spec: the draft would need its own prefilled states",
                       hint="drop --spec, or run without --cp")
    if a.target not in CP_TARGETS:
        raise K31Error(f"--cp needs a target of generated ops ({', '.join(CP_TARGETS)}), got {a.target}",
                       hint="--target numpy runs the ranks on the CPU (gloo)")
    if not a.cp_timeout > 0:
        raise K31Error(f"--cp-timeout must be > 0 seconds, got {a.cp_timeout}")


def _check_inputs(a) -> None:
    """The cheap checks of what every rank will read, here once (not P copies of one error)."""
    from pathlib import Path
    from k31dsl.model.config import K31Config
    from k31dsl.run_cmd import make_prompts
    if a.config:
        K31Config.load(a.config)
    for option, path in (("--weights", a.weights),):
        if path and not Path(path).is_file():
            raise K31Error(f"{option} {path}: no such file", hint="write one with `k31dsl run --save-weights FILE`")
    make_prompts(a.prompt, a.prompt_len, 1, a.seed)


def cp_backend(target: str, ranks: int) -> str:
    """gloo on CPU targets; NCCL for triton on CUDA with >= `ranks` GPUs."""
    if target == "triton":
        from k31dsl.ops.testing import device_for
        if device_for("triton") == "cuda":
            import torch
            have = torch.cuda.device_count()
            if have < ranks:
                raise K31Error(f"--cp {ranks} on the triton target needs {ranks} GPUs (one per rank); this host "
                               f"has {have}", hint=f"--cp {have} or fewer, or --target numpy (gloo on the CPU)")
            return "nccl"
    return "gloo"


def under_torchrun() -> bool:
    """True in a process that torchrun started (its elastic agent sets TORCHELASTIC_RUN_ID)."""
    import os
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ


def generate_cp(a) -> dict | None:
    """Everything `k31dsl run --cp P` does but printing. On one host it launches P ranks and returns
    rank 0's result; under torchrun this process is one rank (torchrun started P of them, maybe on
    several hosts), and only rank 0 returns a result (the others None)."""
    check_cp_args(a)
    _check_inputs(a)
    args = argparse.Namespace(**{k: v for k, v in vars(a).items() if k != "func"})
    if under_torchrun():
        import os
        from k31dsl.model.cp_launch import from_env
        world = int(os.environ["WORLD_SIZE"])
        if world != a.cp:
            raise K31Error(f"--cp {a.cp} but torchrun started {world} processes",
                           hint="give --cp the total of torchrun's --nnodes x --nproc-per-node")
        from k31dsl.ops.testing import device_for
        backend = "nccl" if a.target == "triton" and device_for("triton") == "cuda" else "gloo"
        ctx = from_env(backend, timeout_s=a.cp_timeout)
        try:
            result = cp_rank(ctx, args)
        finally:
            ctx.close()
    else:
        from k31dsl.model.cp_launch import launch
        backend = cp_backend(a.target, a.cp)
        result = launch(cp_rank, a.cp, backend=backend, timeout_s=a.cp_timeout, args=(args,))
    if result is not None:
        result["cp"]["backend"] = backend
    return result


def _layer_gathers(gathers: list[dict]) -> list[dict]:
    """The all-gathers summed per layer (names "l{layer} ..."; the rest under "other")."""
    per: dict = {}
    for g in gathers:
        head = g["name"].split(" ", 1)[0]
        key = int(head[1:]) if head[:1] == "l" and head[1:].isdigit() else None
        d = per.setdefault(key, {"layer": key, "gathers": 0, "bytes": 0, "seconds": 0.0})
        d["gathers"] += 1
        d["bytes"] += g["bytes"]
        d["seconds"] += g["seconds"]
    return sorted(per.values(), key=lambda d: (d["layer"] is None, d["layer"] or 0))


def cp_stats(stats: dict, config) -> dict:
    kinds = config.layer_kinds
    layers = _layer_gathers(stats["gathers"])
    for d in layers:
        d["kind"] = "other" if d["layer"] is None else {"K": "kda", "D": "dsa"}.get(kinds[d["layer"]], "?")
    work, contiguous = stats["indexer_work"], stats["contiguous_work"]

    def balance(w):                  # max / min; None when a rank has none of the prompt
        return max(w) / min(w) if min(w) > 0 else None
    return {"ranks": stats["ranks"], "tokens": stats["tokens"], "chunk": stats["chunk"],
            "program_s": stats["program_s"], "gather_bytes": stats["gather_bytes"], "gather_s": stats["gather_s"],
            "per_layer": layers, "indexer_work": work, "indexer_balance": balance(work),
            "contiguous_work": contiguous, "contiguous_balance": balance(contiguous)}


def _sync(ctx) -> None:
    """Every rank here, the GPU's queued work done."""
    import torch
    import torch.distributed as dist
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    if ctx.world > 1 and dist.is_initialized():
        dist.barrier(group=ctx.group)


def cp_rank(ctx, a) -> dict | None:
    """One rank of `k31dsl run --cp P` (model/cp_launch.launch calls it in each process)."""
    from k31dsl.model import tokenizer
    from k31dsl.model.assembler import ModelRunner
    from k31dsl.model.config import pages_for
    from k31dsl.model.cp_launch import handshake
    from k31dsl.model.distributed import Communicator, cp_prefill, hand_off
    from k31dsl.model.engine import Engine
    from k31dsl.model.sampling import SamplingParams
    from k31dsl.run_cmd import check_target, load_model, make_prompts
    import warnings
    # torch.distributed's own deprecation notices (all_gather_into_tensor) are not the user's business
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    check_target(a.target)
    t0 = time.perf_counter()
    config, weights = load_model(a.config, a.weights, a.seed)
    if a.save_weights and ctx.rank == 0:
        from k31dsl.model.weights import save_weights
        save_weights(a.save_weights, config, weights)
    (prompt,) = make_prompts(a.prompt, a.prompt_len, 1, a.seed)
    pages = pages_for(len(prompt) + a.max_new_tokens + 1)
    runner = ModelRunner(config, weights, a.target, num_pages=pages, num_slots=1, device=ctx.device)
    comm = Communicator(ctx.group, timed=ctx.device.type == "cuda")
    handshake(config, weights, comm)
    del weights
    build_s = time.perf_counter() - t0
    sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p, seed=a.seed)

    def engine():
        return Engine(runner, num_pages=pages, num_slots=1, max_batch=1, seed=a.seed)

    warmup_s = None
    if a.warmup:
        # Compile the CP prefill program on every rank, and on rank 0 the decode program, so the
        # measured prefill and decode exclude compiling.
        t = time.perf_counter()
        warm = cp_prefill(runner, prompt, comm, logits="last")
        if ctx.rank == 0:
            e = engine()
            e.add_prefilled(prompt, warm.logits[0], lambda slot, table: hand_off(warm, runner, slot, table),
                            min(2, a.max_new_tokens))
            e.run()
        warmup_s = time.perf_counter() - t
    _sync(ctx)                       # the ranks start the measured prefill together
    t1 = time.perf_counter()
    res = cp_prefill(runner, prompt, comm, logits="last")
    _sync(ctx)
    prefill_s = time.perf_counter() - t1
    if ctx.rank != 0:
        return None
    e = engine()
    rid = e.add_prefilled(prompt, res.logits[0], lambda slot, table: hand_off(res, runner, slot, table),
                          a.max_new_tokens, sampling=sampling, arrival=t1, prefill_s=prefill_s)
    results = e.run()
    wall_s = time.perf_counter() - t1
    o = results[rid]
    stats = e.stats
    return {
        "config": config.name, "params": config.n_params(), "dtype": config.dtype, "target": a.target,
        "batch": 1, "max_new_tokens": a.max_new_tokens, "seed": a.seed,
        "sampling": {"temperature": a.temperature, "top_p": a.top_p},
        "prompt_tokens": [len(prompt)], "spec": None,
        "outputs": [{"prompt": tokenizer.decode(o.prompt_tokens), "text": tokenizer.decode(o.tokens),
                     "tokens": list(o.tokens), "finish_reason": o.finish_reason}],
        "ttft_s": o.ttft_s,
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "acceptance_rate": None,
        "build_s": build_s, "warmup_s": warmup_s, "wall_s": wall_s,
        "stats": stats.as_dict(),
        "cp": cp_stats(res.stats, config),
    }


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def add_cp_rows(table, r: dict, fmt_s) -> None:
    """The CP rows of the run's table."""
    cp = r["cp"]
    table.add_row(f"context-parallel prefill ({cp['ranks']} ranks, {cp.get('backend', '?')}, chunks of "
                  f"{cp['chunk']} tokens)", fmt_s(cp["program_s"]))
    table.add_row("all-gathers (rank 0: bytes received, time)",
                  f"{_fmt_bytes(cp['gather_bytes'])}, {fmt_s(cp['gather_s'])}")
    work = cp["indexer_work"]

    def ratio(v):
        return "- (a rank has no prompt token)" if v is None else f"{v:.3f}"
    table.add_row("indexer work per rank, max/min (zigzag | contiguous)",
                  f"{ratio(cp['indexer_balance'])} | {ratio(cp['contiguous_balance'])}")
    table.add_row("indexer work per rank (causal query-key pairs)", " ".join(f"{w:,}" for w in work))


def print_cp_layers(console, r: dict, fmt_s) -> None:
    """Per-layer all-gather bytes and time."""
    from rich.table import Table
    t = Table(title="all-gathers per layer (rank 0)")
    for col in ("layer", "kind", "gathers", "bytes", "time"):
        t.add_column(col, justify="right" if col != "kind" else "left")
    for d in r["cp"]["per_layer"]:
        t.add_row("-" if d["layer"] is None else str(d["layer"]), d["kind"], str(d["gathers"]),
                  _fmt_bytes(d["bytes"]), fmt_s(d["seconds"]))
    console.print(t)

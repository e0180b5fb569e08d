"""`k31dsl run`: generate text with a K31 model on a target and report its speed.

The pieces: the config (a preset or a JSON file, model/config.py), its weights (seeded random
init or a safetensors file, model/weights.py), a runner on the target (model/assembler.py's
ModelRunner on numpy/triton/ascendc, or the torch oracle model/reference.py), the engine
(model/engine.py: paged caches, continuous batching, speculative decoding) and the byte-level
tokenizer (model/tokenizer.py). `generate()` does the work and returns a plain dict (what
`--json` prints); `cmd_run` prints it for people.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from k31dsl.dsl.errors import K31Error

RUNNER_TARGETS = ("numpy", "triton", "ascendc")       # generated ops (model/assembler.py)
ORACLE_TARGET = "reference"                           # the plain PyTorch model (model/reference.py)
DEFAULT_PROMPT = "Once upon a time, a K31 model"

RUN_HELP = """\
Generate text with a K31 hybrid model (KDA and DSA attention layers, MoE, Attention Residuals)
and report its speed. The command builds the config (a preset or a JSON file), its weights
(random from --seed, or a safetensors file), the model on the target (every step a graph of
generated ops) and the engine (paged FP8 caches, continuous batching, speculative decoding),
runs the prompt(s), prints the generated text, then the time to first token (TTFT), prefill and
decode tokens/s, and with --spec the draft's acceptance rate. A progress bar runs on stderr.
A short warm-up run first compiles every step program the run needs (one per step kind and
shape class; seconds on numpy), so the reported times are those of compiled steps
(--no-warmup: include compiling).

Prompts are text, one token per UTF-8 byte (model/tokenizer.py). The presets have random
weights, so the generated text is noise: what you see is the machinery and its speed. Control
characters in the output are shown as \\xNN. With no arguments it runs the `tiny` preset on the
numpy target with a built-in prompt (about 13 s on 2 cores, half of it compiling).

targets: numpy (CPU, the reference semantics of the generated ops), triton (a GPU; the Triton
interpreter without one, slow), ascendc (when built), reference (the plain PyTorch model,
model/reference.py: the oracle the others are tested against).

--batch N runs N sequences at once: N copies of the prompt (greedy: N equal outputs; with
--temperature each sequence samples with its own seed, --seed + i). --prompt-len N instead of
--prompt makes random printable ASCII prompts of N bytes, a different one per sequence.

--spec GAMMA: speculative decoding. A draft model proposes GAMMA tokens, the target checks them
in one forward and keeps the longest agreeing prefix plus one token of its own; greedy output is
the same as without --spec. The default draft is a layer-skip draft: the target's first half of
its layers (--draft-layers N to choose) with the target's own weights for them, its embedding,
final norm and LM head: no extra weights, and it agrees with the target far more often than an
unrelated model (tiny, random weights: its first 2 of 4 layers pick the target's next token
~40 % of the time, an independently seeded tiny model ~0 %). --draft-config PRESET|FILE picks
another model (same vocab) with --draft-weights FILE or random weights from --seed + 1.

--cp P: context-parallel prefill. P ranks (processes; gloo on the CPU, NCCL with one GPU per rank
for --target triton) prefill the prompt together, each a zigzag share of it, then rank 0 decodes
(--batch 1, no --spec). The report adds the all-gather bytes and time per layer and the indexer
work per rank. Under torchrun (several hosts) each process is one rank; --cp = their number.

examples:
  k31dsl run                                          tiny on numpy, the built-in prompt
  k31dsl run --prompt "Hello, K31" --max-new-tokens 16
  k31dsl run --prompt-len 32 --batch 4 --temperature 0.8 --top-p 0.9 --seed 3
  k31dsl run --spec 3                                 speculative decoding, acceptance rate
  k31dsl run --spec 2 --draft-layers 1                a cheaper draft: its first layer only
  k31dsl run --spec 2 --draft-config tiny --seed 1    an unrelated random draft: few accepted
  k31dsl run --target reference                       the torch oracle, for comparison
  k31dsl run --save-weights tiny.safetensors          keep the random weights (config inside)
  k31dsl run --weights tiny.safetensors --prompt "Hi" the config comes from the file
  k31dsl run --config small --target triton --prompt-len 4096 --max-new-tokens 128 --batch 64
  k31dsl run --cp 2 --prompt-len 150 -n 3             context-parallel prefill on 2 CPU ranks
  k31dsl run --json                                   one JSON object on stdout, nothing else"""


def add_parser(sub, fmt) -> None:
    p = sub.add_parser("run", help="generate text with a K31 model and report its speed",
                       description=RUN_HELP, formatter_class=fmt)
    p.add_argument("--config", "-c", metavar="tiny|small|FILE",
                   help="a preset or a JSON config file (default: tiny, or the config stored in --weights)")
    p.add_argument("--weights", "-w", metavar="FILE",
                   help="a safetensors weights file (default: random weights from --seed)")
    p.add_argument("--save-weights", metavar="FILE", help="also write the weights used (and their config) to FILE")
    p.add_argument("--target", "-t", default="numpy", metavar="T",
                   help=f"{', '.join(RUNNER_TARGETS)} or {ORACLE_TARGET} (default: numpy)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prompt", "-p", metavar="TEXT",
                       help="the prompt (default: a built-in sentence); write one that starts with '-' as "
                            "--prompt=-TEXT")
    group.add_argument("--prompt-len", type=int, metavar="N", help="random printable prompts of N bytes")
    p.add_argument("--max-new-tokens", "-n", type=int, default=16, metavar="N",
                   help="tokens to generate per sequence (default 16)")
    p.add_argument("--batch", "-b", type=int, default=1, metavar="N", help="sequences run together (default 1)")
    p.add_argument("--spec", type=int, default=0, metavar="GAMMA",
                   help="speculative decoding: the draft proposes GAMMA tokens per step (default: off)")
    p.add_argument("--draft-config", metavar="tiny|small|FILE",
                   help="the draft model for --spec (default: the target's first half of its layers)")
    p.add_argument("--draft-layers", type=int, metavar="N",
                   help="layers of the default layer-skip draft (default: half the target's, at least 1)")
    p.add_argument("--draft-weights", metavar="FILE", help="safetensors weights of --draft-config")
    p.add_argument("--seed", type=int, default=0,
                   help="random weights and sampling (sequence i samples with seed + i); default 0")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature; 0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1.0)")
    p.add_argument("--cp", type=int, default=0, metavar="P",
                   help="context-parallel prefill over P ranks (processes; gloo on the CPU, NCCL with one GPU "
                        "per rank), then decode on rank 0; needs --batch 1, no --spec (default: off)")
    p.add_argument("--cp-timeout", type=float, default=600.0, metavar="S",
                   help="with --cp: seconds a collective may wait for a peer before the run fails (default 600)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up run: TTFT and tokens/s then include compiling the step programs")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text and a table")
    p.set_defaults(func=cmd_run)


# ---------------------------------------------------------------- building the model

def load_model(config_spec: str | None, weights_path: str | None, seed: int, what: str = "--weights"):
    """(config, weights): the config from the preset/file (default tiny) or the weights file."""
    from k31dsl.model import weights as W
    from k31dsl.model.config import K31Config
    config = K31Config.load(config_spec) if config_spec else None
    if weights_path:
        path = Path(weights_path)
        if not path.is_file():
            raise K31Error(f"{what} {weights_path}: no such file",
                           hint="write one with `k31dsl run --save-weights FILE`")
        _need_safetensors(what)
        return W.load_weights(path, config)
    config = config or K31Config.load("tiny")
    return config, W.init_weights(config, seed)


def _need_safetensors(option: str) -> None:
    import importlib.util
    if importlib.util.find_spec("safetensors") is None:
        raise K31Error(f"{option} needs the safetensors package, which is not installed",
                       hint="pip install 'k31dsl[model]' (or safetensors)")


def layer_skip_draft(config, weights, n_layers: int | None = None):
    """The default draft: the target's first `n_layers` layers (default half, at least one), sharing
    the target's tensors for them and its embedding, final AttnRes, final norm and LM head."""
    n = max(1, config.n_layers // 2) if n_layers is None else n_layers
    if not 1 <= n <= config.n_layers:
        raise K31Error(f"--draft-layers must be in [1, {config.n_layers}] (the target's layers), got {n}")
    draft = config.replace(name=f"{config.name}-draft{n}", n_layers=n)
    return draft, {name: weights[name] for name in draft.weight_shapes()}


def check_target(target: str) -> None:
    if target == ORACLE_TARGET:
        return
    if target not in RUNNER_TARGETS:
        raise K31Error(f"unknown target {target!r}; choose one of {', '.join(RUNNER_TARGETS + (ORACLE_TARGET,))}",
                       hint="numpy runs anywhere; triton needs a GPU (or its slow interpreter)")
    from k31dsl.cli import require_target
    require_target(target)


def make_runner(config, weights, target: str, num_pages: int, num_slots: int, max_len: int):
    """A Runner (model/step.py) of the model on the target with room for num_pages cache pages and
    num_slots sequences of up to max_len tokens."""
    if target == ORACLE_TARGET:
        import torch
        from k31dsl.model.reference import ReferenceModel
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return ReferenceModel(config, weights, device=device, num_slots=num_slots, max_len=max_len)
    from k31dsl.model.assembler import ModelRunner
    return ModelRunner(config, weights, target, num_pages=num_pages, num_slots=num_slots)


def make_prompts(prompt: str | None, prompt_len: int | None, batch: int, seed: int) -> list[list[int]]:
    """Token ids of each sequence's prompt."""
    from k31dsl.model import tokenizer
    if prompt_len is None:
        ids = tokenizer.encode(DEFAULT_PROMPT if prompt is None else prompt)
        if not ids:
            raise K31Error("--prompt is empty; give at least one character")
        return [list(ids) for _ in range(batch)]
    import numpy as np
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(32, 127, prompt_len)] for _ in range(batch)]


# ---------------------------------------------------------------- generation

def _check_args(a) -> None:
    for name, v, lo in (("--max-new-tokens", a.max_new_tokens, 1), ("--batch", a.batch, 1),
                        ("--spec", a.spec, 0), ("--prompt-len", a.prompt_len, 1)):
        if v is not None and v < lo:
            raise K31Error(f"{name} must be >= {lo}, got {v}")
    if not a.temperature >= 0:
        raise K31Error(f"--temperature must be >= 0, got {a.temperature}")
    if not 0 < a.top_p <= 1:
        raise K31Error(f"--top-p must be in (0, 1], got {a.top_p}")
    if (a.draft_config or a.draft_weights or a.draft_layers) and not a.spec:
        raise K31Error("--draft-config/--draft-weights/--draft-layers need --spec GAMMA")
    if a.draft_layers and (a.draft_config or a.draft_weights):
        raise K31Error("--draft-layers sets the default layer-skip draft; it does not go with --draft-config")


class _Bar:
    """A rich progress bar on stderr counting generated tokens (only on a terminal)."""

    def __init__(self, total: int, enabled: bool, what: str = "generating"):
        self.bar = None
        if not enabled:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        from k31dsl.cli import _console
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("tokens"), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=_console(stderr=True), transient=True)
        self.task = self.bar.add_task(what, total=total)

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def update(self, done: int, total: int) -> None:
        """The engine's progress callback: tokens generated so far, and the most there can be."""
        if self.bar:
            self.bar.update(self.task, completed=done, total=total)


SMALL_MODEL_PARAMS = 50_000_000


@contextlib.contextmanager
def cpu_threads_for(config):
    """One torch thread for a small model on the CPU (unless OMP_NUM_THREADS says otherwise): its
    tensors are tiny and torch's thread pool only adds waiting — on a busy 2-core machine a tiny
    reference decode step took 420 ms of CPU with 2 threads and 9 ms with one. Restored after."""
    import torch
    saved = None
    if (config.n_params() < SMALL_MODEL_PARAMS and "OMP_NUM_THREADS" not in os.environ
            and not torch.cuda.is_available()):
        saved = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if saved is not None:
            torch.set_num_threads(saved)


def generate(a, progress: bool = False) -> dict:
    """Everything `k31dsl run` does but printing; `a` has the command's arguments."""
    _check_args(a)
    check_target(a.target)
    if getattr(a, "cp", 0):
        from k31dsl.run_cp import generate_cp
        return generate_cp(a)
    t0 = time.perf_counter()
    config, weights = load_model(a.config, a.weights, a.seed)
    with cpu_threads_for(config):
        return _generate(a, config, weights, t0, progress)


def _generate(a, config, weights, t0: float, progress: bool) -> dict:
    from k31dsl.model import tokenizer
    from k31dsl.model.config import PAGE, pages_for
    if a.save_weights:
        _need_safetensors("--save-weights")
        from k31dsl.model.weights import save_weights
        save_weights(a.save_weights, config, weights)
    prompts = make_prompts(a.prompt, a.prompt_len, a.batch, a.seed)
    gamma = a.spec
    # Every sequence's whole life fits at once: prompt + new tokens + a verify step's overshoot.
    pages_per_seq = pages_for(max(map(len, prompts)) + a.max_new_tokens + gamma + 1)
    num_pages, num_slots = a.batch * pages_per_seq, a.batch
    runner = make_runner(config, weights, a.target, num_pages, num_slots, pages_per_seq * PAGE)
    draft_info = None
    draft = None
    if gamma:
        if a.draft_config or a.draft_weights:
            dcfg, dweights = load_model(a.draft_config, a.draft_weights, a.seed + 1, what="--draft-weights")
            kind = "given"
        else:
            dcfg, dweights = layer_skip_draft(config, weights, a.draft_layers)
            kind = "layer-skip"
        if dcfg.vocab_size != config.vocab_size:
            raise K31Error(f"the draft's vocab_size ({dcfg.vocab_size}) differs from the target's "
                           f"({config.vocab_size})", hint="a draft must speak the same tokens")
        draft = make_runner(dcfg, dweights, a.target, num_pages, num_slots, pages_per_seq * PAGE)
        draft_info = {"config": dcfg.name, "kind": kind, "n_layers": dcfg.n_layers, "params": dcfg.n_params()}
    build_s = time.perf_counter() - t0

    from k31dsl.model.engine import Engine
    from k31dsl.model.sampling import SamplingParams
    def new_engine():
        return Engine(runner, num_pages=num_pages, num_slots=num_slots, max_batch=a.batch, draft=draft,
                      gamma=gamma, seed=a.seed)
    warmup_s = None
    if a.warmup:
        # The same prompts once, greedy, a prefill and one decode step (or speculative round): every
        # step program the run needs is compiled here, so TTFT and tokens/s below exclude compiling.
        t = time.perf_counter()
        n = min(a.max_new_tokens, gamma + 2)
        with _Bar(a.batch * n, progress, "warm-up (compiling)") as bar:
            new_engine().generate(prompts, n, progress=bar.update)
        warmup_s = time.perf_counter() - t
    engine = new_engine()
    ids = [engine.add_request(p, a.max_new_tokens,
                              sampling=SamplingParams(temperature=a.temperature, top_p=a.top_p, seed=a.seed + i))
           for i, p in enumerate(prompts)]
    t1 = time.perf_counter()
    with _Bar(a.batch * a.max_new_tokens, progress) as bar:
        results = engine.run(progress=bar.update)
    wall_s = time.perf_counter() - t1
    outs = [results[i] for i in ids]
    stats = engine.stats
    ttfts = sorted(o.ttft_s for o in outs)
    return {
        "config": config.name, "params": config.n_params(), "dtype": config.dtype, "target": a.target,
        "batch": a.batch, "max_new_tokens": a.max_new_tokens, "seed": a.seed,
        "sampling": {"temperature": a.temperature, "top_p": a.top_p},
        "prompt_tokens": [len(p) for p in prompts],
        "spec": {"gamma": gamma, "draft": draft_info} if gamma else None,
        "outputs": [{"prompt": tokenizer.decode(o.prompt_tokens), "text": tokenizer.decode(o.tokens),
                     "tokens": list(o.tokens), "finish_reason": o.finish_reason} for o in outs],
        # TTFT: add_request -> first token, median over the sequences (they are prefilled together).
        "ttft_s": ttfts[len(ttfts) // 2],
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "acceptance_rate": stats.acceptance_rate,
        "build_s": build_s, "warmup_s": warmup_s, "wall_s": wall_s,
        "stats": stats.as_dict(),
    }


# ---------------------------------------------------------------- printing

def _fmt_s(v) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"


def _fmt_rate(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def print_result(r: dict) -> None:
    from rich.markup import escape
    from rich.table import Table
    from k31dsl.cli import _console
    from k31dsl.model.tokenizer import printable
    console = _console()
    sampling = ("greedy" if r["sampling"]["temperature"] == 0 else
                f"temperature {r['sampling']['temperature']}, top-p {r['sampling']['top_p']}")
    console.print(f"[bold]{r['config']}[/] ({r['params'] / 1e6:.2f} M parameters, {r['dtype']}) on "
                  f"[bold]{r['target']}[/], batch {r['batch']}, {sampling}")
    n_out = len(r["outputs"])
    shown = r["outputs"] if n_out <= 8 else r["outputs"][:4]
    for i, o in enumerate(shown):
        if n_out > 1:
            console.print(f"[bold]sequence {i}[/]")
        console.print(f"[dim]prompt ({len(o['prompt'].encode('utf-8', 'replace'))} bytes):[/] "
                      f"{escape(printable(o['prompt']))}", soft_wrap=True)
        console.print(f"[dim]generated ({len(o['tokens'])} tokens):[/] {escape(printable(o['text']))}",
                      soft_wrap=True)
    if n_out > len(shown):
        console.print(f"[dim]… {n_out - len(shown)} more sequences (--json prints all)[/]")
    table = Table()
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("time to first token (TTFT)", _fmt_s(r.get("ttft_s")))
    table.add_row("prefill tokens/s", _fmt_rate(r.get("prefill_tokens_per_s")))
    table.add_row("decode tokens/s", _fmt_rate(r.get("decode_tokens_per_s")))
    if r.get("spec"):
        d, rate = r["spec"]["draft"], r.get("acceptance_rate")
        layers = f"{d['n_layers']} layer{'s' if d['n_layers'] > 1 else ''}"
        table.add_row(f"acceptance rate (γ = {r['spec']['gamma']}; draft {d['config']}, {layers}, {d['kind']})",
                      "-" if rate is None else f"{100 * rate:.1f} %")
    if r.get("cp"):
        from k31dsl.run_cp import add_cp_rows
        add_cp_rows(table, r, _fmt_s)
    table.add_row("building the model", _fmt_s(r.get("build_s")))
    if r.get("warmup_s") is not None:
        table.add_row("warm-up (compiling the step programs)", _fmt_s(r["warmup_s"]))
    table.add_row("generating (wall)", _fmt_s(r.get("wall_s")))
    console.print(table)
    if r.get("cp"):
        from k31dsl.run_cp import print_cp_layers
        print_cp_layers(console, r, _fmt_s)


def cmd_run(a) -> int:
    result = generate(a, progress=sys.stderr.isatty() and not a.json and not a.cp)
    if result is None:               # --cp under torchrun: a rank other than 0 prints nothing
        return 0
    try:
        if a.json:
            print(json.dumps(result))
        else:
            print_result(result)
        sys.stdout.flush()
    except BrokenPipeError:          # `k31dsl run --json | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

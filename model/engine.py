"""The serving engine: continuous batching over a model `Runner` (model/step.py), with paged caches,
a state-slot pool, greedy / seeded sampling, and speculative decoding with a draft runner.

    eng = Engine(runner, num_pages=64, num_slots=8, max_batch=8)
    rid = eng.add_request(prompt_tokens, max_new_tokens=16, sampling=SamplingParams(temperature=0.7, seed=1))
    results = eng.run(progress=None)       # {request id: RequestResult}; or call eng.step() yourself
    results[rid].tokens, results[rid].ttft_s, eng.stats.as_dict()   # EngineStats: tokens/s, acceptance
    eng.generate([prompt_a, prompt_b], max_new_tokens=8)           # add + run: results in prompt order

One `step()`: admit waiting requests (FIFO, while a batch place, a state slot and pages for the whole
prompt are free), run one prefill chunk (`prefill_chunk` tokens per sequence, None = all) for the
sequences still prefilling, then one decode step — or one speculative round when a draft is given —
over every sequence whose prompt is in. Finished requests leave at once and free their pages and
slot, so requests join and leave between steps. A decode that finds no free page preempts the most
recently admitted sequence (its pages and slot are freed; it re-prefills its tokens later: the
tokens it produces are unchanged).

A sequence's tokens are `prompt + generated`; `ctx` of them are in the runner's caches and states.
Between steps a decoding sequence has exactly one unfed token (the last one sampled).

Speculative round (draft runner, `gamma` > 0; the draft shares the engine's page and slot ids, so
it must have been built with at least `num_pages` pages and `num_slots` slots):
  1. snapshot the draft's states (`save_states`); the draft proposes gamma tokens by decode steps;
  2. the target scores [last token, d_1 .. d_gamma] in one `Step(kind="verify")`;
  3. `speculative_accept` keeps a drafts and yields one more token (correction or bonus);
  4. `runner.commit(step, a + 1)` keeps the target's states after the a + 1 kept fed tokens; its
     caches roll back by length (ctx advances by a + 1 only; later steps overwrite the rest);
  5. the draft's states are put back (`load_states`) and the kept tokens re-fed (a prefill step).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from k31dsl.dsl.errors import K31Error
from k31dsl.model.allocator import PageAllocator, SlotAllocator, pages_for
from k31dsl.model.sampling import (GREEDY, SamplingParams, make_generator, propose, sample_token,
                                   speculative_accept)
from k31dsl.model.step import Step


@dataclass
class RequestResult:
    request_id: int
    prompt_tokens: list[int]
    tokens: list[int]              # generated tokens (a stop token, when hit, is the last one)
    finish_reason: str             # "length" (max_new_tokens) | "stop" (a stop token)
    ttft_s: float                  # add_request -> first generated token
    queue_s: float                 # add_request -> first admission
    total_s: float                 # add_request -> finished
    preemptions: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second after the first."""
        dt = self.total_s - self.ttft_s
        return (len(self.tokens) - 1) / dt if dt > 0 and len(self.tokens) > 1 else 0.0


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0        # prompt tokens fed (re-fed ones after a preemption count again)
    prefill_s: float = 0.0         # target + draft prefill forwards
    decode_tokens: int = 0         # tokens produced by decode steps / speculative rounds
    decode_s: float = 0.0          # decode steps / speculative rounds, draft work included
    draft_s: float = 0.0           # the draft's share of decode_s
    generated_tokens: int = 0      # all tokens handed to requests (first tokens included)
    total_s: float = 0.0           # wall time inside step()
    spec_rounds: int = 0
    proposed: int = 0              # draft tokens proposed
    accepted: int = 0              # draft tokens the target kept
    preemptions: int = 0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens (None without speculative rounds)."""
        return self.accepted / self.proposed if self.proposed else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(prefill_tokens_per_s=self.prefill_tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s,
                 tokens_per_s=self.tokens_per_s, acceptance_rate=self.acceptance_rate)
        return d


@dataclass(eq=False)
class _Seq:
    rid: int
    prompt: list[int]
    max_new: int
    params: SamplingParams
    stop: frozenset
    gen: torch.Generator | None
    t_arrival: float
    tokens: list[int] = field(default_factory=list)
    ctx: int = 0                   # tokens in the runner's caches / states
    table: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilling: bool = True
    order: int = -1                # admission counter (the youngest is preempted first)
    preemptions: int = 0
    t_admitted: float | None = None
    t_first: float | None = None
    finish_reason: str | None = None

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


class Engine:
    def __init__(self, runner, *, num_pages: int, num_slots: int, max_batch: int,
                 prefill_chunk: int | None = None, draft=None, gamma: int = 0, seed: int = 0):
        def positive(name, v):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise K31Error(f"Engine: {name} must be an int >= 1, got {v!r}")
        positive("num_pages", num_pages)
        positive("num_slots", num_slots)
        positive("max_batch", max_batch)
        if prefill_chunk is not None:
            positive("prefill_chunk", prefill_chunk)
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
            raise K31Error(f"Engine: gamma must be an int >= 0, got {gamma!r}")
        if (draft is None) != (gamma == 0):
            raise K31Error("Engine: speculative decoding needs both a draft runner and gamma >= 1 "
                           f"(got draft={'a runner' if draft is not None else None}, gamma={gamma})",
                           hint="plain decoding: draft=None, gamma=0")
        self.vocab_size = int(runner.config.vocab_size)
        if draft is not None and int(draft.config.vocab_size) != self.vocab_size:
            raise K31Error(f"Engine: the draft's vocab_size ({draft.config.vocab_size}) differs from the "
                           f"target's ({self.vocab_size})")
        for name, r in (("runner", runner), ("draft", draft)):
            # Page and slot ids go to both runners unchanged: each must hold at least as many.
            for attr, want in (("num_pages", num_pages), ("num_slots", num_slots)):
                have = getattr(r, attr, None) if r is not None else None
                if isinstance(have, int) and have < want:
                    raise K31Error(f"Engine: the {name} ({type(r).__name__}) has {attr}={have}, fewer than the "
                                   f"engine's {want}", hint=f"build the {name} with {attr}={want} or more")
        self.runner, self.draft, self.gamma = runner, draft, gamma
        self.max_batch, self.prefill_chunk, self.seed = max_batch, prefill_chunk, seed
        self.pages = PageAllocator(num_pages)
        self.slots = SlotAllocator(num_slots)
        self.stats = EngineStats()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._results: dict[int, RequestResult] = {}
        self._next_id = 0
        self._admissions = 0

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_tokens, max_new_tokens: int, sampling: SamplingParams | None = None,
                    stop=None) -> int:
        """Queue a request; returns its id. `stop`: token ids that end the request (kept as its last
        token). `sampling.seed` None: seeded from the engine's seed and the request id."""
        s = self._new_seq("add_request", prompt_tokens, max_new_tokens, sampling, stop)
        self._waiting.append(s)
        return s.rid

    def add_prefilled(self, prompt_tokens, last_logits, load, max_new_tokens: int,
                      sampling: SamplingParams | None = None, stop=None, *, arrival: float | None = None,
                      prefill_s: float = 0.0) -> int:
        """Admit now a request whose prompt was prefilled outside the engine (context-parallel
        prefill, model/distributed.py); returns its id. The engine gives it a state slot and the
        pages of its prompt, calls `load(slot, block_table)` to put the prompt's KDA/conv states and
        DSA caches there (e.g. distributed.hand_off), samples its first token from `last_logits`
        (the prompt's last row, [vocab]) and decodes it from the next step on. `arrival`: the
        perf_counter time the prefill started (TTFT counts from it; default now); `prefill_s` is
        counted in the prefill stats. It cannot wait for room (its states live outside the engine):
        no free slot, batch place or pages -> K31Error."""
        if self.draft is not None:
            raise K31Error("add_prefilled: speculative decoding needs the draft's states of the prompt too",
                           hint="use an engine without a draft for prefilled requests")
        logits = torch.as_tensor(last_logits).detach().float().cpu().reshape(-1)
        if logits.numel() != self.vocab_size:
            raise K31Error(f"add_prefilled: last_logits has {logits.numel()} values, expected the vocab's "
                           f"{self.vocab_size}")
        n_prompt = len(list(prompt_tokens))
        if (len(self._running) >= self.max_batch or not self.slots.num_free
                or pages_for(n_prompt) > self.pages.num_free):
            raise K31Error("add_prefilled: no free batch place, state slot or cache pages for the prompt now",
                           hint="admit prefilled requests into an engine with room for them")
        s = self._new_seq("add_prefilled", prompt_tokens, max_new_tokens, sampling, stop)
        self.pages.grow(s.table, len(s.tokens))
        s.slot = self.slots.allocate()
        try:
            self.runner.reset_slot(s.slot)
            load(s.slot, list(s.table))
        except BaseException:
            self.pages.free(s.table)
            self.slots.free(s.slot)
            raise
        s.ctx, s.prefilling, s.order = len(s.tokens), False, self._admissions
        self._admissions += 1
        s.t_admitted = time.perf_counter()
        if arrival is not None:
            s.t_arrival = arrival
        self._running.append(s)
        self.stats.prefill_tokens += len(s.tokens)
        self.stats.prefill_s += prefill_s
        self._emit(s, [sample_token(logits, s.params, s.gen)], [])
        return s.rid

    def _new_seq(self, who: str, prompt_tokens, max_new_tokens, sampling, stop) -> _Seq:
        """A checked new request (not yet queued or admitted)."""
        prompt = list(prompt_tokens)
        if not prompt:
            raise K31Error(f"{who}: the prompt is empty", hint="give at least one token")
        for t in prompt:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < self.vocab_size:
                raise K31Error(f"{who}: prompt token {t!r} is not an int in [0, {self.vocab_size})")
        prompt = [int(t) for t in prompt]
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise K31Error(f"{who}: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        params = GREEDY if sampling is None else sampling
        if not isinstance(params, SamplingParams):
            raise K31Error(f"{who}: sampling must be a SamplingParams, got {type(params).__name__}")
        stop_set = frozenset(int(t) for t in (stop or ()))
        # The most cache positions the request can hold: every token but the last generated one,
        # plus the gamma draft positions a verify step writes past them.
        need = pages_for(len(prompt) + max_new_tokens - 1 + self.gamma)
        if need > self.pages.num_pages:
            raise K31Error(f"{who}: {len(prompt)} prompt + {max_new_tokens} new tokens need {need} cache "
                           f"pages but the engine has {self.pages.num_pages}; this request can never run",
                           hint="build the engine (and its runners) with more pages, or ask for fewer tokens")
        rid = self._next_id
        self._next_id += 1
        gen = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else self.seed * 1_000_003 + rid
            gen = make_generator(seed)
        return _Seq(rid, prompt, max_new_tokens, params, stop_set, gen, time.perf_counter(), tokens=list(prompt))

    def generate(self, prompts, max_new_tokens: int, sampling: SamplingParams | None = None, stop=None,
                 progress=None) -> list[RequestResult]:
        """Add one request per prompt, run them all, return their results in prompt order."""
        ids = [self.add_request(p, max_new_tokens, sampling, stop) for p in prompts]
        results = self.run(progress)
        return [results[i] for i in ids]

    @property
    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def result(self, rid: int) -> RequestResult:
        if rid not in self._results:
            raise K31Error(f"Engine: request {rid} has not finished" if 0 <= rid < self._next_id
                           else f"Engine: no request with id {rid}")
        return self._results[rid]

    def run(self, progress=None) -> dict[int, RequestResult]:
        """Step until every request finished; returns every finished request's result by id.
        `progress(done, total)`, if given, is called after each step: tokens generated so far, and
        the most there can be (max_new_tokens of unfinished requests + tokens of finished ones)."""
        while self.has_unfinished:
            self.step()
            if progress is not None:
                live = (*self._running, *self._waiting)
                finished = sum(len(r.tokens) for r in self._results.values())
                progress(sum(s.n_generated for s in live) + finished, sum(s.max_new for s in live) + finished)
        return dict(sorted(self._results.items()))

    # ------------------------------------------------------------------ one iteration
    def step(self) -> list[int]:
        """One scheduler iteration; returns the ids of the requests that finished in it."""
        t0 = time.perf_counter()
        finished: list[int] = []
        self._admit()
        if not self._running:
            if self._waiting:
                raise K31Error("Engine: a waiting request cannot be admitted into an idle engine (internal)")
            return finished
        prefilling = [s for s in self._running if s.prefilling]
        if prefilling:
            self._prefill(prefilling, finished)
        ready = [s for s in self._running if not s.prefilling]
        ready = self._reserve(ready, 1 + self.gamma)
        if ready:
            if self.draft is None:
                self._decode(ready, finished)
            else:
                self._spec_round(ready, finished)
        self.stats.steps += 1
        self.stats.total_s += time.perf_counter() - t0
        return finished

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch and self.slots.num_free:
            s = self._waiting[0]
            if not self.pages.grow(s.table, len(s.tokens)):
                break                                  # FIFO: later requests wait behind it
            self._waiting.popleft()
            s.slot = self.slots.allocate()
            self.runner.reset_slot(s.slot)
            if self.draft is not None:
                self.draft.reset_slot(s.slot)
            s.ctx, s.prefilling, s.order = 0, True, self._admissions
            self._admissions += 1
            if s.t_admitted is None:
                s.t_admitted = time.perf_counter()
            self._running.append(s)

    def _reserve(self, seqs: list[_Seq], ahead: int) -> list[_Seq]:
        """Grow each sequence's pages to hold ctx + `ahead` tokens, oldest first; when pages run out,
        preempt the youngest running sequence (possibly the one asking). Returns those still running."""
        kept = []
        for s in sorted(seqs, key=lambda s: s.order):
            if s not in self._running:
                continue
            while not self.pages.grow(s.table, s.ctx + ahead):
                victim = max(self._running, key=lambda r: r.order)
                self._preempt(victim)
                if victim is s:
                    break
            if s in self._running:
                kept.append(s)
        return kept

    def _preempt(self, s: _Seq) -> None:
        self._running.remove(s)
        self.pages.free(s.table)
        self.slots.free(s.slot)
        s.slot, s.ctx, s.prefilling = None, 0, True
        s.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(s)                    # first in line again; re-prefills all its tokens

    def _finish(self, s: _Seq, reason: str, finished: list[int]) -> None:
        now = time.perf_counter()
        self._running.remove(s)
        self.pages.free(s.table)
        self.slots.free(s.slot)
        s.slot, s.finish_reason = None, reason
        self._results[s.rid] = RequestResult(
            s.rid, s.prompt, s.tokens[len(s.prompt):], reason, ttft_s=s.t_first - s.t_arrival,
            queue_s=s.t_admitted - s.t_arrival, total_s=now - s.t_arrival, preemptions=s.preemptions)
        finished.append(s.rid)

    def _emit(self, s: _Seq, new_tokens: list[int], finished: list[int]) -> int:
        """Append generated tokens, stopping at max_new_tokens or a stop token. Returns how many
        were kept."""
        kept = 0
        for t in new_tokens:
            s.tokens.append(t)
            kept += 1
            if s.t_first is None:
                s.t_first = time.perf_counter()
            if t in s.stop:
                self._finish(s, "stop", finished)
                break
            if s.n_generated >= s.max_new:
                self._finish(s, "length", finished)
                break
        self.stats.generated_tokens += kept
        return kept

    # ------------------------------------------------------------------ forwards
    def _forward(self, runner, step: Step) -> torch.Tensor:
        out = runner.forward(step)
        # One copy to the host per step: sampling runs there, with per-request CPU generators.
        logits = (out.detach().float().cpu() if isinstance(out, torch.Tensor)
                  else torch.from_numpy(np.asarray(out, np.float32)))
        if tuple(logits.shape) != (step.n_tokens, self.vocab_size):
            raise K31Error(f"Engine: {type(runner).__name__}.forward returned logits of shape "
                           f"{tuple(logits.shape)}, expected ({step.n_tokens}, {self.vocab_size})")
        return logits

    @staticmethod
    def _step(kind: str, seqs: list[_Seq], tokens: list[list[int]], ctx: list[int] | None = None) -> Step:
        # Copies of the tables: a finished sequence's table is emptied after the step.
        return Step(kind, tokens, [s.ctx for s in seqs] if ctx is None else ctx,
                    [s.slot for s in seqs], [list(s.table) for s in seqs])

    def _prefill(self, seqs: list[_Seq], finished: list[int]) -> None:
        t0 = time.perf_counter()
        chunks = []
        for s in seqs:
            n = len(s.tokens) - s.ctx
            if self.prefill_chunk is not None:
                n = min(n, self.prefill_chunk)
            chunks.append(s.tokens[s.ctx:s.ctx + n])
        step = self._step("prefill", seqs, chunks)
        logits = self._forward(self.runner, step)
        if self.draft is not None:
            self._forward(self.draft, step)
        self.stats.prefill_tokens += step.n_tokens
        self.stats.prefill_s += time.perf_counter() - t0
        row = 0
        for s, chunk in zip(seqs, chunks):
            row += len(chunk)
            s.ctx += len(chunk)
            if s.ctx == len(s.tokens):                 # prompt in: its last row gives the next token
                s.prefilling = False
                self._emit(s, [sample_token(logits[row - 1], s.params, s.gen)], finished)

    def _decode(self, seqs: list[_Seq], finished: list[int]) -> None:
        t0 = time.perf_counter()
        logits = self._forward(self.runner, self._step("decode", seqs, [[s.tokens[-1]] for s in seqs]))
        self.stats.decode_s += time.perf_counter() - t0
        greedy = torch.argmax(logits, dim=-1).tolist()
        for i, s in enumerate(seqs):
            s.ctx += 1
            tok = greedy[i] if s.params.greedy else sample_token(logits[i], s.params, s.gen)
            self.stats.decode_tokens += self._emit(s, [tok], finished)

    def _spec_round(self, seqs: list[_Seq], finished: list[int]) -> None:
        t0 = time.perf_counter()
        g, n = self.gamma, len(seqs)
        ctx0 = [s.ctx for s in seqs]
        saved = self.draft.save_states([s.slot for s in seqs])
        drafts: list[list[int]] = [[] for _ in seqs]
        qs: list[list] = [[] for _ in seqs]
        last = [s.tokens[-1] for s in seqs]
        for j in range(g):
            logits = self._forward(self.draft, self._step("decode", seqs, [[t] for t in last],
                                                          [c + j for c in ctx0]))
            greedy = torch.argmax(logits, dim=-1).tolist()
            for i, s in enumerate(seqs):
                tok, q = (greedy[i], None) if s.params.greedy else propose(logits[i], s.params, s.gen)
                drafts[i].append(tok)
                qs[i].append(q)
                last[i] = tok
        t_draft = time.perf_counter() - t0
        verify = self._step("verify", seqs, [[s.tokens[-1]] + d for s, d in zip(seqs, drafts)])
        logits = self._forward(self.runner, verify).view(n, g + 1, self.vocab_size)
        outcome = [speculative_accept(drafts[i], qs[i], logits[i], s.params, s.gen) for i, s in enumerate(seqs)]
        self.runner.commit(verify, [a + 1 for a, _ in outcome])
        t1 = time.perf_counter()
        self.draft.load_states([s.slot for s in seqs], saved)
        self._forward(self.draft, self._step("prefill", seqs, [[s.tokens[-1]] + d[:a] for s, d, (a, _) in
                                                               zip(seqs, drafts, outcome)]))
        t_draft += time.perf_counter() - t1
        self.stats.spec_rounds += 1
        self.stats.proposed += g * n
        self.stats.accepted += sum(a for a, _ in outcome)
        self.stats.draft_s += t_draft
        self.stats.decode_s += time.perf_counter() - t0
        for s, d, (a, nxt) in zip(seqs, drafts, outcome):
            s.ctx += a + 1
            self.stats.decode_tokens += self._emit(s, d[:a] + [nxt], finished)

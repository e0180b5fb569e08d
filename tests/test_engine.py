"""The engine (model/engine.py): allocator, continuous batching, sampling, speculative decoding.

Most tests drive a `FakeRunner`: logits are a deterministic function of a sequence's whole token
history, which the fake reads back from its own paged cache through the step's block table and
checks against a per-slot state (a rolling hash) — so a wrong block table, context length, page
reuse, state reset, commit or draft rollback by the engine fails loudly instead of silently giving
other tokens. The same properties are then checked on the real runners (ReferenceModel,
ModelRunner on target numpy) when those modules are present.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from k31dsl.dsl.errors import K31Error
from k31dsl.model.allocator import PageAllocator, SlotAllocator, pages_for
from k31dsl.model.config import PAGE
from k31dsl.model.engine import Engine
from k31dsl.model.sampling import SamplingParams, distribution, speculative_accept
from k31dsl.model.step import Step

MOD = (1 << 61) - 1


class FakeConfig:
    def __init__(self, vocab_size):
        self.vocab_size = vocab_size


class FakeRunner:
    """A Runner whose logits for a token depend on the hash of the sequence's history up to it.
    `noise` > 0 adds a second, differently seeded logit field (a draft that disagrees sometimes)."""

    def __init__(self, seed, vocab=40, num_pages=32, num_slots=8, noise=0.0, noise_seed=12345):
        self.config = FakeConfig(vocab)
        self.seed, self.noise, self.noise_seed = seed, noise, noise_seed
        self.cache = np.full((num_pages, PAGE), -1, np.int64)
        self.state: dict[int, tuple[int, int]] = {}      # slot -> (tokens fed, rolling hash)
        self.pending: dict[int, list[tuple[int, int]]] = {}
        self.kinds: list[str] = []

    @staticmethod
    def roll(h, tok):
        return (h * 1_000_003 + tok + 1) % MOD

    def _field(self, h, seed):
        g = torch.Generator()
        g.manual_seed((h ^ (seed * 0x9E3779B97F4A7C15)) % (1 << 62))
        return torch.randn(self.config.vocab_size, generator=g)

    def logits_after(self, h):
        row = self._field(h, self.seed)
        return row + self.noise * self._field(h, self.noise_seed) if self.noise else row

    def reset_slot(self, slot):
        self.state[slot] = (0, 0)
        self.pending.pop(slot, None)

    def forward(self, step: Step):
        assert isinstance(step, Step)
        self.kinds.append(step.kind)
        used = [step.block_tables[i][:pages_for(step.context_lens[i] + step.query_lens[i])] for i in range(step.n_seqs)]
        flat = [p for u in used for p in u]
        assert len(flat) == len(set(flat)), "two sequences of one step share a cache page"
        rows = []
        for i in range(step.n_seqs):
            slot, ctx, table = step.state_slots[i], step.context_lens[i], step.block_tables[i]
            assert slot not in self.pending, "forward on a slot whose verify step was never committed"
            n, h = self.state[slot]
            assert n == ctx, f"slot {slot} holds {n} tokens but context_lens says {ctx}"
            hh = 0
            for p in range(ctx):                       # the history as the cache holds it
                tok = int(self.cache[table[p // PAGE], p % PAGE])
                assert tok >= 0, "reading a cache entry never written"
                hh = self.roll(hh, tok)
            assert hh == h, f"slot {slot}: the cache pages disagree with the state"
            after = []
            for j, tok in enumerate(step.tokens[i]):
                p = ctx + j
                self.cache[table[p // PAGE], p % PAGE] = tok
                h = self.roll(h, tok)
                after.append((p + 1, h))
                rows.append(self.logits_after(h))
            if step.kind == "verify":
                self.pending[slot] = after
            else:
                self.state[slot] = after[-1]
        return torch.stack(rows)

    def commit(self, step, accepted):
        assert step.kind == "verify" and len(accepted) == step.n_seqs
        for slot, a, toks in zip(step.state_slots, accepted, step.tokens):
            assert 1 <= a <= len(toks)
            self.state[slot] = self.pending.pop(slot)[a - 1]

    def save_states(self, slots):
        assert not any(s in self.pending for s in slots)
        return [self.state[s] for s in slots]

    def load_states(self, slots, saved):
        for s, v in zip(slots, saved):
            self.state[s] = v


def greedy_reference(runner_logits, prompt, n):
    """Greedy tokens straight from the fake's logit function (no engine)."""
    h = 0
    for t in prompt:
        h = FakeRunner.roll(h, t)
    out = []
    for _ in range(n):
        t = int(torch.argmax(runner_logits(h)))
        out.append(t)
        h = FakeRunner.roll(h, t)
    return out


# ---------------------------------------------------------------------------------- allocator
def test_page_allocator_grow_free_reuse_exhaustion():
    a = PageAllocator(5)
    t1, t2 = [], []
    assert a.grow(t1, 1) and len(t1) == 1
    assert a.grow(t1, PAGE) and len(t1) == 1            # still one page
    assert a.grow(t1, PAGE + 1) and len(t1) == 2         # grows on demand
    assert a.grow(t2, 3 * PAGE) and len(t2) == 3 and a.num_free == 0
    assert not set(t1) & set(t2)
    before = list(t1)
    assert not a.grow(t1, 3 * PAGE) and t1 == before     # exhausted: all or nothing
    freed = set(t2)
    a.free(t2)
    assert t2 == [] and a.num_free == 3
    assert a.grow(t1, 5 * PAGE) and set(t1[2:]) == freed  # freed pages are reused
    with pytest.raises(K31Error, match="freed twice"):
        a.free([before[0], before[0]])


def test_slot_allocator():
    s = SlotAllocator(2)
    x, y = s.allocate(), s.allocate()
    assert {x, y} == {0, 1} and s.allocate() is None
    s.free(x)
    assert s.allocate() == x
    with pytest.raises(K31Error, match="freed twice"):
        s.free(y)
        s.free(y)
    with pytest.raises(K31Error):
        SlotAllocator(0)


# ---------------------------------------------------------------------------------- helpers
def make_engine(seed, vocab=40, num_pages=32, num_slots=8, max_batch=8, draft_noise=None, gamma=0, **kw):
    target = FakeRunner(seed, vocab, num_pages, num_slots)
    draft = None
    if gamma:
        draft = FakeRunner(seed, vocab, num_pages, num_slots, noise=draft_noise or 0.0)
    return Engine(target, num_pages=num_pages, num_slots=num_slots, max_batch=max_batch,
                  draft=draft, gamma=gamma, **kw)


def run_alone(seed, prompt, max_new, sampling=None, **kw):
    eng = make_engine(seed, **kw)
    return eng.generate([prompt], max_new, sampling)[0].tokens


def run_ragged(eng, prompts, max_news, join_at, samplings=None):
    """Requests join the engine at the given step numbers; returns their generated tokens."""
    ids, step = {}, 0
    while len(ids) < len(prompts) or eng.has_unfinished:
        for k, (p, m, j) in enumerate(zip(prompts, max_news, join_at)):
            if j == step and k not in ids:
                ids[k] = eng.add_request(p, m, samplings[k] if samplings else None)
        eng.step()
        step += 1
    return [eng.result(ids[k]).tokens for k in range(len(prompts))]


def random_prompts(rng, lens, vocab=40):
    return [rng.integers(0, vocab, n).tolist() for n in lens]


# ---------------------------------------------------------------------------------- batching
def test_greedy_matches_the_logit_function(rng):
    seed = int(rng.integers(1 << 30))
    prompt = random_prompts(rng, [23])[0]
    ref = greedy_reference(FakeRunner(seed).logits_after, prompt, 9)
    assert run_alone(seed, prompt, 9) == ref
    assert run_alone(seed, prompt, 9, prefill_chunk=5) == ref


@pytest.mark.parametrize("chunk", [None, 7])
def test_ragged_batch_equals_each_alone(rng, chunk):
    seed = int(rng.integers(1 << 30))
    lens = [int(x) for x in rng.permutation([3, 17, 40, 70])]      # 70 crosses a page
    prompts = random_prompts(rng, lens)
    max_news = [6, 9, 4, 8]
    eng = make_engine(seed, prefill_chunk=chunk)
    got = run_ragged(eng, prompts, max_news, join_at=[0, 1, 3, 4])
    for p, m, g in zip(prompts, max_news, got):
        assert len(g) == m
        assert g == run_alone(seed, p, m)
    assert eng.pages.num_used == 0 and eng.slots.num_free == 8
    assert eng.stats.prefill_tokens == sum(lens)
    assert eng.stats.generated_tokens == sum(max_news)
    assert eng.stats.decode_tokens == sum(max_news) - len(prompts)
    assert "prefill" in eng.runner.kinds and "decode" in eng.runner.kinds


def test_max_batch_and_slots_limit_the_running_set(rng):
    seed = int(rng.integers(1 << 30))
    prompts = random_prompts(rng, [5, 9, 4, 12, 6])
    eng = make_engine(seed, num_slots=2, max_batch=3)
    ids = [eng.add_request(p, 5) for p in prompts]
    while eng.has_unfinished:
        eng.step()
        assert len(eng._running) <= 2
    for i, p in zip(ids, prompts):
        assert eng.result(i).tokens == run_alone(seed, p, 5)


def test_waiting_for_pages_and_preemption(rng):
    seed = int(rng.integers(1 << 30))
    # Two prompts of 60 fit in 3 pages, but both cross into a second page while decoding: the
    # younger one is preempted, re-prefills later, and still produces its own tokens.
    prompts = random_prompts(rng, [60, 60, 30])
    eng = make_engine(seed, num_pages=3, num_slots=4)
    ids = [eng.add_request(p, 10) for p in prompts]
    res = eng.run()
    assert eng.stats.preemptions >= 1 and sum(r.preemptions for r in res.values()) >= 1
    for i, p in zip(ids, prompts):
        assert res[i].tokens == run_alone(seed, p, 10)
    assert eng.pages.num_free == 3


def test_request_that_can_never_fit(rng):
    eng = make_engine(0, num_pages=2)
    with pytest.raises(K31Error, match="can never run"):
        eng.add_request([1] * 100, 40)
    eng.add_request([1] * 100, 28)                    # 127 positions: fits exactly
    with pytest.raises(K31Error, match="empty"):
        eng.add_request([], 4)
    with pytest.raises(K31Error, match="not an int in"):
        eng.add_request([1, 40], 4)
    with pytest.raises(K31Error, match="max_new_tokens"):
        eng.add_request([1], 0)
    with pytest.raises(K31Error, match="draft runner and gamma"):
        Engine(FakeRunner(0), num_pages=4, num_slots=2, max_batch=2, gamma=2)
    with pytest.raises(K31Error, match="num_slots=2, fewer"):
        small = FakeRunner(0)
        small.num_slots = 2
        Engine(small, num_pages=4, num_slots=3, max_batch=2)
    with pytest.raises(K31Error, match="vocab_size"):
        Engine(FakeRunner(0), num_pages=4, num_slots=2, max_batch=2, gamma=2, draft=FakeRunner(0, vocab=50))


def test_stop_at_max_new_tokens_and_stop_tokens(rng):
    seed = int(rng.integers(1 << 30))
    prompt = random_prompts(rng, [11])[0]
    full = run_alone(seed, prompt, 12)
    assert len(full) == 12
    # The first token not seen before, from index 2 on (index 0 if none): a stop token there.
    cut = next((i for i in range(2, 12) if full[i] not in full[:i]), 0)
    eng = make_engine(seed)
    r = eng.generate([prompt], 12, stop=[full[cut]])[0]
    assert r.tokens == full[:cut + 1] and r.finish_reason == "stop"
    r = make_engine(seed).generate([prompt], 1)[0]
    assert r.tokens == full[:1] and r.finish_reason == "length"
    for g in (1, 3):                                  # speculative rounds stop at the same places
        eng = make_engine(seed, gamma=g, draft_noise=0.5)
        assert eng.generate([prompt], 5)[0].tokens == full[:5]
        eng = make_engine(seed, gamma=g, draft_noise=0.5)
        r = eng.generate([prompt], 12, stop=[full[cut]])[0]
        assert r.tokens == full[:cut + 1] and r.finish_reason == "stop"


def test_results_timings_and_progress(rng):
    seed = int(rng.integers(1 << 30))
    eng = make_engine(seed)
    calls = []
    res = eng.generate(random_prompts(rng, [4, 8]), 5, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (10, 10) and all(d <= t for d, t in calls)
    for r in res:
        assert 0 <= r.queue_s <= r.ttft_s <= r.total_s
    s = eng.stats.as_dict()
    assert s["tokens_per_s"] > 0 and s["acceptance_rate"] is None and s["steps"] == len(calls)
    with pytest.raises(K31Error, match="no request"):
        eng.result(99)


# ---------------------------------------------------------------------------------- sampling
def test_seeded_sampling_is_independent_of_the_batch(rng):
    seed = int(rng.integers(1 << 30))
    prompts = random_prompts(rng, [6, 13, 21, 9])
    sps = [SamplingParams(temperature=0.8, top_p=0.9, seed=int(rng.integers(1 << 30))) for _ in prompts]
    eng = make_engine(seed, prefill_chunk=8)
    got = run_ragged(eng, prompts, [7] * 4, join_at=[0, 2, 2, 5], samplings=sps)
    alone = [run_alone(seed, p, 7, sp) for p, sp in zip(prompts, sps)]
    assert got == alone
    greedy = [run_alone(seed, p, 7) for p in prompts]
    assert got != greedy                              # it does sample
    other = [run_alone(seed, p, 7, SamplingParams(0.8, 0.9, sp.seed + 1)) for p, sp in zip(prompts, sps)]
    assert other != alone                             # and the seed matters


def test_top_p_cuts_the_tail(rng):
    logits = torch.from_numpy(rng.normal(size=30)).float()
    full = distribution(logits, SamplingParams(temperature=1.0))
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.5))
    order = torch.argsort(full, descending=True)
    keep = int((torch.cumsum(full[order], 0) - full[order] < 0.5).sum())
    assert set(torch.nonzero(p).flatten().tolist()) == set(order[:keep].tolist())
    assert torch.allclose(p[order[:keep]], full[order[:keep]] / full[order[:keep]].sum())


def test_speculative_sampling_keeps_the_target_distribution(rng):
    vocab, trials = 6, 4000
    tl = torch.from_numpy(rng.normal(size=(2, vocab)) * 1.5).float()
    dl = torch.from_numpy(rng.normal(size=vocab) * 1.5).float()
    sp = SamplingParams(temperature=1.0)
    p, q = distribution(tl[0], sp), distribution(dl, sp)
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    counts = np.zeros(vocab)
    n_acc = 0
    for _ in range(trials):
        x = int(torch.multinomial(q, 1, generator=g))
        a, nxt = speculative_accept([x], [q], tl, sp, g)
        counts[x if a == 1 else nxt] += 1
        n_acc += a
    emp, pn = counts / trials, p.numpy()
    assert np.all(np.abs(emp - pn) < 4.5 * np.sqrt(pn * (1 - pn) / trials) + 1e-3), (emp, pn)
    expect_acc = float(torch.minimum(p, q).sum())     # the known acceptance probability
    assert abs(n_acc / trials - expect_acc) < 4.5 * np.sqrt(expect_acc * (1 - expect_acc) / trials) + 1e-3


# ---------------------------------------------------------------------------------- speculative
@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
def test_speculative_greedy_equals_plain_greedy(rng, gamma):
    seed = int(rng.integers(1 << 30))
    prompts = random_prompts(rng, [5, 19, 33, 62])    # 62 + tokens + gamma crosses a page
    plain = [run_alone(seed, p, 10) for p in prompts]
    eng = make_engine(seed, gamma=gamma, draft_noise=0.6, prefill_chunk=16)
    got = run_ragged(eng, prompts, [10] * 4, join_at=[0, 0, 2, 3])
    assert got == plain
    rate = eng.stats.acceptance_rate
    assert 0 < rate < 1, rate
    assert eng.stats.proposed % gamma == 0 and eng.stats.spec_rounds > 0
    assert "verify" in eng.runner.kinds and "decode" not in eng.runner.kinds
    # A draft of another seed: rejections nearly always; the output is still plain greedy.
    eng = make_engine(seed, gamma=gamma)
    eng.draft = FakeRunner(seed + 1, num_pages=32, num_slots=8)
    assert [r.tokens for r in eng.generate(prompts, 10)] == plain
    assert eng.stats.acceptance_rate < 0.5
    # The draft is the target model: every draft is accepted.
    eng = make_engine(seed, gamma=gamma)
    assert [r.tokens for r in eng.generate(prompts, 10)] == plain
    assert eng.stats.acceptance_rate == 1.0


def test_speculative_sampling_is_seeded_and_batch_independent(rng):
    seed = int(rng.integers(1 << 30))
    prompts = random_prompts(rng, [7, 15, 26, 11])
    sps = [SamplingParams(temperature=1.0, seed=int(rng.integers(1 << 30))) for _ in prompts]
    sps[2] = SamplingParams()                         # a greedy request in the same rounds
    kw = dict(gamma=3, draft_noise=0.7)
    eng = make_engine(seed, **kw)
    got = run_ragged(eng, prompts, [9] * 4, join_at=[0, 1, 1, 3], samplings=sps)
    assert got == [run_alone(seed, p, 9, sp, **kw) for p, sp in zip(prompts, sps)]
    assert got[2] == run_alone(seed, prompts[2], 9)
    assert 0 < eng.stats.acceptance_rate < 1


# ---------------------------------------------------------------------------------- real runners
# The same properties on the K31 model itself (tiny preset, random weights): the torch oracle
# (model/reference) and the generated-op runner on target numpy (model/assembler), when present.
MODEL_PAGES, MODEL_SLOTS = 8, 6


def model_runner(kind, config, weights):
    if kind == "reference":
        from k31dsl.model.reference import ReferenceModel
        return ReferenceModel(config, weights, num_slots=MODEL_SLOTS, max_len=MODEL_PAGES * PAGE)
    assembler = pytest.importorskip("k31dsl.model.assembler")
    if not hasattr(assembler, "ModelRunner"):
        pytest.skip("model/assembler.py has no ModelRunner yet")
    return assembler.ModelRunner(config, weights, kind, num_pages=MODEL_PAGES, num_slots=MODEL_SLOTS)


@pytest.fixture(scope="module")
def tiny():
    from k31dsl.model.config import TINY
    from k31dsl.model.weights import init_weights
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print(f"weights seed={seed}")
    return TINY, init_weights(TINY, seed), seed


def model_engine(kind, tiny, draft=None, gamma=0, **kw):
    config, weights, seed = tiny
    d = None
    if draft == "same":                               # the target model itself, its own caches
        d = model_runner(kind, config, weights)
    elif draft == "other":                            # an unrelated model: another weight seed
        from k31dsl.model.weights import init_weights
        d = model_runner(kind, config, init_weights(config, seed + 1))
    elif draft == "skip":                             # the target's first layer: agrees sometimes
        dc = config.replace(name="tiny-draft1", n_layers=1)
        d = model_runner(kind, dc, {n: weights[n] for n in dc.weight_shapes()})
    return Engine(model_runner(kind, config, weights), num_pages=MODEL_PAGES, num_slots=MODEL_SLOTS,
                  max_batch=MODEL_SLOTS, draft=d, gamma=gamma, **kw)


def model_alone(kind, tiny, prompt, max_new, sampling=None):
    return model_engine(kind, tiny).generate([prompt], max_new, sampling)[0].tokens


@pytest.mark.parametrize("chunk", [None, 16])
def test_model_ragged_batch_equals_each_alone(rng, tiny, chunk):
    prompts = random_prompts(rng, [int(n) for n in rng.integers(4, 41, 4)], vocab=256)
    max_news = [4, 3, 5, 3]
    eng = model_engine("reference", tiny, prefill_chunk=chunk)
    got = run_ragged(eng, prompts, max_news, join_at=[0, 1, 2, 4])
    alone = [model_alone("reference", tiny, p, m) for p, m in zip(prompts, max_news)]
    assert got == alone
    assert [len(g) for g in got] == max_news


def test_model_preemption_keeps_the_tokens(rng, tiny):
    """Two 60-token prompts in 3 pages: both cross into a second page while decoding, the younger
    is preempted (pages and slot freed), re-admitted (slot reset) and re-prefilled."""
    config, weights, _ = tiny
    prompts = random_prompts(rng, [60, 60], vocab=256)
    eng = Engine(model_runner("reference", config, weights), num_pages=3, num_slots=3, max_batch=3)
    res = eng.generate(prompts, 6)
    assert eng.stats.preemptions >= 1
    assert [r.tokens for r in res] == [model_alone("reference", tiny, p, 6) for p in prompts]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
def test_model_speculative_equals_greedy(rng, tiny, gamma):
    prompts = random_prompts(rng, [int(n) for n in rng.integers(4, 41, 2)], vocab=256)
    plain = [r.tokens for r in model_engine("reference", tiny).generate(prompts, 6)]
    for draft in ("other", "skip", "same"):
        eng = model_engine("reference", tiny, draft=draft, gamma=gamma)
        assert [r.tokens for r in eng.generate(prompts, 6)] == plain, draft
        rate = eng.stats.acceptance_rate
        assert rate == 1.0 if draft == "same" else rate < 1.0, (draft, rate)


def test_model_seeded_sampling_is_batch_independent(rng, tiny):
    prompts = random_prompts(rng, [int(n) for n in rng.integers(4, 41, 3)], vocab=256)
    sps = [SamplingParams(temperature=1.0, top_p=0.95, seed=int(rng.integers(1 << 30))) for _ in prompts]
    eng = model_engine("reference", tiny)
    got = run_ragged(eng, prompts, [4] * 3, join_at=[0, 1, 1], samplings=sps)
    assert got == [model_alone("reference", tiny, p, 4, sp) for p, sp in zip(prompts, sps)]
    eng = model_engine("reference", tiny, draft="skip", gamma=2)      # speculative sampling too
    got = run_ragged(eng, prompts, [4] * 3, join_at=[0, 0, 2], samplings=sps)
    for p, sp, g in zip(prompts, sps, got):
        assert g == model_engine("reference", tiny, draft="skip", gamma=2).generate([p], 4, sp)[0].tokens


# The generated-op runner costs ~1-2 s per step on numpy (and a compile per new shape class), so it
# gets a smaller set: prompt lengths a multiple of the prefill chunk (one prefill shape class), and
# the runs alone are shared between the two tests.
@pytest.fixture(scope="module")
def numpy_case(tiny):
    prompts = random_prompts(np.random.default_rng(tiny[2]), [8, 16, 8], vocab=256)
    memo = {}

    def alone(k, max_new):
        if (k, max_new) not in memo:
            eng = model_engine("numpy", tiny, prefill_chunk=8)
            memo[k, max_new] = eng.generate([prompts[k]], max_new)[0].tokens
        return memo[k, max_new]
    return prompts, alone


def test_numpy_runner_ragged_batch_equals_each_alone(tiny, numpy_case):
    prompts, alone = numpy_case
    max_news = [3, 2, 3]
    eng = model_engine("numpy", tiny, prefill_chunk=8)
    got = run_ragged(eng, prompts, max_news, join_at=[0, 1, 2])
    assert got == [alone(k, m) for k, m in enumerate(max_news)]


def test_numpy_runner_speculative_equals_greedy(tiny, numpy_case):
    """Verify + commit on the generated ops; the draft is the torch model of another weight seed
    (the engine takes any Runner as draft), so every round has rejections."""
    from k31dsl.model.reference import ReferenceModel
    from k31dsl.model.weights import init_weights
    config, weights, seed = tiny
    prompts, alone = numpy_case
    draft = ReferenceModel(config, init_weights(config, seed + 1), num_slots=MODEL_SLOTS, max_len=MODEL_PAGES * PAGE)
    eng = Engine(model_runner("numpy", config, weights), num_pages=MODEL_PAGES, num_slots=MODEL_SLOTS,
                 max_batch=2, draft=draft, gamma=2)
    assert eng.generate([prompts[0]], 3)[0].tokens == alone(0, 3)
    assert eng.stats.acceptance_rate < 1.0 and eng.stats.spec_rounds >= 1

"""Token sampling: greedy, seeded temperature + top-p, and the speculative accept/resample rule.

Every sampled request owns a `torch.Generator` and draws a fixed number of uniforms per decision
(one per sampled token, one per speculative accept test), so its tokens depend only on its own
logits and seed — never on which other requests share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from k31dsl.dsl.errors import K31Error


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy (argmax, no random draws)
    top_p: float = 1.0            # nucleus: keep the most likely tokens holding >= top_p of the mass
    seed: int | None = None       # None: the engine derives one from its seed and the request id

    def __post_init__(self):
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise K31Error(f"SamplingParams: temperature must be a number >= 0, got {t!r}",
                           hint="temperature 0 is greedy decoding")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise K31Error(f"SamplingParams: top_p must be in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise K31Error(f"SamplingParams: seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed % (1 << 63))
    return g


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The probabilities a sampled request draws from: softmax(logits / T), cut to the top-p
    nucleus and renormalised. fp64 [vocab]."""
    p = torch.softmax(logits.to(torch.float64) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(p, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_p, 0) - sorted_p
        keep_sorted = mass_before < params.top_p          # the first token is always kept
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        p = torch.where(keep, p, torch.zeros_like(p))
        p = p / p.sum()
    return p


def draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    """One token from `probs` (unnormalised is fine) by inverse CDF: exactly one uniform draw."""
    u = torch.rand((), generator=gen, dtype=torch.float64)
    cdf = torch.cumsum(probs.to(torch.float64), 0)
    # First index whose cdf exceeds u * total: zero-probability tokens are never chosen.
    idx = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    return min(idx, probs.numel() - 1)


def sample_token(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """The next token from one row of logits."""
    if params.greedy:
        return int(torch.argmax(logits))
    return draw(distribution(logits, params), gen)


def propose(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None):
    """A draft token and the draft distribution it came from (None for greedy requests)."""
    if params.greedy:
        return int(torch.argmax(logits)), None
    q = distribution(logits, params)
    return draw(q, gen), q


def speculative_accept(drafts: list[int], draft_probs: list, target_logits: torch.Tensor,
                       params: SamplingParams, gen: torch.Generator | None) -> tuple[int, int]:
    """Verify `drafts` (gamma tokens) against the target's gamma + 1 rows of logits (row i scores
    the token after the i-th fed token). Returns (accepted drafts a in 0..gamma, the next token).

    Greedy: drafts are kept while each equals the target's argmax; the next token is the target's
    argmax after the last kept one — exactly the tokens plain greedy decoding gives.
    Sampled (Leviathan et al. / Chen et al.): keep draft x with probability min(1, p(x)/q(x)); on the
    first rejection draw from norm(max(p - q, 0)); after gamma acceptances draw the bonus from p.
    The output is distributed as the target's own (temperature, top-p) distribution."""
    gamma = len(drafts)
    if params.greedy:
        target = torch.argmax(target_logits, dim=-1).tolist()
        a = 0
        while a < gamma and drafts[a] == target[a]:
            a += 1
        return a, int(target[a])
    for i, (x, q) in enumerate(zip(drafts, draft_probs)):
        p = distribution(target_logits[i], params)
        u = float(torch.rand((), generator=gen, dtype=torch.float64))
        if u * float(q[x]) < float(p[x]):
            continue
        residual = torch.clamp(p - q, min=0)
        if not float(residual.sum()) > 0:   # p == q: rejection has probability 0; keep it safe
            residual = p
        return i, draw(residual, gen)
    return gamma, draw(distribution(target_logits[gamma], params), gen)

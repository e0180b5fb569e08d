"""Model weights and prompts for runner-vs-reference tests, drawn so that no discrete decision
of the reference sits on a knife edge. The logits tolerance (1e-2) covers rounding, not a MoE
routing choice that rounding flips: when a token's k-th and (k+1)-th expert probabilities are
within ~1e-4 (seen at seed 1758718750), the runner may pick the other expert and its logits move
by percents. A draw is kept when every routing decision of the reference's own greedy run has a
probability margin of at least MARGIN; otherwise the next seed is drawn (about half are)."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from k31dsl.model.reference import ReferenceModel, functions
from k31dsl.model.step import Step
from k31dsl.model.weights import init_weights

MARGIN = 1e-3           # smallest gap between the k-th and (k+1)-th routing probability (about half
                        # of the tiny preset's 16 + 8 token runs have a smaller one somewhere)
TRIES = 20


@contextmanager
def routing_margins():
    """The smallest routing margin of every `route` call the reference makes inside the block."""
    seen: list[float] = []
    route = functions.route

    def recording(x, router, top_k):
        p = torch.softmax(functions.lin(x, router).float(), dim=-1)
        if p.shape[-1] > top_k and p.shape[0]:
            top = p.topk(top_k + 1, dim=-1).values
            seen.append(float((top[:, top_k - 1] - top[:, top_k]).min()))
        return route(x, router, top_k)

    functions.route = recording
    try:
        yield seen
    finally:
        functions.route = route


def greedy_steps(model, prompt, steps: int, slot: int = 1, page: int = 2):
    """The model's own greedy run: the steps (prefill, then `steps` decodes) and its logits."""
    st = Step("prefill", [prompt], [0], [slot], [[page]])
    plan, logits = [st], [model.forward(st).cpu()]
    ctx = len(prompt)
    for _ in range(steps):
        st = Step("decode", [[int(logits[-1][-1].argmax())]], [ctx], [slot], [[page]])
        plan.append(st)
        logits.append(model.forward(st).cpu())
        ctx += 1
    return plan, logits


def clear_draw(rng, config, prompt_len: int, steps: int, num_slots: int = 3, tries: int = TRIES):
    """(seed, weights, prompt, steps, reference logits) of the first draw whose reference greedy
    run has clear routing margins (longer prompts make more routing decisions: fewer draws pass,
    so their tests allow more tries)."""
    for _ in range(tries):
        seed = int(rng.integers(0, 2 ** 31))
        gen = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, config.vocab_size, (prompt_len,), generator=gen).tolist()
        weights = init_weights(config, seed)
        with routing_margins() as margins:
            plan, want = greedy_steps(ReferenceModel(config, weights, num_slots=num_slots), prompt, steps)
        if min(margins, default=1.0) >= MARGIN:
            return seed, weights, prompt, plan, want
    raise AssertionError(f"no draw with clear routing margins in {tries} tries")

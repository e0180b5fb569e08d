"""The contract between the engine (who runs which tokens, where their caches live) and a model
runner (who computes logits): one `Step` in, logits out.

A runner owns the per-sequence state — the paged FP8 latent + indexer caches (pages handed out by
the engine's block allocator), the KDA state pool and the conv state (one row per `state_slot`).
The engine owns lengths: a token's cache entries are written at its position by `forward`, and a
rejected draft is rolled back simply by not counting it (the next step overwrites the slot).
KDA and conv states cannot be rolled back by length, so a verify step leaves them pending until
`commit(step, accepted)` keeps the first `accepted[i]` tokens of sequence i (state replay).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from k31dsl.dsl.errors import K31Error

STEP_KINDS = ("prefill", "decode", "verify")


@dataclass
class Step:
    kind: str                        # "prefill" | "decode" | "verify"
    tokens: list[list[int]]          # this step's tokens, per sequence (decode: 1 each; verify: gamma + 1 each)
    context_lens: list[int]          # tokens already in the caches before this step, per sequence
    state_slots: list[int]           # KDA state / conv state row of each sequence
    block_tables: list[list[int]]    # cache pages of each sequence, covering context + this step's tokens

    def __post_init__(self):
        n = len(self.tokens)
        if self.kind not in STEP_KINDS:
            raise K31Error(f"Step: kind must be one of {STEP_KINDS}, got {self.kind!r}")
        if not (len(self.context_lens) == len(self.state_slots) == len(self.block_tables) == n) or n == 0:
            raise K31Error("Step: tokens, context_lens, state_slots and block_tables need one entry per "
                           f"sequence (got {n}, {len(self.context_lens)}, {len(self.state_slots)}, "
                           f"{len(self.block_tables)})")
        lens = [len(t) for t in self.tokens]
        if min(lens) < 1:
            raise K31Error("Step: every sequence needs at least one token")
        if self.kind == "decode" and max(lens) != 1:
            raise K31Error("Step: a decode step takes one token per sequence")
        if self.kind == "verify" and len(set(lens)) != 1:
            raise K31Error("Step: a verify step takes the same number of tokens (gamma + 1) per sequence")
        if len(set(self.state_slots)) != n:
            raise K31Error("Step: state_slots must be distinct")
        from k31dsl.model.config import PAGE
        for i, (ctx, bt) in enumerate(zip(self.context_lens, self.block_tables)):
            if ctx < 0 or len(bt) * PAGE < ctx + lens[i]:
                raise K31Error(f"Step: sequence {i} has {ctx} + {lens[i]} tokens but {len(bt)} pages of {PAGE}")

    @property
    def n_seqs(self) -> int:
        return len(self.tokens)

    @property
    def query_lens(self) -> list[int]:
        return [len(t) for t in self.tokens]

    @property
    def n_tokens(self) -> int:
        return sum(self.query_lens)

    def positions(self) -> list[list[int]]:
        return [list(range(c, c + n)) for c, n in zip(self.context_lens, self.query_lens)]


class Runner(Protocol):
    """What the engine needs from a model runner (model/assembler.py: generated ops on a target;
    model/reference.py: the torch oracle)."""

    config: object

    def reset_slot(self, slot: int) -> None:
        """Zero the KDA state and conv state of `slot` (a new sequence starts there)."""

    def forward(self, step: Step):
        """Logits fp32 [step.n_tokens, vocab] (sequences in order, their tokens in order). Writes the
        tokens' cache entries; prefill/decode advance the KDA/conv states; verify leaves them
        pending until `commit`."""

    def commit(self, step: Step, accepted: list[int]) -> None:
        """After a verify step: the states of sequence i become those after its first accepted[i]
        tokens (1 <= accepted[i] <= len(step.tokens[i]))."""

    def save_states(self, slots: list[int]):
        """A copy of the KDA and conv states of `slots` (the engine snapshots a draft model before
        it proposes; caches need no copy: they roll back by length)."""

    def load_states(self, slots: list[int], saved) -> None:
        """Put back states taken by `save_states` for the same slots."""

"""Seeds of the tests' random draws: fresh per test, printed (`seed=N` in a failure's captured
output), and replayable: K31_TEST_SEED=N makes every draw use N."""
from __future__ import annotations

import os

import numpy as np


def draw_seed() -> int:
    replay = os.environ.get("K31_TEST_SEED")
    seed = int(replay) if replay else int(np.random.SeedSequence().entropy % 2 ** 31)
    print(f"seed={seed}")
    return seed

"""Test set-up: the Triton interpreter must be selected before triton is imported anywhere."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("K31_VERIFY", "1")          # the verifier re-runs after every IR pass
os.environ.setdefault("K31_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "k31"))
os.environ.setdefault("K31_ASCENDC_OPT", "-O0")   # AscendC emulator builds: -O2 by default, -O0 here for speed


import numpy as np  # noqa: E402 - after the environment above
import pytest  # noqa: E402

from seeds import draw_seed  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread per test process: CI runs two xdist workers on two cores, and torch's
    own pool on top of them oversubscribes the cores (tiny model steps ran 8x slower)."""
    import torch
    torch.set_num_threads(1)


@pytest.fixture
def rng(request):
    """A fresh random generator per test; its seed is printed and kept with the test's report
    (tests/seeds.py: K31_TEST_SEED=N replays a failure)."""
    seed = draw_seed()
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture
def scratch_registry(monkeypatch):
    """Extra ops registered by a test vanish afterwards (the library's ops are loaded first)."""
    from k31dsl.ops import registry
    registry.all_ops()
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    monkeypatch.delenv("K31_EXTRA_OPS", raising=False)

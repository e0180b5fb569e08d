"""The communicator the distributed host ops of a graph program use (`dist_all_gather`).

The graph IR names collectives; who the peers are is the caller's business: a runtime (e.g.
model/distributed.py over a torch.distributed process group) installs an object with

    rank, world                      this process's rank and the group size
    all_gather(out, inp, name)       out (contiguous, world x inp's elements) <- every rank's inp,
                                     in rank order

for the duration of a run (`with communicator(comm): exe(feed)`). With none installed a program
runs as the only rank: `dist_all_gather` copies its input (world size 1).
"""
from __future__ import annotations

import contextlib
import contextvars

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("k31dsl_communicator", default=None)


def current():
    """The installed communicator, or None (a single rank)."""
    return _CURRENT.get()


@contextlib.contextmanager
def communicator(comm):
    token = _CURRENT.set(comm)
    try:
        yield comm
    finally:
        _CURRENT.reset(token)

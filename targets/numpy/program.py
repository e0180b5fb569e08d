"""NumPy target: a scheduled graph program runs in order on one thread (streams, groups and
events are recorded in the graph but order is all the CPU needs)."""
from __future__ import annotations

from k31dsl.lowering.graph.execute import ProgramExecutor


class NumpyProgram(ProgramExecutor):
    target = "numpy"


def executor(program, **options) -> NumpyProgram:
    return NumpyProgram(program, **options)

"""Graph IR: programs of kernel calls (see ir.py for the builder), the verifier, the text dump,
the pass pipeline per target and `run`."""
from k31dsl.lowering.graph.execute import compile_program, run  # noqa: F401
from k31dsl.lowering.graph.ir import Program, TensorRef, program  # noqa: F401
from k31dsl.lowering.graph.text import dump  # noqa: F401
from k31dsl.lowering.graph.verify import problems, verify  # noqa: F401

__all__ = ["Program", "TensorRef", "program", "run", "compile_program", "dump", "verify", "problems"]

"""fp64 NumPy oracles, written from each op's math (not from the DSL kernels). Imported by the
tests and, through k31dsl.ops.testing.load_oracle, by the ops' `check` functions."""

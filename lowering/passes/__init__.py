"""Graph passes: plain functions Program -> Program (see lowering/graph/pipeline.py)."""

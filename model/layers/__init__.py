"""Layer builders of the assembler (model/assembler.py): each adds one sublayer to a step graph."""

"""The K31 model in plain PyTorch (fp32, docs/model.md): the oracle of the generated-op engine
and the anchor of the GPU benchmark. Independent of the DSL and the op library.

  forward(config, weights, tokens) -> logits fp32 [T, vocab]        one whole sequence
  ReferenceModel(config, weights, device=None, num_slots=8, max_len=2048)
      the Runner protocol of model/step.py (reset_slot, forward, commit, save_states, load_states)
"""
from k31dsl.model.reference.model import ReferenceModel, forward, run_layers

__all__ = ["ReferenceModel", "forward", "run_layers"]

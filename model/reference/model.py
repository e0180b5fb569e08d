"""The K31 model in plain torch (docs/model.md), as a whole-sequence function and as a Runner
(model/step.py) that keeps per-slot state: KDA states, conv states and, per DSA layer, a dense
per-slot copy of what the paged caches hold. AttnRes is token-local: nothing to keep."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import CONV, INDEX_DIM, KV_LORA, ROPE_DIM, K31Config, pages_for
from k31dsl.model.reference.dsa import dsa_layer
from k31dsl.model.reference.functions import attnres, lin, maybe_compiled, moe, rmsnorm, rope_tables
from k31dsl.model.reference.kda import kda_layer
from k31dsl.model.step import Step


def run_layers(cfg: K31Config, w: dict, e: torch.Tensor, attn, mlp, compile: bool = False) -> torch.Tensor:
    """The decoder stack with Block AttnRes (K3 convention: `attnres_block` counts decoder layers).
    attn(l, kind, h) and mlp(l, h) are the sublayers including their pre-norm; returns the final
    AttnRes output h [T, d] (before the final norm)."""
    eps = cfg.attnres_eps
    res = maybe_compiled(attnres, compile)
    blocks: list[torch.Tensor] = []
    prefix = e
    for l, kind in enumerate(cfg.layer_kinds):
        p = f"layers.{l}."
        h = res(blocks + [prefix], w[p + "attn_res.query"], w[p + "attn_res.norm"], eps)
        if l % cfg.attnres_block == 0:
            blocks.append(prefix)
            prefix = None
        a = attn(l, kind, h)
        prefix = a if prefix is None else prefix + a
        h = res(blocks + [prefix], w[p + "mlp_res.query"], w[p + "mlp_res.norm"], eps)
        prefix = prefix + mlp(l, h)
    return res(blocks + [prefix], w["final_res.query"], w["final_res.norm"], eps)


class _States:
    """Per-slot tensors: KDA state [slots, HV, K, V] and conv state [slots, 3, C] per KDA layer; per
    DSA layer the dense caches kv [slots, max_len, 576] (dequantised latent | bf16 rope; `latent`
    and `rope` are views of it) and index [slots, max_len, 128]; pending verify states."""

    def __init__(self, cfg: K31Config, num_slots: int, max_len: int, device):
        f32 = dict(dtype=torch.float32, device=device)
        HV, K, V = cfg.kda_value_heads, cfg.kda_head_dim, cfg.kda_value_dim
        channels = 2 * cfg.kda_heads * K + HV * V
        self.kda = {l: torch.zeros(num_slots, HV, K, V, **f32) for l in cfg.kda_layers}
        self.conv = {l: torch.zeros(num_slots, CONV - 1, channels, **f32) for l in cfg.kda_layers}
        self.kv = {l: torch.zeros(num_slots, max_len, KV_LORA + ROPE_DIM, **f32) for l in cfg.dsa_layers}
        self.latent = {l: t[..., :KV_LORA] for l, t in self.kv.items()}
        self.rope = {l: t[..., KV_LORA:] for l, t in self.kv.items()}
        self.index = {l: torch.zeros(num_slots, max_len, INDEX_DIM, **f32) for l in cfg.dsa_layers}
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


@dataclass
class _Batch:
    """One step's sequences as the layers see them (tokens flattened in sequence order)."""
    kind: str
    slots: list[int]
    offsets: list[int]
    lens: list[int]
    ctx: list[int]
    slot_index: torch.Tensor          # [N] long
    slot_of_token: torch.Tensor       # [Ntok] long
    positions: torch.Tensor           # [Ntok] long
    cos: torch.Tensor                 # [Ntok, 32] fp32
    sin: torch.Tensor
    quantize: bool                    # False: the quantisation points are the identity (exact model)
    compile: bool                     # torch.compile the tensor pieces between the Python loops


class ReferenceModel:
    """The Runner of the torch reference: fp32 activations (matmuls in the weights' dtype).
    quantize=False replaces the quantisation points (FP8 latent, MXFP8 indexer, bf16 rope and Q)
    by the identity: the exact model, whose paths agree to fp32 rounding (tests). compile=True runs
    the tensor pieces between the Python loops through torch.compile (the benchmark's anchor)."""

    def __init__(self, config: K31Config, weights: dict, device=None, num_slots: int = 8, max_len: int = 2048,
                 quantize: bool = True, compile: bool = False):
        from k31dsl.model.weights import check_weights
        check_weights(config, weights, origin="ReferenceModel")
        self.config = config
        self.device = torch.device(device) if device is not None else weights["embed"].device
        self.weights = {n: t.to(self.device) for n, t in weights.items()}
        self.num_slots, self.max_len = num_slots, max_len
        self.states = _States(config, num_slots, max_len, self.device)
        self.quantize, self.compile = quantize, compile
        self._verify: Step | None = None

    # ------------------------------------------------------------------ Runner protocol
    def reset_slot(self, slot: int) -> None:
        self._check_slots([slot])
        for t in list(self.states.kda.values()) + list(self.states.conv.values()):
            t[slot] = 0

    def forward(self, step: Step) -> torch.Tensor:
        cfg, w = self.config, self.weights
        self._check_step(step)
        if self._verify is not None:
            raise K31Error("ReferenceModel: a verify step is pending; call commit(step, accepted) first")
        batch = self._batch(step)
        flat = [t for seq in step.tokens for t in seq]
        if min(flat) < 0 or max(flat) >= cfg.vocab_size:
            raise K31Error(f"ReferenceModel: token ids must be in [0, {cfg.vocab_size})")
        tokens = torch.tensor(flat, dtype=torch.long, device=self.device)
        e = w["embed"][tokens].float()

        def attn(l, kind, h):
            x = rmsnorm(h, w[f"layers.{l}.attn_norm"], cfg.rms_eps)
            layer = kda_layer if kind == "K" else dsa_layer
            return layer(cfg, w, f"layers.{l}.attn.", x, batch, self.states, l)

        def mlp(l, h):
            x = rmsnorm(h, w[f"layers.{l}.mlp_norm"], cfg.rms_eps)
            return moe(x, w, f"layers.{l}.moe.", cfg.n_experts_per_tok, self.compile)

        h = run_layers(cfg, w, e, attn, mlp, self.compile)
        if step.kind == "verify":
            self._verify = step
        return lin(rmsnorm(h, w["final_norm"], cfg.rms_eps), w["lm_head"]).float()

    def commit(self, step: Step, accepted: list[int]) -> None:
        pending = self._verify
        if pending is None or pending.state_slots != step.state_slots:
            raise K31Error("ReferenceModel.commit: no pending verify step for these state slots")
        if len(accepted) != step.n_seqs or any(not 1 <= a <= n for a, n in zip(accepted, step.query_lens)):
            raise K31Error(f"ReferenceModel.commit: accepted must give 1..{step.query_lens[0]} per sequence, "
                           f"got {accepted}")
        st = self.states
        slots = torch.tensor(step.state_slots, dtype=torch.long, device=self.device)
        acc = torch.tensor(accepted, dtype=torch.long, device=self.device)
        rows = torch.arange(len(accepted), device=self.device)
        window = acc[:, None] + torch.arange(CONV - 1, device=self.device)      # last 3 inputs after acc tokens
        for l, (s_all, full) in st.pending.items():
            st.kda[l][slots] = s_all[rows, acc - 1]
            st.conv[l][slots] = full[rows[:, None], window]
        st.pending.clear()
        self._verify = None

    def save_states(self, slots: list[int]):
        self._check_slots(slots)
        idx = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        return {"slots": list(slots),
                "kda": {l: t[idx].clone() for l, t in self.states.kda.items()},
                "conv": {l: t[idx].clone() for l, t in self.states.conv.items()}}

    def load_states(self, slots: list[int], saved) -> None:
        if list(slots) != saved["slots"]:
            raise K31Error(f"ReferenceModel.load_states: states were saved for slots {saved['slots']}, not {list(slots)}")
        idx = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        for l, t in self.states.kda.items():
            t[idx] = saved["kda"][l]
        for l, t in self.states.conv.items():
            t[idx] = saved["conv"][l]

    # ------------------------------------------------------------------ helpers
    def _check_slots(self, slots) -> None:
        bad = [s for s in slots if not 0 <= s < self.num_slots]
        if bad:
            raise K31Error(f"ReferenceModel: state slot(s) {bad} out of range [0, {self.num_slots})")

    def _check_step(self, step: Step) -> None:
        self._check_slots(step.state_slots)
        for ctx, n in zip(step.context_lens, step.query_lens):
            if ctx + n > self.max_len:
                raise K31Error(f"ReferenceModel: a sequence of {ctx + n} tokens exceeds max_len {self.max_len}",
                               hint="construct the ReferenceModel with a larger max_len")

    def _batch(self, step: Step) -> _Batch:
        dev = self.device
        offsets, o = [], 0
        for n in step.query_lens:
            offsets.append(o)
            o += n
        positions = torch.tensor([p for ps in step.positions() for p in ps], dtype=torch.long, device=dev)
        slot_of_token = torch.tensor([s for s, n in zip(step.state_slots, step.query_lens) for _ in range(n)],
                                     dtype=torch.long, device=dev)
        cos, sin = rope_tables(positions, self.config.rope_theta, ROPE_DIM // 2)
        return _Batch(step.kind, list(step.state_slots), offsets, step.query_lens, list(step.context_lens),
                      torch.tensor(step.state_slots, dtype=torch.long, device=dev), slot_of_token, positions, cos, sin,
                      self.quantize, self.compile)


def forward(config: K31Config, weights: dict, tokens, quantize: bool = True) -> torch.Tensor:
    """Logits fp32 [T, vocab] of one whole sequence (a fresh model, one prefill step)."""
    tokens = [int(t) for t in tokens]
    if not tokens:
        raise K31Error("forward: the sequence needs at least one token")
    model = ReferenceModel(config, weights, num_slots=1, max_len=len(tokens), quantize=quantize)
    pages = list(range(pages_for(len(tokens))))
    return model.forward(Step("prefill", [tokens], [0], [0], [pages]))

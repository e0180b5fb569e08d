"""K31Config: the shape of a K31 hybrid model, its presets, and the table of its weights.

The model (docs/model.md has the math): token embedding -> decoder layers, each an attention
sublayer (KDA or DSA, by `layer_pattern`) and an MoE sublayer, joined by Block Attention Residuals
in the K3 convention (`attnres_block` counts decoder layers) -> final AttnRes -> RMSNorm -> LM head.
Every weight is named and shaped by `weight_shapes()`; reference, loader and assembler all read
that one table, so a model file either matches it exactly or is refused with the tensor's name.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from k31dsl.dsl.errors import K31Error, Loc, error

# Fixed by the cache formats of the DSA ops (research/dsa.md §3.3, §1.4).
KV_LORA = 512          # MLA latent width (FP8 tiles of 128 in the paged cache)
ROPE_DIM = 64          # MLA rope dims (bf16 in the cache), NeoX half split
INDEX_DIM = 128        # indexer head dim (Hadamard over 128, MXFP8 groups of 32)
PAGE = 64              # tokens per cache page
CONV = 4               # KDA short-conv kernel (state keeps CONV - 1 inputs)


def pages_for(n_tokens: int) -> int:
    """Cache pages that hold `n_tokens` tokens."""
    return -(-n_tokens // PAGE)


@dataclass(frozen=True)
class K31Config:
    name: str = "custom"
    vocab_size: int = 256                 # byte-level tokenizer
    d_model: int = 64
    n_layers: int = 4
    layer_pattern: str = "KKKD"           # K = KDA, D = DSA; repeated to n_layers
    # KDA (fla shapes): H q/k heads, HV value heads (GVA: HV a multiple of H)
    kda_heads: int = 2
    kda_value_heads: int = 4
    kda_head_dim: int = 32
    kda_value_dim: int = 32
    kda_gate: str = "lower_bound"         # "softplus" (Kimi Linear) or "lower_bound" (K3 safe gate)
    kda_lower_bound: float = -5.0
    # DSA: MLA (absorbed, latent KV_LORA + ROPE_DIM) and the Lightning Indexer
    mla_heads: int = 2
    q_lora_rank: int = 32
    qk_nope_dim: int = 32
    v_head_dim: int = 32
    index_heads: int = 16                 # power of two in [16, 128] (the indexer kernel's rule)
    index_topk: int = 32
    rope_theta: float = 10000.0
    # MoE: softmax router, top-k renormalised, one shared expert, SwiGLU experts
    n_experts: int = 4
    n_experts_per_tok: int = 2
    moe_ffn_dim: int = 64
    shared_ffn_dim: int = 64
    # AttnRes: decoder layers per block (K3 convention); eps of the key RMSNorm
    attnres_block: int = 2
    attnres_eps: float = 1e-6
    rms_eps: float = 1e-6
    dtype: str = "float32"                # weights/activations on the target ("float32" | "bfloat16")

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ derived
    @property
    def layer_kinds(self) -> list[str]:
        """'K' or 'D' per decoder layer."""
        return [self.layer_pattern[i % len(self.layer_pattern)] for i in range(self.n_layers)]

    @property
    def kda_layers(self) -> list[int]:
        return [i for i, c in enumerate(self.layer_kinds) if c == "K"]

    @property
    def dsa_layers(self) -> list[int]:
        return [i for i, c in enumerate(self.layer_kinds) if c == "D"]

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + ROPE_DIM

    @property
    def sm_scale(self) -> float:
        return self.qk_head_dim ** -0.5

    @property
    def n_blocks(self) -> int:
        """AttnRes blocks (each starts at a decoder layer l with l % attnres_block == 0)."""
        return -(-self.n_layers // self.attnres_block)

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def bad(msg, hint=None):
            raise K31Error(f"K31Config {self.name!r}: {msg}", hint=hint)
        ints = [f.name for f in fields(self) if f.type in ("int", int)]
        for n in ints:
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(f"{n} must be an int >= 1, got {v!r}")
        if not self.layer_pattern or set(self.layer_pattern) - {"K", "D"}:
            bad(f"layer_pattern must be a non-empty string of 'K' (KDA) and 'D' (DSA), got {self.layer_pattern!r}",
                hint="e.g. 'KKKD': three KDA layers to one DSA layer")
        if self.kda_value_heads % self.kda_heads:
            bad(f"kda_value_heads ({self.kda_value_heads}) must be a multiple of kda_heads ({self.kda_heads}) (GVA)")
        for n in ("kda_head_dim", "kda_value_dim"):
            v = getattr(self, n)
            if v < 16 or v & (v - 1):
                bad(f"{n} must be a power of two >= 16, got {v}")
        if self.kda_gate not in ("softplus", "lower_bound"):
            bad(f"kda_gate must be 'softplus' or 'lower_bound', got {self.kda_gate!r}")
        if self.kda_gate == "lower_bound" and not -5.0 <= self.kda_lower_bound < 0:
            bad(f"kda_lower_bound must be in [-5, 0), got {self.kda_lower_bound}")
        if self.index_heads & (self.index_heads - 1) or not 16 <= self.index_heads <= 128:
            bad(f"index_heads must be a power of two in [16, 128], got {self.index_heads}")
        if self.n_experts_per_tok > self.n_experts:
            bad(f"n_experts_per_tok ({self.n_experts_per_tok}) exceeds n_experts ({self.n_experts})")
        if self.vocab_size < 256:
            bad(f"vocab_size must be >= 256 (the byte-level tokenizer), got {self.vocab_size}")
        if self.dtype not in ("float32", "bfloat16"):
            bad(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        for n in ("attnres_eps", "rms_eps", "rope_theta"):
            v = getattr(self, n)
            if not isinstance(v, (int, float)) or not v > 0:
                bad(f"{n} must be a number > 0, got {v!r}")

    # ------------------------------------------------------------------ weights
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight of the model, name -> shape (torch Linear layout [out, in])."""
        d, hk, hv = self.d_model, self.kda_heads, self.kda_value_heads
        K, V = self.kda_head_dim, self.kda_value_dim
        H, dn, dv = self.mla_heads, self.qk_nope_dim, self.v_head_dim
        E, F, Fs = self.n_experts, self.moe_ffn_dim, self.shared_ffn_dim
        w: dict[str, tuple[int, ...]] = {"embed": (self.vocab_size, d)}
        for i, kind in enumerate(self.layer_kinds):
            p = f"layers.{i}."
            for s in ("attn_res", "mlp_res"):
                w[p + s + ".query"] = (d,)
                w[p + s + ".norm"] = (d,)
            w[p + "attn_norm"] = (d,)
            w[p + "mlp_norm"] = (d,)
            a = p + "attn."
            if kind == "K":
                w.update({a + "q_proj": (hk * K, d), a + "k_proj": (hk * K, d), a + "v_proj": (hv * V, d),
                          a + "q_conv": (hk * K, CONV), a + "k_conv": (hk * K, CONV), a + "v_conv": (hv * V, CONV),
                          a + "f_a": (K, d), a + "f_b": (hv * K, K), a + "b_proj": (hv, d),
                          a + "A_log": (hv,), a + "dt_bias": (hv * K,),
                          a + "g_proj": (hv * V, d), a + "o_norm": (V,), a + "o_proj": (d, hv * V)})
            else:
                w.update({a + "q_a": (self.q_lora_rank, d), a + "q_a_norm": (self.q_lora_rank,),
                          a + "q_b": (H * (dn + ROPE_DIM), self.q_lora_rank),
                          a + "kv_a": (KV_LORA + ROPE_DIM, d), a + "kv_a_norm": (KV_LORA,),
                          a + "w_uk": (H, dn, KV_LORA), a + "w_uv": (H, dv, KV_LORA),
                          a + "o_proj": (d, H * dv),
                          a + "idx_wq_b": (self.index_heads * INDEX_DIM, self.q_lora_rank),
                          a + "idx_wk": (INDEX_DIM, d), a + "idx_k_norm_w": (INDEX_DIM,),
                          a + "idx_k_norm_b": (INDEX_DIM,), a + "idx_weights_proj": (self.index_heads, d)})
            m = p + "moe."
            w.update({m + "router": (E, d), m + "gate_up": (E, 2 * F, d), m + "down": (E, d, F),
                      m + "shared_gate_up": (2 * Fs, d), m + "shared_down": (d, Fs)})
        w.update({"final_res.query": (d,), "final_res.norm": (d,), "final_norm": (d,),
                  "lm_head": (self.vocab_size, d)})
        return w

    def n_params(self) -> int:
        total = 0
        for shape in self.weight_shapes().values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        """A short hash of the config (ranks and model files compare it)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **changes) -> "K31Config":
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict, origin: str = "config") -> "K31Config":
        if not isinstance(d, dict):
            raise K31Error(f"{origin}: a config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise K31Error(f"{origin}: unknown config field(s) {', '.join(extra)}",
                           hint="known fields: " + ", ".join(sorted(known)))
        return cls(**d)

    @classmethod
    def load(cls, spec: str) -> "K31Config":
        """A preset name ('tiny', 'small') or a JSON file's path."""
        if spec in PRESETS:
            return PRESETS[spec]
        path = Path(spec)
        if not path.is_file():
            raise K31Error(f"config {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise error(f"invalid JSON in the config: {e.msg}", Loc(str(path), e.lineno, e.colno - 1)) from None
        return cls.from_dict(data, origin=str(path))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


TINY = K31Config(name="tiny")

# Sized for one GPU: about 1B parameters, heads and dims as in the K3 family's kernels.
SMALL = K31Config(
    name="small", vocab_size=256, d_model=2048, n_layers=16, layer_pattern="KKKD",
    kda_heads=16, kda_value_heads=16, kda_head_dim=128, kda_value_dim=128,
    mla_heads=16, q_lora_rank=768, qk_nope_dim=128, v_head_dim=128, index_heads=32, index_topk=2048,
    n_experts=8, n_experts_per_tok=2, moe_ffn_dim=1024, shared_ffn_dim=1024,
    attnres_block=4, dtype="bfloat16")

PRESETS = {"tiny": TINY, "small": SMALL}

"""The model's hyperparameters: `ModelConfig`, read from a Hugging Face style ``config.json``
(and ``generation_config.json``) and written back, with its `RopeScaling`. The fields
particular to one family are read and written by that family's entry in
`jaxinfer.models.registry`, which also decides which ``model_type`` values are supported.

Split from `jaxinfer.config` (the serving configuration), which re-exports `ModelConfig`:
most modules import it from there. Plain Python: no JAX import, so host-side modules and
tests can use it freely.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from jaxinfer.models import registry

ROPE_SCALING_TYPES = ("llama3", "linear", "dynamic", "yarn")
_ROPE_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",),
                  "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ()}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling of a Hugging Face config (``rope_scaling``, or ``rope_parameters`` in transformers 5).

    Field meanings and defaults follow transformers ``modeling_rope_utils``; the
    frequencies themselves are computed by `jaxinfer.layers.rope`.

    Attributes:
      rope_type: ``"linear"`` (position interpolation, Chen et al. 2023), ``"dynamic"``
        (dynamic NTK), ``"llama3"`` (Llama 3.1) or ``"yarn"`` (Peng et al. 2023).
      factor: context extension factor (> 0).
      original_max_position_embeddings: pre-training context (llama3, yarn); defaults
        to the config's ``max_position_embeddings``.
      low_freq_factor, high_freq_factor: llama3 band edges (high > low).
      beta_fast, beta_slow: yarn ramp bounds in rotations (32, 1 when unset or 0).
      attention_factor: yarn cos/sin scale; None: derived from factor, mscale, mscale_all_dim.
      mscale, mscale_all_dim: yarn (DeepSeek style) attention-factor terms.
      truncate: yarn: floor/ceil the correction range (True).
    """

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, d: dict[str, Any] | None, max_position_embeddings: int,
                original_max_position_embeddings: int | None = None) -> "RopeScaling | None":
        """Parse a HF RoPE dict; None for plain RoPE (absent, empty or type ``"default"``).

        ``rope_type`` wins over the legacy ``type`` key. ``original_max_position_embeddings``
        comes from the dict, else the config's top level (passed in), else
        ``max_position_embeddings``; a yarn ``factor`` of None is their ratio (as in transformers).

        Raises:
          ValueError: an unsupported type (named in the message), a missing required
            key, ``partial_rotary_factor`` other than 1, or inconsistent values.
        """
        d = d or {}
        rope_type = d.get("rope_type", d.get("type")) or "default"
        if rope_type == "default":
            return None
        if rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"RoPE scaling type {rope_type!r} is not supported; supported: "
                             f"{', '.join(ROPE_SCALING_TYPES)} (or none)")
        missing = [k for k in _ROPE_REQUIRED[rope_type] if d.get(k) is None]
        if missing:
            raise ValueError(f"RoPE scaling type {rope_type!r} needs {', '.join(missing)}")
        if d.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"partial_rotary_factor {d['partial_rotary_factor']} is not supported (only 1.0)")
        orig = None
        if rope_type in ("llama3", "yarn"):
            orig = int(d.get("original_max_position_embeddings") or original_max_position_embeddings
                       or max_position_embeddings)
        factor = d.get("factor")
        if factor is None:  # yarn only (others require it): the context extension ratio
            factor = max_position_embeddings / orig
        out = cls(rope_type=rope_type, factor=float(factor), original_max_position_embeddings=orig,
                  low_freq_factor=_opt_float(d.get("low_freq_factor")),
                  high_freq_factor=_opt_float(d.get("high_freq_factor")),
                  beta_fast=float(d.get("beta_fast") or 32), beta_slow=float(d.get("beta_slow") or 1),
                  attention_factor=_opt_float(d.get("attention_factor")), mscale=_opt_float(d.get("mscale")),
                  mscale_all_dim=_opt_float(d.get("mscale_all_dim")), truncate=bool(d.get("truncate", True)))
        if out.factor <= 0:
            raise ValueError(f"RoPE scaling factor must be > 0, got {out.factor}")
        if rope_type == "llama3" and not out.high_freq_factor > out.low_freq_factor:
            raise ValueError(f"llama3 RoPE needs high_freq_factor > low_freq_factor, got "
                             f"{out.high_freq_factor} and {out.low_freq_factor}")
        return out

    def to_hf(self) -> dict[str, Any]:
        """The HF dict (``rope_type`` plus the fields its type uses); `from_hf` inverts it."""
        keys = {"linear": ("factor",), "dynamic": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                         "mscale", "mscale_all_dim", "truncate")}[self.rope_type]
        out = {"rope_type": self.rope_type}
        out.update({k: getattr(self, k) for k in keys if getattr(self, k) is not None})
        if out.get("truncate") is True:  # the default; older transformers do not know the key
            del out["truncate"]
        return out


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only hyperparameters of the registered families (Hugging Face field names).

    Attributes mirror ``LlamaConfig``: ``hidden_size`` D, ``num_attention_heads`` N,
    ``num_key_value_heads`` K (GQA), ``head_dim`` H, ``intermediate_size`` F,
    ``vocab_size`` V, ``num_hidden_layers`` L. ``rope_scaling``: None for plain RoPE
    (for Gemma 3: the scaling of the global layers only, as in transformers).

    Family switches (Llama values are the defaults; `from_dict` sets the others through the
    family's ``hf_config_fields``, e.g. `jaxinfer.models.gemma3_family.hf_config_fields`):
      model_type: a `jaxinfer.models.registry.model_types` name (``"llama"``, ``"gemma3_text"``,
        ``"qwen2"``, ``"qwen3"``, ...), written back by `to_hf_dict`.
      hidden_act: MLP gate activation, ``"silu"`` (SwiGLU) or ``"gelu_pytorch_tanh"`` (GeGLU).
      sliding_window: keys a sliding layer's query sees, itself included (``q - k < window``);
        None: no sliding layers.
      layer_types: per layer ``"sliding_attention"`` or ``"full_attention"``; () = all full.
      rope_local_base: RoPE theta of sliding layers (None: ``rope_theta``).
      qk_norm: RMSNorm over ``head_dim`` on q and k before RoPE (Gemma 3, Qwen3).
      qkv_bias: biases on the q, k and v projections (Qwen2; Llama's and Qwen3's
        ``attention_bias`` sets it with ``o_proj_bias``).
      o_proj_bias: a bias on the attention output projection.
      sandwich_norm: RMSNorm on the attention and MLP outputs too, before the residual add.
      scale_embeddings: multiply the embeddings by ``sqrt(hidden_size)``.
      norm_offset: RMSNorm multiplies by ``norm_offset + weight`` (Gemma stores ``w``, uses ``1 + w``).
      query_pre_attn_scalar: softmax scale is its ``** -0.5`` (None: ``head_dim ** -0.5``).
      final_logit_softcapping: logits ``= c * tanh(logits / c)`` (None: off).

    Mixture of experts (`jaxinfer.models.moe_block`; 0 experts: every layer has the dense MLP):
      num_experts: experts per sparse layer E (HF Mixtral ``num_local_experts``, Qwen3-MoE
        ``num_experts``).
      num_experts_per_tok: k, experts each token is routed to.
      moe_intermediate_size: one expert's hidden width (Mixtral: ``intermediate_size``).
      norm_topk_prob: renormalise the k routing weights to sum to 1 (Mixtral always does).
      decoder_sparse_step, mlp_only_layers: layer ``i`` is sparse when ``i`` is not in
        ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers'
        ``Qwen3MoeDecoderLayer``); the others have the dense MLP of width ``intermediate_size``.

    Serving choice (not read from checkpoints, not written back):
      quantization: None (float weights) or ``"int8"``: int8 weights with group
        scales (`jaxinfer.layers.quantization.int8`; ``--quantization``), which changes the params tree.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope_scaling: RopeScaling | None = None
    model_type: str = "llama"
    hidden_act: str = "silu"
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    rope_local_base: float | None = None
    qk_norm: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    sandwich_norm: bool = False
    scale_embeddings: bool = False
    norm_offset: float = 0.0
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}")
        registry.by_model_type(self.model_type)
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unknown layer types {bad}; supported: {', '.join(LAYER_TYPES)}")
        if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) >= 1:
            raise ValueError(f"sliding layers need sliding_window >= 1, got {self.sliding_window}")
        if self.num_experts:
            self._check_moe()

    def _check_moe(self) -> None:
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                             f"got {self.num_experts_per_tok}")
        if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
            raise ValueError(f"moe_intermediate_size and decoder_sparse_step must be >= 1, got "
                             f"{self.moe_intermediate_size} and {self.decoder_sparse_step}")
        if self.quantization:
            raise ValueError("quantization of mixture-of-experts models is not supported")
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"mlp_only_layers {bad} are not layers of a {self.num_hidden_layers}-layer model")

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer: whether its MLP is the mixture of experts (all False without experts)."""
        return tuple(bool(self.num_experts) and i not in self.mlp_only_layers
                     and (i + 1) % self.decoder_sparse_step == 0 for i in range(self.num_hidden_layers))

    @property
    def is_moe(self) -> bool:
        """Whether any layer is a mixture of experts."""
        return any(self.sparse_layers)

    @property
    def has_dense_mlp(self) -> bool:
        """Whether any layer has the dense MLP."""
        return not all(self.sparse_layers)

    @property
    def active_mlp_width(self) -> int:
        """Hidden width a token's sparse-layer MLP computes: k experts' worth (``k * moe_intermediate_size``)."""
        return self.num_experts_per_tok * self.moe_intermediate_size

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer: the sliding window in tokens, or None for a full (global) layer."""
        types = self.layer_types or ("full_attention",) * self.num_hidden_layers
        return tuple(self.sliding_window if t == "sliding_attention" else None for t in types)

    @property
    def sm_scale(self) -> float:
        """Softmax scale of the attention scores (``query_pre_attn_scalar ** -0.5`` or ``head_dim ** -0.5``)."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def from_dict(cls, d: dict[str, Any], generation_config: dict[str, Any] | None = None) -> "ModelConfig":
        """Build from a HF ``config.json`` dict (and optional ``generation_config.json``).

        EOS ids are the union of the config's and the generation config's ``eos_token_id``
        (either may be an int or a list): serving case SC-13. RoPE scaling is read from
        ``rope_parameters`` (transformers 5) or ``rope_scaling`` (`RopeScaling.from_hf`).

        Raises:
          ValueError: an unregistered ``model_type`` (absent: ``"llama"``), an unsupported RoPE
            scaling type, malformed RoPE scaling fields, or a feature the family's decoder lacks.
        """
        n_heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // n_heads
        model_type = d.get("model_type") or "llama"
        family, rope = registry.by_model_type(model_type).hf_config_fields(d)
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        eos: list[int] = []
        for src in (d, generation_config or {}):
            v = src.get("eos_token_id")
            for e in (v if isinstance(v, list) else [v]):
                if e is not None and e not in eos:
                    eos.append(int(e))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=n_heads,
            num_key_value_heads=d.get("num_key_value_heads", n_heads),
            head_dim=head_dim,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=tuple(eos),
            rope_scaling=RopeScaling.from_hf(rope, d.get("max_position_embeddings", 4096),
                                             d.get("original_max_position_embeddings")),
            model_type=model_type,
            **family,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        """Read ``config.json`` (and ``generation_config.json`` if present) from a folder."""
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        gen_path = path / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.exists() else None
        return cls.from_dict(cfg, gen)

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF ``config.json`` fields, readable by transformers' own config class of the
        family (``LlamaForCausalLM``, ``Gemma3ForCausalLM``, ...); `from_dict` inverts it.

        ``architectures``, ``model_type`` and the layer shape, then the family's fields
        (`jaxinfer.models.family.ModelFamily.hf_config_dict`).
        """
        family = registry.by_model_type(self.model_type)
        return {
            "architectures": [family.hf_architectures[0]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            **family.hf_config_dict(self),
        }

    def hf_moe_fields(self) -> dict[str, Any]:
        """The mixture-of-experts ``config.json`` fields (Qwen3-MoE's names, with Mixtral's
        ``num_local_experts`` too), for the MoE families' ``hf_config_dict``."""
        return {"num_experts": self.num_experts, "num_local_experts": self.num_experts,
                "num_experts_per_tok": self.num_experts_per_tok, "moe_intermediate_size": self.moe_intermediate_size,
                "norm_topk_prob": self.norm_topk_prob, "decoder_sparse_step": self.decoder_sparse_step,
                "mlp_only_layers": list(self.mlp_only_layers)}

    def hf_common_fields(self) -> dict[str, Any]:
        """The HF ``config.json`` fields every family writes alike (norm epsilon, context,
        tying, BOS and EOS), for the families' ``hf_config_dict``."""
        return {
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }

    @property
    def max_context_len(self) -> int:
        """Longest sequence the model serves, in tokens (vLLM's rule for RoPE scaling).

        ``max_position_embeddings`` times ``factor`` for linear and dynamic scaling (their
        configs keep the pre-training length there), ``original_max_position_embeddings``
        times ``factor`` for yarn, else ``max_position_embeddings`` (llama3 configs already
        give the extended length).
        """
        rs = self.rope_scaling
        if rs is None or rs.rope_type == "llama3":
            return self.max_position_embeddings
        if rs.rope_type == "yarn":
            return int(rs.original_max_position_embeddings * rs.factor)
        return int(self.max_position_embeddings * rs.factor)

    @property
    def kv_bytes_per_token(self) -> int:
        """float32 bytes of K and V for one token over all layers (scale by dtype size / 4)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4


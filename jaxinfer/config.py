"""Configuration tree: frozen dataclasses that flow downward from the entry points.

Owns `ModelConfig` (read from a Hugging Face style ``config.json``) with its `RopeScaling`, `CacheConfig`,
`SchedulerConfig`, `ParallelConfig` and `EngineConfig`. Plain Python: no JAX import, so host-side modules
and tests can use it freely. CLI flags of ``server.py`` map one-to-one onto these fields.
"""
from __future__ import annotations

import dataclasses
import math
import json
from pathlib import Path
from typing import Any

from jaxinfer.spec_decode.config import SpeculativeConfig

BLOCK_SIZE = 16  # tokens per KV block (PagedAttention, Kwon et al. 2023)
BLOCK_SIZES = (8, 16, 32, 64, 128)  # accepted block sizes (each tested end to end on CPU)
DTYPES = ("auto", "float32", "bfloat16")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


def auto_dtype(platform: str) -> str:
    """The dtype ``"auto"`` stands for on a JAX platform: float32 on ``"cpu"`` (XLA:CPU
    computes bfloat16 slowly and it keeps CPU results equal to the float32 reference),
    bfloat16 on accelerators (``"gpu"``, ``"tpu"``, ...), as vLLM does for float32/bf16
    checkpoints."""
    return "float32" if platform == "cpu" else "bfloat16"

ROPE_SCALING_TYPES = ("llama3", "linear", "dynamic", "yarn")
_ROPE_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",),
                  "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ()}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling of a Hugging Face config (``rope_scaling``, or ``rope_parameters`` in transformers 5).

    Field meanings and defaults follow transformers ``modeling_rope_utils``; the
    frequencies themselves are computed by `jaxinfer.models.rope`.

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


def _int_if_whole(v: float | None) -> float | int | None:
    return int(v) if v is not None and float(v).is_integer() else v  # transformers' Gemma3TextConfig wants an int


MODEL_TYPES = ("llama", "gemma3_text")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LAYER_TYPES = ("sliding_attention", "full_attention")
GEMMA3_SLIDING_PATTERN = 6  # transformers' default for configs without layer_types: every 6th layer is global


def _gemma3_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Gemma 3 text-config fields -> (ModelConfig keyword arguments, the global layers' RoPE dict).

    Reads transformers 5's nested ``rope_parameters`` (``full_attention`` /
    ``sliding_attention``) or the older ``rope_theta`` / ``rope_local_base_freq`` /
    ``rope_scaling``; ``layer_types`` or the older ``sliding_window_pattern`` (default 6).

    Raises:
      ValueError: attention-logit soft-capping or bidirectional attention (not supported).
    """
    if d.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping is not supported (Gemma 2 style attention soft-capping)")
    if d.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported (decoder-only serving)")
    n = d["num_hidden_layers"]
    rp = d.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        full = dict(rp.get("full_attention") or {})
        local = rp.get("sliding_attention") or {}
    else:
        full = dict(d.get("rope_scaling") or rp or {})
        local = {}
    full.setdefault("rope_theta", d.get("rope_theta", 1_000_000.0))
    pattern = d.get("sliding_window_pattern") or GEMMA3_SLIDING_PATTERN
    types = d.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(n)]
    fields = dict(
        hidden_act=d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        sliding_window=d.get("sliding_window", 4096),
        layer_types=tuple(types),
        rope_local_base=float(local.get("rope_theta", d.get("rope_local_base_freq", 10_000.0))),
        qk_norm=True, sandwich_norm=True, scale_embeddings=True, norm_offset=1.0,
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
        final_logit_softcapping=_opt_float(d.get("final_logit_softcapping")),
    )
    return fields, full


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only hyperparameters of the two supported families (Hugging Face field names).

    Attributes mirror ``LlamaConfig``: ``hidden_size`` D, ``num_attention_heads`` N,
    ``num_key_value_heads`` K (GQA), ``head_dim`` H, ``intermediate_size`` F,
    ``vocab_size`` V, ``num_hidden_layers`` L. ``rope_scaling``: None for plain RoPE
    (for Gemma 3: the scaling of the global layers only, as in transformers).

    Family switches (Llama values are the defaults; `from_dict` sets Gemma 3's, from
    transformers ``Gemma3TextConfig`` and the Gemma 3 technical report, 2025):
      model_type: ``"llama"`` or ``"gemma3_text"`` (written back by `to_hf_dict`).
      hidden_act: MLP gate activation, ``"silu"`` (SwiGLU) or ``"gelu_pytorch_tanh"`` (GeGLU).
      sliding_window: keys a sliding layer's query sees, itself included (``q - k < window``);
        None: no sliding layers.
      layer_types: per layer ``"sliding_attention"`` or ``"full_attention"``; () = all full.
      rope_local_base: RoPE theta of sliding layers (None: ``rope_theta``).
      qk_norm: RMSNorm over ``head_dim`` on q and k before RoPE.
      sandwich_norm: RMSNorm on the attention and MLP outputs too, before the residual add.
      scale_embeddings: multiply the embeddings by ``sqrt(hidden_size)``.
      norm_offset: RMSNorm multiplies by ``norm_offset + weight`` (Gemma stores ``w``, uses ``1 + w``).
      query_pre_attn_scalar: softmax scale is its ``** -0.5`` (None: ``head_dim ** -0.5``).
      final_logit_softcapping: logits ``= c * tanh(logits / c)`` (None: off).

    Serving choice (not read from checkpoints, not written back):
      quantization: None (float weights) or ``"int8"``: int8 weights with group
        scales (`jaxinfer.models.quant`; ``--quantization``), which changes the params tree.
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
    sandwich_norm: bool = False
    scale_embeddings: bool = False
    norm_offset: float = 0.0
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unknown layer types {bad}; supported: {', '.join(LAYER_TYPES)}")
        if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) >= 1:
            raise ValueError(f"sliding layers need sliding_window >= 1, got {self.sliding_window}")

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
          ValueError: an unsupported RoPE scaling type or malformed RoPE scaling fields.
        """
        n_heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // n_heads
        model_type = d.get("model_type") or "llama"
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        family: dict[str, Any] = {}
        if model_type == "gemma3_text":
            family, rope = _gemma3_fields(d)
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
        """The HF ``config.json`` fields (``LlamaForCausalLM``, or ``Gemma3ForCausalLM`` for
        ``gemma3_text``, readable by transformers' own config classes); `from_dict` inverts it."""
        if self.model_type == "gemma3_text":
            return self._gemma3_hf_dict()
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **self._shape_hf_fields(),
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
            "hidden_act": "silu",
        }

    def _shape_hf_fields(self) -> dict[str, Any]:
        """The layer-shape fields both families' HF configs share."""
        return {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim}

    def _gemma3_hf_dict(self) -> dict[str, Any]:
        full = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            full.update(self.rope_scaling.to_hf())
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            **self._shape_hf_fields(),
            "hidden_activation": self.hidden_act,
            "rope_parameters": {"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": self.rope_local_base}},
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "query_pre_attn_scalar": _int_if_whole(self.query_pre_attn_scalar),
            "final_logit_softcapping": self.final_logit_softcapping,
            "attn_logit_softcapping": None,
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


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    Attributes:
      block_size: tokens per block (16; one of `BLOCK_SIZES`).
      num_blocks: explicit pool size including the null block 0; overrides the budget.
      kv_cache_memory: budget in bytes for K and V of all layers (None: from
        ``gpu_memory_utilization`` on an accelerator, or 4 GiB on CPU, at most a quarter of RAM).
      gpu_memory_utilization: fraction of the device's memory for weights, activations
        and the KV cache together (vLLM's meaning); None: 0.9
        (`DEFAULT_GPU_MEMORY_UTILIZATION`). Ignored on CPU and when ``num_blocks`` or
        ``kv_cache_memory`` is set.
      watermark: fraction of blocks kept free when admitting new prefills (0.15).
      enable_prefix_caching: reuse KV blocks of shared prompt prefixes (on by default).
      kv_cache_dtype: "auto" (the model dtype), "int8" or "fp8" (e4m3): K/V stored in 8 bits
        with a scale per token and KV head (`jaxinfer.kv_quant`), about twice the blocks of
        a bfloat16 cache in the same budget.
    """

    block_size: int = BLOCK_SIZE
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    watermark: float = 0.15
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in ("auto", "int8", "fp8"):
            raise ValueError(f"kv_cache_dtype must be one of auto, int8, fp8, got {self.kv_cache_dtype!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.num_blocks is not None and self.num_blocks < 2:  # block 0 is the null block
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {self.num_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {self.block_size}")

    @property
    def memory_utilization(self) -> float:
        """``gpu_memory_utilization``, or its default 0.9 when unset."""
        return DEFAULT_GPU_MEMORY_UTILIZATION if self.gpu_memory_utilization is None else self.gpu_memory_utilization


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits.

    Attributes:
      max_num_seqs: cap on running sequences per step.
      max_num_batched_tokens: per-step token budget (prefill chunks + decodes).
      max_model_len: prompt + output limit in tokens.
      max_queue_len: bound on the waiting queue: requests waiting beyond the free sequence
        slots (`Scheduler.num_queued`); the server answers 429 past it.
      scheduler: "continuous" or "static" (`StaticScheduler`, the baseline).
      scheduling_policy: continuous only: "fcfs" (`ContinuousScheduler`, first come
        first served) or "priority" (`PriorityScheduler`: ``SamplingParams.priority``,
        lower first, then arrival).
      priority_aging_s: priority only: seconds of waiting that lower a request's
        effective priority by 1 (bounds starvation; see `jaxinfer.priority_scheduler`);
        None: no aging.
      batch_timeout_s: static only: seconds the oldest queued request waits for a full batch.
      prefill_budget_while_decoding: cap on prefill tokens in a step that also decodes
        (None: only ``max_num_batched_tokens`` applies). Stall-free batching (Sarathi-Serve,
        Agrawal et al. 2024): running decodes share each step with at most this many
        prompt tokens, so their inter-token latency stays near a pure decode step's while
        prompts keep arriving; steps without decodes still prefill up to the full budget.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 4096
    max_queue_len: int = 256
    scheduler: str = "continuous"
    scheduling_policy: str = "fcfs"
    priority_aging_s: float | None = None
    batch_timeout_s: float = 0.1
    prefill_budget_while_decoding: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_budget_while_decoding is not None and self.prefill_budget_while_decoding < 1:
            raise ValueError(f"prefill_budget_while_decoding must be >= 1 or None, got "
                             f"{self.prefill_budget_while_decoding}")
        if self.scheduler not in ("continuous", "static"):
            raise ValueError(f"scheduler must be 'continuous' or 'static', got {self.scheduler!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.priority_aging_s is not None and not (math.isfinite(self.priority_aging_s)
                                                      and self.priority_aging_s > 0):
            raise ValueError(f"priority_aging_s must be a positive number of seconds or None, got "
                             f"{self.priority_aging_s}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:  # 0 would never schedule anything
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got "
                             f"{self.max_num_seqs} and {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (one prompt and one output token), got {self.max_model_len}")
        if self.max_num_seqs > self.max_num_batched_tokens:  # a step must fit one token per sequence
            raise ValueError(f"max_num_seqs ({self.max_num_seqs}) must not exceed max_num_batched_tokens "
                             f"({self.max_num_batched_tokens})")
        if self.max_queue_len < 1:  # 0 would turn every request away
            raise ValueError(f"max_queue_len must be >= 1, got {self.max_queue_len}")
        if self.batch_timeout_s < 0:
            raise ValueError("batch_timeout_s must be >= 0")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """How one engine spreads over devices and processes (see `jaxinfer.sharding`).

    Attributes:
      tensor_parallel_size: devices per replica (mesh axis ``model``; Megatron TP).
      data_parallel_size: replicas, each with its own scheduler and KV pool (axis ``data``).
      coordinator_address: ``host:port`` of process 0 for multi-host (``jax.distributed``);
        None: single process, or read from the cluster environment (SLURM, ...).
      num_processes, process_id: multi-host layout; None: from the environment.
    """

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ValueError("tensor_parallel_size and data_parallel_size must be >= 1")

    @property
    def world_size(self) -> int:
        """Devices used: tensor_parallel_size * data_parallel_size."""
        return self.tensor_parallel_size * self.data_parallel_size


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, as one tree.

    ``dtype`` is ``"float32"``, ``"bfloat16"`` or ``"auto"`` (`auto_dtype` of the devices'
    platform; `jaxinfer.builder.resolve_dtype` replaces it before anything is built; the
    entry points ``server.py`` and `LLM` default to it). ``tokenizer``: a folder or a name under ``weights/`` to load the
    tokenizer and chat template from instead of the model's folder (None: the model's).
    ``chat_template``: a ``--chat-template`` value (a file, a bundled name such as ``gemma3``, or
    Jinja text: `jaxinfer.templates.load_chat_template`) that replaces the tokenizer's template.
    ``quantization``: None, or ``"int8"`` (``--quantization``): the float weights are
    quantized to int8 with group scales (64 inputs per scale) as they are loaded (`jaxinfer.models.quant`).
    ``speculative``: speculative decoding (`jaxinfer.spec_decode.SpeculativeConfig`), None = off.
    """

    model_path: str
    dtype: str = "float32"
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    attention_backend: str | None = None  # "xla" | "pallas"; None picks by platform
    max_logprobs: int = 20
    max_logit_bias: int = 128
    seed: int = 0
    warmup: bool = True
    return_logits: bool = False  # debug/tests: keep each sampled position's raw logits
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    tokenizer: str | None = None
    chat_template: str | None = None
    quantization: str | None = None
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend not in (None, "xla", "pallas"):
            raise ValueError(f"attention_backend must be 'xla' or 'pallas', got {self.attention_backend!r}")
        if self.speculative is not None and self.scheduler.scheduler == "static":  # it reserves whole requests
            raise ValueError("speculative decoding needs the continuous scheduler (not --scheduler static)")

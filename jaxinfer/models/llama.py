"""Decoder of both supported families (Llama, Gemma 3) as one Flax linen module that runs
one ragged, paged step. `ModelConfig` fields switch the family differences on; there is no
per-family code path.

Follows Hugging Face ``LlamaForCausalLM`` and ``Gemma3ForCausalLM`` numerically: RMSNorm
(Zhang & Sennrich 2019; ``x * (norm_offset + w)``, Gemma's ``1 + w``), rotate-half RoPE
(Su et al. 2021) with theta and scaling from the config (`jaxinfer.models.rope`), GQA
(Ainslie et al. 2023), gated MLP with SiLU (SwiGLU, Shazeer 2020) or tanh-GELU (GeGLU),
tied or untied LM head. Gemma 3 (Gemma Team, "Gemma 3 technical report", 2025) adds:
embeddings times ``sqrt(D)``, RMSNorm on q and k, norms on the attention and MLP outputs
("sandwich"), a query scale of ``query_pre_attn_scalar ** -0.5``, and local layers with a
sliding window and their own RoPE base (5 local : 1 global in Gemma 3). The per-layer
window and RoPE choice are looked up from the traced layer index inside the scan body.

Layers are stacked and run under ``nn.scan`` so compile time does not grow with depth;
the KV cache rides in the scan carry (never as scan xs/ys, which would copy it). With
``scan_layers=False`` the same layers run unrolled, one module per layer over its own
arrays (``layers_0 .. layers_{L-1}``, `jaxinfer.models.layer_layout`), the KV cache still
one carried array indexed by layer: faster for a one-token step on XLA:CPU, slower to compile. Every
layer keeps its whole context in the KV cache (sliding layers too); the window is a mask,
so prefix caching and recompute after preemption need nothing special.

Precision: ``dtype`` (float32 or bfloat16) is the storage and matmul-operand dtype of
weights and KV; every matmul accumulates in float32, and the residual stream, norms,
RoPE, softmax and logits are float32 (bf16 operands with f32 accumulation is also the
fastest matmul on the CPUs it was measured on). On CPU a bfloat16 model's scanned layer
stack is stored as uint16 bits, its embedding rows gathered as bits and its one-row products
run as two rows: `jaxinfer.models.cpu_bf16` says why. Where the caller passes packed
weights (the ``amx`` collection, `jaxinfer.native_amx.packed_variables`: one CPU device with
AMX or AVX-512 BF16), every projection and the LM head reads them instead, at any row count
(`_project`; the MLP's gate and up as one call, `MLP`), in place by layer index: the scan
broadcasts that collection, never slices it.

Parameter tree (``params`` collection; L stacked on axis 0; logical axis names in
brackets, mapped to mesh axes in one place by the sharding module):
  embed/embedding [V, D] (vocab, embed)
  layers/attn/{q,k,v}_proj/kernel [L, D, N|K, H] (layers, embed, heads|kv_heads, head_dim)
  layers/attn/o_proj/kernel [L, N, H, D] (layers, heads, head_dim, embed)
  layers/attn/{q,k}_norm/scale [L, H] (layers, head_dim), only with ``qk_norm``
  layers/mlp/{gate,up}_proj/kernel [L, D, F] (layers, embed, mlp); down_proj [L, F, D]
  layers/{input_norm,post_attention_norm}/scale [L, D]: the norms before attention and
    before the MLP (HF Llama's input_layernorm / post_attention_layernorm, HF Gemma's
    input_layernorm / pre_feedforward_layernorm)
  layers/{attn_out_norm,mlp_out_norm}/scale [L, D], only with ``sandwich_norm`` (HF Gemma's
    post_attention_layernorm / post_feedforward_layernorm); final_norm/scale [D]
  lm_head/kernel [D, V] (embed, vocab), only when embeddings are untied.
With ``cfg.quantization == "int8"`` (`jaxinfer.models.quant`) every kernel and the embedding
table are int8 and a ``scale`` leaf sits beside each (the kernel's axes, the innermost input
axis divided by the group size; ``embed/scale [V, D / g]``).
Einsum letters: T tokens, D model, N query heads, K kv heads, H head dim, F ffn, V vocab.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxinfer import native_amx
from jaxinfer.attention import AttentionBackend, AttentionMetadata, XlaAttention, paged_attention
from jaxinfer.config import ModelConfig
from jaxinfer.models import cpu_bf16
from jaxinfer.models.quant import QDenseGeneral, QEmbed
from jaxinfer.models.rope import apply_rope, layer_rope_tables, select_rope
from jaxinfer.xla_work_plan import XlaWorkPlan

_init = nn.initializers.normal(0.02)
# Matmul operands in the model dtype (bf16 or f32), accumulation and output in float32:
# the residual stream, norms, RoPE and softmax stay float32 (bf16 only stores weights/KV).
# On CPU a one-row product over bfloat16 weights runs as two rows (`cpu_bf16`).
_dot_f32 = cpu_bf16.dot_general
_dot_f32_native = functools.partial(cpu_bf16.dot_general, native=True)  # few rows: `jaxinfer.native_gemv`


def _part(init, names):
    return nn.with_logical_partitioning(init, names)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * (offset + scale)`` over the last axis, computed and returned
    in float32 (HF LlamaRMSNorm with offset 0, Gemma3RMSNorm with offset 1).

    The scale is initialised so that the norm starts as a plain normalisation (ones, or
    zeros with an offset of 1). ``axis_name``: logical name of the scale's axis.
    """

    eps: float
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    offset: float = 0.0
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        scale = self.param("scale", _part(init, (self.axis_name,)), (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return y * (self.offset + scale.astype(jnp.float32))


def _dense(cfg: ModelConfig, dtype, param_dtype, features, names: tuple[str, ...], name: str, n_in: int = 1,
           native: bool = False):
    """A bias-free projection contracting the input's last ``n_in`` axes into ``features``
    (kernel logical axes ``names``): float ``nn.DenseGeneral``, or `QDenseGeneral` (int8
    kernel + group scales) when ``cfg.quantization`` is "int8". ``native``: products of one
    or two rows over bfloat16 weights run in `jaxinfer.native_gemv` (`cpu_bf16.dot_general`)."""
    feats = features if isinstance(features, tuple) else (features,)
    if cfg.quantization == "int8":
        return QDenseGeneral(feats, n_in, names, dtype, name=name)
    axis = tuple(range(-n_in, 0)) if n_in > 1 else -1
    return nn.DenseGeneral(features, axis=axis, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                           dot_general=_dot_f32_native if native else _dot_f32, kernel_init=_part(_init, names), name=name)


PACKED = "_packed"  # suffix of a projection's packed stack in the `native_amx.COLLECTION` collection


def _packed(module: nn.Module, name: str):
    """The packed weights of ``module``'s projection ``name`` (all layers, `native_amx.pack`),
    or None when the caller passed none (`native_amx.packed_variables`)."""
    key = name + PACKED
    return module.get_variable(native_amx.COLLECTION, key) if module.has_variable(native_amx.COLLECTION, key) else None


def _project(module: nn.Module, dense, x, layer, features, names: tuple[str, ...], name: str, n_in: int = 1,
             rows=None):
    """``dense(features, names, name, n_in=n_in)(x)``, or the same product (float32
    ``[..., *features]``) from the packed weights of layer ``layer`` by the packed-product kernel
    (`jaxinfer.native_amx`) when they were passed; there only the first ``rows`` rows (the
    step's real tokens, `real_tokens`; None: all) are multiplied, the rest are zeros."""
    packed = _packed(module, name)
    lead = x.shape[:x.ndim - n_in]
    if packed is None:
        return dense(features, names, name, n_in=n_in)(x)
    feats = features if isinstance(features, tuple) else (features,)
    x = x.reshape(math.prod(lead), -1).astype(module.dtype)  # the compute dtype, as XLA's dot gets it
    return native_amx.matmul(x, packed, layer, rows).reshape(*lead, *feats)


def real_tokens(meta: AttentionMetadata) -> jax.Array:
    """The step's real tokens ([] int32): padding tokens lie past ``query_start_loc[num_seqs]``,
    the tail of ``query_start_loc`` (`jaxinfer.batch`)."""
    return meta.query_start_loc[-1]


def _norm(cfg: ModelConfig, dtype, param_dtype, **kw):
    return functools.partial(RMSNorm, cfg.rms_norm_eps, dtype, param_dtype, cfg.norm_offset, **kw)


NO_WINDOW = 1 << 30  # the window of a full-attention layer in a model that has sliding layers


def layer_window(cfg: ModelConfig, layer: jax.Array) -> jax.Array | None:
    """The sliding window of layer ``layer`` ([] int32, traced), `NO_WINDOW` for a global
    layer; None (static) when the model has no sliding layers at all."""
    windows = cfg.layer_windows
    if all(w is None for w in windows):
        return None
    return jnp.asarray([NO_WINDOW if w is None else w for w in windows], jnp.int32)[layer]


def _split_heads(y, lead: tuple[int, ...], c: ModelConfig):
    """The fused q/k/v product ``y [M, (N + 2 K) H]`` (q's columns, then k's, then v's) -> q
    ``[*lead, N, H]``, k and v ``[*lead, K, H]``."""
    n, kv, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q, k, v = jnp.split(y, [n * h, (n + kv) * h], axis=-1)
    return q.reshape(*lead, n, h), k.reshape(*lead, kv, h), v.reshape(*lead, kv, h)


class Attention(nn.Module):
    cfg: ModelConfig
    attention: AttentionBackend
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    native_products: bool = False

    @nn.compact
    def __call__(self, x, k_cache, v_cache, layer, meta: AttentionMetadata, plan: XlaWorkPlan | None, cos, sin):
        c = self.cfg
        dense = functools.partial(_dense, c, self.dtype, self.param_dtype, native=self.native_products)
        rows = real_tokens(meta)
        project = functools.partial(_project, self, dense, rows=rows)
        qkv = _packed(self, "qkv")
        if qkv is not None:  # one product for the three (`native_amx.packed_variables`)
            y = native_amx.matmul(x.reshape(-1, x.shape[-1]).astype(self.dtype), qkv, layer, rows)
            q, k, v = _split_heads(y, x.shape[:-1], c)
        else:
            q = project(x, layer, (c.num_attention_heads, c.head_dim), ("embed", "heads", "head_dim"), "q_proj")
            k = project(x, layer, (c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), "k_proj")
            v = project(x, layer, (c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), "v_proj")
        if c.qk_norm:
            head_norm = _norm(c, self.dtype, self.param_dtype, axis_name="head_dim")
            q, k = head_norm(name="q_norm")(q), head_norm(name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out, k_cache, v_cache = paged_attention(self.attention, q, k, v, k_cache, v_cache, layer, meta,
                                                c.sm_scale, layer_window(c, layer), plan=plan)
        o = project(out, layer, c.hidden_size, ("heads", "head_dim", "embed"), "o_proj", n_in=2)
        return o, k_cache, v_cache


_ACT = {"silu": nn.silu, "gelu_pytorch_tanh": functools.partial(nn.gelu, approximate=True)}


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); act = SiLU (SwiGLU) or tanh-approximated GELU (GeGLU).
    Where the caller passed gate and up packed together (``gate_up_packed``,
    `native_amx.packed_variables`) and the row count is the kernel's, act(gate(x)) * up(x) is one
    kernel call that returns it in bfloat16 (`native_amx.gated_matmul`). A packed projection's
    input is cast to the compute dtype (`_project`); ``rows``: the step's real tokens
    (`real_tokens`), the packed products' rows (None: all)."""

    cfg: ModelConfig
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    native_products: bool = False

    @nn.compact
    def __call__(self, x, layer, rows=None):
        c = self.cfg
        dense = functools.partial(_dense, c, self.dtype, self.param_dtype, native=self.native_products)
        project = functools.partial(_project, self, dense, rows=rows)
        gate_up, lead = _packed(self, "gate_up"), x.shape[:-1]
        if gate_up is not None and c.hidden_act in native_amx.GATED_ACTS:
            h = native_amx.gated_matmul(x.reshape(math.prod(lead), -1), gate_up, layer, c.hidden_act, rows)
            h = h.reshape(*lead, -1)
        else:
            g = project(x, layer, c.intermediate_size, ("embed", "mlp"), "gate_proj")
            u = project(x, layer, c.intermediate_size, ("embed", "mlp"), "up_proj")
            h = _ACT[c.hidden_act](g) * u
        return project(h, layer, c.hidden_size, ("mlp", "embed"), "down_proj")


class DecoderLayer(nn.Module):
    """One pre-norm transformer block (with sandwich norms when configured); the scan body.
    Carry: (x, k_cache, v_cache, layer); broadcast: the step's metadata, its XLA work plan
    (None on the Pallas backend) and the RoPE tables."""

    cfg: ModelConfig
    attention: AttentionBackend
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    native_products: bool = False

    @nn.compact
    def __call__(self, carry, meta: AttentionMetadata, plan: XlaWorkPlan | None, rope):
        x, k_cache, v_cache, layer = carry
        c = self.cfg
        norm = _norm(c, self.dtype, self.param_dtype)
        cos, sin = select_rope(rope, c, layer)
        a, k_cache, v_cache = Attention(c, self.attention, self.dtype, self.param_dtype, self.native_products,
                                        name="attn")(norm(name="input_norm")(x), k_cache, v_cache, layer, meta,
                                                     plan, cos, sin)
        if c.sandwich_norm:
            a = norm(name="attn_out_norm")(a)
        x = x + a
        m = MLP(c, self.dtype, self.param_dtype, self.native_products, name="mlp")(norm(name="post_attention_norm")(x), layer,
                                                                                  real_tokens(meta))
        if c.sandwich_norm:
            m = norm(name="mlp_out_norm")(m)
        return (x + m, k_cache, v_cache, layer + 1), None


class LlamaForCausalLM(nn.Module):
    """The decoder (Llama or Gemma 3, per ``cfg``) over one packed ragged step.

    Call args:
      token_ids: [T] int32. meta: `AttentionMetadata`. k_cache, v_cache:
      [L, NB, bs, K, H]. logits_indices: [R] int32 rows of T whose logits are needed.

    Returns:
      (logits [R, V] float32, k_cache, v_cache). The attention backend's per-step
      preparation (`AttentionBackend.prepare`; the XLA backend's work lists) is derived here
      from ``meta``, once, before the layer loop. Applied with ``mutable=["intermediates"]``
      it also sows `HIDDEN`: the final-normed hidden states of all T tokens [T, D] float32,
      from which `LMHead` gives the logits of any token (prompt logprobs).
    """

    cfg: ModelConfig
    attention: AttentionBackend = XlaAttention()
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    scan_layers: bool = True
    native_products: bool = False  # one CPU device, bfloat16: few-row products in `jaxinfer.native_gemv`

    @nn.compact
    def __call__(self, token_ids, meta: AttentionMetadata, k_cache, v_cache, logits_indices):
        c = self.cfg
        embed = _embedding(c, self.dtype, self.param_dtype)
        if c.quantization == "int8":
            x = embed(token_ids).astype(jnp.float32)
        else:  # nn.Embed's own lookup, gathered as bits on CPU (`cpu_bf16.take_rows`)
            x = cpu_bf16.take_rows(embed.embedding.astype(self.dtype), token_ids).astype(jnp.float32)
        if c.scale_embeddings:
            x = x * jnp.float32(c.hidden_size ** 0.5)
        rope = layer_rope_tables(meta.positions, c)
        plan = self.attention.prepare(meta, k_cache.shape[2])  # once per step (the XLA backend's work lists)
        carry = (x, k_cache, v_cache, jnp.int32(0))
        if self.scan_layers:
            # bit-stored bfloat16 stacks (`cpu_bf16.weights_as_bits`) read as bfloat16 per layer
            layer = nn.map_variables(DecoderLayer, "params", cpu_bf16.bits_as_bfloat16, init=self.is_initializing())
            # packed AMX weights (`native_amx.COLLECTION`) stay whole: read in place by layer index
            stack = nn.scan(layer, variable_axes={"params": 0}, variable_broadcast=native_amx.COLLECTION,
                            split_rngs={"params": True},
                            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
                            metadata_params={nn.PARTITION_NAME: "layers"})
            carry, _ = stack(c, self.attention, self.dtype, self.param_dtype, self.native_products, name="layers")(carry, meta, plan, rope)
        else:  # one module (and one set of [D, ...] arrays) per layer: `unstack_layers`
            for i in range(c.num_hidden_layers):
                carry, _ = DecoderLayer(c, self.attention, self.dtype, self.param_dtype, self.native_products,
                                        name=layer_name(i))(carry, meta, plan, rope)
        x, k_cache, v_cache, _ = carry
        x = _norm(c, self.dtype, self.param_dtype)(name="final_norm")(x)  # row-wise: every T row, then gather
        self.sow("intermediates", HIDDEN, x)  # kept only when the caller asks (prompt logprobs read it)
        logits = lm_head_logits(c, self.dtype, self.param_dtype, x[logits_indices], embed, self.native_products,
                                _packed(self, "lm_head"), rows=meta.num_seqs)
        return logits, k_cache, v_cache


def layer_name(i: int) -> str:
    """Parameter-tree key of layer ``i`` in the unrolled layout (``scan_layers=False``)."""
    return f"layers_{i}"


HIDDEN = "final_hidden"  # the sown [T, D] float32 final-normed hidden states (``mutable=["intermediates"]``)


def lm_head_logits(c: ModelConfig, dtype, param_dtype, x, embed: nn.Embed, native: bool = False, packed=None,
                   rows=None):
    """The LM head: final-normed hidden states [R, D] -> float32 logits [R, V] (tied to
    ``embed`` or the ``lm_head`` kernel, then Gemma's soft-capping). Its submodules belong to
    the calling module, so `LlamaForCausalLM` and `LMHead` read the same parameters.
    ``native``: as `_dense`'s. ``packed``: the head's weight [D, V] packed for AMX
    (`native_amx.pack`, one layer), used when given; then only the first ``rows`` rows (the
    step's real sequences; None: all) are multiplied, the others' logits are zeros."""
    if packed is not None:
        logits = native_amx.matmul(x.astype(dtype), packed, 0, rows)
    elif c.tie_word_embeddings and c.quantization == "int8":
        logits = embed.attend(x)
    elif c.tie_word_embeddings:
        table = embed.embedding.astype(dtype)
        logits = cpu_bf16.tied_logits(x.astype(dtype), table, native)
    else:
        logits = _dense(c, dtype, param_dtype, c.vocab_size, ("embed", "vocab"), "lm_head", native=native)(x)
    logits = logits.astype(jnp.float32)
    if c.final_logit_softcapping:
        logits = jnp.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
    return logits


class LMHead(nn.Module):
    """The LM head of `LlamaForCausalLM` alone, over the same parameter names (``embed``,
    ``lm_head``): final-normed hidden states [T, D] (the sown `HIDDEN`) -> logits [T, V]
    float32. Applied with the model's ``params`` (prompt logprobs of every prompt position)."""

    cfg: ModelConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        return lm_head_logits(self.cfg, self.dtype, self.param_dtype, x,
                              _embedding(self.cfg, self.dtype, self.param_dtype))


def _embedding(c: ModelConfig, dtype, param_dtype):
    """The token embedding module ``embed`` (int8 with per-row scales under ``quantization``)."""
    if c.quantization == "int8":
        return QEmbed(c.vocab_size, c.hidden_size, dtype, name="embed")
    return nn.Embed(c.vocab_size, c.hidden_size, dtype=dtype, param_dtype=param_dtype,
                    embedding_init=_part(_init, ("vocab", "embed")), name="embed")

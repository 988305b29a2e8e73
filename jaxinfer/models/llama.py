"""Llama-family decoder (Flax linen) that runs one ragged, paged step.

Follows Hugging Face ``LlamaForCausalLM`` numerically: RMSNorm (Zhang & Sennrich 2019),
rotate-half RoPE (Su et al. 2021) with theta and scaling from the config (`jaxinfer.models.rope`),
GQA (Ainslie et al. 2023), SwiGLU MLP (Shazeer 2020), tied or untied LM head. Layers are stacked and run under
``nn.scan`` so compile time does not grow with depth; the KV cache rides in the scan
carry (never as scan xs/ys, which would copy it).

Precision: ``dtype`` (float32 or bfloat16) is the storage and matmul-operand dtype of
weights and KV; every matmul accumulates in float32, and the residual stream, norms,
RoPE, softmax and logits are float32 (bf16 operands with f32 accumulation is also the
fastest matmul on the CPUs it was measured on).

Parameter tree (``params`` collection; L stacked on axis 0; logical axis names in
brackets, mapped to mesh axes in one place by the sharding module):
  embed/embedding [V, D] (vocab, embed)
  layers/attn/{q,k,v}_proj/kernel [L, D, N|K, H] (layers, embed, heads|kv_heads, head_dim)
  layers/attn/o_proj/kernel [L, N, H, D] (layers, heads, head_dim, embed)
  layers/mlp/{gate,up}_proj/kernel [L, D, F] (layers, embed, mlp); down_proj [L, F, D]
  layers/{input_norm,post_attention_norm}/scale [L, D]; final_norm/scale [D]
  lm_head/kernel [D, V] (embed, vocab), only when embeddings are untied.
Einsum letters: T tokens, D model, N query heads, K kv heads, H head dim, F ffn, V vocab.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxinfer.attention import AttentionBackend, AttentionMetadata, paged_attention
from jaxinfer.config import ModelConfig
from jaxinfer.models.rope import apply_rope, rope_tables

_init = nn.initializers.normal(0.02)
# Matmul operands in the model dtype (bf16 or f32), accumulation and output in float32:
# the residual stream, norms, RoPE and softmax stay float32 (bf16 only stores weights/KV).
_dot_f32 = functools.partial(jax.lax.dot_general, preferred_element_type=jnp.float32)


def _part(init, names):
    return nn.with_logical_partitioning(init, names)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * scale``, computed and returned in float32 (HF LlamaRMSNorm)."""

    eps: float
    dtype: jnp.dtype
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", _part(nn.initializers.ones, ("embed",)), (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return y * scale.astype(jnp.float32)


class Attention(nn.Module):
    cfg: ModelConfig
    attention: AttentionBackend
    dtype: jnp.dtype
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, k_cache, v_cache, layer, meta: AttentionMetadata, cos, sin):
        c = self.cfg
        dense = functools.partial(nn.DenseGeneral, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                                  dot_general=_dot_f32)
        q = dense((c.num_attention_heads, c.head_dim), kernel_init=_part(_init, ("embed", "heads", "head_dim")),
                  name="q_proj")(x)
        k = dense((c.num_key_value_heads, c.head_dim), kernel_init=_part(_init, ("embed", "kv_heads", "head_dim")),
                  name="k_proj")(x)
        v = dense((c.num_key_value_heads, c.head_dim), kernel_init=_part(_init, ("embed", "kv_heads", "head_dim")),
                  name="v_proj")(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out, k_cache, v_cache = paged_attention(self.attention, q, k, v, k_cache, v_cache, layer, meta,
                                                c.head_dim ** -0.5)
        o = dense(c.hidden_size, axis=(-2, -1), kernel_init=_part(_init, ("heads", "head_dim", "embed")),
                  name="o_proj")(out)
        return o, k_cache, v_cache


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    cfg: ModelConfig
    dtype: jnp.dtype
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        dense = functools.partial(nn.Dense, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                                  dot_general=_dot_f32)
        g = dense(c.intermediate_size, kernel_init=_part(_init, ("embed", "mlp")), name="gate_proj")(x)
        u = dense(c.intermediate_size, kernel_init=_part(_init, ("embed", "mlp")), name="up_proj")(x)
        return dense(c.hidden_size, kernel_init=_part(_init, ("mlp", "embed")), name="down_proj")(nn.silu(g) * u)


class DecoderLayer(nn.Module):
    """One pre-norm transformer block; the scan body. Carry: (x, k_cache, v_cache, layer)."""

    cfg: ModelConfig
    attention: AttentionBackend
    dtype: jnp.dtype
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, carry, meta: AttentionMetadata, cos, sin):
        x, k_cache, v_cache, layer = carry
        norm = functools.partial(RMSNorm, self.cfg.rms_norm_eps, self.dtype, self.param_dtype)
        h = norm(name="input_norm")(x)
        a, k_cache, v_cache = Attention(self.cfg, self.attention, self.dtype, self.param_dtype,
                                        name="attn")(h, k_cache, v_cache, layer, meta, cos, sin)
        x = x + a
        x = x + MLP(self.cfg, self.dtype, self.param_dtype, name="mlp")(norm(name="post_attention_norm")(x))
        return (x, k_cache, v_cache, layer + 1), None


class LlamaForCausalLM(nn.Module):
    """Llama decoder over one packed ragged step.

    Call args:
      token_ids: [T] int32. meta: `AttentionMetadata`. k_cache, v_cache:
      [L, NB, bs, K, H]. logits_indices: [R] int32 rows of T whose logits are needed.

    Returns:
      (logits [R, V] float32, k_cache, v_cache)
    """

    cfg: ModelConfig
    attention: AttentionBackend = AttentionBackend()
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, token_ids, meta: AttentionMetadata, k_cache, v_cache, logits_indices):
        c = self.cfg
        embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype,
                         embedding_init=_part(_init, ("vocab", "embed")), name="embed")
        x = embed(token_ids).astype(jnp.float32)
        cos, sin = rope_tables(meta.positions, c)
        stack = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
        carry = (x, k_cache, v_cache, jnp.int32(0))
        (x, k_cache, v_cache, _), _ = stack(c, self.attention, self.dtype, self.param_dtype,
                                            name="layers")(carry, meta, cos, sin)
        x = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype, name="final_norm")(x[logits_indices])
        if c.tie_word_embeddings:
            table = embed.embedding.astype(self.dtype)
            logits = jnp.einsum("rd,vd->rv", x.astype(self.dtype), table, preferred_element_type=jnp.float32)
        else:
            logits = nn.Dense(c.vocab_size, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                              dot_general=_dot_f32, kernel_init=_part(_init, ("embed", "vocab")), name="lm_head")(x)
        return logits.astype(jnp.float32), k_cache, v_cache

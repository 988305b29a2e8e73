"""Decoder of the dense families (Llama, Gemma 3, Qwen2, Qwen3) as one Flax linen module that
runs one ragged, paged step. `ModelConfig` fields switch the family differences on; there is
no per-family code path.

Follows Hugging Face ``LlamaForCausalLM``, ``Gemma3ForCausalLM``, ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM`` numerically: RMSNorm
(Zhang & Sennrich 2019; ``x * (norm_offset + w)``, Gemma's ``1 + w``), rotate-half RoPE
(Su et al. 2021) with theta and scaling from the config (`jaxinfer.layers.rope`), GQA
(Ainslie et al. 2023), gated MLP with SiLU (SwiGLU, Shazeer 2020) or tanh-GELU (GeGLU),
tied or untied LM head. Gemma 3 (Gemma Team, "Gemma 3 technical report", 2025) adds:
embeddings times ``sqrt(D)``, RMSNorm on q and k, norms on the attention and MLP outputs
("sandwich"), a query scale of ``query_pre_attn_scalar ** -0.5``, and local layers with a
sliding window and their own RoPE base (5 local : 1 global in Gemma 3). The per-layer
window and RoPE choice are looked up from the traced layer index inside the scan body.
Qwen2 adds biases on q, k and v (``qkv_bias``; Llama's and Qwen3's ``attention_bias`` also
``o_proj_bias``), added in float32 after the product whatever the linear method; Qwen3 uses
the q/k norm (plain ``w``) with an explicit ``head_dim``.

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
run as two rows: `jaxinfer.layers.cpu_bf16` says why.

Every projection, the embedding lookup and the LM head run through the linear method the
module is given (``linear``, `jaxinfer.layers.linear.LinearMethod`, named by the execution
plan, `jaxinfer.platform`); this module never looks at the dtype, the quantization or the CPU
to pick a product. A packed method reads weights the runner packed at load (the
`PACKED_COLLECTION` collection) at any row count, in place by layer index: the scan broadcasts
that collection, never slices it; q/k/v may be one product (`LinearMethod.fused`) and the MLP's
gate and up one gated call (`LinearMethod.gated`).

Parameter tree (``params`` collection; L stacked on axis 0; logical axis names in
brackets, mapped to mesh axes in one place by the sharding module):
  embed/embedding [V, D] (vocab, embed)
  layers/attn/{q,k,v}_proj/kernel [L, D, N|K, H] (layers, embed, heads|kv_heads, head_dim)
  layers/attn/o_proj/kernel [L, N, H, D] (layers, heads, head_dim, embed)
  layers/attn/{q,k}_norm/scale [L, H] (layers, head_dim), only with ``qk_norm``
  layers/attn/q_bias [L, N, H], layers/attn/{k,v}_bias [L, K, H] (layers, heads|kv_heads,
    head_dim), only with ``qkv_bias``; layers/attn/o_bias [L, D] (layers, embed), only with
    ``o_proj_bias``
  layers/mlp/{gate,up}_proj/kernel [L, D, F] (layers, embed, mlp); down_proj [L, F, D]
  layers/{input_norm,post_attention_norm}/scale [L, D]: the norms before attention and
    before the MLP (HF Llama's input_layernorm / post_attention_layernorm, HF Gemma's
    input_layernorm / pre_feedforward_layernorm)
  layers/{attn_out_norm,mlp_out_norm}/scale [L, D], only with ``sandwich_norm`` (HF Gemma's
    post_attention_layernorm / post_feedforward_layernorm); final_norm/scale [D]
  lm_head/kernel [D, V] (embed, vocab), only when embeddings are untied.
With the ``int8`` linear methods (`jaxinfer.layers.quantization.int8`) every kernel and the embedding
table are int8 and a ``scale`` leaf sits beside each (the kernel's axes, the innermost input
axis divided by the group size; ``embed/scale [V, D / g]``).
Einsum letters: T tokens, D model, N query heads, K kv heads, H head dim, F ffn, V vocab.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxinfer.layers.attention.base import AttentionBackend, paged_attention
from jaxinfer.layers.attention.xla import XlaAttention
from jaxinfer.layers.step_metadata import AttentionMetadata
from jaxinfer.config import ModelConfig
from jaxinfer.layers.linear import PACKED_COLLECTION, LinearMethod, Projection, default_linear_method
from jaxinfer.layers import cpu_bf16
from jaxinfer.layers.rope import apply_rope, layer_rope_tables, select_rope
from jaxinfer.layers.attention.xla_work_plan import XlaWorkPlan
from jaxinfer.models.moe_block import SparseMoeBlock


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


def real_tokens(meta: AttentionMetadata) -> jax.Array:
    """The step's real tokens ([] int32): padding tokens lie past ``query_start_loc[num_seqs]``,
    the tail of ``query_start_loc`` (`jaxinfer.runner.batch`)."""
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


def _method(module: nn.Module) -> LinearMethod:
    """The module's linear method: its ``linear``, or `default_linear_method` (built without a plan)."""
    return module.linear if module.linear is not None else default_linear_method(module.cfg)


class Attention(nn.Module):
    cfg: ModelConfig
    attention: AttentionBackend
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    linear: LinearMethod | None = None

    @nn.compact
    def __call__(self, x, k_cache, v_cache, layer, meta: AttentionMetadata, plan: XlaWorkPlan | None, cos, sin):
        c, linear = self.cfg, _method(self)
        rows = real_tokens(meta)
        y = linear.fused(self, "qkv", x, layer, rows)  # one product for the three, where packed so
        if y is not None:
            q, k, v = _split_heads(y, x.shape[:-1], c)
        else:
            q, k, v = (linear.apply(self, p, x, layer, rows) for p in (
                Projection("q_proj", (c.num_attention_heads, c.head_dim), ("embed", "heads", "head_dim")),
                Projection("k_proj", (c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim")),
                Projection("v_proj", (c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"))))
        if c.qkv_bias:
            q = _add_bias(self, "q_bias", q, ("heads", "head_dim"))
            k = _add_bias(self, "k_bias", k, ("kv_heads", "head_dim"))
            v = _add_bias(self, "v_bias", v, ("kv_heads", "head_dim"))
        if c.qk_norm:
            head_norm = _norm(c, self.dtype, self.param_dtype, axis_name="head_dim")
            q, k = head_norm(name="q_norm")(q), head_norm(name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out, k_cache, v_cache = paged_attention(self.attention, q, k, v, k_cache, v_cache, layer, meta,
                                                c.sm_scale, layer_window(c, layer), plan=plan)
        o = linear.apply(self, Projection("o_proj", c.hidden_size, ("heads", "head_dim", "embed"), n_in=2), out,
                         layer, rows)
        if c.o_proj_bias:
            o = _add_bias(self, "o_bias", o, ("embed",))
        return o, k_cache, v_cache


def _add_bias(module: nn.Module, name: str, y, names: tuple[str, ...]):
    """``y [..., *names]`` plus ``module``'s parameter ``name`` (shape ``y.shape[-len(names):]``,
    logical axes ``names``, zeros at init), added in float32 after the product, whatever the
    linear method computed it (packed, int8, fused q/k/v: the bias is never quantized or
    packed). HF ``nn.Linear(..., bias=True)``'s ``x W^T + b``."""
    shape = y.shape[y.ndim - len(names):]
    b = module.param(name, _part(nn.initializers.zeros, names), shape, module.param_dtype)
    return y.astype(jnp.float32) + b.astype(jnp.float32)


_ACT = {"silu": nn.silu, "gelu_pytorch_tanh": functools.partial(nn.gelu, approximate=True)}


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); act = SiLU (SwiGLU) or tanh-approximated GELU (GeGLU).
    Where the linear method has gate and up as one gated call (`LinearMethod.gated`, packed
    bfloat16 weights), act(gate(x)) * up(x) comes from it in bfloat16. ``rows``: the step's real
    tokens (`real_tokens`), the packed products' rows (None: all)."""

    cfg: ModelConfig
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    linear: LinearMethod | None = None

    @nn.compact
    def __call__(self, x, layer, rows=None):
        c, linear = self.cfg, _method(self)
        h = linear.gated(self, x, layer, c.hidden_act, rows)
        if h is None:
            g = linear.apply(self, Projection("gate_proj", c.intermediate_size, ("embed", "mlp")), x, layer, rows)
            u = linear.apply(self, Projection("up_proj", c.intermediate_size, ("embed", "mlp")), x, layer, rows)
            h = _ACT[c.hidden_act](g) * u
        return linear.apply(self, Projection("down_proj", c.hidden_size, ("mlp", "embed")), h, layer, rows)


class DecoderLayer(nn.Module):
    """One pre-norm transformer block (with sandwich norms when configured); the scan body.
    Carry: (x, k_cache, v_cache, layer); broadcast: the step's metadata, its XLA work plan
    (None on the Pallas backend) and the RoPE tables."""

    cfg: ModelConfig
    attention: AttentionBackend
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    linear: LinearMethod | None = None

    @nn.compact
    def __call__(self, carry, meta: AttentionMetadata, plan: XlaWorkPlan | None, rope):
        x, k_cache, v_cache, layer = carry
        c = self.cfg
        norm = _norm(c, self.dtype, self.param_dtype)
        cos, sin = select_rope(rope, c, layer)
        a, k_cache, v_cache = Attention(c, self.attention, self.dtype, self.param_dtype, self.linear,
                                        name="attn")(norm(name="input_norm")(x), k_cache, v_cache, layer, meta,
                                                     plan, cos, sin)
        if c.sandwich_norm:
            a = norm(name="attn_out_norm")(a)
        x = x + a
        m = self._mlp(norm(name="post_attention_norm")(x), layer, real_tokens(meta))
        if c.sandwich_norm:
            m = norm(name="mlp_out_norm")(m)
        return (x + m, k_cache, v_cache, layer + 1), None

    def _mlp(self, h, layer, rows):
        """The layer's MLP: the dense one, the mixture of experts (`SparseMoeBlock`, on the
        attention backend's mesh), or, when the model mixes both (``mlp_only_layers``,
        ``decoder_sparse_step``), the one ``cfg.sparse_layers`` names for the traced ``layer``
        (both run and one is kept: each layer of the stack then has both parameter sets, a
        layer's unused set zeros; no released checkpoint of these families mixes them)."""
        c = self.cfg
        dense = MLP(c, self.dtype, self.param_dtype, self.linear, name="mlp") if c.has_dense_mlp else None
        moe = SparseMoeBlock(c, self.dtype, self.param_dtype, self.attention.mesh, name="moe") if c.is_moe else None
        if moe is None:
            return dense(h, layer, rows)
        if dense is None:
            return moe(h)
        sparse = jnp.asarray(c.sparse_layers)[layer]
        return jnp.where(sparse, moe(h), dense(h, layer, rows))


class LlamaForCausalLM(nn.Module):
    """The decoder (Llama, Gemma 3, Qwen2 or Qwen3, per ``cfg``) over one packed ragged step.

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
    linear: LinearMethod | None = None  # every product's method (None: `default_linear_method`)

    @nn.compact
    def __call__(self, token_ids, meta: AttentionMetadata, k_cache, v_cache, logits_indices):
        c, linear = self.cfg, _method(self)
        embed = linear.embedding(self, c)
        x = linear.embed(self, embed, token_ids)
        if c.scale_embeddings:
            x = x * jnp.float32(c.hidden_size ** 0.5)
        rope = layer_rope_tables(meta.positions, c)
        plan = self.attention.prepare(meta, k_cache.shape[2])  # once per step (the XLA backend's work lists)
        carry = (x, k_cache, v_cache, jnp.int32(0))
        if self.scan_layers:
            # bit-stored bfloat16 stacks (`cpu_bf16.weights_as_bits`) read as bfloat16 per layer
            layer = nn.map_variables(DecoderLayer, "params", cpu_bf16.bits_as_bfloat16, init=self.is_initializing())
            # packed weights (`PACKED_COLLECTION`) stay whole: read in place by layer index
            stack = nn.scan(layer, variable_axes={"params": 0}, variable_broadcast=PACKED_COLLECTION,
                            split_rngs={"params": True},
                            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
                            metadata_params={nn.PARTITION_NAME: "layers"})
            carry, _ = stack(c, self.attention, self.dtype, self.param_dtype, self.linear, name="layers")(carry, meta,
                                                                                                         plan, rope)
        else:  # one module (and one set of [D, ...] arrays) per layer: `unstack_layers`
            for i in range(c.num_hidden_layers):
                carry, _ = DecoderLayer(c, self.attention, self.dtype, self.param_dtype, self.linear,
                                        name=layer_name(i))(carry, meta, plan, rope)
        x, k_cache, v_cache, _ = carry
        x = _norm(c, self.dtype, self.param_dtype)(name="final_norm")(x)  # row-wise: every T row, then gather
        self.sow("intermediates", HIDDEN, x)  # kept only when the caller asks (prompt logprobs read it)
        logits = lm_head_logits(self, linear, x[logits_indices], embed, rows=meta.num_seqs)
        return logits, k_cache, v_cache


def layer_name(i: int) -> str:
    """Parameter-tree key of layer ``i`` in the unrolled layout (``scan_layers=False``)."""
    return f"layers_{i}"


HIDDEN = "final_hidden"  # the sown [T, D] float32 final-normed hidden states (``mutable=["intermediates"]``)


def lm_head_logits(module: nn.Module, linear: LinearMethod, x, embed: nn.Module, rows=None):
    """The LM head: final-normed hidden states [R, D] -> float32 logits [R, V] by ``linear``
    (`LinearMethod.logits`: tied to ``embed`` or the ``lm_head`` kernel, read packed where the
    method packed it, then only the first ``rows`` rows, the step's real sequences, are
    multiplied), then Gemma's soft-capping. Its submodules belong to ``module``, so
    `LlamaForCausalLM` and `LMHead` read the same parameters."""
    c = module.cfg
    logits = linear.logits(module, c, x, embed, rows).astype(jnp.float32)
    if c.final_logit_softcapping:
        logits = jnp.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
    return logits


class LMHead(nn.Module):
    """The LM head of `LlamaForCausalLM` alone, over the same parameter names (``embed``,
    ``lm_head``): final-normed hidden states [T, D] (the sown `HIDDEN`) -> logits [T, V]
    float32. Applied with the model's ``params`` (prompt logprobs of every prompt position);
    ``linear``: the execution plan's ``prompt_head`` method (None: `default_linear_method`)."""

    cfg: ModelConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    linear: LinearMethod | None = None

    @nn.compact
    def __call__(self, x):
        linear = _method(self)
        return lm_head_logits(self, linear, x, linear.embedding(self, self.cfg))

"""Parameter trees of the model: random init, shapes and logical axis names.

`init_params` makes random weights of the right shapes and dtype (tests, and
``--load-format dummy``); `param_logical_axes` gives each leaf's logical axis names
(``("layers", "embed", "heads", "head_dim")``, ...) for the sharding rules; `abstract_params`
gives shapes without allocating (``jax.eval_shape``). The decoder is the family's
(`jaxinfer.models.registry.decoder_class`).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.layers.attention.registry import get_attention_backend
from jaxinfer.layers.step_metadata import AttentionMetadata
from jaxinfer.config import ModelConfig
from jaxinfer.models import registry


def _dummy_call_args(cfg: ModelConfig):
    i32 = jnp.int32
    z1 = jnp.zeros((1,), i32)
    meta = AttentionMetadata(positions=z1, slot_mapping=z1, block_tables=jnp.zeros((1, 0), i32),
                             query_start_loc=jnp.zeros((2,), i32), kv_lens=z1, num_seqs=jnp.zeros((), i32),
                             logits_indices=z1)
    kv = jnp.zeros((cfg.num_hidden_layers, 1, 16, cfg.num_key_value_heads, cfg.head_dim), jnp.float32)
    return z1, meta, kv, kv, z1


def _boxed_init(cfg: ModelConfig, dtype: str, seed: int):
    model = registry.decoder_class(cfg)(cfg, get_attention_backend("xla"), jnp.dtype(dtype), jnp.dtype(dtype))
    return model.init(jax.random.PRNGKey(seed), *_dummy_call_args(cfg))["params"]


def abstract_params(cfg: ModelConfig, dtype: str = "float32"):
    """ShapeDtypeStruct tree of the params (no allocation)."""
    return nn.unbox(jax.eval_shape(lambda: _boxed_init(cfg, dtype, 0)))


def param_logical_axes(cfg: ModelConfig):
    """Tree of ``PartitionSpec`` of logical axis names, matching the params tree."""
    boxed = jax.eval_shape(lambda: _boxed_init(cfg, "float32", 0))
    return nn.get_partition_spec(boxed)


def init_params(cfg: ModelConfig, dtype: str = "float32", seed: int = 0, scale: float | None = None):
    """Random params (normal, std 0.02; norms ones) as numpy arrays.

    Args:
      scale: if given, multiply every non-norm weight std by it (bigger logits in tests).
    """
    params = nn.unbox(jax.jit(lambda: _boxed_init(cfg, dtype, seed))())
    params = jax.device_get(params)
    if scale is not None:
        params = jax.tree_util.tree_map_with_path(
            lambda p, x: x if "norm" in jax.tree_util.keystr(p) else (x * scale).astype(x.dtype), params)
    return jax.tree.map(np.asarray, params)

"""The sparse mixture-of-experts block of the decoder (`jaxinfer.models.llama`'s MLP option),
and its dispatch and combine over an expert-parallel mesh.

Follows transformers' ``MixtralSparseMoeBlock`` and ``Qwen3MoeSparseMoeBlock``: router logits
``x Wr`` ([T, E]), softmax, top k, optionally renormalised (`jaxinfer.layers.moe.route`), then
the SwiGLU experts of each token's k experts weighted and summed
(`jaxinfer.layers.moe.DEFAULT_IMPL`, chosen by ``benchmarks/moe_probe.py``'s measurements). No
shared expert, no router bias (neither family has one).

Parameters (under the layer's ``moe``; L stacked on axis 0 by the layer scan; logical axes):
  router [L, D, E] (layers, embed, router): replicated;
  gate_proj, up_proj [L, E, D, F] (layers, experts, embed, expert_mlp); down_proj [L, E, F, D]
  (layers, experts, expert_mlp, embed), F = ``moe_intermediate_size``.

Parallelism (`jaxinfer.distributed.sharding`: ``experts`` on the ``expert`` mesh axis,
``expert_mlp`` on ``model``): the step's activations are replicated over a replica's devices
(tensor parallelism all-reduces after o_proj), so every device routes every token itself and
dispatch needs no communication: under ``jax.shard_map`` each device runs only the
assignments to the experts it holds (the chosen implementation with ``expert_offset`` = its index on
``expert`` times E / ep), over its slice of each expert's width, and the combine is one
``psum`` of the ``[T, D]`` float32 partial sums over the axes the experts were split on
(``expert`` and/or ``model``). Modelled bytes per MoE layer and step: one all-reduce of
``T * D * 4`` bytes over the replica's ``tp`` devices (a ring moves ``2 (tp - 1) / tp`` of that
per device), the same as the dense MLP's tensor-parallel all-reduce; no all-to-all. (An
all-to-all dispatch pays off when activations are sharded over tokens, i.e. data-parallel
attention, which this engine does not do.)
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from jaxinfer.config import ModelConfig
from jaxinfer.distributed.sharding import EXPERT_AXIS, expert_weight_specs
from jaxinfer.layers.moe import DEFAULT_IMPL, EXPERT_IMPLS, route

_init = nn.initializers.normal(0.02)


def _part(names):
    return nn.with_logical_partitioning(_init, names)


def _split_axes(spec: P) -> tuple[str, ...]:
    """The mesh axes a partition spec splits on (flattened)."""
    out: list[str] = []
    for a in spec:
        if a is not None:
            out.extend(a if isinstance(a, tuple) else (a,))
    return tuple(out)


def parallel_experts(cfg: ModelConfig, mesh: Mesh | None, x, weights, experts, w_gate, w_up, w_down,
                     dtype=jnp.float32, impl: str = DEFAULT_IMPL):
    """The experts' weighted sum per token ``[T, D]`` float32 on ``mesh`` (module docstring).

    Args:
      x: ``[T, D]`` tokens; weights, experts: `route`'s ``[T, k]``.
      w_gate, w_up: ``[E, D, F]``; w_down ``[E, F, D]``: one layer's experts, laid out on the
        mesh as `expert_weight_specs` says (resharded to it otherwise).
      mesh: the replica's mesh, or None (one device: no shard_map).
      impl: an `EXPERT_IMPLS` name.
    """
    gu_spec, d_spec = expert_weight_specs(cfg, mesh)
    run = functools.partial(EXPERT_IMPLS[impl], act=cfg.hidden_act, dtype=dtype)
    axes = _split_axes(gu_spec)
    if mesh is None or not axes:
        return run(x, weights, experts, w_gate, w_up, w_down)

    def local(x, weights, experts, w_gate, w_up, w_down):
        offset = jax.lax.axis_index(EXPERT_AXIS) * w_gate.shape[0] if EXPERT_AXIS in axes else 0
        return jax.lax.psum(run(x, weights, experts, w_gate, w_up, w_down, expert_offset=offset), axes)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), gu_spec, gu_spec, d_spec), out_specs=P(),
                         check_vma=False)(x, weights, experts, w_gate, w_up, w_down)


class SparseMoeBlock(nn.Module):
    """Router + top-k + experts: ``x [T, D]`` -> float32 ``[T, D]`` (module docstring).

    ``mesh``: the replica's mesh (None on one device)."""

    cfg: ModelConfig
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        e, d, f = c.num_experts, c.hidden_size, c.moe_intermediate_size
        router = self.param("router", _part(("embed", "router")), (d, e), self.param_dtype)
        w_gate = self.param("gate_proj", _part(("experts", "embed", "expert_mlp")), (e, d, f), self.param_dtype)
        w_up = self.param("up_proj", _part(("experts", "embed", "expert_mlp")), (e, d, f), self.param_dtype)
        w_down = self.param("down_proj", _part(("experts", "expert_mlp", "embed")), (e, f, d), self.param_dtype)
        logits = jnp.dot(x.astype(self.dtype), router.astype(self.dtype), preferred_element_type=jnp.float32)
        weights, experts = route(logits, c.num_experts_per_tok, c.norm_topk_prob)
        return parallel_experts(c, self.mesh, x, weights, experts, w_gate, w_up, w_down, self.dtype)

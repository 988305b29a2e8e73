"""Mixture-of-experts math: the router's top-k and the experts as grouped matmuls.

Owns what a sparse MoE block (Shazeer et al. 2017; Mixtral, Jiang et al. 2024; Qwen3-MoE)
computes, independent of parameter trees and meshes (the block is
`jaxinfer.models.moe_block.SparseMoeBlock`):

* `route`: router logits ``[T, E]`` -> softmax over all E experts (float32) -> the top k
  probabilities and their expert ids, renormalised to sum to 1 when ``renormalize``
  (Mixtral always; Qwen3-MoE's ``norm_topk_prob``), as transformers'
  ``MixtralSparseMoeBlock`` / ``Qwen3MoeSparseMoeBlock`` do.
* `grouped_experts`: the SwiGLU experts ``down(act(x Wg_e) * (x Wu_e))`` of every (token,
  expert) assignment, weighted by its routing weight and summed per token. The ``T * k``
  assignments are sorted by expert id (a stable argsort), the tokens gathered in that order,
  and each of the three projections is one ``jax.lax.ragged_dot`` over the groups of
  consecutive rows that share an expert (``group_sizes`` from a bincount). Every shape is
  fixed by T, k and the expert count, never by the routing: any routing (all tokens on one
  expert, or spread) runs the same compiled step.

  Only a contiguous range of experts may be held (``expert_offset``, the weights' leading
  axis): assignments to other experts sort after the held ones, are left out of
  ``group_sizes`` and contribute nothing. That is expert parallelism's local step
  (`jaxinfer.models.moe_block`).

The model's choice, `DEFAULT_IMPL` = ``segment`` (`segmented_experts`: the sorted assignments,
then per held expert a loop over its group in fixed-size chunks, each one dense SwiGLU), was
measured by ``benchmarks/moe_probe.py`` (``benchmarks/results/2026-12-06-moe-probe/``, XLA:CPU,
jax 0.10.2, float32, a 2-core host shared with other jobs) against the other fixed-shape ways:
``ragged`` (one ``jax.lax.ragged_dot`` per projection over the sorted assignments, the grouped
matmul the issue named), ``dense`` (every held expert on every token, masked by the routing
weights: E / k times the FLOPs) and ``gather`` (each assignment's expert weights gathered,
``[T * k, D, F]``). At 256 rows (prefill) ``segment`` was the fastest on every shape, by
1.9-13x (Mixtral-like: 4.0x a dense MLP of the active width, ``ragged`` 14.9x, ``dense`` 7.5x);
``ragged_dot`` on XLA:CPU was never the fastest at any shape or row count.
At 32 rows (decode) ``segment`` and ``dense`` were within the machine's noise of each other
and both ahead of ``ragged``; ``gather`` was 60-200x. No method came near 1.5x a dense MLP of
the active width at 32 rows: with T * k >= E nearly every expert is routed to, so a step must
read E / k times the active weights (the probe's floor, a dense MLP of the touched experts'
width, was itself 5-8x the active one). On GPUs ``ragged_dot`` has grouped-GEMM kernels and
would likely win; that was not measured (no GPU run).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_ACT = {"silu": jax.nn.silu, "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}


def route(logits: jax.Array, top_k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
    """Top-k routing.

    Args:
      logits: router logits ``[T, E]`` (any float dtype; computed in float32).
      top_k: experts per token (k <= E).
      renormalize: divide the k probabilities by their sum (``norm_topk_prob``).
    Returns:
      (weights ``[T, k]`` float32, experts ``[T, k]`` int32), highest probability first
      (``jax.lax.top_k`` breaks ties by the lower expert id, as ``torch.topk`` does on CPU).
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def _dot(x, w, dtype):
    return jax.lax.dot_general(x.astype(dtype), w.astype(dtype), (((x.ndim - 1,), (w.ndim - 2,)), ((), ())),
                               preferred_element_type=jnp.float32)


def grouped_experts(x: jax.Array, weights: jax.Array, experts: jax.Array, w_gate: jax.Array, w_up: jax.Array,
                    w_down: jax.Array, act: str = "silu", expert_offset=0, dtype=jnp.float32) -> jax.Array:
    """The experts' weighted sum per token by ``ragged_dot`` over assignments sorted by expert.

    Args:
      x: tokens ``[T, D]``.
      weights, experts: `route`'s ``[T, k]`` float32 weights and int32 expert ids (global ids).
      w_gate, w_up: ``[E_l, D, F]``; w_down ``[E_l, F, D]``: the held experts
        ``expert_offset .. expert_offset + E_l - 1``.
      act: the gate activation (``"silu"``: SwiGLU).
      expert_offset: id of the first held expert ([] int32, may be traced: the device's
        place on the expert axis times E_l).
      dtype: matmul operand dtype (float32 accumulation).
    Returns:
      ``[T, D]`` float32: sum over the token's assignments to held experts of weight times
      expert output (zero for tokens none of whose experts is held).
    """
    t = experts.shape[0]
    order, token, group_sizes, held = _sort_assignments(experts, w_gate.shape[0], expert_offset)
    xs = x[token].astype(dtype)
    rd = functools.partial(jax.lax.ragged_dot, group_sizes=group_sizes, preferred_element_type=jnp.float32)
    h = _ACT[act](rd(xs, w_gate.astype(dtype))) * rd(xs, w_up.astype(dtype))
    y = rd(h.astype(dtype), w_down.astype(dtype))
    w = jnp.where(held, weights.reshape(-1), 0.0)[order]
    y = jnp.where(w[:, None] != 0, y * w[:, None], 0.0)  # rows past the groups are not computed: never read them
    return jnp.zeros((t, x.shape[-1]), jnp.float32).at[token].add(y)


def dense_experts(x, weights, experts, w_gate, w_up, w_down, act="silu", expert_offset=0, dtype=jnp.float32):
    """`grouped_experts`' result by running every held expert on every token and weighting
    by a dense ``[T, E_l]`` routing matrix (zero where not routed): E_l / k times the FLOPs.
    Kept for ``benchmarks/moe_probe.py``."""
    n_local = w_gate.shape[0]
    local = experts - expert_offset
    onehot = jax.nn.one_hot(local, n_local, dtype=jnp.float32)  # out-of-range ids give zero rows
    dense_w = jnp.einsum("tk,tke->te", weights, onehot)
    xd = x.astype(dtype)
    g = jnp.einsum("td,edf->etf", xd, w_gate.astype(dtype), preferred_element_type=jnp.float32)
    u = jnp.einsum("td,edf->etf", xd, w_up.astype(dtype), preferred_element_type=jnp.float32)
    y = jnp.einsum("etf,efd->etd", (_ACT[act](g) * u).astype(dtype), w_down.astype(dtype),
                   preferred_element_type=jnp.float32)
    return jnp.einsum("etd,te->td", y, dense_w)


def gathered_experts(x, weights, experts, w_gate, w_up, w_down, act="silu", expert_offset=0, dtype=jnp.float32):
    """`grouped_experts`' result by gathering each assignment's expert weights
    (``[T, k, D, F]``) and one batched product per assignment. Kept for ``benchmarks/moe_probe.py``."""
    n_local = w_gate.shape[0]
    local = experts - expert_offset
    held = (local >= 0) & (local < n_local)
    idx = jnp.clip(local, 0, n_local - 1)
    xd = x.astype(dtype)
    g = jnp.einsum("td,tkdf->tkf", xd, w_gate[idx].astype(dtype), preferred_element_type=jnp.float32)
    u = jnp.einsum("td,tkdf->tkf", xd, w_up[idx].astype(dtype), preferred_element_type=jnp.float32)
    y = jnp.einsum("tkf,tkfd->tkd", (_ACT[act](g) * u).astype(dtype), w_down[idx].astype(dtype),
                   preferred_element_type=jnp.float32)
    return jnp.einsum("tkd,tk->td", y, jnp.where(held, weights, 0.0))


def _sort_assignments(experts, n_local, expert_offset):
    """(order [M], source token per sorted row [M], group sizes [E_l], held mask [M] in input order)
    of the ``M = T * k`` assignments sorted by held expert (others last)."""
    k = experts.shape[1]
    local = experts.reshape(-1) - expert_offset
    held = (local >= 0) & (local < n_local)
    key = jnp.where(held, local, n_local)
    order = jnp.argsort(key, stable=True)
    group_sizes = jnp.bincount(key, length=n_local + 1)[:n_local].astype(jnp.int32)
    return order, order // k, group_sizes, held


def segment_chunk(rows: int, top_k: int, n_local: int) -> int:
    """Rows per expert chunk of `segmented_experts`: the mean group size ``T * k / E_l`` rounded
    up to a power of two, within [1, T] (a group never exceeds T: a token picks an expert once)."""
    mean = max(1, -(-rows * top_k // n_local))
    return min(rows, 1 << (mean - 1).bit_length())


def segmented_experts(x, weights, experts, w_gate, w_up, w_down, act="silu", expert_offset=0, dtype=jnp.float32):
    """`grouped_experts`' result with the ragged product as a loop: the assignments sorted by
    expert as there, then for each held expert (a Python loop: static weight slices) a
    ``fori_loop`` over its group in chunks of `segment_chunk` rows, each chunk one dense SwiGLU
    of that expert; the trip count is the group's chunk count (traced), the shapes fixed.
    FLOPs: at most ``T * k + E_l * (chunk - 1)`` rows' worth."""
    t, k = experts.shape
    n_local, d = w_gate.shape[0], x.shape[-1]
    m = t * k
    c = segment_chunk(t, k, n_local)
    order, token, group_sizes, held = _sort_assignments(experts, n_local, expert_offset)
    xs = jnp.concatenate([x[token].astype(dtype), jnp.zeros((c, d), dtype)])  # c rows of slack: no clamped slice
    starts = jnp.cumsum(group_sizes) - group_sizes
    act_fn = _ACT[act]
    out = jnp.zeros((m + c, d), jnp.float32)
    for e in range(n_local):
        wg, wu, wd = w_gate[e].astype(dtype), w_up[e].astype(dtype), w_down[e].astype(dtype)

        def body(i, acc, e=e, wg=wg, wu=wu, wd=wd):
            s = starts[e] + i * c
            rows = jax.lax.dynamic_slice_in_dim(xs, s, c)
            h = act_fn(_dot(rows, wg, dtype)) * _dot(rows, wu, dtype)
            y = _dot(h.astype(dtype), wd, dtype)
            y = jnp.where((i * c + jnp.arange(c) < group_sizes[e])[:, None], y, 0.0)
            return jax.lax.dynamic_update_slice_in_dim(acc, jax.lax.dynamic_slice_in_dim(acc, s, c) + y, s, 0)

        out = jax.lax.fori_loop(0, (group_sizes[e] + c - 1) // c, body, out)
    w = jnp.where(held, weights.reshape(-1), 0.0)[order]
    return jnp.zeros((t, d), jnp.float32).at[token].add(out[:m] * w[:, None])


EXPERT_IMPLS = {"ragged": grouped_experts, "segment": segmented_experts, "dense": dense_experts,
                "gather": gathered_experts}
DEFAULT_IMPL = "segment"  # the model's choice (module docstring)

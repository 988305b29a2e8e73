"""The online softmax of the XLA attention path's jnp parts, in one place: a running (max, sum,
weighted values) triple, folded one block of scores at a time (`fold`, and `fold_segments` for
a ragged work list) and merged across parts by log-sum-exp (`merge`) (Milakov & Gimelshein
2018, "Online normalizer calculation for softmax"; FlashAttention, Dao et al. 2022), and the
sliding window's mask. Masked keys are -inf; an empty query stays (-inf, 0, 0).

Not shared with `jaxinfer.kernels.pallas`: the Pallas kernel keeps its own in-kernel form (finite
``MASK_VALUE``, ``[R, 1]`` statistics for Triton's 2-D tiles, HIGHEST-precision dots) and its
split merge, and that package imports nothing from jaxinfer; its pure-jnp reference is a dense
softmax, not an online one. Einsum letters: X queries, P work items, K kv heads, G query heads
per kv head, H head dim, S keys.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def init_state(lead: tuple[int, ...], head_dim: int):
    """An empty running state for queries of shape ``lead`` (e.g. ``(X, K, G)``):
    (max -inf, sum 0, acc 0 ``[*lead, head_dim]``), float32; it merges as nothing."""
    return jnp.full(lead, -jnp.inf), jnp.zeros(lead), jnp.zeros(lead + (head_dim,))


def fold(carry, s, v):
    """One online-softmax step: fold scores ``s [X, K, G, S]`` over values ``v [S, K, H]`` into
    ``carry`` = (max [X, K, G], sum [X, K, G], acc [X, K, G, H]) float32. Keys masked to -inf
    count for nothing; a query with no finite score so far keeps (-inf, 0, 0)."""
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(-1))
    safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - safe[..., None])
    scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
    return (m_new, l * scale + p.sum(-1),
            acc * scale[..., None] + jnp.einsum("xkgs,skh->xkgh", p, v.astype(jnp.float32)))


def fold_segments(carry, s, v, rows, num_segments: int):
    """`fold` over a ragged work list: item ``p`` of ``s [P, K, G, S]`` / ``v [P, S, K, H]``
    belongs to query ``rows[p]`` (int32 [P], sorted) of ``carry`` = (max, sum, acc) with
    ``num_segments`` queries; each item's keys are its own, and items of one query are
    reduced into it with segment max / sum. Returns the updated carry."""
    m, l, acc = carry
    segs = dict(num_segments=num_segments, indices_are_sorted=True)
    m_new = jnp.maximum(m, jax.ops.segment_max(s.max(-1), rows, **segs))
    safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - safe[rows][..., None])
    scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
    pv = jnp.einsum("pkgs,pskh->pkgh", p, v.astype(jnp.float32))
    return (m_new, l * scale + jax.ops.segment_sum(p.sum(-1), rows, **segs),
            acc * scale[..., None] + jax.ops.segment_sum(pv, rows, **segs))


def partial_softmax(s, v):
    """Unnormalised pieces (max, sum, weighted values) of a softmax over the last axis of
    ``s [X, K, G, S]`` against ``v [S, K, H]``: `fold` into an empty state."""
    return fold(init_state(s.shape[:-1], v.shape[-1]), s, v)


def merge(parts):
    """Combine (max, sum, acc) partial softmaxes over disjoint key sets into the normalised
    output ``acc / sum`` at one shared max (log-sum-exp): float32 ``[..., H]``."""
    m = parts[0][0]
    for pm, _, _ in parts[1:]:
        m = jnp.maximum(m, pm)
    denom, acc = 0.0, 0.0
    for pm, pl, pa in parts:
        w = jnp.where(jnp.isfinite(pm), jnp.exp(pm - m), 0.0)
        denom = denom + pl * w
        acc = acc + pa * w[..., None]
    return acc / denom[..., None]


def in_window(q_pos, k_pos, window):
    """Whether keys at ``k_pos`` lie in the sliding window of queries at ``q_pos`` (broadcast):
    ``q_pos - k_pos < window`` (transformers' sliding-window mask). True when ``window`` is None."""
    return True if window is None else (q_pos - k_pos) < window

"""Rotary position embedding (RoPE, Su et al. 2021) with Hugging Face's scaling types.

Owns the inverse frequencies of plain RoPE and of every `RopeScaling` type, the per-step
cos/sin tables and the rotate-half rotation. The formulas are those of transformers
``modeling_rope_utils`` (``_compute_*_parameters``) and ``LlamaRotaryEmbedding``:

  default  ``inv_freq[i] = theta ** (-2i / H)``
  linear   ``inv_freq / factor`` (position interpolation, Chen et al. 2023)
  llama3   wavelengths above ``orig / low_freq_factor`` divided by ``factor``, below
           ``orig / high_freq_factor`` kept, a linear blend between (Meta's Llama 3.1 code)
  yarn     per-dimension ramp between interpolated and original frequencies, and cos/sin
           times ``attention_factor`` (YaRN, Peng et al. 2023)
  dynamic  NTK-aware base that grows with the position (`dynamic_inv_freq`)

All but ``dynamic`` have one frequency vector per model: it is computed once on the host
(float64, rounded to float32) and enters the compiled step as a constant; a step only
computes ``cos``/``sin`` of ``position * inv_freq`` for its T tokens, as before scaling.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config import ModelConfig


def default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """``theta ** (-2i / H)`` for i < H/2: [H/2] float64 (plain RoPE, Su et al. 2021)."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [H/2] float32 of ``cfg``'s RoPE, in radians per position.

    For ``dynamic`` this is the unscaled vector, used up to ``max_position_embeddings``.
    Source: transformers ``modeling_rope_utils`` (linear, llama3, yarn).
    """
    base = default_inv_freq(cfg.head_dim, cfg.rope_theta)
    rs = cfg.rope_scaling
    if rs is None or rs.rope_type == "dynamic":
        out = base
    elif rs.rope_type == "linear":
        out = base / rs.factor
    elif rs.rope_type == "llama3":
        out = _llama3(base, rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position_embeddings)
    elif rs.rope_type == "yarn":
        out = _yarn(cfg, base)
    else:  # RopeScaling.from_hf refuses other types; a hand-built config may not
        raise ValueError(f"RoPE scaling type {rs.rope_type!r} is not supported")
    return out.astype(np.float32)


def _llama3(inv: np.ndarray, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(medium, blended, scaled)


def _yarn(cfg: ModelConfig, inv: np.ndarray) -> np.ndarray:
    rs, dim = cfg.rope_scaling, cfg.head_dim

    def correction_dim(rotations: float) -> float:  # the dimension that turns `rotations` times over orig
        return dim * math.log(rs.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(cfg.rope_theta))

    low, high = correction_dim(rs.beta_fast), correction_dim(rs.beta_slow)
    if rs.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency, 0: interpolate (divide by factor)
    return inv / rs.factor * (1 - extrapolate) + inv * extrapolate


def attention_factor(cfg: ModelConfig) -> float:
    """Scale of cos and sin (so of q·k by its square): 1 except for yarn.

    yarn: ``attention_factor`` if set, else ``get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim)`` when both are set, else ``0.1 ln(factor) + 1``
    (``get_mscale(s, m) = 0.1 m ln(s) + 1`` for s > 1, else 1; transformers, YaRN §3.4).
    """
    rs = cfg.rope_scaling
    if rs is None or rs.rope_type != "yarn":
        return 1.0
    if rs.attention_factor is not None:
        return rs.attention_factor

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rs.mscale and rs.mscale_all_dim:
        return get_mscale(rs.factor, rs.mscale) / get_mscale(rs.factor, rs.mscale_all_dim)
    return get_mscale(rs.factor)


def dynamic_inv_freq(positions: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Dynamic NTK inverse frequencies [T, H/2] float32 for the tokens at ``positions`` [T].

    The token at position p uses transformers' ``_compute_dynamic_ntk_parameters`` with
    ``seq_len = max(p + 1, M)``, M = ``max_position_embeddings``: base
    ``theta * (factor * seq_len / M - (factor - 1)) ** (H / (H - 2))``; below M that is the
    unscaled vector, which is used as is.

    What is exact. transformers recomputes one base per forward call from its longest
    sequence and keeps it between calls; its KV cache keeps each key rotated with the base
    current when the key was written. vLLM instead fixes one base for
    ``seq_len = factor * M`` at every position, which differs from transformers for every
    sequence shorter than M. The per-position rule here:
      * makes a key depend only on its token and position, so paged KV, prefix caching,
        chunked prefill and recompute after preemption all give the same numbers;
      * is plain RoPE on sequences within M, as in transformers;
      * equals transformers' ``generate`` with its KV cache (batch of one) whenever the
        prompt fits in M, generated tokens past M included: there each decode step grows
        the base by one position, which is this rule;
      * differs when the prompt itself is longer than M: transformers then rotates every
        prompt token with the base of the whole prompt length.
    Cost: one [T, H/2] ``pow`` per step, beside the cos/sin every RoPE type computes.
    """
    rs, dim = cfg.rope_scaling, cfg.head_dim
    m = cfg.max_position_embeddings
    seq_len = jnp.maximum(positions.astype(jnp.float32) + 1, m)
    base = cfg.rope_theta * (rs.factor * seq_len / m - (rs.factor - 1)) ** (dim / (dim - 2))
    exponent = jnp.asarray(np.arange(0, dim, 2, dtype=np.float32) / dim)
    scaled = 1.0 / base[:, None] ** exponent[None, :]
    return jnp.where((positions + 1 > m)[:, None], scaled, jnp.asarray(inv_freq(cfg))[None, :])


def rope_tables(positions: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """cos, sin [T, H] float32 for rotate-half RoPE at integer ``positions`` [T].

    ``emb = concat([p * inv_freq, p * inv_freq])``; both tables times `attention_factor`
    (HF ``LlamaRotaryEmbedding.forward``). Static types use a host-computed constant.
    """
    if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "dynamic":
        freqs = positions.astype(jnp.float32)[:, None] * dynamic_inv_freq(positions, cfg)
    else:
        freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq(cfg))[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    scale = attention_factor(cfg)
    if scale == 1.0:
        return jnp.cos(emb), jnp.sin(emb)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [T, heads, H] rotated by position (HF ``apply_rotary_pos_emb``, rotate-half layout)."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos[:, None, :] + rot * sin[:, None, :]).astype(x.dtype)


def layer_rope_tables(positions: jax.Array, cfg: ModelConfig) -> tuple[tuple[jax.Array, jax.Array], ...]:
    """The RoPE tables the layers need: ``((cos, sin),)`` for one theta, or
    ``((cos_global, sin_global), (cos_local, sin_local))`` when sliding layers use their own
    base (``rope_local_base``, unscaled: Gemma 3, transformers ``rope_parameters``
    ``sliding_attention``). Each table is [T, H] float32 (`rope_tables`)."""
    tables = (rope_tables(positions, cfg),)
    if cfg.rope_local_base is not None and "sliding_attention" in cfg.layer_types:
        local = dataclasses.replace(cfg, rope_theta=cfg.rope_local_base, rope_scaling=None)
        tables += (rope_tables(positions, local),)
    return tables


def select_rope(tables: tuple[tuple[jax.Array, jax.Array], ...], cfg: ModelConfig,
                layer: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin [T, H] of layer ``layer`` ([] int32, traced) from `layer_rope_tables`."""
    if len(tables) == 1:
        return tables[0]
    local = jnp.asarray([t == "sliding_attention" for t in cfg.layer_types])[layer]
    (cg, sg), (cl, sl) = tables
    return jnp.where(local, cl, cg), jnp.where(local, sl, sg)

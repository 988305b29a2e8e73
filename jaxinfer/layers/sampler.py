"""Per-row sampling inside the jitted step.

Every option is a per-row array of the step's `jaxinfer.layers.step_metadata.SamplingMetadata`
(registered here as a pytree), so one compiled step serves any mix of greedy and
sampled rows. Expensive stages run under ``lax.cond`` on batch-wide flags (XLA executes
only the taken branch), so a greedy batch pays for an argmax only.

Order (as vLLM): token bitmask of structured outputs (``bitmask``, only in steps where a
row is constrained; -inf for disallowed tokens) -> logit_bias -> penalties (repetition: CTRL, Keskar et al. 2019;
presence/frequency: OpenAI API docs) -> [logprobs taken here] -> temperature ->
min_p -> top_k -> top_p (nucleus, Holtzman et al. 2019) -> an inverse-CDF draw with one
uniform from a per-row key ``fold_in(PRNGKey(seed), output_index)``: given the same logits, the
same request and seed draw the same tokens alone or in any batch. The logits themselves can
differ in their last bits with the batch (see `jaxinfer.sampling_params`, ``seed``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.layers.step_metadata import SamplingMetadata

# The step's sampling contract (`jaxinfer.layers.step_metadata`, host side JAX-free) as a pytree;
# a None field (no penalty history, no bitmask) is an empty subtree: its own executable.
jax.tree_util.register_dataclass(SamplingMetadata)


def apply_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    """Set disallowed tokens to -inf.

    Args:
      logits: [R, V] float32.
      bitmask: [R, ceil(V / 32)] int32; bit ``t % 32`` of word ``t // 32`` set = token ``t``
        allowed (llguidance / xgrammar layout; ``-1`` words allow all 32 tokens).
    Returns:
      [R, V] float32, the allowed logits unchanged.
    """
    R, V = logits.shape
    bits = (bitmask[:, :, None] >> jnp.arange(32, dtype=jnp.int32)[None, None, :]) & 1
    allowed = bits.reshape(R, -1)[:, :V].astype(bool)
    return jnp.where(allowed, logits, -jnp.inf)


def _apply_bias(logits, s):
    rows = jnp.arange(logits.shape[0])[:, None]
    return logits.at[rows, s.bias_ids].add(s.bias_values, mode="drop")


def _apply_penalties(logits, s):
    R, V = logits.shape
    rows = jnp.arange(R)[:, None]
    j = jnp.arange(s.hist_ids.shape[1])[None, :]
    is_out = (j >= s.num_prompt[:, None]) & (j < s.num_hist[:, None])
    counts = jnp.zeros((R, V), jnp.float32).at[rows, s.hist_ids].add(is_out.astype(jnp.float32), mode="drop")
    seen = jnp.zeros((R, V), bool).at[rows, s.hist_ids].max(j < s.num_hist[:, None], mode="drop")
    rp = s.repetition_penalty[:, None]
    logits = jnp.where(seen, jnp.where(logits > 0, logits / rp, logits * rp), logits)
    logits = logits - s.frequency_penalty[:, None] * counts
    return logits - s.presence_penalty[:, None] * (counts > 0)


CANDIDATES = 256  # top-k / top-p work on this many best logits per row (lax.top_k), not a full sort


def _filter_top(logits, s):
    """top_k then top_p masks, computed on the best `CANDIDATES` logits of each row.

    A row whose filter stays inside its candidates (``top_k <= CANDIDATES``, or no top-k and the
    candidates hold at least ``top_p`` of the probability mass) is filtered on them; the other
    rows by `_filter_bisect`, which finds both thresholds by bisection without sorting (run only
    when some row needs it). Each row's path depends on that row alone, so its result does not
    depend on the batch. A full sort of a 262K vocabulary costs seconds per step on a CPU;
    ``lax.top_k`` of 256 costs milliseconds.
    """
    V = logits.shape[1]
    if V <= CANDIDATES:
        return _filter_bisect(logits, s)
    top = jax.lax.top_k(logits, CANDIDATES)[0]  # [R, C] descending
    k = jnp.clip(s.top_k, 1, V)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # the normaliser when no top-k applies
    mass = jnp.sum(jnp.exp(top - lse), axis=-1)
    covered = (k <= CANDIDATES) | ((k >= V) & (mass >= s.top_p))
    on_candidates = _threshold(logits, top, k, s.top_p, lse)
    return jax.lax.cond(jnp.all(covered), lambda: on_candidates,
                        lambda: jnp.where(covered[:, None], on_candidates, _filter_bisect(logits, s)))


def _ordered_keys(x):
    """float32 [..] -> uint32 [..] whose unsigned order is the floats' order (NaN excluded): the
    sign bit flipped for non-negative floats, every bit flipped for negative ones."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _largest_key(keys, weights, target):
    """Per row, the largest uint32 ``b`` with ``sum(weights[keys >= b]) >= target``.

    Args:
      keys: [R, V] uint32 (`_ordered_keys`); weights: [R, V] float32, non-negative;
      target: [R] float32, at most each row's total weight (else 0 comes back).
    Returns [R] uint32, by 32 halvings of [0, 2**32) (each one pass over the row: compare,
    select, sum), so the cost is fixed and no sort runs.
    """
    lo = jnp.zeros(keys.shape[:1], jnp.uint32)  # sum over keys >= 0 is the whole row
    span = jnp.full(keys.shape[:1], 1 << 31, jnp.uint32)

    def halve(_, lo_span):
        lo, span = lo_span
        mid = lo + span  # never wraps: lo + 2 * span <= 2**32 - 1 + 1
        ok = jnp.sum(jnp.where(keys >= mid[:, None], weights, 0.0), axis=-1) >= target
        return jnp.where(ok, mid, lo), span >> 1

    return jax.lax.fori_loop(0, 32, halve, (lo, span))[0]


def _filter_bisect(logits, s):
    """top_k then top_p masks without a sort, for filters wider than the candidates.

    Top-k keeps the logits at or above the k-th largest: the largest key with at least k logits
    at or above it. Top-p (over the top-k survivors' softmax) keeps the tokens whose probability
    is at or above the largest value ``v`` with ``mass(p >= v) >= top_p``; that is the set a
    descending sort keeps (every token whose mass strictly above it is below ``top_p``, ties
    kept whole, as vLLM's sort-based ``apply_top_k_top_p``). Cost: up to 64 passes of compare-and-sum over [R, V]
    instead of R sorts of V.
    """
    V = logits.shape[1]
    k = jnp.clip(s.top_k, 1, V)
    lkeys = _ordered_keys(logits)
    kth = jax.lax.cond(jnp.any(k < V),
                       lambda: _largest_key(lkeys, jnp.ones_like(logits), k.astype(jnp.float32)),
                       lambda: jnp.zeros_like(k, jnp.uint32))
    keep = lkeys >= kth[:, None]
    probs = jax.nn.softmax(jnp.where(keep, logits, -jnp.inf), axis=-1)
    pkeys = _ordered_keys(probs)
    pth = _largest_key(pkeys, probs, s.top_p)
    pth = jnp.minimum(pth, jnp.max(pkeys, axis=-1))  # the best token survives any top_p, 0 after rounding too
    pth = jnp.where(s.top_p >= 1.0, 0, pth)  # top_p = 1 keeps every top-k survivor, rounding aside
    return jnp.where(keep & (pkeys >= pth[:, None]), logits, -jnp.inf)


def _threshold(logits, srt, k, top_p, full_lse):
    """Mask ``logits`` [R, V] below the top-k and top-p thresholds read off ``srt`` [R, C], the
    rows' best C logits in descending order. Top-p's probabilities are those of the top-k
    survivors (top-k before top-p, as vLLM), logits tied with the k-th included: a softmax over
    them, or with ``k > C`` (only when k covers the vocabulary) ``full_lse`` [R, 1], the
    logsumexp of the whole row. Logits tied with the k-th that did not make ``srt`` survive
    top-k, so they count in the normaliser too."""
    C = srt.shape[1]
    kk = jnp.minimum(k, C)
    kth = jnp.take_along_axis(srt, (kk - 1)[:, None], axis=-1)
    srt = jnp.where(srt >= kth, srt, -jnp.inf)
    lse = jax.nn.logsumexp(srt, axis=-1, keepdims=True)
    missed = (jnp.sum(logits == kth, axis=-1, keepdims=True) - jnp.sum(srt == kth, axis=-1, keepdims=True))
    missed = missed.astype(jnp.float32)
    lse = jnp.where(missed > 0, jnp.logaddexp(lse, kth + jnp.log(jnp.maximum(missed, 1.0))), lse)
    lse = jnp.where((k > C)[:, None], full_lse, lse)
    probs = jnp.exp(srt - lse)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
    keep = before < top_p[:, None]
    keep = keep.at[:, 0].set(True)  # the top token always survives
    num_keep = jnp.sum(keep, axis=-1)
    pth = jnp.take_along_axis(srt, (num_keep - 1)[:, None], axis=-1)
    return jnp.where(logits < jnp.maximum(kth, pth), -jnp.inf, logits)


def _apply_min_p(x, s):
    probs = jax.nn.softmax(x, axis=-1)
    return jnp.where(probs < s.min_p[:, None] * probs.max(-1, keepdims=True), -jnp.inf, x)


def _sample(logits, s):
    x = logits / s.temperature[:, None]
    x = jax.lax.cond(jnp.any(s.min_p > 0), _apply_min_p, lambda l, _: l, x, s)
    x = jax.lax.cond(s.any_sort, _filter_top, lambda l, _: l, x, s)
    seeds = (s.seed_hi.astype(jnp.uint32), s.seed_lo.astype(jnp.uint32))

    def row(hi, lo, idx, lg):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(lo), hi), idx)
        return _inverse_cdf(lg, jax.random.uniform(key, (), jnp.float32))

    return jax.vmap(row)(seeds[0], seeds[1], s.output_index, x).astype(jnp.int32)


def _inverse_cdf(logits, u):
    """Inverse-transform draw from softmax(logits) [V] with one uniform ``u`` in [0, 1).

    Draws the first token of non-zero weight whose running sum of the unnormalised weights
    passes ``u * total``: token i with probability p_i. A filtered (-inf) token has zero weight
    and is never drawn, whatever the rounding: XLA's cumsum adds each position's sum in its own
    order, so the running sum is not exactly monotone; if no token passes (rounding at the top
    end), the last token of non-zero weight is drawn. One uniform per row instead of a
    Gumbel-max draw's V (13 ms against 2 ms at 32 rows of 49,152 on a 2-core CPU), as
    FlashInfer's sampling kernels; float32 sums honour each token's probability to ~1e-7 of the
    total, so a token far below that (the flat tail of a 262K vocabulary) is drawn within a
    few percent of its probability rather than exactly.
    """
    weights = jnp.exp(logits - jnp.max(logits))
    cdf = jnp.cumsum(weights)
    ids = jnp.arange(logits.shape[0], dtype=jnp.int32)
    live = weights > 0
    first = jnp.min(jnp.where(live & (cdf > u * cdf[-1]), ids, logits.shape[0]))
    last = jnp.max(jnp.where(live, ids, 0))
    return jnp.where(first < logits.shape[0], first, last).astype(jnp.int32)


def _logprobs(logits, sampled, num_top: int):
    lp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(lp, sampled[:, None], axis=-1)[:, 0]
    rank = jnp.sum(lp > chosen[:, None], axis=-1).astype(jnp.int32) + 1
    top_lp, top_ids = jax.lax.top_k(lp, num_top)
    return chosen, rank, top_ids.astype(jnp.int32), top_lp


def sample(logits: jax.Array, s: SamplingMetadata, num_top_logprobs: int) -> dict:
    """Sample one token per row.

    Args:
      logits: [R, V] float32 raw logits.
      s: the step's `SamplingMetadata` (see there for names/shapes); penalties apply only
        when its penalty history is present, the structured-output mask only when its
        ``bitmask`` is.
      num_top_logprobs: static N of the returned top-N logprobs (the server maximum).

    Returns:
      dict with ``token_ids [R] int32``; ``logprob [R] float32`` and ``rank [R] int32``
      of the chosen token; ``top_ids [R, N] int32`` and ``top_logprobs [R, N] float32``.
      Logprobs are log-softmax of the logits after mask, bias and penalties, before
      temperature and filtering (zeros when no row asked for them).
    """
    logits = logits.astype(jnp.float32)
    if s.has_bitmask:  # static: the structured-output variant
        logits = apply_bitmask(logits, s.bitmask)
    logits = _apply_bias(logits, s)
    if s.has_history:  # static: the penalty variant
        logits = jax.lax.cond(s.any_penalty, _apply_penalties, lambda l, _: l, logits, s)
    R = logits.shape[0]
    greedy_ids = jax.lax.cond(jnp.any(s.greedy), lambda l: jnp.argmax(l, axis=-1).astype(jnp.int32),
                              lambda l: jnp.zeros(R, jnp.int32), logits)  # skipped when every row samples
    sampled_ids = jax.lax.cond(s.any_sampled, _sample, lambda l, _: greedy_ids, logits, s)
    token_ids = jnp.where(s.greedy, greedy_ids, sampled_ids)
    zeros = (jnp.zeros(R, jnp.float32), jnp.zeros(R, jnp.int32), jnp.zeros((R, num_top_logprobs), jnp.int32),
             jnp.zeros((R, num_top_logprobs), jnp.float32))
    chosen, rank, top_ids, top_lp = jax.lax.cond(
        s.any_logprobs, lambda l, t: _logprobs(l, t, num_top_logprobs), lambda l, t: zeros, logits, token_ids)
    return {"token_ids": token_ids, "logprob": chosen, "rank": rank, "top_ids": top_ids, "top_logprobs": top_lp}


def prompt_logprobs(logits: jax.Array, targets: jax.Array, num_top: int) -> dict:
    """Logprobs of given next tokens under raw logits (prompt logprobs, vLLM's meaning).

    Args:
      logits: [T, V] float32, the model's raw logits at every packed token of a step (no
        bias, penalties, mask or temperature: the model's own distribution).
      targets: [T] int32, the token whose logprob each row scores (the next prompt token);
        negative for rows nobody reads (their outputs are those of token 0).
      num_top: static N of the returned top-N alternatives (the server maximum).

    Returns:
      dict with ``logprob [T] float32`` and 1-based ``rank [T] int32`` of the target,
      ``top_ids [T, N] int32`` and ``top_logprobs [T, N] float32`` (best first).
    """
    chosen, rank, top_ids, top_lp = _logprobs(logits.astype(jnp.float32), jnp.maximum(targets, 0), num_top)
    return {"logprob": chosen, "rank": rank, "top_ids": top_ids, "top_logprobs": top_lp}

"""Sampler properties against NumPy references (jitted, per-row options mixed in one batch)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.runner import batch as B
from jaxinfer.runner.buckets import Bucket, BucketLadders
from jaxinfer.layers.sampler import sample
from jaxinfer.layers.step_metadata import SamplingMetadata, from_arrays

V = 64
LAYOUT = B.BatchLayout(BucketLadders(16, 8, 8), 16, V, 128, 8)


def arrays(rows: list[dict]) -> SamplingMetadata:
    """Sampling metadata of 8 rows, the first ``len(rows)`` set from ``rows`` (field -> value;
    ``hist``, ``bias``; ``penalized`` / ``want_logprobs`` turn the batch-wide flags on)."""
    a = B.empty_inputs(Bucket(8, 8, 0), LAYOUT).to_arrays()
    for i, r in enumerate(rows):
        for k, v in r.items():
            if k == "hist":
                a["hist_ids"][i, :len(v)] = v
                a["num_hist"][i] = len(v)
            elif k == "bias":
                a["bias_ids"][i, :len(v)] = list(v)
                a["bias_values"][i, :len(v)] = list(v.values())
            elif k not in ("penalized", "want_logprobs"):
                a[k][i] = v
    n = len(rows)
    a["any_sampled"][...] = np.any(~a["greedy"][:n])
    a["any_sort"][...] = np.any((a["top_k"][:n] < V) | (a["top_p"][:n] < 1))
    a["any_penalty"][...] = any(r.get("penalized", False) for r in rows)
    a["any_logprobs"][...] = any(r.get("want_logprobs", False) for r in rows)
    return from_arrays(SamplingMetadata, a)


_sample = jax.jit(lambda l, s: sample(l, s, 5))


def run(logits, rows):
    return jax.device_get(_sample(logits, arrays(rows)))


@pytest.fixture
def logits():
    return np.random.RandomState(0).randn(8, V).astype(np.float32) * 3


def test_greedy_and_greedy_equivalents(logits):
    rows = [{}, {"greedy": False, "temperature": 1.0, "top_k": 1, "seed_lo": 3},
            {"greedy": False, "temperature": 1.0, "top_p": 1e-9, "seed_lo": 4},
            {"greedy": False, "temperature": 1e-6, "seed_lo": 5}]
    out = run(logits, rows)
    assert (out["token_ids"][:4] == logits[:4].argmax(-1)).all()


def test_logit_bias_and_logprobs(logits):
    out = run(logits, [{"bias": {7: 100.0}, "want_logprobs": True}, {"want_logprobs": True}])
    assert out["token_ids"][0] == 7
    ref = logits[1] - np.log(np.exp(logits[1] - logits[1].max()).sum()) - logits[1].max()
    np.testing.assert_allclose(out["top_logprobs"][1], np.sort(ref)[::-1][:5], rtol=1e-5, atol=1e-5)
    assert out["top_ids"][1][0] == logits[1].argmax() and out["rank"][1] == 1
    np.testing.assert_allclose(out["logprob"][1], ref.max(), atol=1e-5)


def test_penalties_match_numpy(logits):
    hist = [5, 5, 9, 11]  # prompt [5], output [5, 9, 11]
    row = {"penalized": True, "presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.5,
           "hist": hist, "num_prompt": 1, "want_logprobs": True}
    out = run(logits, [row])
    ref = logits[0].astype(np.float64).copy()
    for t in set(hist):
        ref[t] = ref[t] / 1.5 if ref[t] > 0 else ref[t] * 1.5
    for t, c in {5: 1, 9: 1, 11: 1}.items():
        ref[t] -= 0.25 * c + 0.5
    lp = ref - np.log(np.exp(ref - ref.max()).sum()) - ref.max()
    np.testing.assert_allclose(out["top_logprobs"][0], np.sort(lp)[::-1][:5], atol=1e-5)
    assert out["token_ids"][0] == ref.argmax()


def test_top_k_top_p_min_p_support(logits):
    probs = np.exp(logits[0] - logits[0].max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    top3 = set(order[:3].tolist())
    nucleus = set(order[:np.searchsorted(np.cumsum(probs[order]), 0.6) + 1].tolist())
    minp = set(np.nonzero(probs >= 0.2 * probs.max())[0].tolist())
    seen = {"k": set(), "p": set(), "m": set()}
    for seed in range(60):
        out = run(np.repeat(logits[:1], 8, 0), [
            {"greedy": False, "top_k": 3, "seed_lo": seed},
            {"greedy": False, "top_p": 0.6, "seed_lo": seed},
            {"greedy": False, "min_p": 0.2, "seed_lo": seed}])
        for key, t in zip("kpm", out["token_ids"][:3]):
            seen[key].add(int(t))
    assert seen["k"] <= top3 and len(seen["k"]) > 1
    assert seen["p"] <= nucleus and seen["m"] <= minp


def test_sampling_distribution_and_seed_reproducibility():
    lg = np.log(np.array([0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4), np.float32))
    counts = np.zeros(V)
    for seed in range(400):
        out = run(lg[None, :].repeat(8, 0), [{"greedy": False, "seed_lo": seed * 8 + i} for i in range(8)])
        for t in out["token_ids"]:
            counts[t] += 1
    freq = counts / counts.sum()
    np.testing.assert_allclose(freq[:4], [0.5, 0.3, 0.15, 0.05], atol=0.03)
    a = run(lg[None].repeat(8, 0), [{"greedy": False, "seed_lo": 42, "output_index": 3}])["token_ids"][0]
    b = run(lg[None].repeat(8, 0), [{}, {}, {"greedy": False, "seed_lo": 42, "output_index": 3}])["token_ids"][2]
    assert a == b  # same seed and position: same token in any row of any batch


def test_temperature_sharpens():
    lg = np.log(np.array([0.6, 0.4] + [1e-9] * (V - 2), np.float32))
    hot = [run(lg[None].repeat(8, 0), [{"greedy": False, "temperature": 2.0, "seed_lo": s}])["token_ids"][0]
           for s in range(150)]
    cold = [run(lg[None].repeat(8, 0), [{"greedy": False, "temperature": 0.25, "seed_lo": s}])["token_ids"][0]
            for s in range(150)]
    assert np.mean(np.array(cold) == 0) > np.mean(np.array(hot) == 0) + 0.15


def nucleus_reference(logits, top_k, top_p):
    """Kept mask of top-k then top-p in float64 NumPy, as vLLM's sort-based apply_top_k_top_p:
    top-k keeps every logit at or above the k-th largest (ties whole), top-p renormalises over
    those and keeps each token whose mass strictly above it is below top_p (ties whole).
    Also returns where float32 may decide either way: mass above within 1e-6 of top_p < 1."""
    kept, unsure = np.zeros(logits.shape, bool), np.zeros(logits.shape, bool)
    for r, row in enumerate(np.asarray(logits, np.float64)):
        in_k = row >= np.sort(row)[::-1][min(top_k[r], row.size) - 1]
        p = np.where(in_k, np.exp(row - row.max()), 0.0)
        p /= p.sum()
        values, where = np.unique(p, return_inverse=True)
        above = (np.cumsum(values[::-1] * np.bincount(where)[::-1])[::-1] - values * np.bincount(where))[where]
        kept[r] = in_k & ((above < top_p[r]) | (top_p[r] >= 1))
        unsure[r] = in_k & (np.abs(above - top_p[r]) < 1e-6) & (top_p[r] < 1)
    return kept, unsure


def assert_same_kept(got, logits, s):
    want, unsure = nucleus_reference(logits, s.top_k, s.top_p)
    np.testing.assert_array_equal(np.isfinite(got) | unsure, want | unsure)
    assert unsure.sum() <= 8  # the comparison is not vacuous


@pytest.mark.parametrize("top_k,top_p,spread,step", [
    (-1, 0.9, 1.0, 0.0),     # flat: the nucleus is thousands of tokens
    (-1, 0.3, 3.0, 0.0),
    (-1, 0.999, 3.0, 0.0),
    (1000, 0.5, 1.0, 0.0),
    (300, 1.0, 1.0, 0.0),    # top-k alone, past the candidates
    (-1, 0.7, 2.0, 0.25),    # logits on a grid of 0.25: ties at the cut
    (2000, 0.8, 2.0, 0.5),
    (1, 0.9, 1.0, 0.0),
])
def test_bisection_filter_equals_full_sort(top_k, top_p, spread, step):
    """The sort-free fallback keeps exactly the tokens a float64 sort-based filter keeps, ties
    included (a float32 sort's running sum once dropped 226 tail tokens at top_p = 1)."""
    from jaxinfer.layers import sampler

    V, R = 8192, 3
    rng = np.random.default_rng(int(spread * 10 + step * 100) + top_k % 89)
    raw = rng.normal(0, spread, (R, V))
    logits = jnp.asarray(np.round(raw / step) * step if step else raw, jnp.float32)
    layout = B.BatchLayout(BucketLadders(R, R, 4), 16, V, 128, 8)
    s = dataclasses.replace(B.empty_inputs(Bucket(R, R, 4), layout, penalties=False, mask=False).sampling,
                            top_k=np.full((R,), V if top_k < 0 else top_k, np.int32),
                            top_p=np.array([top_p, min(1.0, top_p + 0.05), top_p], np.float32))
    got = np.asarray(jax.jit(sampler._filter_bisect)(logits, s))
    assert_same_kept(got, logits, s)
    np.testing.assert_array_equal(got[np.isfinite(got)], np.asarray(logits)[np.isfinite(got)])


def test_ordered_keys_follow_the_float_order():
    from jaxinfer.layers import sampler

    x = np.array([-np.inf, -3e38, -2.5, -1e-30, -0.0, 0.0, 1e-30, 1e-7, 0.5, 2.5, 3e38, np.inf], np.float32)
    keys = np.asarray(sampler._ordered_keys(jnp.asarray(x)))
    assert (np.diff(keys.astype(np.int64)) >= 0).all() and keys[4] + 1 == keys[5]


@pytest.mark.parametrize("top_k,top_p", [(50, 1.0), (256, 0.9), (-1, 0.3), (-1, 0.999), (1000, 0.5), (7, 0.2)])
def test_top_candidates_filter_equals_full_sort(top_k, top_p):
    """A large vocabulary filters on lax.top_k candidates; the kept set equals a float64 sort's,
    both when the candidates cover the filter and when the step falls back to bisection."""
    from jaxinfer.layers import sampler

    V, R = 8192, 4
    rng = np.random.default_rng(top_k % 97)
    logits = jnp.asarray(rng.normal(0, 3.0, (R, V)), jnp.float32)
    layout = B.BatchLayout(BucketLadders(R, R, 4), 16, V, 128, 8)
    s = dataclasses.replace(B.empty_inputs(Bucket(R, R, 4), layout, penalties=False, mask=False).sampling,
                            top_k=np.full((R,), V if top_k < 0 else top_k, np.int32),
                            top_p=np.full((R,), top_p, np.float32))
    got = np.asarray(jax.jit(sampler._filter_top)(logits, s))
    assert_same_kept(got, logits, s)
    kept = np.isfinite(got).sum(-1)  # the filters do something here
    assert (kept < V).all() and (kept >= 1).all()


def test_inverse_cdf_draws_follow_the_softmax_and_skip_filtered_tokens():
    """The draw's frequencies match softmax(logits); a -inf token is never drawn, at u = 0 or
    at the largest uniform below 1 either (the point is kept under the running total)."""
    from jaxinfer.layers import sampler

    logits = jnp.log(jnp.asarray([0.0, 0.5, 0.3, 0.0, 0.2, 0.0], jnp.float32))  # -inf at 0, 3, 5
    keys = jax.random.split(jax.random.PRNGKey(7), 6000)
    us = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    draws = np.asarray(jax.jit(jax.vmap(sampler._inverse_cdf, in_axes=(None, 0)))(logits, us))
    freq = np.bincount(draws, minlength=6) / draws.size
    np.testing.assert_allclose(freq, [0, 0.5, 0.3, 0, 0.2, 0], atol=0.025)
    edges = jnp.asarray([0.0, np.nextafter(np.float32(1), np.float32(0))], jnp.float32)
    assert np.asarray(jax.vmap(sampler._inverse_cdf, in_axes=(None, 0))(logits, edges)).tolist() == [1, 4]


def test_inverse_cdf_never_draws_a_filtered_token_at_the_boundaries():
    """Uniforms placed exactly on the running sum's steps (and one ulp below): XLA's cumsum is
    not exactly monotone, and a count of steps below the point once landed on -inf tokens
    (803 of 65,536 draws here)."""
    from jaxinfer.layers import sampler

    rng = np.random.default_rng(1)
    draw = jax.jit(jax.vmap(sampler._inverse_cdf, in_axes=(None, 0)))
    for _ in range(8):
        lg = rng.normal(0, 2, 4096).astype(np.float32)
        lg[rng.random(4096) < 0.5] = -np.inf
        c = np.asarray(jnp.cumsum(jnp.exp(jnp.asarray(lg) - lg.max())))
        us = np.concatenate([c / c[-1], np.nextafter(c / c[-1], 0)])
        us = np.clip(us, 0, np.nextafter(np.float32(1), np.float32(0))).astype(np.float32)
        assert np.isfinite(lg[np.asarray(draw(jnp.asarray(lg), jnp.asarray(us)))]).all()


def _filter_rows(rows, top_k, top_p):
    from jaxinfer.layers import sampler

    R, V = rows.shape
    layout = B.BatchLayout(BucketLadders(R, R, 4), 16, V, 128, 8)
    s = dataclasses.replace(B.empty_inputs(Bucket(R, R, 4), layout, penalties=False, mask=False).sampling,
                            top_k=np.asarray(top_k, np.int32), top_p=np.asarray(top_p, np.float32))
    return np.isfinite(np.asarray(jax.jit(sampler._filter_top)(jnp.asarray(rows, jnp.float32), s)))


@pytest.mark.parametrize("top_k,top_p,expect", [(3, 0.05, 1000), (1000, 1e-40, 1), (1000, 1e-50, 1)])
def test_a_rows_filter_does_not_depend_on_its_batch(top_k, top_p, expect):
    """A row filtered alone and beside a row that needs the bisection fallback keeps the same
    tokens: logits tied with the k-th past the 256 candidates count in top-p's normaliser on
    both paths, and a top_p that is 0 in float32 still keeps the best token."""
    row = np.array([3.0, 2.0] + [0.0] * 998)
    flat = np.random.default_rng(0).normal(0, 0.1, 1000)
    alone = _filter_rows(row[None], [top_k], [top_p])[0]
    beside = _filter_rows(np.stack([row, flat]), [top_k, 1000], [top_p, 0.9])[0]
    assert alone.sum() == beside.sum() == expect
    np.testing.assert_array_equal(alone, beside)

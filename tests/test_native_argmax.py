"""The C++ row argmax (`jaxinfer.kernels.cpu.argmax`): the same ids as ``jnp.argmax`` on random rows,
ties, rows of -inf, +inf and NaN (the first NaN wins, as in jnp), widths that are not a multiple
of the vector width; and the engine's steps call it on one CPU device with the same greedy
outputs as ``jnp.argmax``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_bf16_llm
from jaxinfer import SamplingParams
from jaxinfer.kernels.cpu import argmax as native_argmax

pytestmark = pytest.mark.skipif(not native_argmax.available(), reason="no C++ compiler: the loop cannot be built")


def rows_with_edge_cases(R: int, V: int) -> np.ndarray:
    x = np.random.default_rng(R * 1000 + V).standard_normal((R, V)).astype(np.float32)
    special = [
        lambda r: r.fill(-np.inf),                               # every value -inf: index 0
        lambda r: r.__setitem__(slice(None), 0.5),               # all tied: index 0
        lambda r: r.__setitem__([V // 3, V - 1], 9.0),           # a tie: the first
        lambda r: r.__setitem__([V - 1], np.nan),                # NaN last: still the NaN
        lambda r: r.__setitem__([V // 2, 1], [np.nan, np.nan]),  # two NaNs: the first
        lambda r: r.__setitem__([V - 1, 0], [np.inf, np.nan]),   # NaN beats +inf
        lambda r: r.__setitem__([V - 1], np.inf),                # +inf in the tail
    ]
    for i, put in enumerate(special[:R]):
        put(x[i])
    return x


@pytest.mark.parametrize("R,V", [(1, 49152), (7, 49152), (32, 1000), (3, 17), (9, 16), (8, 5), (4, 1)])
def test_ids_equal_jnp_argmax(R, V):
    x = jnp.asarray(rows_with_edge_cases(R, V))
    got = jax.jit(native_argmax.argmax)(x)
    assert got.shape == (R,) and got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(x, axis=-1)))


def test_bfloat16_logits_are_widened_first():
    x = jnp.asarray(rows_with_edge_cases(5, 300), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(jax.jit(native_argmax.argmax)(x)), np.asarray(jnp.argmax(x, axis=-1)))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="logits"):
        native_argmax.argmax(jnp.zeros((3,), jnp.float32))
    with pytest.raises(ValueError, match="logits"):
        native_argmax.argmax(jnp.zeros((3, 0), jnp.float32))


def test_engine_steps_call_the_loop_with_jnp_outputs(monkeypatch):
    """Greedy decoding of a tiny model: every compiled step calls the loop when it is on, none
    when it is off, and the token ids are the same."""
    prompts = [[5, 6, 7, 8, 9], [11, 12], [3] * 20]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ids = {}
    for on in (True, False):
        llm = tiny_bf16_llm(native_argmax=on)
        assert llm.engine.runner.native_argmax is on
        ids[on] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        texts = [e.as_text() for e in llm.engine.runner._executables.values()]
        assert texts and all((native_argmax.TARGET in t) is on for t in texts)
    assert ids[True] == ids[False]

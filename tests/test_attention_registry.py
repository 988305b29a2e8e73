"""The attention-backend registry (`jaxinfer.layers.attention.registry`) and the KV storage
type (`jaxinfer.layers.attention.kv_storage.KVStorage`): the names the config, the server's
choices and the runner read are the registry's keys, each key builds its backend, and each
storage format allocates, writes and reads back what the old per-format code did."""
from __future__ import annotations

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.config import EngineConfig
from jaxinfer.layers.attention.kv_quant import QuantKV, as_stored
from jaxinfer.layers.attention.base import AttentionBackend
from jaxinfer.layers.attention.kv_storage import BF16_BITS, KVStorage, gather_pages, write_kv
from jaxinfer.layers.attention.registry import ATTENTION_BACKENDS, backend_class, get_attention_backend


def test_every_registered_name_builds_its_backend():
    for name in ATTENTION_BACKENDS:
        backend = get_attention_backend(name, mesh=None, native=False, interpret=True)
        assert isinstance(backend, AttentionBackend) and backend.name == name and hash(backend) is not None
    with pytest.raises(ValueError, match="unknown attention backend"):
        backend_class("flash")


def test_config_and_server_read_the_registry_keys():
    with pytest.raises(ValueError, match="xla, pallas"):
        EngineConfig("m", attention_backend="flash")
    for name in ATTENTION_BACKENDS:
        assert EngineConfig("m", attention_backend=name).attention_backend == name
    import server

    action = next(a for a in server.build_parser()._actions if "--attention-backend" in a.option_strings)
    assert list(action.choices) == list(ATTENTION_BACKENDS)


def test_the_config_and_the_registry_import_no_jax():
    code = "import sys, jaxinfer.config, jaxinfer.layers.attention.registry; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dtype, platform, kind", [("float32", "cpu", "float"), ("bfloat16", "cpu", "bf16_bits"),
                                                   ("bfloat16", "gpu", "float")])
def test_float_formats(dtype, platform, kind):
    kv = KVStorage.select(dtype, platform)
    assert kv.kind == kind and KVStorage.of(kv.alloc((1, 2, 4, 1, 8))) == kv
    assert (kv.dtype == BF16_BITS) == (kind == "bf16_bits")
    assert kv.bytes_per_token_head(64) == 64 * jnp.dtype(kv.dtype).itemsize


@pytest.mark.parametrize("storage", [("float32", "auto"), ("bfloat16", "auto"), ("float32", "int8"),
                                     ("float32", "fp8")])
def test_a_write_reads_back_as_stored(storage):
    kv = KVStorage.select(storage[0], "cpu", storage[1])
    cache = kv.alloc((2, 3, 4, 2, 8))
    assert isinstance(cache, QuantKV) == kv.quantized and KVStorage.of(cache) == kv
    new = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 8)), jnp.float32)
    cache = write_kv(cache, jnp.int32(1), jnp.array([5], jnp.int32), new)  # block 1, offset 1
    got = gather_pages(cache, jnp.int32(1), jnp.array([1]))[0, 1]
    want = as_stored(new[0], kv.kind) if kv.quantized else new[0].astype(jnp.dtype(storage[0]))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    np.testing.assert_array_equal(np.asarray(kv.as_stored(new[0]), np.float32), np.asarray(want, np.float32)
                                  if kv.quantized else np.asarray(new[0]))

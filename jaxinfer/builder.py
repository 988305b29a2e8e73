"""Assemble an `LLMEngine` from an `EngineConfig`: weights, tokenizer, KV pool, runner.

Owns the KV pool sizing rule (blocks from a memory budget), the attention-backend
default (pallas on GPU, xla elsewhere) and the warm-up call. ``load_format="dummy"``
builds random weights of the right shapes (performance work without a checkpoint).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxinfer.config import CacheConfig, EngineConfig, ModelConfig
from jaxinfer.engine import LLMEngine
from jaxinfer.model_runner import ModelRunner

logger = logging.getLogger(__name__)

CPU_DEFAULT_KV_BYTES = 1 << 30  # 1 GiB when the device reports no memory size


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: str, tensor_parallel_size: int = 1) -> int:
    """Bytes of K and V for one block over all layers on one device: 2 * L * bs * K_dev * H
    * itemsize, with K_dev = K / TP when TP divides K, else K (replicated; `jaxinfer.sharding`)."""
    from jaxinfer.sharding import kv_heads_per_device

    k_dev = kv_heads_per_device(cfg, tensor_parallel_size)
    return 2 * cfg.num_hidden_layers * block_size * k_dev * cfg.head_dim * jnp.dtype(dtype).itemsize


def kv_budget_bytes(device_memory: int, memory_fraction: float, weight_bytes: int) -> int:
    """Per-device KV budget: ``device_memory * memory_fraction - weight_bytes`` (bytes per
    device; negative when the weights do not fit). Blocks = budget // `kv_bytes_per_block`.
    Shared by `plan_num_blocks` and ``python -m jaxinfer.plan``."""
    return int(device_memory * memory_fraction) - weight_bytes


def plan_num_blocks(cfg: ModelConfig, cache: CacheConfig, dtype: str, weight_bytes: int = 0,
                    tensor_parallel_size: int = 1) -> tuple[int, str]:
    """Number of KV blocks (including the null block) and a sentence saying why.

    Per-device accounting: ``weight_bytes`` is what one device holds, ``kv_cache_memory``
    is a per-device budget, and a block costs `kv_bytes_per_block` on each device of
    the TP group. Precedence: explicit ``num_blocks``; ``kv_cache_memory`` bytes; else
    ``kv_cache_memory_fraction`` of the device's memory minus the weights; else 1 GiB.
    """
    per_block = kv_bytes_per_block(cfg, cache.block_size, dtype, tensor_parallel_size)
    if cache.num_blocks is not None:
        return cache.num_blocks, f"{cache.num_blocks} blocks (set explicitly)"
    if cache.kv_cache_memory is not None:
        budget, why = cache.kv_cache_memory, "--kv-cache-memory"
    else:
        stats = jax.devices()[0].memory_stats() or {}
        limit = stats.get("bytes_limit")
        if limit:
            budget = kv_budget_bytes(limit, cache.kv_cache_memory_fraction, weight_bytes)
            why = f"{cache.kv_cache_memory_fraction:.0%} of device memory minus weights"
        else:
            budget, why = CPU_DEFAULT_KV_BYTES, "default CPU budget"
    if budget // per_block < 2:  # block 0 is the null block: nothing could ever run
        raise ValueError(f"the KV budget ({why}: {budget} bytes) holds {max(0, budget // per_block)} blocks of "
                         f"{per_block} bytes; at least 2 are needed (block 0 is the null block)")
    n = budget // per_block
    return n, f"{n} blocks x {per_block / 2**20:.2f} MiB per device = {n * per_block / 2**30:.2f} GiB ({why})"


def check_model_fits(config: EngineConfig, model_config: ModelConfig) -> None:
    """Refuse a ``max_model_len`` past the model's context (as vLLM does).

    Raises:
      ValueError: ``max_model_len`` > the model's context (`ModelConfig.max_context_len`:
        ``max_position_embeddings``, extended by RoPE scaling).
    """
    limit = model_config.max_context_len
    if config.scheduler.max_model_len > limit:
        raise ValueError(f"max_model_len {config.scheduler.max_model_len} exceeds the model's context of {limit} "
                         "tokens (max_position_embeddings, times the RoPE scaling factor if any)")


def enable_compilation_cache(path: str | None = None) -> None:
    """Turn on JAX's persistent compilation cache (warm-up of a known config then loads
    executables from disk: ~6x faster start on CPU). Respects a directory already set
    through JAX's own ``JAX_COMPILATION_CACHE_DIR``."""
    if jax.config.jax_compilation_cache_dir:
        return
    path = path or str(Path.home() / ".cache" / "jaxinfer" / "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def default_backend() -> str:
    return "pallas" if jax.default_backend() == "gpu" else "xla"


def load_model(config: EngineConfig, load_format: str = "auto", weights_dir: str = "weights"):
    """Returns (model_config, params, tokenizer or None, model folder or None).

    Raises:
      ValueError: an unknown ``load_format`` or model.
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    from jaxinfer.checkpoint import load_params
    from jaxinfer.weights import resolve_model

    path = Path(config.model_path)
    if load_format == "dummy" and path.suffix == ".json" and path.is_file():
        return ModelConfig.from_dict(json.loads(path.read_text())), None, None, None
    folder = resolve_model(config.model_path, weights_dir)
    model_config = ModelConfig.from_dir(folder)
    tokenizer = None
    if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
        from jaxinfer.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(folder)
    shardings = None
    if load_format != "dummy" and (config.parallel.world_size > 1 or jax.process_count() > 1):
        from jaxinfer import sharding  # restore each array straight into its shards

        par = config.parallel
        mesh = sharding.make_mesh(par.tensor_parallel_size, par.data_parallel_size)
        shardings = sharding.param_shardings(model_config, mesh)
    params = None if load_format == "dummy" else load_params(folder / "params", dtype=config.dtype,
                                                             shardings=shardings)
    return model_config, params, tokenizer, folder


def build_engine(config: EngineConfig, *, load_format: str = "auto", weights_dir: str = "weights",
                 model_config: ModelConfig | None = None, params=None, tokenizer=None) -> LLMEngine:
    """Load (or take) weights and tokenizer, size the KV pool, build and warm up the engine.

    Args:
      load_format: "auto" (orbax checkpoint) or "dummy" (random weights).
      model_config, params, tokenizer: pass all three to skip loading (tests).
    """
    enable_compilation_cache()
    if model_config is None:
        model_config, params, tokenizer, _ = load_model(config, load_format, weights_dir)
    check_model_fits(config, model_config)
    if config.parallel.world_size > 1 or jax.process_count() > 1:  # mesh: TP and/or DP replicas
        from jaxinfer.dp_router import build_parallel_engine

        return build_parallel_engine(config, model_config, params, tokenizer)
    if params is None:
        from jaxinfer.params import init_params

        params = init_params(model_config, config.dtype, seed=config.seed)
    params = jax.device_put(params)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    num_blocks, why = plan_num_blocks(model_config, config.cache, config.dtype, weight_bytes)
    logger.info("KV cache: %s", why)
    backend = config.attention_backend or default_backend()
    runner = ModelRunner(model_config, params, num_blocks, config.cache.block_size, config.dtype, backend,
                         config.max_logprobs, config.return_logits)
    engine = LLMEngine(config, model_config, runner, num_blocks, tokenizer)
    engine.kv_cache_description = why
    if config.warmup:
        engine.warmup()
    return engine


"""Assemble an `LLMEngine` from an `EngineConfig`: weights, tokenizer, KV pool, runner.

`build_replica` builds one engine on one device or on one replica's mesh: the only
place a runner and engine are put together (`jaxinfer.engine.dp_router.build_parallel_engine`
calls it once per data-parallel replica).

Owns the KV pool sizing rule (blocks from a memory budget: ``--gpu-memory-utilization``
of the device minus weights and an activation estimate), the ``dtype="auto"`` and
attention-backend defaults (bfloat16 and pallas on GPU; float32 and xla on CPU), the
start-up line of effective settings and the warm-up call (with progress). ``load_format="dummy"``
builds random weights of the right shapes (performance work without a checkpoint).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxinfer.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from jaxinfer.platform.dtype import auto_dtype
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.runner.model_runner import ModelRunner
from jaxinfer.platform.execution_plan import resolve_plan
from jaxinfer.engine.warmup_progress import WarmupProgress

logger = logging.getLogger(__name__)

CPU_DEFAULT_KV_BYTES = 4 << 30  # KV budget on a CPU (no device memory size): 4 GiB,
CPU_KV_MAX_RAM_FRACTION = 0.25  # but never more than a quarter of the machine's memory


def cpu_default_kv_bytes() -> int:
    """The default KV budget on a CPU: `CPU_DEFAULT_KV_BYTES`, capped at
    `CPU_KV_MAX_RAM_FRACTION` of physical memory (a small laptop keeps room to work).

    4 GiB holds ~5,800 blocks of SmolLM2-135M in float32: about 100 requests of 512 + 256
    tokens at once above the 15% watermark, where 1 GiB held 26 and turned a 32-client
    load away."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: no cap
        return CPU_DEFAULT_KV_BYTES
    return min(CPU_DEFAULT_KV_BYTES, int(ram * CPU_KV_MAX_RAM_FRACTION))


XLA_WORKSPACE_BYTES = 256 << 20  # compiler scratch, cuBLAS/cuDNN workspaces: a fixed allowance


def resolve_dtype(dtype: str) -> str:
    """``"auto"`` -> `jaxinfer.platform.dtype.auto_dtype` of the first device's platform (logged:
    ``dtype auto -> bfloat16 (cpu)``); ``"float32"`` / ``"bfloat16"`` unchanged.

    Call it after ``jax.distributed`` is initialised (it asks JAX for its devices).
    """
    if dtype != "auto":
        return dtype
    platform = jax.devices()[0].platform
    resolved = auto_dtype(platform)
    logger.info("dtype auto -> %s (%s)", resolved, platform)
    return resolved


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: str, tensor_parallel_size: int = 1,
                       kv_cache_dtype: str = "auto") -> int:
    """Bytes of K and V for one block over all layers on one device: 2 * L * bs * K_dev * b,
    with K_dev = K / TP when TP divides K, else K (replicated; `jaxinfer.distributed.sharding`), and b
    the bytes of one token-head (`jaxinfer.layers.attention.kv_quant.kv_bytes_per_token_head`: H * itemsize
    of ``dtype``, or H + 2 for an 8-bit ``kv_cache_dtype``)."""
    from jaxinfer.layers.attention.kv_quant import kv_bytes_per_token_head
    from jaxinfer.distributed.sharding import kv_heads_per_device

    k_dev = kv_heads_per_device(cfg, tensor_parallel_size)
    per_head = kv_bytes_per_token_head(cfg.head_dim, kv_cache_dtype, jnp.dtype(dtype).itemsize)
    return 2 * cfg.num_hidden_layers * block_size * k_dev * per_head


def activation_reserve_bytes(cfg: ModelConfig, sched: SchedulerConfig) -> int:
    """Estimated peak activation memory of one step, in bytes per device (an upper-side
    estimate; vLLM measures it with a profiling run instead).

    One layer's live float32 activations for the whole token budget T =
    ``max_num_batched_tokens`` (layers run in a scan, so one layer's worth is live):
    T * (4 D + 2 F + (N + 2 K) H) * 4 bytes, doubled for XLA temporaries; plus the
    sampler's float32 logits and their softmax / sort / logprob copies, 4 * S * V * 4
    bytes for S = ``max_num_seqs`` rows; plus `XLA_WORKSPACE_BYTES`.
    """
    per_token = 4 * cfg.hidden_size + 2 * cfg.intermediate_size + (
        cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    layer = 2 * sched.max_num_batched_tokens * per_token * 4
    logits = 4 * sched.max_num_seqs * cfg.vocab_size * 4
    return layer + logits + XLA_WORKSPACE_BYTES


def kv_budget_bytes(device_memory: int, memory_fraction: float, weight_bytes: int, reserve_bytes: int = 0) -> int:
    """Per-device KV budget: ``device_memory * memory_fraction - weight_bytes - reserve_bytes``
    (bytes per device; negative when the weights do not fit). Blocks = budget //
    `kv_bytes_per_block`. Shared by `plan_num_blocks` and ``python -m jaxinfer.plan``."""
    return int(device_memory * memory_fraction) - weight_bytes - reserve_bytes


def device_memory_bytes() -> int | None:
    """Memory JAX's allocator may use on this process's first device
    (``memory_stats()["bytes_limit"]``), or None where the device reports none (CPU). On
    GPU this is by default 75% of the device (``XLA_PYTHON_CLIENT_MEM_FRACTION``): raise
    that to give the server more. (A local device: in a multi-process run the others'
    devices are not addressable here.)"""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("bytes_limit") or None


def kv_pool_budget(cache: CacheConfig, device_memory: int | None, weight_bytes: int,
                   reserve_bytes: int, host_devices: int = 1) -> tuple[int, str]:
    """The KV budget in bytes per device and where it came from (a pure function).

    Precedence: ``cache.kv_cache_memory``; else, with ``device_memory`` bytes known (an
    accelerator), ``gpu_memory_utilization * device_memory - weight_bytes -
    reserve_bytes`` (vLLM's ``--gpu-memory-utilization``: weights, activations and KV
    together stay under that fraction); else `cpu_default_kv_bytes` (an explicit
    ``gpu_memory_utilization`` is then logged as not applying), split evenly over the
    ``host_devices`` CPU devices of the engine, which all live in the host's memory (a
    TP 2 x DP 2 engine on 4 CPU devices shares one 4 GiB budget, not 4 x 4 GiB).
    ``num_blocks`` is handled by `plan_num_blocks` before this is asked.
    """
    if cache.kv_cache_memory is not None:
        return cache.kv_cache_memory, "--kv-cache-memory, or this model's even share of the budget"
    if device_memory:
        util = cache.memory_utilization
        budget = kv_budget_bytes(device_memory, util, weight_bytes, reserve_bytes)
        return budget, (f"gpu_memory_utilization {util:g} x {device_memory / 2**30:.2f} GiB - weights "
                        f"{weight_bytes / 2**30:.2f} GiB - activations {reserve_bytes / 2**30:.2f} GiB")
    if cache.gpu_memory_utilization is not None:
        logger.info("--gpu-memory-utilization does not apply on CPU (no device memory size): KV budget %.1f GiB "
                    "(set --kv-cache-memory or --num-blocks to change it)", cpu_default_kv_bytes() / 2**30)
    share = f", shared by {host_devices} CPU devices" if host_devices > 1 else ""
    return (cpu_default_kv_bytes() // max(1, host_devices),
            f"default CPU budget (4 GiB, at most a quarter of RAM{share})")


def size_kv_pool(cfg: ModelConfig, cache: CacheConfig, dtype: str, weight_bytes: int = 0,
                 tensor_parallel_size: int = 1, scheduler: SchedulerConfig | None = None,
                 host_devices: int | None = None, device_memory: int | None = None) -> tuple[int, int, str]:
    """The KV pool rule, shared by the server (`plan_num_blocks`) and ``python -m jaxinfer.plan``:
    ``(blocks, bytes per block per device, why)``; blocks may be < 2 (nothing fits) here.

    Per-device accounting: ``weight_bytes`` is what one device holds, ``kv_cache_memory``
    is a per-device budget, and a block costs `kv_bytes_per_block` on each device of
    the TP group. Precedence: explicit ``num_blocks``; else `kv_pool_budget` of the
    device's memory with `activation_reserve_bytes` of ``scheduler`` (default limits
    when None). ``host_devices``: the engine's devices in all (default: the TP group),
    over which the CPU default budget is split. ``device_memory``: bytes of one device
    (None: `device_memory_bytes` of this process's device; the planner passes the memory it is told).
    """
    per_block = kv_bytes_per_block(cfg, cache.block_size, dtype, tensor_parallel_size, cache.kv_cache_dtype)
    if cache.num_blocks is not None:
        return cache.num_blocks, per_block, f"{cache.num_blocks} blocks (set explicitly)"
    reserve = activation_reserve_bytes(cfg, scheduler or SchedulerConfig())
    memory = device_memory_bytes() if device_memory is None else device_memory
    budget, why = kv_pool_budget(cache, memory, weight_bytes, reserve, host_devices or tensor_parallel_size)
    n = max(0, budget // per_block)
    return n, per_block, (f"{n} blocks x {per_block / 2**20:.2f} MiB per device = {n * per_block / 2**30:.2f} GiB "
                          f"({why})")


def plan_num_blocks(cfg: ModelConfig, cache: CacheConfig, dtype: str, weight_bytes: int = 0,
                    tensor_parallel_size: int = 1, scheduler: SchedulerConfig | None = None,
                    host_devices: int | None = None, device_memory: int | None = None) -> tuple[int, str]:
    """Number of KV blocks (including the null block) and a sentence saying why: `size_kv_pool`
    (the same arguments), which ``python -m jaxinfer.plan`` also calls.

    Raises:
      ValueError: the budget holds fewer than 2 blocks.
    """
    n, per_block, why = size_kv_pool(cfg, cache, dtype, weight_bytes, tensor_parallel_size, scheduler, host_devices,
                                     device_memory)
    if n < 2:  # block 0 is the null block: nothing could ever run
        raise ValueError(f"the KV budget ({why}) holds {n} blocks of {per_block} bytes; at least 2 are needed "
                         "(block 0 is the null block)")
    return n, why


def max_concurrency_at_full_length(num_blocks: int, block_size: int, watermark: float, max_model_len: int) -> int:
    """Sequences of ``max_model_len`` tokens the KV pool holds at once:
    floor(usable / ceil(max_model_len / block_size)), where usable = the blocks past the
    null block minus the admission watermark (ceil(watermark * (num_blocks - 1)), as
    `jaxinfer.core.sched.scheduler.Scheduler` keeps free). ``max_num_seqs`` caps running sequences
    separately."""
    usable = num_blocks - 1
    usable -= math.ceil(watermark * usable)
    return max(0, usable) // math.ceil(max_model_len / block_size)


def settings_line(config: EngineConfig, backend: str, num_blocks: int, plan=None) -> str:
    """The one start-up line of effective settings (``num_blocks`` per replica; ``plan``: the
    runner's `jaxinfer.platform.execution_plan.ExecutionPlan`, described at the end when given)."""
    sc, cc = config.scheduler, config.cache
    conc = max_concurrency_at_full_length(num_blocks, cc.block_size, cc.watermark, sc.max_model_len)
    par = config.parallel
    layout = f" tp={par.tensor_parallel_size} dp={par.data_parallel_size}" if par.world_size > 1 else ""
    if par.expert_parallel_degree > 1:
        layout += f" ep={par.expert_parallel_degree}"
    spec = config.speculative
    extras = (f" quantization={config.quantization}" if config.quantization else "") + (
        f" speculative={spec.method} k={spec.num_speculative_tokens}" if spec is not None else "") + (
        f" runner=pooling pooling_type={config.pooling_type}" if config.runner == "pooling" else "")
    return (f"model={config.model_path} dtype={config.dtype}{extras} kv_cache_dtype={cc.kv_cache_dtype} "
            f"backend={backend}{layout} "
            f"max_model_len={sc.max_model_len} max_num_seqs={sc.max_num_seqs} "
            f"max_num_batched_tokens={sc.max_num_batched_tokens} kv_blocks={num_blocks} "
            f"(block_size {cc.block_size}, the null block included) max_concurrency_at_full_length={conc}"
            + (f" plan: {plan.describe()}" if plan is not None else ""))


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
    """The attention backend when none is configured, before the model is known
    (`jaxinfer.platform.execution_plan.default_attention_backend`; the plan refines it per model)."""
    from jaxinfer.platform.execution_plan import default_attention_backend, gpu_compute_capability

    platform = jax.default_backend()
    return default_attention_backend(platform, gpu_compute_capability() if platform == "gpu" else None)


def load_model(config: EngineConfig, load_format: str = "auto", weights_dir: str = "weights"):
    """Returns (model_config, params, tokenizer or None, model folder or None).

    Raises:
      ValueError: an unknown ``load_format`` or model.
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    from jaxinfer.weights.checkpoint import load_params
    from jaxinfer.weights.catalog import resolve_model

    path = Path(config.model_path)
    if load_format == "dummy" and path.suffix == ".json" and path.is_file():
        tokenizer = None if config.tokenizer is None else load_tokenizer(config.tokenizer, weights_dir)
        return ModelConfig.from_dict(json.loads(path.read_text())), None, tokenizer, None
    folder = resolve_model(config.model_path, weights_dir)
    model_config = ModelConfig.from_dir(folder)
    if config.tokenizer is not None:
        tokenizer = load_tokenizer(config.tokenizer, weights_dir)
    elif has_tokenizer(folder):
        tokenizer = load_tokenizer(folder, weights_dir)
    else:
        tokenizer = None
    shardings = None
    if load_format != "dummy" and (config.parallel.world_size > 1 or jax.process_count() > 1):
        from jaxinfer.distributed import sharding  # restore each array straight into its shards

        par = config.parallel
        mesh = sharding.make_mesh(par.tensor_parallel_size, par.data_parallel_size,
                                  expert_parallel_size=par.expert_parallel_degree)
        shardings = sharding.param_shardings(model_config, mesh)
    params = None if load_format == "dummy" else load_params(folder / "params", dtype=resolve_dtype(config.dtype),
                                                             shardings=shardings)
    return model_config, params, tokenizer, folder


def has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists()


def load_tokenizer(path_or_name: str | Path, weights_dir: str = "weights"):
    """The tokenizer (and its chat template) of a folder, or of a model name under
    ``weights_dir`` (``--tokenizer``).

    Raises:
      ValueError: neither a folder with tokenizer files nor such a name.
    """
    from jaxinfer.tokenizer.tokenizer import Tokenizer

    for folder in (Path(path_or_name), Path(weights_dir) / str(path_or_name)):
        if folder.is_dir() and has_tokenizer(folder):
            return Tokenizer.from_dir(folder)
    raise ValueError(f"no tokenizer at {str(path_or_name)!r}: expected a folder with tokenizer.json or "
                     f"tokenizer_config.json, or the name of a model under {weights_dir}/")


def apply_chat_template(tokenizer, spec: str | None):
    """``tokenizer`` with the template of a ``--chat-template`` value (`jaxinfer.tokenizer.templates.load_chat_template`),
    as a new `jaxinfer.tokenizer.tokenizer.Tokenizer` (the given one is unchanged); ``spec`` None: ``tokenizer`` itself.

    Raises:
      ValueError: ``spec`` is not a file, a bundled name or template text; or the model has no tokenizer.
    """
    if spec is None:
        return tokenizer
    from jaxinfer.tokenizer.templates import load_chat_template

    template = load_chat_template(spec)
    if tokenizer is None:
        raise ValueError("--chat-template needs a tokenizer, and this model has none (pass --tokenizer)")
    if tokenizer.has_chat_template and tokenizer.chat_template != template:
        logger.info("--chat-template replaces the tokenizer's own chat template")
    return tokenizer.with_chat_template(template)


def build_engine(config: EngineConfig, *, load_format: str = "auto", weights_dir: str = "weights",
                 model_config: ModelConfig | None = None, params=None, tokenizer=None,
                 use_tqdm: bool | None = None, draft_model_config: ModelConfig | None = None,
                 draft_params=None, plan=None) -> LLMEngine:
    """Load (or take) weights and tokenizer, size the KV pool, build and warm up the engine.

    ``config.chat_template`` (``--chat-template``) replaces the tokenizer's chat template here.

    Logs one line of effective settings (`settings_line`) and the warm-up's progress
    (`jaxinfer.engine.warmup_progress.WarmupProgress`).

    Args:
      load_format: "auto" (orbax checkpoint) or "dummy" (random weights).
      model_config, params, tokenizer: pass all three to skip loading (tests).
      use_tqdm: a tqdm bar for the warm-up (None: only when stderr is a terminal).
      draft_model_config, draft_params: the speculative draft model, to skip loading it
        (tests; params None: random).
      plan: the one-device runner's `jaxinfer.platform.execution_plan.ExecutionPlan` (tests pick a path with
        ``dataclasses.replace`` of a resolved one); None: resolved by the runner.

    Raises:
      ValueError: a draft model with tensor or data parallelism (one device only).
    """
    enable_compilation_cache()
    config = dataclasses.replace(config, dtype=resolve_dtype(config.dtype))
    if model_config is None:
        model_config, params, tokenizer, _ = load_model(config, load_format, weights_dir)
    check_model_fits(config, model_config)
    from jaxinfer.layers.attention.kv_quant import check_kv_cache_dtype

    check_kv_cache_dtype(config.cache.kv_cache_dtype, jax.devices()[0].platform)
    model_config, params = quantize_model(config, model_config, params)
    tokenizer = apply_chat_template(tokenizer, config.chat_template)
    backend = config.attention_backend or default_backend()
    draft = None
    if config.speculative is not None and config.speculative.method == "draft_model":
        draft = dict(weights_dir=weights_dir, draft_model_config=draft_model_config, draft_params=draft_params)
    if config.parallel.world_size > 1 or jax.process_count() > 1:  # mesh: TP and/or DP replicas
        from jaxinfer.engine.dp_router import build_parallel_engine

        if draft is not None:
            raise ValueError("speculative decoding with a draft model runs on one device (no TP / DP yet)")
        engine = build_parallel_engine(config, model_config, params, tokenizer)
        desc = engine.describe()
        logger.info("%s", settings_line(config, desc.plan.attention if desc.plan else backend, desc.num_blocks, desc.plan))
        return engine
    if params is None:
        from jaxinfer.models.params import init_params

        params = init_params(model_config, config.dtype, seed=config.seed)
    return build_replica(config, model_config, jax.device_put(params), tokenizer,
                         progress=WarmupProgress(use_tqdm),
                         on_planned=lambda n, plan: logger.info("%s", settings_line(config, plan.attention, n, plan)),
                         draft=draft, plan=plan)


def quantize_model(config: EngineConfig, model_config: ModelConfig, params):
    """(model config, params) with ``config.quantization`` applied: for "int8", the config
    says so and float params are quantized on device (`jaxinfer.layers.quantization.int8.quantize_params`;
    the float tree is dropped; ``placed`` params keep their devices and are re-placed by
    the mesh builder); params already int8 or None (random init) pass through.
    No quantization: unchanged."""
    if config.quantization is None or model_config.quantization == config.quantization:
        return model_config, params
    from jaxinfer.layers.quantization.int8 import quantize_params

    model_config = dataclasses.replace(model_config, quantization=config.quantization)
    if params is not None:
        params = quantize_params(params)
        logger.info("weights quantized to %s: %.1f MiB", config.quantization,
                    sum(x.nbytes for x in jax.tree.leaves(params)) / 2**20)
    return model_config, params


def build_replica(config: EngineConfig, model_config: ModelConfig, params, tokenizer, mesh=None, *,
                  progress=None, on_planned=None, draft: dict | None = None, grammar=None, plan=None,
                  device_memory: int | None = None) -> LLMEngine:
    """One engine (one replica) on one device or on a ``(data=1, model=tp)`` mesh: the KV
    pool sized per device (`plan_num_blocks`), the runner, warm-up if configured.

    Args:
      params: the weights as ``jax.Array``s, on the default device (``mesh`` None) or
        placed with `jaxinfer.distributed.sharding.param_shardings` on ``mesh``.
      tokenizer: a `jaxinfer.tokenizer.tokenizer.Tokenizer` or None.
      mesh: the replica's mesh (`jaxinfer.distributed.sharding.replica_meshes`), or None for one device.
      progress: ``progress(done, total)`` for the warm-up (`WarmupProgress`), or None.
      on_planned: called with the pool's block count and the runner's execution plan once
        planned (the settings line).
      draft: keyword arguments of `jaxinfer.spec_decode.draft_model.build_draft_proposer`
        beyond the engine's own (a draft model for speculative decoding), or None.
      grammar: a `jaxinfer.engine.protocol.SharedGrammar` shared with other replicas, or None.
      plan: the runner's `jaxinfer.platform.execution_plan.ExecutionPlan`; None: `resolve_plan` (once, here).
      device_memory: bytes of one device for the KV budget (`plan_num_blocks`); None: this
        process's device. With ``params`` as ``jax.ShapeDtypeStruct``s (abstract weights) the
        runner is abstract (`jaxinfer.runner.model_runner.ModelRunner`): it lowers, never runs.

    Multi-process: the runner is `jaxinfer.distributed.multihost.step_runner`'s (the leader's broadcasts).

    Raises:
      ValueError: the KV budget holds fewer than 2 blocks.
    """
    from jaxinfer.distributed import multihost as distributed
    from jaxinfer.distributed import sharding

    tp = 1 if mesh is None else sharding.mesh_degrees(mesh)[0]
    weight_bytes = sharding.per_device_bytes(params)
    num_blocks, why = plan_num_blocks(model_config, config.cache, config.dtype, weight_bytes, tp, config.scheduler,
                                      host_devices=tp * config.parallel.data_parallel_size,
                                      device_memory=device_memory)
    if jax.process_count() > 1:  # one cache shape on every process: the smallest pool any of them planned
        agreed = distributed.agree_num_blocks(num_blocks)
        if agreed != num_blocks:
            num_blocks, why = agreed, f"{agreed} blocks (the smallest pool planned over the processes; here: {why})"
    if mesh is None:
        logger.info("KV cache: %s", why)
        shardings = None
    else:
        logger.info("replica on devices %s: weights %.2f GiB per device; KV cache: %s",
                    [d.id for d in mesh.devices.flat], weight_bytes / 2**30, why)
        shardings = (jax.tree.map(lambda x: x.sharding, params), sharding.kv_cache_sharding(model_config, mesh),
                     sharding.replicated(mesh))
    plan = plan or resolve_plan(model_config, config.dtype, config.attention_backend,  # pallas: per TP shard
                                block_size=config.cache.block_size, sharded=shardings is not None,
                                kv_cache_dtype=config.cache.kv_cache_dtype)
    if on_planned is not None:
        on_planned(num_blocks, plan)
    backend = plan.attention
    runner = ModelRunner(model_config, params, num_blocks, config.cache.block_size, config.dtype, backend,
                         config.max_logprobs, config.return_logits, shardings=shardings,
                         kv_cache_dtype=config.cache.kv_cache_dtype, plan=plan, pooling=config.runner == "pooling")
    if jax.process_count() > 1:
        runner = distributed.step_runner(runner)
    # The draft model follows a forced backend, else its own plan (the Mosaic kernel may not serve its shapes).
    factory = None if draft is None else _draft_factory(config, model_config, num_blocks, config.attention_backend,
                                                        draft)
    engine = LLMEngine(config, model_config, runner, num_blocks, tokenizer, proposer_factory=factory,
                       grammar=grammar, kv_cache_description=why, mesh=mesh)
    if config.warmup:
        engine.warmup(progress=progress)
    return engine


def _draft_factory(config: EngineConfig, model_config: ModelConfig, num_blocks: int, backend: str | None, draft: dict):
    """``factory(layout)`` -> the draft model's proposer for the engine's batch layout
    (`jaxinfer.spec_decode.draft_model.build_draft_proposer`, with ``draft``'s own keywords)."""
    from jaxinfer.spec_decode.draft_model import build_draft_proposer

    def factory(layout):
        return build_draft_proposer(config.speculative, model_config, num_blocks, config.cache.block_size,
                                    config.dtype, backend, layout, **draft)
    return factory

"""Configuration tree: frozen dataclasses that flow downward from the entry points.

Owns `CacheConfig`, `SchedulerConfig`, `ParallelConfig` and `EngineConfig`, and the dtypes and
block sizes they accept (`ModelConfig` is `jaxinfer.config.model_config`'s). Plain Python: no JAX
import, so host-side modules and tests can use it freely. The flags of ``server.py`` map onto
these fields through one table, `jaxinfer.config.args`.
"""
from __future__ import annotations

import dataclasses
import math

from jaxinfer.reasoning import PARSERS
from jaxinfer.core.sched.registry import SCHEDULING_POLICIES
from jaxinfer.layers.attention.registry import ATTENTION_BACKENDS
from jaxinfer.pooling_params import POOLING_TYPES, RUNNERS
from jaxinfer.sampling_params import is_integer
from jaxinfer.spec_decode.config import SpeculativeConfig

BLOCK_SIZE = 16  # tokens per KV block (PagedAttention, Kwon et al. 2023)
BLOCK_SIZES = (8, 16, 32, 64, 128)  # accepted block sizes (each tested end to end on CPU)
DTYPES = ("auto", "float32", "bfloat16")
QUANTIZATIONS = ("int8",)  # weight quantizations (--quantization; None: the dtype's float weights)
KV_CACHE_DTYPES = ("auto", "int8", "fp8")  # --kv-cache-dtype ("auto": the model dtype)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
# Sequence slots when ``max_num_seqs`` is left unset: the design's headline scene (128 concurrent
# clients) runs at once instead of in waves of 32, whose fourth wave waited past the queue
# bound. TGI answers 429 only past 128 concurrent requests (``max_concurrent_requests``);
# vLLM's CPU server default is 128 too. Slots beyond what the KV pool holds cost nothing:
# the scheduler's KV watermark holds such requests back (docs/api.md, "Admission").
DEFAULT_MAX_NUM_SEQS = 128
# Static batching's default batch size stays 32: it reserves max_model_len of KV per member,
# so 128 members of 4096 tokens would not fit the 4 GiB CPU pool and the rest would fail.
DEFAULT_STATIC_BATCH = 32


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    Attributes:
      block_size: tokens per block (16; one of `BLOCK_SIZES`).
      num_blocks: explicit pool size including the null block 0; overrides the budget.
      kv_cache_memory: budget in bytes for K and V of all layers (None: from
        ``gpu_memory_utilization`` on an accelerator, or 4 GiB on CPU, at most a quarter of RAM).
      gpu_memory_utilization: fraction of the device's memory for weights, activations
        and the KV cache together (vLLM's meaning); None: 0.9
        (`DEFAULT_GPU_MEMORY_UTILIZATION`). Ignored on CPU and when ``num_blocks`` or
        ``kv_cache_memory`` is set.
      watermark: fraction of blocks kept free when admitting new prefills (0.15).
      enable_prefix_caching: reuse KV blocks of shared prompt prefixes (on by default).
      kv_cache_dtype: "auto" (the model dtype), "int8" or "fp8" (e4m3): K/V stored in 8 bits
        with a scale per token and KV head (`jaxinfer.layers.attention.kv_quant`), about twice the blocks of
        a bfloat16 cache in the same budget.
    """

    block_size: int = BLOCK_SIZE
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    watermark: float = 0.15
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.num_blocks is not None and self.num_blocks < 2:  # block 0 is the null block
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {self.num_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {self.block_size}")

    @property
    def memory_utilization(self) -> float:
        """``gpu_memory_utilization``, or its default 0.9 when unset."""
        return DEFAULT_GPU_MEMORY_UTILIZATION if self.gpu_memory_utilization is None else self.gpu_memory_utilization


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits.

    Attributes:
      max_num_seqs: cap on running sequences per step (the sequence slots); None (the
        default): `DEFAULT_MAX_NUM_SEQS` (static batching: `DEFAULT_STATIC_BATCH`), or
        ``max_num_batched_tokens`` when that is smaller
        (a step holds one token per sequence). Resolved in ``__post_init__``: an int after.
      max_num_batched_tokens: per-step token budget (prefill chunks + decodes).
      max_model_len: prompt + output limit in tokens.
      max_queue_len: bound on the waiting queue: requests waiting beyond the free sequence
        slots (`Scheduler.num_queued`); the server answers 429 past it.
      scheduler: "continuous" or "static" (`StaticScheduler`, the baseline).
      scheduling_policy: continuous only: "fcfs" (`ContinuousScheduler`, first come
        first served) or "priority" (`PriorityScheduler`: ``SamplingParams.priority``,
        lower first, then arrival).
      priority_aging_s: priority only: seconds of waiting that lower a request's
        effective priority by 1 (bounds starvation; see `jaxinfer.core.sched.priority`);
        None: no aging.
      batch_timeout_s: static only: seconds the oldest queued request waits for a full batch.
      prefill_budget_while_decoding: cap on prefill tokens in a step that also decodes
        (None: only ``max_num_batched_tokens`` applies). Stall-free batching (Sarathi-Serve,
        Agrawal et al. 2024): running decodes share each step with at most this many
        prompt tokens, so their inter-token latency stays near a pure decode step's while
        prompts keep arriving; steps without decodes still prefill up to the full budget.
    """

    max_num_seqs: int | None = None
    max_num_batched_tokens: int = 512
    max_model_len: int = 4096
    max_queue_len: int = 256
    scheduler: str = "continuous"
    scheduling_policy: str = "fcfs"
    priority_aging_s: float | None = None
    batch_timeout_s: float = 0.1
    prefill_budget_while_decoding: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs is None and is_integer(self.max_num_batched_tokens):
            default = DEFAULT_STATIC_BATCH if self.scheduler == "static" else DEFAULT_MAX_NUM_SEQS
            object.__setattr__(self, "max_num_seqs", max(1, min(default, self.max_num_batched_tokens)))
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_queue_len"):
            _check_int(name, getattr(self, name))
        if self.prefill_budget_while_decoding is not None:
            _check_int("prefill_budget_while_decoding", self.prefill_budget_while_decoding)
        if self.prefill_budget_while_decoding is not None and self.prefill_budget_while_decoding < 1:
            raise ValueError(f"prefill_budget_while_decoding must be >= 1 or None, got "
                             f"{self.prefill_budget_while_decoding}")
        if self.scheduler not in ("continuous", "static"):
            raise ValueError(f"scheduler must be 'continuous' or 'static', got {self.scheduler!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(map(repr, SCHEDULING_POLICIES))}, got "
                             f"{self.scheduling_policy!r}")
        if self.priority_aging_s is not None and self.scheduling_policy != "priority":
            raise ValueError("priority_aging_s applies to scheduling_policy 'priority' only (with 'fcfs' nothing "
                             "reads it)")
        if self.priority_aging_s is not None and not (math.isfinite(self.priority_aging_s)
                                                      and self.priority_aging_s > 0):
            raise ValueError(f"priority_aging_s must be a positive number of seconds or None, got "
                             f"{self.priority_aging_s}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:  # 0 would never schedule anything
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got "
                             f"{self.max_num_seqs} and {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (one prompt and one output token), got {self.max_model_len}")
        if self.max_num_seqs > self.max_num_batched_tokens:  # a step must fit one token per sequence
            raise ValueError(f"max_num_seqs ({self.max_num_seqs}) must not exceed max_num_batched_tokens "
                             f"({self.max_num_batched_tokens})")
        if self.max_queue_len < 1:  # 0 would turn every request away
            raise ValueError(f"max_queue_len must be >= 1, got {self.max_queue_len}")
        if self.batch_timeout_s < 0:
            raise ValueError("batch_timeout_s must be >= 0")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """How one engine spreads over devices and processes (see `jaxinfer.distributed.sharding`).

    Attributes:
      tensor_parallel_size: devices per replica (mesh axis ``model``; Megatron TP).
      data_parallel_size: replicas, each with its own scheduler and KV pool (axis ``data``).
      enable_expert_parallel: split a mixture of experts' experts over an ``expert`` mesh axis
        of `expert_parallel_degree` devices (vLLM's ``--enable-expert-parallel``).
      expert_parallel_size: the ``expert`` axis size (dividing ``tensor_parallel_size``); None:
        all ``tensor_parallel_size`` devices.
      coordinator_address: ``host:port`` of process 0 for multi-host (``jax.distributed``);
        None: single process, or read from the cluster environment (SLURM, ...).
      num_processes, process_id: multi-host layout; None: from the environment.
    """

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    expert_parallel_size: int | None = None
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ValueError("tensor_parallel_size and data_parallel_size must be >= 1")
        ep = self.expert_parallel_size
        if ep is not None and not self.enable_expert_parallel:
            raise ValueError("expert_parallel_size needs enable_expert_parallel")
        if ep is not None and (ep < 1 or self.tensor_parallel_size % ep):
            raise ValueError(f"expert_parallel_size {ep} must be >= 1 and divide tensor_parallel_size "
                             f"{self.tensor_parallel_size}")

    @property
    def expert_parallel_degree(self) -> int:
        """Size of the ``expert`` mesh axis: 1 without expert parallelism."""
        if not self.enable_expert_parallel:
            return 1
        return self.expert_parallel_size or self.tensor_parallel_size

    @property
    def world_size(self) -> int:
        """Devices used: tensor_parallel_size * data_parallel_size."""
        return self.tensor_parallel_size * self.data_parallel_size


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, as one tree.

    ``dtype`` is ``"float32"``, ``"bfloat16"`` or ``"auto"`` (`auto_dtype` of the devices'
    platform; `jaxinfer.engine.builder.resolve_dtype` replaces it before anything is built; the
    entry points ``server.py`` and `LLM` default to it). ``tokenizer``: a folder or a name under ``weights/`` to load the
    tokenizer and chat template from instead of the model's folder (None: the model's).
    ``chat_template``: a ``--chat-template`` value (a file, a bundled name such as ``gemma3``, or
    Jinja text: `jaxinfer.tokenizer.templates.load_chat_template`) that replaces the tokenizer's template.
    ``quantization``: None, or ``"int8"`` (``--quantization``): the float weights are
    quantized to int8 with group scales (64 inputs per scale) as they are loaded (`jaxinfer.layers.quantization.int8`).
    ``speculative``: speculative decoding (`jaxinfer.spec_decode.SpeculativeConfig`), None = off.
    ``runner``: ``"generate"`` (text generation) or ``"pooling"`` (``--runner pooling``, vLLM's name:
    embeddings; warm-up also compiles the pooling pass, and the front doors serve embeddings and
    refuse generation); ``pooling_type``: how a pooling request pools the final hidden states,
    ``"last"`` (the last prompt token's, the default for decoder embedding models) or ``"mean"``
    (`jaxinfer.core.pooling`).
    ``reasoning_parser``: None, or a name in `jaxinfer.reasoning.PARSERS` (``--reasoning-parser``):
    chat answers split ``<think>...</think>`` into ``reasoning_content``, and structured outputs
    apply after the reasoning.
    """

    model_path: str
    dtype: str = "float32"
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    attention_backend: str | None = None  # a key of ATTENTION_BACKENDS ("xla", "pallas"); None picks by platform
    max_logprobs: int = 20
    max_logit_bias: int = 128
    seed: int = 0
    warmup: bool = True
    return_logits: bool = False  # debug/tests: keep each sampled position's raw logits
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    tokenizer: str | None = None
    chat_template: str | None = None
    quantization: str | None = None
    speculative: SpeculativeConfig | None = None
    runner: str = "generate"
    pooling_type: str = "last"
    reasoning_parser: str | None = None

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {self.runner!r}")
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {self.pooling_type!r}")
        _check_int("seed", self.seed)
        if not 0 <= self.seed < 2**63:  # numpy's default_rng takes no negative seed
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be None or {' or '.join(map(repr, QUANTIZATIONS))}, "
                             f"got {self.quantization!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in PARSERS:
            raise ValueError(f"reasoning_parser must be None or one of {', '.join(PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if self.speculative is not None and self.scheduler.scheduler == "static":  # it reserves whole requests
            raise ValueError("speculative decoding needs the continuous scheduler (not --scheduler static)")


def _check_int(name: str, value) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer (not a bool or a
    string such as ``"512"``), before a comparison would fail with a bare ``TypeError``."""
    if not is_integer(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")

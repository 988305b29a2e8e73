"""Lowering the engine's model step for another platform, from shapes alone (no device, no weights).

Owns `lower_engine_steps`: every warm-up bucket of an engine configuration (the buckets
`jaxinfer.engine.llm_engine.LLMEngine.warmup` compiles) is traced through the runner's step
(`ModelRunner._model_step`, the same decoder, attention backend and linear method the plan
picks for a GPU) with abstract parameters and KV cache, and lowered with
``lowering_platforms=("cuda",)``. On a CPU-only machine this checks that a GPU attention kernel
(Triton or Mosaic GPU) lowers inside the real step for a large layout (Llama-3-8B) without
allocating it; the lowered text names the kernel's custom call (`KERNEL_CALLS`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterator

import jax

from jaxinfer.layers.attention.kv_storage import KVStorage
from jaxinfer.layers.attention.registry import get_attention_backend
from jaxinfer.layers.linear import get_linear_method
from jaxinfer.models import registry
from jaxinfer.models.params import abstract_params
from jaxinfer.platform.execution_plan import resolve_plan
from jaxinfer.runner import batch as batch_mod
from jaxinfer.runner.buckets import Bucket, BucketLadders
from jaxinfer.runner.model_runner import ModelRunner, kv_cache_shape

# The custom-call target each GPU attention backend's kernel lowers to.
KERNEL_CALLS = {"pallas": "xla.gpu.triton", "mosaic": "stablehlo.custom_call @mosaic_gpu"}


@dataclasses.dataclass(frozen=True)
class StepShapes:
    """The engine settings that fix the step's shapes (`jaxinfer.config` names)."""

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 128
    max_model_len: int = 4096
    block_size: int = 16
    num_blocks: int = 4096
    max_logit_bias: int = 64

    def layout(self, vocab_size: int) -> batch_mod.BatchLayout:
        ladders = BucketLadders(self.max_num_batched_tokens, self.max_num_seqs,
                                -(-self.max_model_len // self.block_size))
        return batch_mod.BatchLayout(ladders=ladders, block_size=self.block_size, vocab_size=vocab_size,
                                     max_model_len=self.max_model_len, max_logit_bias=self.max_logit_bias)


def _spec(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def lower_engine_steps(cfg, dtype: str, backend: str, shapes: StepShapes, *, kv_cache_dtype: str = "auto",
                       compute_capability: tuple[int, int] = (9, 0)) -> Iterator[tuple[Bucket, str]]:
    """(bucket, lowered StableHLO text) of every warm-up bucket, lowered for CUDA.

    Args:
      cfg: the `ModelConfig`. dtype: "bfloat16" / "float16" / "float32". backend: a registered
        attention backend, or None for the plan's default on a GPU of ``compute_capability``.
      shapes: the engine settings the buckets follow.
    Raises:
      ValueError: as `resolve_plan` (e.g. "mosaic" for a cache it does not read).
    """
    plan = resolve_plan(cfg, dtype, backend, block_size=shapes.block_size, platform="gpu", environ={},
                        kv_cache_dtype=kv_cache_dtype, compute_capability=compute_capability)
    attention = get_attention_backend(plan.attention, interpret=False, mesh=None, native=False)
    linear = get_linear_method(plan.linear, plan.linear_fallback)
    model = registry.decoder_class(cfg)(cfg, attention, jax.numpy.dtype(dtype), jax.numpy.dtype(dtype), linear=linear)
    params = {"params": abstract_params(cfg, dtype)}
    storage = KVStorage.select(dtype, "gpu", kv_cache_dtype)
    kv = jax.eval_shape(lambda: storage.alloc(kv_cache_shape(cfg, shapes.num_blocks, shapes.block_size)))
    step = jax.jit(functools.partial(ModelRunner._model_step, model, native_ids=False), donate_argnums=(1, 2))
    layout = shapes.layout(cfg.vocab_size)
    for bucket in layout.ladders.all_buckets():
        inputs = batch_mod.empty_inputs(bucket, layout)
        args = jax.tree.map(_spec, (inputs.token_ids, inputs.attention))
        text = step.trace(params, kv, kv, *args).lower(lowering_platforms=("cuda",)).as_text()
        yield bucket, text

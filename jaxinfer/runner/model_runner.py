"""The model runner: the only place that compiles, calls ``device_put``, or reads back.

Owns the parameters, the paged KV cache (donated to every step and returned by it),
one ahead-of-time compiled executable per `Bucket`, and the compilation counter.
One step = two compiled calls with the logits kept on device: the model step per
(tokens, context) bucket over the token ids and the step's `AttentionMetadata` (embed,
the layers with K/V write + paged attention, LM head at its ``logits_indices``), then
the sampler over the step's `SamplingMetadata` per (row count, penalties or not,
structured-output mask or not) (split so warm-up compiles the sampler a few times, not
once per model bucket; the no-penalty variant takes no token history, the no-mask
variant no bitmask). Both metadata pytrees reach the executables as `jaxinfer.runner.batch`
made them: the runner never picks fields by name. Sampled ids come back to the host once per
step. The model step also returns the final hidden states of every packed token [T, D]
(left on device); in a step with prompt logprobs (`StepInputs.prompt_targets`), a third
call per token count T runs the LM head over them (`jaxinfer.models.llama.LMHead`, then
`jaxinfer.layers.sampler.prompt_logprobs`), read back with the sampled ids. In a step with a
pooling row (`StepInputs.pool_rows`), a call per bucket (T, R) sums the hidden states per row
(`jaxinfer.layers.pooler.pool`) and reads back [R, D] as ``pooled`` (compiled at warm-up when
the runner is a pooling one; a generate-only step runs neither pass).

Which implementation runs each part of the step (attention kernel, linear method, argmax, bit
storage, unrolling) is the `jaxinfer.platform.execution_plan.ExecutionPlan` the runner is given or resolves
once from its arguments; the runner reads nothing else to choose.

Layer layouts (`jaxinfer.models.layer_layout`): on a CPU without packed weights (the plan's ``packed``), buckets of
up to ``unroll_max_tokens`` tokens (a lone stream's decode step) run the layers unrolled over per-layer weight arrays,
split from the stacked ones once here; every other bucket runs them under ``nn.scan`` over
the stacked arrays, which compiles several times faster. Both give the same logits. The
per-layer copy costs the layer weights' bytes once more (0 disables it).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.cpu import argmax as native_argmax
from jaxinfer.layers.attention.kv_storage import KVStorage, kv_storage_dtype
from jaxinfer.layers.attention.registry import get_attention_backend
from jaxinfer.layers.step_metadata import AttentionMetadata
from jaxinfer.runner.batch import StepInputs
from jaxinfer.runner.buckets import Bucket
from jaxinfer.config import ModelConfig
from jaxinfer.layers.linear import PACKED_COLLECTION, get_linear_method
from jaxinfer.layers import cpu_bf16
from jaxinfer.models.layer_layout import unstack_layers
from jaxinfer.models import registry
from jaxinfer.models.llama import HIDDEN, LMHead
from jaxinfer.platform.execution_plan import ExecutionPlan, resolve_plan
from jaxinfer.layers.pooler import pool
from jaxinfer.layers.sampler import prompt_logprobs, sample
from jaxinfer.layers.step_metadata import SamplingMetadata

logger = logging.getLogger(__name__)

# Buckets of up to `jaxinfer.platform.execution_plan.UNROLL_MAX_TOKENS` tokens (1) run unrolled
# layers on CPU (module docstring): the one-token step of a lone stream, where the scanned stack
# cost most there (benchmarks/decode_probe.py). Other platforms scan: not measured there, and the
# per-layer copy would take accelerator memory the KV planner does not count.
# ``JAXINFER_UNROLL_MAX_TOKENS=0`` (environment) scans every bucket: it saves the per-layer
# copy (the layer weights' bytes once more) and the unrolled buckets' slower compiles
# (~37 s of a cold warm-up of the default model), at a slower lone-stream decode step.
# With packed weights (the plan's ``packed``: AMX, AVX-512 BF16 or int8 VNNI) nothing unrolls by
# default: the scanned step reads them in place for one row too (`jaxinfer.kernels.cpu.amx`). On the
# 2-core AMD EPYC (AVX-512 BF16, no AMX) its lone-stream step matched the unrolled one over
# `native_gemv` (11.6 / 13.2 against 11.7 / 13.0 ms, processes alternated; amx_gemm.cc's header).
# On the 2-core AMX CPU its lone-stream decode step took 22-27 ms against 36-42 ms unrolled over
# per-layer arrays (SmolLM2-135M, 128-token prompt, medians of 126 steps, 2 processes each,
# alternated); unrolled over the packed weights it took 23-29 ms against 22-26 ms scanned, no better.

# On one device the step's numpy inputs go straight into the compiled executables, whose
# C++ call path copies them in: ``jax.device_put`` of the same ~18-35 small arrays first
# cost ~1-1.6 ms per step on the 2-core CPU against ~0.05 ms (benchmarks/onestream_probe.py,
# 3% of a lone stream's decode step). A mesh still places them with `put_replicated`.
# False: ``jax.device_put`` first (the earlier path; the probe's A/B).
HOST_INPUTS_DIRECT = True


class CompileCounter:
    """Counts XLA backend compilations process-wide (``/jax/core/compile/backend_compile_duration``).

    Catches stray compilations anywhere (a jnp op on the hot path, a new shape), not
    only the runner's own.
    """

    _lock = threading.Lock()
    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        with cls._lock:
            if cls._installed:
                return

            def listener(event: str, duration: float, **kw) -> None:
                if event.endswith("backend_compile_duration"):
                    with cls._lock:
                        cls.count += 1

            jax.monitoring.register_event_duration_secs_listener(listener)
            cls._installed = True


def _specs(tree, sharding=None):
    """The shapes and dtypes of a pytree of arrays (ahead-of-time compilation)."""
    return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding), tree)


def _sampler_key(num_seqs: int, s: SamplingMetadata) -> tuple[int, bool, bool]:
    """Sampler executables are per (row count, whether the penalty history is sent,
    whether the structured-output bitmask is sent)."""
    return num_seqs, s.has_history, s.has_bitmask


def _sampler_variants(s: SamplingMetadata) -> list[SamplingMetadata]:
    """``s`` and, when it carries them (warm-up shapes), its variants without the
    penalty history, without the bitmask, and without both."""
    variants = [s]
    if s.has_history:
        variants.append(dataclasses.replace(s, hist_ids=None, num_prompt=None, num_hist=None))
    if s.has_bitmask:
        variants += [dataclasses.replace(v, bitmask=None) for v in variants]
    return variants


def greedy_only(s: SamplingMetadata, vocab_size: int) -> bool:
    """Whether the step's sampler would return the argmax of the raw logits for every row
    (host-side, from the step's arrays alone, so every process of a multi-host run decides
    alike): no row samples, asks for logprobs, uses penalties, a structured-output mask or
    a logit bias (`jaxinfer.layers.sampler.sample` then changes nothing before its argmax)."""
    return not (s.any_sampled or s.any_logprobs or s.has_history or s.has_bitmask
                or bool(np.any(s.bias_ids < vocab_size)))


def is_abstract(tree) -> bool:
    """Whether every leaf of ``tree`` is a ``jax.ShapeDtypeStruct`` (an abstract runner's weights)."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def kv_cache_shape(cfg: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """[L, num_blocks, block_size, K, H] for each of K and V."""
    return (cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)


class ModelRunner:
    """Runs bucketed steps of one model over its paged KV cache.

    Args:
      cfg: model hyperparameters.
      params: the ``params`` tree (arrays, already on device or numpy).
      num_blocks, block_size: KV pool geometry.
      dtype: compute/storage dtype name ("float32" | "bfloat16").
      backend: "xla" or "pallas" (which kernels run within it is the plan's).
      max_logprobs: N of the top-N logprobs the step returns.
      return_logits: also return the [R, V] logits (tests/debugging).
      shardings: optional (param shardings, kv sharding, replicated) for a mesh.
      kv_cache_dtype: "auto" (the model dtype) or "int8" / "fp8": an 8-bit cache with
        per-token scales (`jaxinfer.layers.attention.kv_quant.QuantKV`; its scales shard with the values).
      unroll_max_tokens: buckets with at most this many tokens run the unrolled layers
        over per-layer arrays (module docstring); 0: every bucket scans; None: the plan's
        (the environment, else 1 on a CPU without packed weights).
      plan: the `jaxinfer.platform.execution_plan.ExecutionPlan` (tests pass ``dataclasses.replace`` of a
        resolved one); None: `jaxinfer.platform.execution_plan.resolve_plan` of these arguments. A given
        ``unroll_max_tokens`` overrides the plan's.
      pooling: compile the pooling pass with every bucket (``--runner pooling``); without it a
        pooling step compiles its pass on first use (with a warning).
    """

    def __init__(self, cfg: ModelConfig, params, num_blocks: int, block_size: int, dtype: str = "float32",
                 backend: str = "xla", max_logprobs: int = 20, return_logits: bool = False, shardings=None,
                 kv_cache_dtype: str = "auto", unroll_max_tokens: int | None = None,
                 plan: ExecutionPlan | None = None, pooling: bool = False):
        CompileCounter.install()
        self.pooling = pooling
        self.cfg = cfg
        self.dtype = jnp.dtype(dtype)
        if plan is None:
            plan = resolve_plan(cfg, self.dtype, backend, block_size=block_size, sharded=shardings is not None,
                                unroll_max_tokens=unroll_max_tokens, kv_cache_dtype=kv_cache_dtype)
        elif unroll_max_tokens is not None:
            plan = dataclasses.replace(plan, unroll_max_tokens=unroll_max_tokens)
        self.plan = plan
        self.backend = plan.attention
        self.max_logprobs = max_logprobs
        self.return_logits = return_logits
        attention = get_attention_backend(plan.attention, interpret=plan.pallas_interpret,
                                          mesh=shardings[1].mesh if shardings else None,  # the KV cache's mesh
                                          native=plan.native_attention)
        self.linear = get_linear_method(plan.linear, plan.linear_fallback)
        decoder = registry.decoder_class(cfg)  # the family's decoder (`jaxinfer.models.registry`)
        self.model = decoder(cfg, attention, self.dtype, self.dtype, linear=self.linear)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_storage = KVStorage.select(self.dtype, plan.platform, kv_cache_dtype)  # the cache's format
        if shardings is not None:  # an 8-bit cache's scales [L, NB, bs, K] split like the values
            shardings = (shardings[0], self.kv_storage.sharding(shardings[1]), shardings[2])
        self.head = LMHead(cfg, self.dtype, self.dtype, linear=get_linear_method(plan.prompt_head))
        self._shardings = shardings
        self._replicated = shardings[2] if shardings else None
        self.greedy_fast_path = True  # `greedy_only` steps skip the sampler executable (`execute`)
        self.abstract = is_abstract(params)
        if self.abstract:
            self.plan = plan = dataclasses.replace(plan, unroll_max_tokens=0)
        self._place_params(params)
        self.kv_shape = kv_cache_shape(cfg, num_blocks, block_size)
        self.kv_dtype = kv_storage_dtype(self.dtype, plan.platform)
        self.k_cache, self.v_cache = self._alloc_cache()
        self._executables: dict[Bucket, object] = {}
        self._samplers: dict[int, object] = {}
        self._prompt_heads: dict[int, object] = {}  # T -> LM head + prompt logprobs over all T tokens
        self._poolers: dict[tuple[int, int], object] = {}  # (T, R) -> the pooling pass
        self.num_compilations = 0
        self.compile_seconds = 0.0
        # sharded: KV stays in its sharding across steps; logits gathered for the sampler
        rep = shardings[2] if shardings else None
        out = {} if shardings is None else {"out_shardings": (rep, rep, shardings[1], shardings[1], rep)}
        step = functools.partial(self._model_step, native_ids=plan.native_argmax)
        self._jitted = jax.jit(functools.partial(step, self.model), donate_argnums=(1, 2), **out)
        unrolled = decoder(cfg, attention, self.dtype, self.dtype, scan_layers=False, linear=self.linear)
        self._jitted_unrolled = jax.jit(functools.partial(step, unrolled), donate_argnums=(1, 2), **out)
        self._jitted_head = jax.jit(self._prompt_step, **({} if shardings is None else {"out_shardings": shardings[2]}))

    @property
    def unroll_max_tokens(self) -> int:
        """Buckets of at most this many tokens run the unrolled layers (the plan's)."""
        return self.plan.unroll_max_tokens

    @property
    def native_argmax(self) -> bool:
        """Whether greedy ids come from the C++ argmax loop (the plan's)."""
        return self.plan.native_argmax

    def _place_params(self, params) -> None:
        """The step's weights, once: the linear method's packed copies (``self.amx``, None where it
        packs nothing) with the stacked kernels they copy dropped, the unrolled layout's per-layer
        arrays where buckets unroll, and the scanned stack as bits where the plan stores bfloat16
        so (`cpu_bf16.weights_as_bits`)."""
        if self.abstract:
            self._place_abstract_params(params)
            return
        scanned, self.amx = self.linear.process_weights_after_loading(params, self.cfg)
        # The unrolled layout shares every leaf but the layers' with the stacked tree.
        self.layer_params = unstack_layers(params, self.cfg.num_hidden_layers) if self.unroll_max_tokens > 0 else None
        if self.plan.bf16_bits:  # the scanned stack's slices stay 16-bit
            scanned = {**scanned, "layers": cpu_bf16.weights_as_bits(scanned["layers"])}
        self.params = scanned

    def _place_abstract_params(self, params) -> None:
        """`_place_params` over shapes: the same scanned tree (bit-stored as the plan says), no
        packed copies, no unrolled layout (the abstract runner scans every bucket).

        Raises:
          ValueError: the plan's linear method packs weights (it needs their values).
        """
        if self.plan.packed:
            raise ValueError(f"an abstract runner cannot pack weights (linear method {self.plan.linear!r})")
        self.amx, self.layer_params = None, None
        if self.plan.bf16_bits:  # the same shapes and shardings, stored as `cpu_bf16.BITS`
            bits = lambda x: jax.ShapeDtypeStruct(x.shape, cpu_bf16.BITS if x.dtype == jnp.bfloat16  # noqa: E731
                                                  else x.dtype, sharding=x.sharding)
            params = {**params, "layers": jax.tree.map(bits, params["layers"])}
        self.params = params

    def _alloc_cache(self):
        kv_sharding = self._shardings[1] if self._shardings else None
        if self.abstract:  # shapes only, in the cache's sharding
            shapes = jax.eval_shape(lambda: self.kv_storage.alloc(self.kv_shape))
            place = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
            cache = jax.tree.map(place, shapes, kv_sharding) if kv_sharding is not None else shapes
            return cache, cache
        make = jax.jit(lambda: self.kv_storage.alloc(self.kv_shape), out_shardings=kv_sharding)
        return make(), make()

    def _unrolled(self, bucket: Bucket) -> bool:
        return bucket.num_tokens <= self.unroll_max_tokens

    def _step_params(self, bucket: Bucket):
        """The variables of ``bucket``'s executable: its layout's ``params`` tree, and for a scanned
        bucket the packed weights when there are (the plan's ``packed``)."""
        if self._unrolled(bucket):
            return {"params": self.layer_params}
        return {"params": self.params, **({PACKED_COLLECTION: self.amx} if self.amx else {})}

    @staticmethod
    def _model_step(model, variables, k_cache, v_cache, token_ids, meta: AttentionMetadata, native_ids=False):
        (logits, k_cache, v_cache), state = model.apply(
            variables, token_ids, meta, k_cache, v_cache, meta.logits_indices, mutable=["intermediates"])
        greedy_ids = native_argmax.greedy_ids(logits, native_ids)  # the sampler's ids in a `greedy_only` step
        return logits, greedy_ids, k_cache, v_cache, state["intermediates"][HIDDEN][0]

    def _head_params(self, params) -> dict:
        """The parameters the LM head reads (`LMHead`)."""
        return {k: params[k] for k in ("embed", "lm_head") if k in params}

    def _prompt_step(self, head_params, hidden, targets):
        logits = self.head.apply({"params": head_params}, hidden)
        return prompt_logprobs(logits, targets, self.max_logprobs)

    def _sample_step(self, logits, s: SamplingMetadata):
        out = sample(logits, s, self.max_logprobs)
        if self.return_logits:
            out["logits"] = logits
        return out

    def compile(self, inputs_like: StepInputs) -> None:
        """Compile the model step for ``inputs_like.bucket`` and the sampler for its row
        count, ahead of time from shapes only (no allocation)."""
        bucket = inputs_like.bucket
        if bucket not in self._executables:
            t0 = time.perf_counter()
            self._executables[bucket] = self.lower(inputs_like).compile()
            self.num_compilations += 1
            self.compile_seconds += time.perf_counter() - t0
        for s in _sampler_variants(inputs_like.sampling):
            self._compile_sampler(bucket.num_seqs, s)
        self._compile_prompt_head(bucket.num_tokens)
        if self.pooling:
            self._compile_pooler(bucket.num_tokens, bucket.num_seqs)

    def _compile_pooler(self, num_tokens: int, num_seqs: int) -> None:
        """Compile the pooling pass for a (T, R) bucket (`jaxinfer.layers.pooler.pool`)."""
        key = (num_tokens, num_seqs)
        if key in self._poolers:
            return
        t0 = time.perf_counter()
        rep = self._replicated
        hidden = jax.ShapeDtypeStruct((num_tokens, self.cfg.hidden_size), jnp.float32, sharding=rep)
        rows = jax.ShapeDtypeStruct((num_tokens,), jnp.int32, sharding=rep)
        weights = jax.ShapeDtypeStruct((num_tokens,), jnp.float32, sharding=rep)
        out = {} if rep is None else {"out_shardings": rep}
        fn = jax.jit(functools.partial(pool, num_rows=num_seqs), **out)
        self._poolers[key] = fn.lower(hidden, rows, weights).compile()
        self.num_compilations += 1
        self.compile_seconds += time.perf_counter() - t0

    def lower(self, inputs_like: StepInputs, lowering_platforms: tuple[str, ...] | None = None):
        """The model step of ``inputs_like.bucket`` lowered from shapes only (``jax.stages.Lowered``),
        the one `compile` compiles. ``lowering_platforms``: e.g. ``("cuda",)`` to lower for a
        platform this host does not have (``jax.stages.Traced.lower``); None: the devices'."""
        bucket = inputs_like.bucket
        params_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                  sharding=getattr(x, "sharding", None)),
                                   self._step_params(bucket))
        kv_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.k_cache)
        jitted = self._jitted_unrolled if self._unrolled(bucket) else self._jitted
        traced = jitted.trace(params_spec, kv_spec, kv_spec,
                              *_specs((inputs_like.token_ids, inputs_like.attention), self._replicated))
        return traced.lower(lowering_platforms=lowering_platforms)

    def lower_sampler(self, num_seqs: int, s: SamplingMetadata, lowering_platforms: tuple[str, ...] | None = None):
        """The sampler over ``num_seqs`` rows of ``s``'s variant lowered from shapes only (as `lower`)."""
        logits_spec = jax.ShapeDtypeStruct((num_seqs, self.cfg.vocab_size), jnp.float32, sharding=self._replicated)
        out = {} if self._replicated is None else {"out_shardings": self._replicated}
        return jax.jit(self._sample_step, **out).trace(logits_spec, _specs(s, self._replicated)).lower(
            lowering_platforms=lowering_platforms)

    def _compile_prompt_head(self, num_tokens: int) -> None:
        """Compile the prompt-logprobs pass for T = ``num_tokens`` (one per token rung, at
        warm-up with the model buckets)."""
        if num_tokens in self._prompt_heads:
            return
        t0 = time.perf_counter()
        spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))  # noqa: E731
        head_spec = jax.tree.map(spec, self._head_params(self.params))
        hidden = jax.ShapeDtypeStruct((num_tokens, self.cfg.hidden_size), jnp.float32, sharding=self._replicated)
        targets = jax.ShapeDtypeStruct((num_tokens,), jnp.int32, sharding=self._replicated)
        self._prompt_heads[num_tokens] = self._jitted_head.lower(head_spec, hidden, targets).compile()
        self.num_compilations += 1
        self.compile_seconds += time.perf_counter() - t0

    def _compile_sampler(self, num_seqs: int, s: SamplingMetadata) -> None:
        key = _sampler_key(num_seqs, s)
        if key in self._samplers:
            return
        t0 = time.perf_counter()
        self._samplers[key] = self.lower_sampler(num_seqs, s).compile()
        self.num_compilations += 1
        self.compile_seconds += time.perf_counter() - t0

    def execute(self, inputs: StepInputs) -> dict[str, np.ndarray]:
        """Run one step (model then sampler, logits stay on device; then the prompt-logprobs
        pass when ``inputs.prompt_targets`` is set, its results under ``prompt_*`` keys); one
        read back.

        Returns:
          ``token_ids [R] int32``; the sampler's logprob outputs (`jaxinfer.layers.sampler.sample`)
          only when a row asks for logprobs (``any_logprobs``); ``logits [R, V]`` with
          ``return_logits``; ``prompt_*`` with prompt targets. A `greedy_only` step (with
          ``greedy_fast_path``) takes its ids from the model step's own argmax and runs no
          sampler (nor copies its metadata): the same ids, as the sampler would only take
          that argmax of the unchanged logits.
        """
        if self.abstract:
            raise RuntimeError("an abstract runner (shapes only) cannot execute a step; it can only lower one")
        bucket = inputs.bucket
        key = _sampler_key(bucket.num_seqs, inputs.sampling)
        if bucket not in self._executables or key not in self._samplers or bucket.num_tokens not in self._prompt_heads:
            logger.warning("compiling bucket %s outside warm-up", bucket)
            self.compile(inputs)
        greedy = self.greedy_fast_path and greedy_only(inputs.sampling, self.cfg.vocab_size)
        host = (inputs.token_ids, inputs.attention) + (() if greedy else (inputs.sampling,))
        if self._replicated is not None:
            from jaxinfer.distributed.sharding import put_replicated

            dev = put_replicated(host, self._replicated)
        elif HOST_INPUTS_DIRECT:
            dev = host
        else:
            dev = jax.device_put(host)
        logits, greedy_ids, self.k_cache, self.v_cache, hidden = self._executables[bucket](
            self._step_params(bucket), self.k_cache, self.v_cache, *dev[:2])
        if greedy:
            out = {"token_ids": greedy_ids, **({"logits": logits} if self.return_logits else {})}
        else:
            out = self._samplers[key](logits, dev[2])
            if not inputs.sampling.any_logprobs:  # nobody reads them: read back the ids (and logits) alone
                out = {k: v for k, v in out.items() if k in ("token_ids", "logits")}
        if inputs.prompt_targets is not None:
            targets = jax.device_put(inputs.prompt_targets, self._replicated)
            scored = self._prompt_heads[bucket.num_tokens](self._head_params(self.params), hidden, targets)
            out = {**out, **{f"prompt_{k}": v for k, v in scored.items()}}
        if inputs.pool_rows is not None:
            out = {**out, "pooled": self._pooled(bucket, hidden, inputs)}
        return jax.device_get(out)

    def _pooled(self, bucket: Bucket, hidden, inputs: StepInputs):
        """The step's per-row pooled sums [R, D] (on device), compiling the pass if warm-up did not."""
        key = (bucket.num_tokens, bucket.num_seqs)
        if key not in self._poolers:
            logger.warning("compiling the pooling pass for bucket %s outside warm-up (not a --runner pooling engine)",
                           bucket)
            self._compile_pooler(*key)
        rows, weights = jax.device_put((inputs.pool_rows, inputs.pool_weights), self._replicated)
        return self._poolers[key](hidden, rows, weights)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the live K and V buffers (values and scales; whole arrays, all shards)."""
        return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((self.k_cache, self.v_cache))))

"""The typed contract of one step between host preparation and the jitted step.

`AttentionMetadata` is everything the model's paged attention (both backends) and its
LM-head gather read besides the token ids; `SamplingMetadata` is everything the sampler
reads besides the logits. `jaxinfer.runner.batch.prepare` fills them with padded numpy arrays of
the step's `jaxinfer.runner.buckets.Bucket` (T tokens, R rows, W block-table columns); the
runner hands them to its compiled step as they are, where the same classes hold
``jax.Array`` leaves. Both are frozen dataclasses: the fields never change after
`prepare`, but their numpy arrays are filled in place (the engine writes the constrained
rows of ``SamplingMetadata.bitmask``).

Plain dataclasses; no JAX import (the host side imports none). The JAX consumers register
them as pytrees: `jaxinfer.layers.attention.base` for `AttentionMetadata`, `jaxinfer.layers.sampler` for
`SamplingMetadata` (an optional field left None is an empty subtree, so a step without
penalty history or bitmask has its own tree structure and its own executable).
"""
from __future__ import annotations

import dataclasses
from typing import Any

Array = Any  # numpy.ndarray on the host, jax.Array inside the step


@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Per-step inputs of attention and of the logits gather (shapes bucketed).

    The standard ragged contract only, no work lists: the Pallas kernel reads these fields as
    they are, and the XLA path derives its work lists from them inside the step
    (`jaxinfer.layers.attention.xla_work_plan`).

    One block-table rule for both backends: ``block_tables`` covers each row's whole
    context *including this step's tokens*, so W >= ceil(kv_len / block_size) for every
    row. The Pallas kernel reads up to ``kv_lens`` after the new K/V are written; the XLA
    path reads only the cached positions (< ``kv_lens`` minus the row's new tokens) from the
    pages and takes the new tokens from the fresh K/V.

    Attributes:
      positions: [T] int32 absolute position of each token (padding 0).
      slot_mapping: [T] int32 cache slot each new K/V is written to (padding 0, the null block).
      block_tables: [R, W] int32 block ids of each row's context and new tokens (padding 0).
      query_start_loc: [R+1] int32 first packed token of each row; the tail repeats the end.
      kv_lens: [R] int32 context length including this step's tokens (padding 0).
      num_seqs: [] int32 real rows.
      logits_indices: [R] int32 packed index of each row's last token (its logits are sampled).
    """

    positions: Array
    slot_mapping: Array
    block_tables: Array
    query_start_loc: Array
    kv_lens: Array
    num_seqs: Array
    logits_indices: Array


@dataclasses.dataclass(frozen=True)
class SamplingMetadata:
    """Per-row sampling options of a step (R rows; padding rows are greedy and neutral).

    Attributes:
      temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty:
        [R] float32 (neutral: 1, 1, 0, 0, 0, 1).
      top_k: [R] int32; the vocabulary size V means off.
      seed_hi, seed_lo: [R] uint32 the high and low words of the row's seed.
      output_index: [R] int32 index of the token being sampled (folded into the row's key).
      greedy: [R] bool argmax row.
      bias_ids: [R, B] int32 logit-bias token ids (V = none, dropped by the scatter);
        bias_values: [R, B] float32.
      any_sampled, any_sort, any_penalty, any_logprobs: [] bool batch-wide flags (some row
        samples / uses top-k or top-p / uses penalties / asks for logprobs).
      hist_ids: [R, M] int32 prompt then output tokens (M = max_model_len, padding V),
        num_prompt, num_hist: [R] int32; the penalty history, all three present only in
        steps where some row uses penalties, else None.
      bitmask: [R, ceil(V/32)] int32 structured-output token bitmask (-1 = all allowed),
        only in steps where some row is constrained, else None.
    """

    temperature: Array
    top_p: Array
    top_k: Array
    min_p: Array
    presence_penalty: Array
    frequency_penalty: Array
    repetition_penalty: Array
    seed_hi: Array
    seed_lo: Array
    output_index: Array
    greedy: Array
    bias_ids: Array
    bias_values: Array
    any_sampled: Array
    any_sort: Array
    any_penalty: Array
    any_logprobs: Array
    hist_ids: Array | None = None
    num_prompt: Array | None = None
    num_hist: Array | None = None
    bitmask: Array | None = None

    @property
    def has_history(self) -> bool:
        """Whether the penalty history is sent (static: picks the sampler variant)."""
        return self.hist_ids is not None

    @property
    def has_bitmask(self) -> bool:
        """Whether the structured-output bitmask is sent (static: picks the sampler variant)."""
        return self.bitmask is not None


def field_names(cls) -> tuple[str, ...]:
    """The field names of a metadata class, in order."""
    return tuple(f.name for f in dataclasses.fields(cls))


def to_arrays(meta) -> dict[str, Array]:
    """The present fields of ``meta`` as a flat name -> array dict (None fields left out)."""
    return {k: v for k in field_names(type(meta)) if (v := getattr(meta, k)) is not None}


def from_arrays(cls, arrays: dict[str, Array]):
    """Rebuild ``cls`` from a flat dict (the inverse of `to_arrays`; extra names ignored,
    missing optional fields None).

    Raises:
      TypeError: a required field is missing.
    """
    return cls(**{k: arrays[k] for k in field_names(cls) if k in arrays})

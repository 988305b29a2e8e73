"""Host-side batch preparation: `SchedulerOutput` -> padded numpy `StepInputs`.

Packs the scheduled requests' new tokens back to back, pads every array to the step's
`Bucket`, and lays out per-row sampling options, so the jitted step sees only fixed
shapes: the typed `jaxinfer.layers.step_metadata.AttentionMetadata` (the standard ragged contract;
no attention work lists, which the XLA path derives inside the step) and `SamplingMetadata`.
One block-table rule whatever the attention backend: a row's table covers its whole context
including this step's tokens (`_rows_width`). A request verifying speculative drafts
takes one single-token row per position (`step_rows`). Plain numpy; no JAX import.

Padding conventions: padding tokens lie past ``query_start_loc[num_seqs]``, with position 0
and write slot 0 (the null block); padding rows have no tokens, empty block tables (block 0),
``kv_len = 0`` and greedy sampling; padded token-id lists use ``vocab_size`` (dropped by scatters).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxinfer.core import pooling, prompt_logprobs
from jaxinfer.runner.buckets import Bucket, BucketLadders
from jaxinfer.layers.step_metadata import AttentionMetadata, SamplingMetadata, from_arrays, to_arrays

PENALTY_FIELDS = ("hist_ids", "num_prompt", "num_hist")  # sent only when a row uses penalties
MASK_FIELD = "bitmask"  # sent only when a row has a structured-output constraint


from jaxinfer.core.request import Request
from jaxinfer.core.sched.scheduler import SchedulerOutput


@dataclasses.dataclass
class StepInputs:
    """Everything one step needs, as padded numpy arrays of ``bucket`` (T tokens, R rows).

    Attributes:
      bucket: the step's static shape.
      token_ids: [T] int32 packed new tokens (padding 0).
      attention: positions, slots, block tables, row offsets and lengths, and the logits rows
        (`jaxinfer.layers.step_metadata.AttentionMetadata`), the model's only other input.
      sampling: per-row options, the penalty history only in steps where some row uses
        penalties (it was ~90% of a decode step's input bytes when always sent; vLLM v1
        likewise sends penalty state only for the requests that need it), the
        structured-output bitmask only in steps where some row has a grammar matcher
        (``req.matcher``; all ones here, the engine fills the constrained rows with
        `jaxinfer.structured_outputs.grammar.GrammarEngine.fill_bitmask`)
        (`jaxinfer.layers.step_metadata.SamplingMetadata`), the sampler's only other input.
      prompt_targets: [T] int32 the prompt token each packed token's logits score (-1 for
        none), only in steps where a row needs prompt logprobs
        (`jaxinfer.core.prompt_logprobs.step_targets`); neither model nor sampler sees it.
      pool_rows, pool_weights: [T] int32 / [T] float32, only in steps with a pooling row
        (`jaxinfer.core.pooling.step_weights`): the row each packed token's final hidden state
        adds to (R for none) and its weight; the runner's pooling pass reads them.
    """

    bucket: Bucket
    token_ids: np.ndarray
    attention: AttentionMetadata
    sampling: SamplingMetadata
    prompt_targets: np.ndarray | None = None
    pool_rows: np.ndarray | None = None
    pool_weights: np.ndarray | None = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """token_ids, every present metadata field, ``prompt_targets`` and the pooling
        inputs (when set) as one flat name -> array dict: the multi-process step stream.
        Followers must run the same computations as the leader, the prompt-logprobs and
        pooling passes included."""
        extra = {k: v for k in _OPTIONAL if (v := getattr(self, k)) is not None}
        return {"token_ids": self.token_ids, **to_arrays(self.attention), **to_arrays(self.sampling), **extra}

    @classmethod
    def from_arrays(cls, bucket: Bucket, arrays: dict[str, np.ndarray]) -> "StepInputs":
        """The inverse of `to_arrays`.

        Raises:
          KeyError / TypeError: a required field is missing.
        """
        return cls(bucket, arrays["token_ids"], from_arrays(AttentionMetadata, arrays),
                   from_arrays(SamplingMetadata, arrays), **{k: arrays.get(k) for k in _OPTIONAL})


_OPTIONAL = ("prompt_targets", "pool_rows", "pool_weights")  # StepInputs' fields sent only when set


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """Static facts the packer needs."""

    ladders: BucketLadders
    block_size: int
    vocab_size: int
    max_model_len: int
    max_logit_bias: int


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a step: ``tokens`` of ``req`` from position ``start``. ``drafts``: the
    speculative draft tokens before this row (``Request.draft_token_ids[:j]`` for a
    request's verification row j; they extend its history for sampling)."""

    req: Request
    start: int
    tokens: list[int]
    drafts: tuple[int, ...] = ()


def step_rows(sched: SchedulerOutput) -> list[Row]:
    """The step's rows in batch order. A request with k draft tokens becomes k + 1
    single-token rows at positions ``start .. start + k`` (its last token, then the
    drafts), each attending to the cached context below it (the earlier rows' K/V are
    written in the same layer before attention reads it), so every position gets its own
    logits and sample: the verification rows of `jaxinfer.spec_decode`."""
    rows = []
    for req, n in sched.scheduled:
        start = req.num_computed_tokens
        drafts = req.draft_token_ids
        if not drafts:
            rows.append(Row(req, start, req.all_token_ids[start:start + n]))
            continue
        toks = [req.all_token_ids[start]] + list(drafts)
        rows.extend(Row(req, start + j, [toks[j]], tuple(drafts[:j])) for j in range(len(toks)))
    return rows


def _rows_width(rows: list[Row], layout: BatchLayout) -> int:
    """Block-table columns the rows need: each row's whole context including its new
    tokens (what the Pallas kernel reads after writing them; the XLA path reads the
    cached part only, `jaxinfer.layers.step_metadata.AttentionMetadata`)."""
    return max((math.ceil((row.start + len(row.tokens)) / layout.block_size) for row in rows), default=0)


def prepare(sched: SchedulerOutput, layout: BatchLayout) -> StepInputs:
    """Pack one scheduled step into bucket-shaped numpy arrays (rows as `step_rows`).

    Raises:
      ValueError: if the step does not fit the largest bucket (scheduler bug).
    """
    return prepare_rows(step_rows(sched), layout)


def prepare_rows(rows: list[Row], layout: BatchLayout, greedy: bool = False) -> StepInputs:
    """Pack ``rows`` into bucket-shaped numpy arrays; ``greedy``: sample every row by
    argmax, whatever its request asks (a draft model's proposals).

    Raises:
      ValueError: if the rows do not fit the largest bucket (scheduler bug).
    """
    num_rows = len(rows)
    num_tokens = sum(len(r.tokens) for r in rows)
    bucket = layout.ladders.round_up(num_tokens, num_rows, _rows_width(rows, layout))
    sampled_rows = [] if greedy else [r.req.params for r in rows if r.req.pooling is None]
    a = _empty_arrays(bucket, layout, penalties=any(p.has_penalties for p in sampled_rows),
                      mask=not greedy and any(r.req.matcher is not None for r in rows))
    offset = 0
    for i, row in enumerate(rows):
        _fill_tokens(a, i, offset, row, layout)
        if not greedy and row.req.pooling is None:  # a pooling row samples nothing: greedy defaults
            _fill_sampling(a, i, row, layout)
        offset += len(row.tokens)
    a["query_start_loc"][num_rows + 1:] = offset
    a["num_seqs"][...] = num_rows
    a["any_sampled"][...] = np.any(~a["greedy"][:num_rows])
    a["any_penalty"][...] = any(p.has_penalties for p in sampled_rows)
    a["any_sort"][...] = np.any((a["top_k"][:num_rows] < layout.vocab_size) | (a["top_p"][:num_rows] < 1.0))
    a["any_logprobs"][...] = any(p.logprobs is not None for p in sampled_rows)
    scored = [] if greedy else [(r.req, len(r.tokens)) for r in rows]  # a draft model scores no prompt
    inputs = _assemble(bucket, a, prompt_logprobs.step_targets(scored, bucket.num_tokens))
    if not greedy and any(r.req.pooling is not None for r in rows):  # generate-only steps: no pooling input
        inputs.pool_rows, inputs.pool_weights = pooling.step_weights(
            [(r.req, r.start, len(r.tokens)) for r in rows], bucket.num_tokens, bucket.num_seqs)
    return inputs


def empty_inputs(b: Bucket, layout: BatchLayout, penalties: bool = True, mask: bool = True) -> StepInputs:
    """All-padding inputs of bucket ``b``: the shapes warm-up compiles from (``penalties``:
    with the penalty history; ``mask``: with the all-ones bitmask; warm-up takes both so
    that every sampler variant compiles, `jaxinfer.runner.model_runner.ModelRunner.compile`)."""
    return _assemble(b, _empty_arrays(b, layout, penalties, mask))


def _assemble(b: Bucket, a: dict[str, np.ndarray], prompt_targets: np.ndarray | None = None) -> StepInputs:
    """The typed `StepInputs` over the filled arrays ``a`` (no copies)."""
    return StepInputs(b, a["token_ids"], from_arrays(AttentionMetadata, a), from_arrays(SamplingMetadata, a),
                      prompt_targets)


def _empty_arrays(b: Bucket, layout: BatchLayout, penalties: bool, mask: bool) -> dict[str, np.ndarray]:
    """All-padding arrays of bucket ``b`` by field name, which `prepare_rows` fills."""
    T, R, W, V = b.num_tokens, b.num_seqs, b.ctx_blocks, layout.vocab_size
    i32, f32 = np.int32, np.float32
    a = {
        "token_ids": np.zeros(T, i32), "positions": np.zeros(T, i32), "slot_mapping": np.zeros(T, i32),
        "block_tables": np.zeros((R, W), i32), "query_start_loc": np.zeros(R + 1, i32),
        "kv_lens": np.zeros(R, i32), "num_seqs": np.zeros((), i32), "logits_indices": np.zeros(R, i32),
        "temperature": np.ones(R, f32), "top_p": np.ones(R, f32), "top_k": np.full(R, V, i32),
        "min_p": np.zeros(R, f32), "presence_penalty": np.zeros(R, f32), "frequency_penalty": np.zeros(R, f32),
        "repetition_penalty": np.ones(R, f32), "seed_hi": np.zeros(R, np.uint32), "seed_lo": np.zeros(R, np.uint32),
        "output_index": np.zeros(R, i32), "greedy": np.ones(R, bool),
        "bias_ids": np.full((R, layout.max_logit_bias), V, i32), "bias_values": np.zeros((R, layout.max_logit_bias), f32),
        "any_sampled": np.zeros((), bool), "any_sort": np.zeros((), bool), "any_penalty": np.zeros((), bool),
        "any_logprobs": np.zeros((), bool),
    }
    if mask:
        a[MASK_FIELD] = np.full((R, (V + 31) // 32), -1, i32)
    if penalties:
        a.update(hist_ids=np.full((R, layout.max_model_len), V, i32), num_prompt=np.zeros(R, i32),
                 num_hist=np.zeros(R, i32))
    return a


def _fill_tokens(a, i: int, offset: int, row: Row, layout: BatchLayout) -> None:
    bs = layout.block_size
    req, start, tokens, n = row.req, row.start, row.tokens, len(row.tokens)
    pos = np.arange(start, start + n, dtype=np.int32)
    blocks = np.asarray(req.block_ids, np.int32)
    sl = slice(offset, offset + n)
    a["token_ids"][sl] = tokens
    a["positions"][sl] = pos
    a["slot_mapping"][sl] = blocks[pos // bs] * bs + pos % bs
    width = a["block_tables"].shape[1]
    used = min(len(blocks), width)
    a["block_tables"][i, :used] = blocks[:used]
    a["query_start_loc"][i] = offset
    a["query_start_loc"][i + 1] = offset + n
    a["kv_lens"][i] = start + n
    a["logits_indices"][i] = offset + n - 1


def _fill_sampling(a, i: int, row: Row, layout: BatchLayout) -> None:
    req = row.req
    p = req.params
    V = layout.vocab_size
    a["greedy"][i] = p.greedy
    a["temperature"][i] = 1.0 if p.greedy else p.temperature
    a["top_k"][i] = V if p.top_k <= 0 else min(p.top_k, V)
    a["top_p"][i] = p.top_p
    a["min_p"][i] = p.min_p
    a["seed_hi"][i] = (req.seed >> 32) & 0xFFFFFFFF
    a["seed_lo"][i] = req.seed & 0xFFFFFFFF
    a["output_index"][i] = req.num_output_tokens + len(row.drafts)
    if p.logit_bias:
        ids, vals = zip(*p.logit_bias)
        a["bias_ids"][i, :len(ids)] = ids
        a["bias_values"][i, :len(vals)] = vals
    if p.has_penalties:
        a["presence_penalty"][i] = p.presence_penalty
        a["frequency_penalty"][i] = p.frequency_penalty
        a["repetition_penalty"][i] = p.repetition_penalty
        hist = req.all_token_ids + list(row.drafts)
        a["hist_ids"][i, :len(hist)] = hist
        a["num_prompt"][i] = req.num_prompt_tokens
        a["num_hist"][i] = len(hist)

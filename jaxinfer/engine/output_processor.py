"""The engine step's update phase: sampled ids in, `RequestOutput`s out.

`OutputProcessor` owns what turns one step's result into outputs (vLLM v1's output
processor): the per-request incremental detokenizers (text and stop strings), the
acceptance of speculative drafts, the appending of tokens through the scheduler (stop
rules live in `jaxinfer.core.stop`, applied by `jaxinfer.core.sched.scheduler.Scheduler.update`), the
grammar matchers of structured outputs, sampled and prompt logprobs, returned logits, and
the `RequestOutput` records, including a finished request's last one. The engine
(`jaxinfer.engine.llm_engine.LLMEngine`) calls `process` once per executed step and `finish` for a
request that ended outside a step (abort, timeout, a failed step). Host side; no JAX import.
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from jaxinfer.runner import batch as batch_mod
from jaxinfer.core import pooling, prompt_logprobs
from jaxinfer.outputs import CompletionOutput, PoolingOutput, RequestMetrics, RequestOutput
from jaxinfer.core.request import FinishReason, Request
from jaxinfer.core.sched.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


class OutputProcessor:
    """Per-engine update phase (module docstring).

    Args:
      scheduler: a callable returning the engine's scheduler, read at each use (the engine's
        scheduler may be replaced, e.g. by a recording subclass in a notebook): its ``update``
        appends the sampled tokens and applies the stop rules; ``finish`` ends a request
        whose grammar completed.
      stats: the engine's `jaxinfer.engine.llm_engine.EngineStats` (generation tokens, finish reasons).
      requests: the engine's live requests by id; a finished request is removed from it.
      tokenizer: the model's tokenizer, or None (no text, no logprob strings).
      eos_token_ids: the model's end-of-sequence ids.
      return_logits: keep each sampled row's logits on the request (tests, `LLM(return_logits=True)`).
      speculator: a callable returning the engine's speculator (or None); it verifies the
        draft tokens of requests that carry them.
    """

    def __init__(self, scheduler: Callable[[], object], stats, requests: dict[str, Request], tokenizer,
                 eos_token_ids: frozenset[int], return_logits: bool, speculator: Callable[[], object | None]):
        self._scheduler = scheduler
        self.stats = stats
        self.requests = requests
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.return_logits = return_logits
        self._speculator = speculator
        self.detokenizers: dict[str, object] = {}

    def add(self, req: Request) -> None:
        """Start the incremental detokenizer of a new request (when there is a tokenizer)."""
        if self.tokenizer is None or req.pooling is not None:  # a pooling request has no text
            return
        from jaxinfer.tokenizer.tokenizer import IncrementalDetokenizer

        p = req.params
        self.detokenizers[req.request_id] = IncrementalDetokenizer(
            self.tokenizer, req.prompt_token_ids, skip_special_tokens=p.skip_special_tokens, stop=p.stop,
            include_stop_str_in_output=p.include_stop_str_in_output)

    def process(self, sched: SchedulerOutput, result: dict) -> list[RequestOutput]:
        """Apply one executed step's ``result`` (the runner's arrays: ``token_ids`` [rows], and
        logprob / prompt-logprob / logits arrays when the step asked for them) to its requests.

        Returns one output per request that advanced or ended in this step.
        """
        if "prompt_logprob" in result:  # before update advances num_computed_tokens
            offset = 0
            for row in batch_mod.step_rows(sched):  # packed order (a request's verification rows too)
                prompt_logprobs.record(row.req, result, offset, len(row.tokens), self.tokenizer)
                offset += len(row.tokens)
        if "pooled" in result:  # before update finishes the requests whose prompt this step ends
            self._record_pooled(sched, result["pooled"])
        first_row, sampled = self._sampled(sched, result["token_ids"])
        before = {id(req): req.num_output_tokens for req, _ in sched.scheduled}
        got = self._scheduler().update(sched, sampled, self.text_stop)
        outputs = []
        for req in got:
            i = first_row[id(req)]
            for j in range(req.num_output_tokens - before[id(req)]):  # a row per new token
                self.stats.generation_tokens += 1
                tok = req.output_token_ids[before[id(req)] + j]
                if req.matcher is not None:
                    self._advance_matcher(req)
                self._record_logprobs(req, result, i + j, tok)
                if self.return_logits:
                    req.logits.append(np.asarray(result["logits"][i + j]))
            outputs.append(self.finish(req) if req.is_finished else self.output(req))
        return outputs

    @staticmethod
    def _record_pooled(sched: SchedulerOutput, pooled) -> None:
        """Add the step's pooled rows to their pooling requests' running state (`jaxinfer.core.pooling`)."""
        for i, row in enumerate(batch_mod.step_rows(sched)):
            if row.req.pooling is not None and not row.req.is_finished:
                pooling.record(row.req, pooled[i], row.start, len(row.tokens))

    def _sampled(self, sched: SchedulerOutput, ids) -> tuple[dict[int, int], list]:
        """(first result row of each request by ``id(req)``, what each request sampled): one id
        per request, or the accepted run of a request that verified ``k`` drafts in k + 1 rows."""
        first_row, sampled, row = {}, [], 0
        for req, _ in sched.scheduled:
            first_row[id(req)] = row
            k = len(req.draft_token_ids)
            sampled.append(int(ids[row]) if not k else self._speculator().verify(req, ids[row:row + k + 1].tolist()))
            row += k + 1
        return first_row, sampled

    def text_stop(self, req: Request) -> str | None:
        """Advance the request's text by its newest token; the stop string it matched, if any."""
        detok = self.detokenizers.get(req.request_id)
        return None if detok is None else detok.step([req.output_token_ids[-1]])

    def _advance_matcher(self, req: Request) -> None:
        """Feed the new token to the request's grammar; finish it once the grammar is complete."""
        tok = req.output_token_ids[-1]
        if req.is_finished and tok in self.eos_token_ids:
            return
        if not req.matcher.consume_token(tok):  # cannot happen under the mask; keep the text, stop
            logger.warning("request %s: grammar rejected token %d: %s", req.request_id, tok,
                           req.matcher.get_error()[:200])
        if not req.is_finished and (req.matcher.is_stopped() or req.matcher.is_error()):
            self._scheduler().finish(req, FinishReason.STOP)

    def _record_logprobs(self, req: Request, result: dict, i: int, tok: int) -> None:
        """Append the logprobs of ``tok``, sampled in result row ``i`` (when requested)."""
        n = req.params.logprobs
        if n is None:
            return
        entry = prompt_logprobs.token_entry(tok, result["logprob"][i], result["rank"][i], result["top_ids"][i],
                                            result["top_logprobs"][i], n, self.tokenizer)  # masked tokens are -inf
        req.cumulative_logprob += entry[tok].logprob
        req.logprobs.append(entry)

    def finish(self, req: Request) -> RequestOutput:
        """The last output of a finished request: counts its finish reason, releases held-back
        text (unless a stop string ended it) and forgets the request."""
        self.stats.finished[req.finish_reason.value] += 1
        detok = self.detokenizers.pop(req.request_id, None)
        if detok is not None and not isinstance(req.stop_reason, str):
            detok.flush()  # not ended by a stop string: release held-back text
        out = self.output(req, detok)
        self.requests.pop(req.request_id, None)
        return out

    def output(self, req: Request, detok=None) -> RequestOutput:
        """The request's `RequestOutput` as it stands (cumulative text, ids, logprobs, metrics)."""
        detok = detok or self.detokenizers.get(req.request_id)
        text = detok.text if detok is not None else ""
        logprobs_on = req.params.logprobs is not None
        comp = CompletionOutput(
            index=0, text=text, token_ids=list(req.output_token_ids),
            finish_reason=req.finish_reason.value if req.finish_reason else None, stop_reason=req.stop_reason,
            logprobs=list(req.logprobs) if logprobs_on else None,
            cumulative_logprob=req.cumulative_logprob if logprobs_on else None,
            logits=list(req.logits) if self.return_logits else None)
        metrics = RequestMetrics(req.arrival_time, req.first_scheduled_time, req.first_token_time, req.finished_time,
                                 req.num_preemptions)
        # position 0 has no logprob (None); a one-token prompt has nothing else to score
        prompt_lp = list(req.prompt_logprobs or [None]) if req.params.prompt_logprobs is not None else None
        pooled = None
        if req.pooling is not None and req.finish_reason == FinishReason.STOP and req.pooled is not None:
            pooled = PoolingOutput(pooling.finalize(req))
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, [comp], req.is_finished, metrics,
                             num_cached_tokens=req.num_cached_tokens, prompt_logprobs=prompt_lp, pooled=pooled)

"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own per app.

Per-request histograms are observed by the HTTP layer when an engine request ends with
``stop`` or ``length`` (from the engine's ``time.monotonic`` timestamps: arrival, first
scheduled, first token, finished); HTTP error statuses are counted by
`jaxinfer.entrypoints.openai.status_counter.ErrorResponseCounter`; engine state (queues, KV blocks,
counters) is read at scrape time from the engine's `snapshot()` (an `LLMEngine` and a
data-parallel router alike) by a custom collector, so nothing is double-counted and the
engine thread never touches prometheus. Every series carries ``model_name`` (vLLM's label
name): the served model the series is about, one set of series per model when the server
serves several (`jaxinfer.entrypoints.openai.model_registry`). HTTP error responses are counted under
the default (first) model, since a 404 or 413 may name no model. ``*_created`` series are
disabled (process-wide, on import).

Names (vLLM's ``vllm:*`` metrics with our prefix where one exists; semantics follow vLLM):
  histograms  jaxinfer_time_to_first_token_seconds   arrival -> first token
              jaxinfer_time_per_output_token_seconds (finished - first token) / (output tokens - 1)
              jaxinfer_e2e_request_latency_seconds   arrival -> finished
              jaxinfer_request_queue_time_seconds    arrival -> first scheduled
              jaxinfer_request_prefill_time_seconds  first scheduled -> first token
              jaxinfer_request_decode_time_seconds   first token -> finished
              jaxinfer_request_prompt_tokens, jaxinfer_request_generation_tokens
  gauges      jaxinfer_num_requests_running, jaxinfer_num_requests_waiting,
              jaxinfer_kv_blocks_total, jaxinfer_kv_blocks_free, jaxinfer_kv_cache_usage_ratio,
              jaxinfer_kv_fragmentation_ratio (current), jaxinfer_engine_healthy,
              jaxinfer_spec_decode_mean_acceptance_length (since start)
  summary     jaxinfer_kv_fragmentation_step_ratio (_sum, _count: one sample per engine step)
  counters    jaxinfer_request_success_total{finished_reason}, jaxinfer_http_error_responses_total{status},
              jaxinfer_requests_rejected_total{reason}, jaxinfer_preemptions_total,
              jaxinfer_requests_degraded_total{fallback} (model_name: the model asked for),
              jaxinfer_request_timeouts_total, jaxinfer_requests_aborted_total,
              jaxinfer_prompt_tokens_total, jaxinfer_prefill_tokens_total,
              jaxinfer_generation_tokens_total, jaxinfer_compilations_total,
              jaxinfer_prefix_cache_queries_total, jaxinfer_prefix_cache_hits_total,
              jaxinfer_spec_decode_num_drafts_total, jaxinfer_spec_decode_num_draft_tokens_total,
              jaxinfer_spec_decode_num_accepted_tokens_total (vLLM's spec_decode counters)
  /v1/responses store (`register_responses_store`; server-wide, the default model's label):
              jaxinfer_responses_stored, jaxinfer_responses_store_bytes (gauges),
              jaxinfer_responses_store_evictions_total (entries dropped by a limit)
"""
from __future__ import annotations

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from jaxinfer.engine.snapshot import EngineSnapshot
from jaxinfer.outputs import RequestOutput
from jaxinfer.core.request import FinishReason

prometheus_client.disable_created_metrics()  # no duplicate ``*_created`` series next to each counter

MODEL_LABEL = "model_name"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
# vLLM's request-phase buckets (0.3 s ... 7680 s) with finer ones below 0.3 s for fast phases
_PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0, float("inf"))
# vLLM's 1-2-5 token buckets (it stops at max_model_len, unknown here until the engine is built)
_TOKEN_BUCKETS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5)) + (float("inf"),)

REJECT_REASONS = ("queue_full", "queue_wait_expired", "not_ready")
ERROR_STATUSES = (400, 401, 404, 413, 429, 499, 500, 503, 504)  # exposed as 0 before the first one
FINISH_REASONS = tuple(r.value for r in FinishReason)


class Metrics:
    """The server's metrics.

    Args:
      models: the served models (`jaxinfer.entrypoints.openai.model_registry.ModelRegistry`), whose
        engines are read at scrape time; each name is a ``model_name`` label value.
    """

    def __init__(self, models):
        self.model_name = models.default.name  # the label of server-wide series
        self.registry = r = CollectorRegistry()

        def histogram(name: str, doc: str, buckets: tuple):
            return Histogram(name, doc, [MODEL_LABEL], buckets=buckets, registry=r)

        self.ttft = histogram("jaxinfer_time_to_first_token_seconds", "Arrival to first output token (s).",
                              _LATENCY_BUCKETS)
        self.tpot = histogram("jaxinfer_time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request (s).", _TPOT_BUCKETS)
        self.e2e = histogram("jaxinfer_e2e_request_latency_seconds", "Arrival to finish (s).", _LATENCY_BUCKETS)
        self.queue_time = histogram("jaxinfer_request_queue_time_seconds",
                                    "Arrival to first scheduled (waiting for admission, s).", _PHASE_BUCKETS)
        self.prefill_time = histogram("jaxinfer_request_prefill_time_seconds",
                                      "First scheduled to first output token (s).", _PHASE_BUCKETS)
        self.decode_time = histogram("jaxinfer_request_decode_time_seconds",
                                     "First output token to finish (s).", _PHASE_BUCKETS)
        self.prompt_len = histogram("jaxinfer_request_prompt_tokens", "Prompt length of finished requests (tokens).",
                                    _TOKEN_BUCKETS)
        self.output_len = histogram("jaxinfer_request_generation_tokens",
                                    "Generated tokens of finished requests.", _TOKEN_BUCKETS)
        self._rejected = Counter("jaxinfer_requests_rejected", "HTTP requests refused for overload or readiness.",
                                 [MODEL_LABEL, "reason"], registry=r)
        self._degraded = Counter("jaxinfer_requests_degraded",
                                 "Requests the fallback model took instead of the model asked for (model_name): "
                                 "their estimated time to first token exceeded --degrade-ttft-slo, or that "
                                 "model's queue was full.",
                                 [MODEL_LABEL, "fallback"], registry=r)
        for m in models:
            for h in (self.ttft, self.tpot, self.e2e, self.queue_time, self.prefill_time, self.decode_time,
                      self.prompt_len, self.output_len):
                h.labels(m.name)  # every series exists (at 0) from the start
            for reason in REJECT_REASONS:
                self._rejected.labels(m.name, reason)
            if models.fallback is not None and m.name != models.fallback:
                self._degraded.labels(m.name, models.fallback)
        self._errors = Counter("jaxinfer_http_error_responses",
                               "HTTP responses with status >= 400, by status (each response counted once).",
                               [MODEL_LABEL, "status"], registry=r)
        for status in ERROR_STATUSES:
            self._errors.labels(self.model_name, str(status))
        r.register(_EngineCollector(models))

    def reject(self, reason: str, model: str | None = None) -> None:
        """Count a request for ``model`` (default: the default model) refused for ``reason``
        (one of `REJECT_REASONS`)."""
        self._rejected.labels(model or self.model_name, reason).inc()

    def count_degraded(self, model: str, fallback: str) -> None:
        """Count one request for ``model`` that the ``fallback`` model answered instead."""
        self._degraded.labels(model, fallback).inc()

    def count_error_response(self, status: int) -> None:
        """Count one HTTP response with this status (>= 400)."""
        self._errors.labels(self.model_name, str(status)).inc()

    def observe_finished(self, out: RequestOutput, model: str | None = None) -> None:
        """Record the histograms of a request that ``model`` (default: the default model)
        ended with ``stop`` or ``length`` (intervals in seconds from its ``time.monotonic``
        timestamps; lengths in tokens)."""
        m = out.metrics
        if m is None or m.finished_time is None:
            return
        label = model or self.model_name
        n = len(out.outputs[0].token_ids)
        self.e2e.labels(label).observe(m.finished_time - m.arrival_time)
        self.prompt_len.labels(label).observe(len(out.prompt_token_ids))
        self.output_len.labels(label).observe(n)
        if m.first_scheduled_time is not None:
            self.queue_time.labels(label).observe(m.first_scheduled_time - m.arrival_time)
        if m.first_token_time is not None:
            self.ttft.labels(label).observe(m.first_token_time - m.arrival_time)
            self.decode_time.labels(label).observe(m.finished_time - m.first_token_time)
            if m.first_scheduled_time is not None:
                self.prefill_time.labels(label).observe(m.first_token_time - m.first_scheduled_time)
            if n > 1:
                self.tpot.labels(label).observe((m.finished_time - m.first_token_time) / (n - 1))

    def register_responses_store(self, store) -> None:
        """Expose a `jaxinfer.entrypoints.openai.responses_store.ResponseStore`'s size, bytes
        charged and evictions (read at scrape time)."""
        self.registry.register(_StoreCollector(store, self.model_name))

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_GAUGES = {  # EngineSnapshot attribute -> help
    "num_requests_running": "Requests holding KV blocks.",
    "num_requests_waiting": "Requests queued for admission.",
    "kv_blocks_total": "Usable KV blocks.",
    "kv_blocks_free": "Free KV blocks (evictable prefix-cache blocks included).",
    "kv_cache_usage_ratio": "Fraction of KV blocks in use.",
    "spec_decode_mean_acceptance_length": "Speculative decoding: tokens emitted per verified draft since start "
                                          "(1 + accepted / drafts; 0 before any draft).",
    "kv_fragmentation_ratio": "Current share of the KV token slots that requests hold but that hold no "
                              "token yet (1 - computed tokens / (held blocks x block size)); 0 when idle.",
}
_SNAPSHOT_FIELD = {"num_requests_running": "num_running", "num_requests_waiting": "num_waiting",
                   "spec_decode_mean_acceptance_length": "spec_mean_acceptance_length"}
_COUNTERS = {  # metric name (without _total) -> (EngineSnapshot attribute, help)
    "preemptions": ("preemptions", "Requests preempted (recomputed later)."),
    "prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    "prefix_cache_evictions": ("prefix_cache_evictions", "Cached KV blocks reclaimed (their prefix dropped) "
                               "for new allocations."),
    "request_timeouts": ("timeouts", "Sequences evicted at their deadline (a request with n > 1 counts n)."),
    "requests_aborted": ("aborted", "Requests aborted (client gone)."),
    "prompt_tokens": ("prompt_tokens", "Prompt tokens of admitted requests."),
    "prefill_tokens": ("prefill_tokens", "Prompt tokens computed (recomputation included)."),
    "generation_tokens": ("generation_tokens", "Tokens generated."),
    "compilations": ("compilations", "XLA compilations by the model runner."),
    "spec_decode_num_drafts": ("spec_num_drafts", "Speculative decoding: verifications of a request's drafts."),
    "spec_decode_num_draft_tokens": ("spec_num_draft_tokens", "Speculative decoding: draft tokens proposed."),
    "spec_decode_num_accepted_tokens": ("spec_num_accepted_tokens", "Speculative decoding: draft tokens accepted."),
}


class _EngineCollector:
    """Turns every served model's `EngineSnapshot` into families at scrape time: each family
    once, with one series per model (``model_name``), as the Prometheus text format wants (a
    second ``# TYPE`` line for a name is an error to its strict parsers).

    Args:
      models: the served models (``.name``, ``.async_engine``), in the registry's order.
    """

    def __init__(self, models):
        self.models = list(models)

    def describe(self):
        return []

    def collect(self):
        healthy = GaugeMetricFamily("jaxinfer_engine_healthy", "1 when the engine is ready to serve.",
                                    labels=[MODEL_LABEL])
        gauges = {name: GaugeMetricFamily(f"jaxinfer_{name}", doc, labels=[MODEL_LABEL])
                  for name, doc in _GAUGES.items()}
        steps = SummaryMetricFamily("jaxinfer_kv_fragmentation_step_ratio",
                                    "KV fragmentation sampled once per engine step (mean over an interval: "
                                    "increase of _sum / increase of _count).", labels=[MODEL_LABEL])
        counters = {name: CounterMetricFamily(f"jaxinfer_{name}", doc, labels=[MODEL_LABEL])
                    for name, (_, doc) in _COUNTERS.items()}
        success = CounterMetricFamily("jaxinfer_request_success", "Engine requests that ended, by finish reason "
                                      "(stop, length, abort, timeout, rejected, error, failed).",
                                      labels=[MODEL_LABEL, "finished_reason"])
        loaded = False
        for model in self.models:
            label = [model.name]
            healthy.add_metric(label, float(model.async_engine.is_healthy))
            engine = model.async_engine.engine
            if engine is None:  # still loading: its engine series appear once it is built
                continue
            loaded = True
            snap: EngineSnapshot = engine.snapshot()
            for name, family in gauges.items():
                family.add_metric(label, float(getattr(snap, _SNAPSHOT_FIELD.get(name, name))))
            steps.add_metric(label, count_value=snap.fragmentation_steps, sum_value=snap.fragmentation_step_sum)
            for name, (field, _) in _COUNTERS.items():
                counters[name].add_metric(label, float(getattr(snap, field)))
            for reason in FINISH_REASONS:
                success.add_metric(label + [reason], float(snap.finished.get(reason, 0)))
        yield healthy
        if loaded:
            yield from gauges.values()
            yield steps
            yield from counters.values()
            yield success


class _StoreCollector:
    """The responses store's gauges and eviction counter, read at scrape time."""

    def __init__(self, store, model_name: str):
        self.store, self.model_name = store, model_name

    def describe(self):
        return []

    def collect(self):
        label = [self.model_name]
        for name, doc, value in (("jaxinfer_responses_stored", "Responses kept for previous_response_id and GET.",
                                  len(self.store)),
                                 ("jaxinfer_responses_store_bytes", "Bytes the stored responses are charged "
                                  "(<= --responses-store-max-bytes).", self.store.bytes_charged)):
            g = GaugeMetricFamily(name, doc, labels=[MODEL_LABEL])
            g.add_metric(label, value)
            yield g
        c = CounterMetricFamily("jaxinfer_responses_store_evictions", "Stored responses dropped by the store's "
                                "entry, byte or age limit.", labels=[MODEL_LABEL])
        c.add_metric(label, self.store.evictions)
        yield c

"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own per app.

Latency histograms are observed by the HTTP layer when an engine request ends; engine
state (queues, KV blocks, counters) is read from the engine at scrape time by a custom
collector, so nothing is double-counted and the engine thread never touches prometheus.
Names:
  histograms  jaxinfer_time_to_first_token_seconds, jaxinfer_time_per_output_token_seconds,
              jaxinfer_e2e_request_latency_seconds
  gauges      jaxinfer_num_requests_running, jaxinfer_num_requests_waiting,
              jaxinfer_kv_blocks_total, jaxinfer_kv_blocks_free, jaxinfer_kv_cache_usage_ratio,
              jaxinfer_kv_fragmentation_ratio (mean over steps since start), jaxinfer_engine_healthy
  counters    jaxinfer_preemptions_total, jaxinfer_requests_rejected_total{reason},
              jaxinfer_request_timeouts_total, jaxinfer_requests_aborted_total,
              jaxinfer_prompt_tokens_total, jaxinfer_prefill_tokens_total,
              jaxinfer_generation_tokens_total, jaxinfer_compilations_total,
              jaxinfer_prefix_cache_queries_total, jaxinfer_prefix_cache_hits_total
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jaxinfer.outputs import RequestOutput

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))

REJECT_REASONS = ("queue_full", "queue_wait_expired", "not_ready")


class Metrics:
    """The server's metrics.

    Args:
      async_engine: the `AsyncEngine` whose engine is read at scrape time.
    """

    def __init__(self, async_engine):
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("jaxinfer_time_to_first_token_seconds", "Arrival to first output token (s).",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("jaxinfer_time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request (s).",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("jaxinfer_e2e_request_latency_seconds", "Arrival to finish (s).",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.rejected = Counter("jaxinfer_requests_rejected", "HTTP requests refused for overload or readiness.",
                                ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        r.register(_EngineCollector(async_engine))

    def observe_finished(self, out: RequestOutput) -> None:
        """Record the latencies of a request that ended with ``stop`` or ``length``."""
        m = out.metrics
        if m is None or m.finished_time is None:
            return
        self.e2e.observe(m.finished_time - m.arrival_time)
        if m.first_token_time is not None:
            self.ttft.observe(m.first_token_time - m.arrival_time)
            n = len(out.outputs[0].token_ids)
            if n > 1:
                self.tpot.observe((m.finished_time - m.first_token_time) / (n - 1))

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineCollector:
    """Reads the engine's gauges and counters at scrape time (plain ints, GIL-atomic reads)."""

    def __init__(self, async_engine):
        self.async_engine = async_engine

    def describe(self):
        return []

    def collect(self):
        engine = self.async_engine.engine
        yield GaugeMetricFamily("jaxinfer_engine_healthy", "1 when the engine is ready to serve.",
                                value=float(self.async_engine.is_healthy))
        if engine is None:
            return
        total, free = engine.num_total_blocks, engine.num_free_blocks
        st = engine.stats
        gauges = {
            "num_requests_running": ("Requests holding KV blocks.", engine.num_running),
            "num_requests_waiting": ("Requests queued for admission.", engine.num_waiting),
            "kv_blocks_total": ("Usable KV blocks.", total),
            "kv_blocks_free": ("Free KV blocks.", free),
            "kv_cache_usage_ratio": ("Fraction of KV blocks in use.", (total - free) / total if total else 0.0),
            "kv_fragmentation_ratio": ("Mean share of reserved KV slots holding no token.",
                                       st.fragmentation_sum / st.fragmentation_samples
                                       if st.fragmentation_samples else 0.0),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"jaxinfer_{name}", doc, value=float(value))
        counters = {
            "preemptions": ("Requests preempted (recomputed later).", engine.scheduler.num_preemptions),
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.",
                                     getattr(engine.scheduler, "prefix_queries", 0)),
            "prefix_cache_hits": ("Prompt tokens found in the prefix cache.",
                                  getattr(engine.scheduler, "prefix_hits", 0)),
            "request_timeouts": ("Sequences evicted at their deadline (a request with n > 1 counts n).", st.timeouts),
            "requests_aborted": ("Requests aborted (client gone).", st.aborted),
            "prompt_tokens": ("Prompt tokens of admitted requests.", st.prompt_tokens),
            "prefill_tokens": ("Prompt tokens computed (recomputation included).", st.prefill_tokens),
            "generation_tokens": ("Tokens generated.", st.generation_tokens),
            "compilations": ("XLA compilations by the model runner.", getattr(engine.runner, "num_compilations", 0)),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"jaxinfer_{name}", doc, value=float(value))

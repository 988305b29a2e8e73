"""Serving benchmark client (``python -m jaxinfer.bench serve ...``).

Drives any OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` endpoint
with streaming requests and reports TTFT, TPOT, ITL, E2E latency, throughput, goodput and
outcome counts. Modules:

  * `workloads`: request lengths (fixed, uniform, normal, synthetic ShareGPT-like,
    shared prefix) and the prompts built from them (random token-id lists or their text).
  * `client`: one streaming request -> `RequestResult` (timings from the SSE stream).
  * `load`: closed-loop concurrency or Poisson/gamma arrivals, warm-up, progress bar.
  * `stats`: percentiles, throughput, goodput, outcome counts over many results.
  * `metadata`: what was measured (model, checkpoint hash, git commit, device, server).
  * `report`: JSON, a markdown table, latency / throughput plots and the console summary.
Host-side only: no JAX import (the client must not perturb the server it measures).
"""

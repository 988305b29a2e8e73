"""Aggregate per-request results into the numbers a benchmark reports.

Latency summaries are in milliseconds: mean, median, P90, P95, P99 (``numpy.percentile``,
linear interpolation). Throughputs divide by the measured phase's wall time (first send
to last completion, warm-up excluded):
  * output throughput: output tokens of successful requests / s;
  * total token throughput: (prompt + output) tokens of successful requests / s, prompt
    tokens per `RequestResult.input_tokens` (the server's ``usage`` for completions; for
    chat the raw prompt text's tokens, without the chat template's; the server's count,
    template included, is ``server_prompt_tokens``);
  * request throughput: successful requests / s;
  * goodput: successful requests / s that met both SLOs, TTFT <= ``slo_ttft_ms`` and
    TPOT <= ``slo_tpot_ms`` (DistServe's definition, Zhong et al. 2024).
TTFT / TPOT / E2E are over successful requests; ITL pools every gap of every successful
request. With client retries (``LoadConfig.max_retries``) TTFT counts from the last send;
``ttft_with_retries_ms`` counts from the first, and ``retries`` sums the resends.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from jaxinfer.bench.client import OUTCOMES, RequestResult

PERCENTILES = (50, 90, 95, 99)


def summarize_ms(values_s: Iterable[float]) -> dict:
    """Mean, median and percentiles of durations given in seconds, reported in ms.

    Returns:
      ``{"count", "mean", "median", "p90", "p95", "p99"}`` (None values when empty).
    """
    x = np.asarray([v for v in values_s if v is not None], np.float64) * 1e3
    if x.size == 0:
        return {"count": 0, "mean": None, "median": None, **{f"p{p}": None for p in PERCENTILES[1:]}}
    pct = np.percentile(x, PERCENTILES)
    return {"count": int(x.size), "mean": float(x.mean()), "median": float(pct[0]),
            **{f"p{p}": float(v) for p, v in zip(PERCENTILES[1:], pct[1:])}}


def count_outcomes(results: Sequence[RequestResult]) -> dict:
    """Requests per outcome (every name in `OUTCOMES`, zeros included) plus ``total`` and
    ``http_200`` (responses with status 200, whatever happened to their stream)."""
    counts = {name: 0 for name in OUTCOMES}
    for r in results:
        counts[r.outcome] += 1
    counts["http_200"] = sum(r.status == 200 for r in results)
    counts["total"] = len(results)
    return counts


def meets_slo(r: RequestResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    """A successful request within both SLOs (a one-token request has no TPOT to miss)."""
    if r.outcome != "ok":
        return False
    if slo_ttft_ms is not None and r.ttft * 1e3 > slo_ttft_ms:
        return False
    tpot = r.tpot
    return not (slo_tpot_ms is not None and tpot is not None and tpot * 1e3 > slo_tpot_ms)


def aggregate(results: Sequence[RequestResult], duration_s: float, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict:
    """Everything the report needs from one measured phase.

    Args:
      results: measured requests (warm-up excluded).
      duration_s: wall time of the measured phase, seconds.
      slo_ttft_ms, slo_tpot_ms: goodput thresholds (None: not constrained).
    """
    ok = [r for r in results if r.outcome == "ok"]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.input_tokens for r in ok)
    good = sum(meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in ok)
    def per_s(v: float) -> float:
        return v / duration_s if duration_s > 0 else 0.0

    return {
        "duration_s": duration_s,
        "counts": count_outcomes(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "input_tokens": in_tokens,
        "server_prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "output_tokens": out_tokens,
        "output_throughput_tok_s": per_s(out_tokens),
        "total_token_throughput_tok_s": per_s(in_tokens + out_tokens),
        "request_throughput_req_s": per_s(len(ok)),
        "goodput_req_s": per_s(good),
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "requests_meeting": good,
                "fraction_meeting": good / len(results) if results else 0.0},
        "retries": sum(r.attempts - 1 for r in results),
        "ttft_ms": summarize_ms(r.ttft for r in ok),
        "ttft_with_retries_ms": summarize_ms(r.ttft + r.retry_wait for r in ok),
        "tpot_ms": summarize_ms(r.tpot for r in ok),
        "itl_ms": summarize_ms(g for r in ok for g in r.itl),
        "e2el_ms": summarize_ms(r.e2el for r in ok),
    }

"""The soak run's verdict and plot (`benchmarks/soak.py` collects, this module judges).

Owns `evaluate` (the acceptance checks of issue 19, computed from the run's samples,
idle-gap checks and per-request records) and `plot` (RSS, KV blocks free and TTFT p50 / p99
over time). Plain Python + numpy (+ matplotlib for the plot); no JAX, no server.

Acceptance, after the warm phase (``warm_s``):
  * ``rss_growth``: the median RSS of the last 3 samples is < 5% above the median of the
    first 3 samples after warm-up;
  * ``kv_free_returns``: at the end of every idle gap, KV blocks free equals its idle value
    (measured before any load);
  * ``fds_flat`` / ``threads_flat``: at the ends of the idle gaps after warm-up, open file
    descriptors and threads never exceed the first such value by more than a small
    tolerance (`FD_TOLERANCE`, `THREAD_TOLERANCE`: keep-alive connections come and go);
  * ``no_unexpected_5xx``: no response (status, or an error event in a stream) is a 5xx,
    except the 504s of the requests sent with a short ``request_timeout`` on purpose;
  * ``every_request_answered``: every request got a status and, when streamed, ``[DONE]``
    (or was closed by its own client on purpose);
  * ``ttft_p99_stable``: TTFT p99 of the last ``W`` seconds is <= 1.2x that of the first
    ``W`` seconds after warm-up, ``W = min(300, (end - warm_s) / 2)``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

RSS_GROWTH_LIMIT = 0.05
TTFT_RATIO_LIMIT = 1.2
TTFT_WINDOW_S = 300.0
FD_TOLERANCE = 8
THREAD_TOLERANCE = 4
EXPECTED_OUTCOMES = {"ok", "client_abort", "rate_limited", "timeout_expected"}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation), None for no values."""
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else None


def _check(passed: bool, **detail) -> dict:
    return {"pass": bool(passed), **detail}


def rss_growth(samples: Sequence[dict], warm_s: float) -> dict:
    """RSS growth from the first to the last 3 samples after warm-up (fraction)."""
    rss = [s["rss_bytes"] for s in samples if s["t"] >= warm_s]
    if len(rss) < 2:
        return _check(False, reason="fewer than 2 samples after warm-up")
    k = min(3, len(rss) // 2)
    first, last = float(np.median(rss[:k])), float(np.median(rss[-k:]))
    growth = last / first - 1.0
    return _check(growth < RSS_GROWTH_LIMIT, first_bytes=first, last_bytes=last, growth=growth,
                  limit=RSS_GROWTH_LIMIT)


def kv_free_returns(idle_checks: Sequence[dict], idle_value: float) -> dict:
    """KV blocks free at the end of every idle gap equals the value before any load."""
    values = [c["kv_free"] for c in idle_checks]
    bad = [c["t"] for c in idle_checks if c["kv_free"] != idle_value]
    return _check(bool(values) and not bad, idle_value=idle_value, at_gap_ends=values, gaps_not_returned_at_s=bad,
                  **({} if values else {"reason": "no idle gap ended during the run"}))


def flat(idle_checks: Sequence[dict], warm_s: float, key: str, tolerance: int) -> dict:
    """``key`` at the ends of the idle gaps after warm-up never exceeds the first by more than ``tolerance``."""
    values = [c[key] for c in idle_checks if c["t"] >= warm_s]
    if len(values) < 2:
        return _check(False, values=values, reason="fewer than 2 idle gaps ended after warm-up: nothing to compare")
    return _check(max(values) - values[0] <= tolerance, values=values, tolerance=tolerance)


def ttft_stable(requests: Sequence[dict], warm_s: float, end_s: float) -> dict:
    """TTFT p99 of the last window vs the first window after warm-up (successful requests)."""
    window = min(TTFT_WINDOW_S, (end_s - warm_s) / 2)
    firsts = [(r["t_first_token"], r["ttft_s"]) for r in requests if r["outcome"] == "ok" and r["ttft_s"] is not None]
    early = [v for t, v in firsts if warm_s <= t < warm_s + window]
    late = [v for t, v in firsts if end_s - window <= t <= end_s]
    if not early or not late:
        return _check(False, reason="no successful request in one of the windows", window_s=window)
    p_early, p_late = percentile(early, 99), percentile(late, 99)
    ratio = p_late / p_early if p_early > 0 else float("inf")
    return _check(ratio <= TTFT_RATIO_LIMIT, window_s=window, first_p99_s=p_early, last_p99_s=p_late, ratio=ratio,
                  requests=[len(early), len(late)], limit=TTFT_RATIO_LIMIT)


def evaluate(samples: Sequence[dict], idle_checks: Sequence[dict], requests: Sequence[dict], *, idle_kv_free: float,
             warm_s: float, end_s: float) -> dict:
    """Every acceptance check (see the module docstring); ``all_pass`` when all pass.

    Args:
      samples: periodic samples, each with ``t`` (s from the start) and ``rss_bytes``.
      idle_checks: one per ended idle gap: ``t``, ``kv_free``, ``fds``, ``threads``.
      requests: one per request: ``outcome`` (see `EXPECTED_OUTCOMES`; anything else
        counts against the run), ``status``, ``t_first_token`` and ``ttft_s`` (None
        without a first token).
      idle_kv_free: KV blocks free before any load.
      warm_s, end_s: the end of the warm phase and of the run (s from the start).
    """
    outcomes: dict[str, int] = {}
    for r in requests:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    unexpected_5xx = [r for r in requests if r["outcome"] == "server_error"]
    unanswered = [r for r in requests if r["outcome"] == "unanswered"]
    checks = {
        "rss_growth": rss_growth(samples, warm_s),
        "kv_free_returns": kv_free_returns(idle_checks, idle_kv_free),
        "fds_flat": flat(idle_checks, warm_s, "fds", FD_TOLERANCE),
        "threads_flat": flat(idle_checks, warm_s, "threads", THREAD_TOLERANCE),
        "no_unexpected_5xx": _check(not unexpected_5xx, count=len(unexpected_5xx),
                                    examples=[r.get("error") for r in unexpected_5xx[:5]]),
        "every_request_answered": _check(not unanswered, count=len(unanswered),
                                         examples=[r.get("error") for r in unanswered[:5]]),
        "ttft_p99_stable": ttft_stable(requests, warm_s, end_s),
    }
    return {"all_pass": all(c["pass"] for c in checks.values()), "checks": checks, "outcomes": outcomes}


def plot(path: Path, samples: Sequence[dict], idle_checks: Sequence[dict], *, warm_s: float, title: str) -> Path:
    """Three panels over time (minutes): RSS (MiB), KV blocks free, TTFT p50 / p99 (ms) per
    sample interval; the warm phase shaded, the idle-gap ends marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([s["t"] for s in samples]) / 60
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [s["rss_bytes"] / 2**20 for s in samples], marker=".")
    axes[0].set_ylabel("server RSS (MiB)")
    axes[1].plot(t, [s["kv_free"] for s in samples], marker=".", label="sampled")
    axes[1].scatter([c["t"] / 60 for c in idle_checks], [c["kv_free"] for c in idle_checks], color="C3", zorder=3,
                    label="end of idle gap")
    axes[1].set_ylabel("KV blocks free")
    axes[1].legend(loc="lower right")
    for q, key in ((50, "ttft_p50_ms"), (99, "ttft_p99_ms")):
        axes[2].plot(t, [np.nan if s[key] is None else s[key] for s in samples], marker=".", label=f"p{q}")
    axes[2].set_ylabel("TTFT (ms)")
    axes[2].set_xlabel("minutes")
    axes[2].legend(loc="upper left")
    for ax in axes:
        ax.axvspan(0, warm_s / 60, color="0.9", zorder=0)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Write benchmark results: JSON, a markdown table, plots (matplotlib, Agg backend).

  * ``<label>.json``: metadata, the aggregate summary and every request's raw timings.
  * ``<label>.md`` / `markdown_table`: one row per run (throughputs, latency percentiles,
    outcome counts), ready to paste into a README.
  * ``<label>_cdf.png``: empirical CDFs of TTFT, TPOT, ITL and E2E latency (ms).
  * `plot_sweep`: output throughput and P99 TTFT against concurrency over several runs.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxinfer.bench.client import RequestResult


def result_dict(label: str, metadata: dict, summary: dict, results: Sequence[RequestResult]) -> dict:
    """One run as a JSON-able dict (raw per-request timings in seconds, plus their TPOT)."""
    raw = [{**dataclasses.asdict(r), "tpot": r.tpot} for r in results]
    return {"label": label, "metadata": metadata, "summary": summary, "requests": raw}


def write_json(path: Path, obj: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))
    return path


def _fmt(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown_table(runs: Sequence[tuple[str, dict]]) -> str:
    """Rows of (label, summary from `stats.aggregate`, optionally with ``kv_fragmentation``).

    Columns: completed/total, output tok/s, request/s, goodput, TTFT / TPOT / ITL / E2E
    (median and P99, ms), 429 / 4xx / 5xx / timeouts / client and stream errors, fragmentation.
    """
    head = ("| run | ok/total | out tok/s | req/s | goodput req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
            "| ITL p50 / p99 ms | E2E p50 / p99 ms | 429 | 4xx | 5xx | timeout | client / stream err | KV frag |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, s in runs:
        c = s["counts"]
        lat = [f"{_fmt(s[k]['median'])} / {_fmt(s[k]['p99'])}" for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")]
        frag = s.get("kv_fragmentation")
        lines.append(f"| {label} | {s['completed']}/{c['total']} | {_fmt(s['output_throughput_tok_s'])} "
                     f"| {_fmt(s['request_throughput_req_s'], 2)} | {_fmt(s['goodput_req_s'], 2)} | "
                     + " | ".join(lat)
                     + f" | {c['http_429']} | {c['http_4xx']} | {c['http_5xx']} | {c['timeout']} "
                       f"| {c['client_error']} / {c['stream_error']} | {_fmt(frag, 3)} |")
    return "\n".join(lines) + "\n"


def plot_cdfs(path: Path, runs: Sequence[tuple[str, Sequence[RequestResult]]]) -> Path:
    """Empirical CDFs (TTFT, TPOT, ITL, E2E; ms) of successful requests, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    getters = {"TTFT": lambda r: [r.ttft], "TPOT": lambda r: [r.tpot], "ITL": lambda r: r.itl,
               "E2E latency": lambda r: [r.e2el]}
    for ax, (name, get) in zip(axes, getters.items()):
        for label, results in runs:
            x = np.sort([v * 1e3 for r in results if r.outcome == "ok" for v in get(r) if v is not None])
            if x.size:
                ax.plot(x, np.arange(1, x.size + 1) / x.size, label=label)
        ax.set(title=name, xlabel="ms", ylabel="fraction of requests" if name != "ITL" else "fraction of gaps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(path: Path, series: dict[str, Sequence[tuple[float, dict]]]) -> Path:
    """Output throughput and P99 TTFT against concurrency.

    Args:
      series: system label -> [(concurrency, summary)], one line per system.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, points in series.items():
        points = sorted(points, key=lambda p: p[0])
        xs = [p[0] for p in points]
        a.plot(xs, [p[1]["output_throughput_tok_s"] for p in points], "o-", label=label)
        b.plot(xs, [p[1]["ttft_ms"]["p99"] or np.nan for p in points], "o-", label=label)
    a.set(title="output throughput", xlabel="concurrency", ylabel="tokens/s")
    b.set(title="P99 TTFT", xlabel="concurrency", ylabel="ms", yscale="log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Write benchmark results: JSON, a markdown table, plots (matplotlib, Agg backend).

  * ``<label>.json``: metadata, the aggregate summary and every request's raw timings.
  * ``<label>.md`` / `markdown_table`: one row per run (throughputs, latency percentiles,
    outcome counts), ready to paste into a README.
  * ``<label>_cdf.png``: empirical CDFs of TTFT, TPOT, ITL and E2E latency (ms).
  * `plot_sweep`: output throughput and P99 TTFT against concurrency over several runs.
  * `console_summary`: the text block printed after a run, with the lines of vLLM's
    ``vllm bench serve`` result (requests, duration, token totals, throughputs, and
    mean / median / P90 / P99 of TTFT, TPOT, ITL and E2EL in ms).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxinfer.bench.client import OUTCOMES, RequestResult


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


WIDTH = 50  # characters per console line
LATENCIES = (("ttft_ms", "TTFT", "Time to First Token"), ("tpot_ms", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl_ms", "ITL", "Inter-token Latency"), ("e2el_ms", "E2EL", "End-to-end Latency"))
LATENCY_STATS = (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99"))


def _line(name: str, value, digits: int = 2) -> str:
    text = str(value) if isinstance(value, int) else _fmt(value, digits)
    return f"{name + ':':<{WIDTH - 12}}{text:>12}"


def console_summary(summary: dict, label: str | None = None) -> str:
    """A run's summary as the terminal block printed after it.

    Args:
      summary: from `stats.aggregate`.
      label: the run's name, shown in the title when given.

    Returns:
      Lines of `WIDTH` characters: successful / failed requests (failures split by outcome),
      duration (s), total input / generated tokens, request / output / total token
      throughput, goodput when an SLO was set, then mean / median / P90 / P99 of TTFT, TPOT,
      ITL and E2EL in ms ("-" where no request measured it); with speculative decoding
      (``summary["spec_decode"]``, `jaxinfer.bench.serve.spec_decode_summary`), its
      acceptance rate and length. The same lines and units as
      vLLM's ``vllm bench serve`` result, so the two can be read side by side.
    """
    c = summary["counts"]
    failed = c["total"] - summary["completed"]
    title = " Serving Benchmark Result " + (f"({label}) " if label else "")
    out = [title.center(WIDTH, "="), _line("Successful requests", summary["completed"]),
           _line("Failed requests", failed)]
    out += [_line(f"  {name}", c[name]) for name in OUTCOMES if name != "ok" and c.get(name)]
    out += [_line("Benchmark duration (s)", summary["duration_s"]),
            _line("Total input tokens", int(summary["input_tokens"])),
            _line("Total generated tokens", int(summary["output_tokens"])),
            _line("Request throughput (req/s)", summary["request_throughput_req_s"]),
            _line("Output token throughput (tok/s)", summary["output_throughput_tok_s"]),
            _line("Total token throughput (tok/s)", summary["total_token_throughput_tok_s"])]
    slo = summary.get("slo") or {}
    if slo.get("ttft_ms") is not None or slo.get("tpot_ms") is not None:
        out.append(_line("Request goodput (req/s)", summary["goodput_req_s"]))
    for key, short, long in LATENCIES:
        out.append(f" {long} ".center(WIDTH, "-"))
        out += [_line(f"{name} {short} (ms)", summary[key][stat]) for stat, name in LATENCY_STATS]
    spec = summary.get("spec_decode")
    if spec:  # vLLM's "Speculative Decoding" block
        out += [" Speculative Decoding ".center(WIDTH, "-"),
                _line("Acceptance rate (%)", 100 * spec["acceptance_rate"]),
                _line("Acceptance length", spec["mean_acceptance_length"]),
                _line("Drafts", spec["num_drafts"]), _line("Draft tokens", spec["num_draft_tokens"]),
                _line("Accepted tokens", spec["num_accepted_tokens"])]
    out.append("=" * WIDTH)
    return "\n".join(out) + "\n"


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

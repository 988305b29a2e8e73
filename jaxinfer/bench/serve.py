"""``python -m jaxinfer.bench serve``: benchmark a running OpenAI-compatible server.

`run_benchmark` is the library entry point (``benchmarks/compare.py`` calls it): build the
workload, warm up, offer the load, aggregate, then write ``<out>/<label>.json``,
``<label>.md`` and ``<label>_cdf.png``. Several ``--concurrency`` values run one after
another and add ``<label>_sweep.png`` / ``<label>_sweep.md``.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from jaxinfer.bench import load, metadata, report, stats, workloads


def run_benchmark(load_cfg: load.LoadConfig, workload: workloads.WorkloadConfig, *, label: str,
                  out_dir: Path | None = None, warmup_requests: int = 0, slo_ttft_ms: float | None = None,
                  slo_tpot_ms: float | None = None, server_info: dict | None = None, decode=None) -> dict:
    """Run one benchmark and (if ``out_dir``) write its files.

    Args:
      warmup_requests: requests sent first and excluded from every number.
      slo_ttft_ms, slo_tpot_ms: goodput thresholds in milliseconds.
      server_info: what the caller knows about the server (backend, dtype, device, flags).
      decode: token ids -> text, to send text prompts instead of token ids.

    Returns:
      `report.result_dict`: label, metadata, summary, per-request timings.
    """
    meta = metadata.collect(load_cfg.model, server_info)
    meta.update(workload=workloads.describe(workload), warmup_requests=warmup_requests,
                load={k: v for k, v in dataclasses.asdict(load_cfg).items() if k != "progress"})
    requests = workloads.build_requests(workload, decode=decode)
    warm = workloads.build_requests(workload, warmup_requests, seed_offset=1_000_003, decode=decode)
    meta["server_before"] = metadata.server_state(load_cfg.base_url)
    results, duration = asyncio.run(load.run(load_cfg, requests, warm))
    meta["server_after"] = after = metadata.server_state(load_cfg.base_url)
    summary = stats.aggregate(results, duration, slo_ttft_ms, slo_tpot_ms)
    frag = step_mean_fragmentation(meta["server_before"]["metrics"], after["metrics"])
    if frag is not None:
        summary["kv_fragmentation"] = frag
    run = report.result_dict(label, meta, summary, results)
    if out_dir is not None:
        out_dir = Path(out_dir)
        report.write_json(out_dir / f"{label}.json", run)
        (out_dir / f"{label}.md").write_text(report.markdown_table([(label, summary)]))
        report.plot_cdfs(out_dir / f"{label}_cdf.png", [(label, results)])
    return run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxinfer.bench serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="smollm2-135m-instruct", help="`model` field; also weights/<model> for the hash")
    p.add_argument("--workload", default="fixed", choices=workloads.WORKLOADS)
    p.add_argument("--concurrency", type=int, nargs="+", default=None,
                   help="closed-loop clients (several values: a sweep); with --request-rate, the in-flight cap")
    p.add_argument("--request-rate", type=float, default=None, help="open-loop arrivals per second (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival times (1 = Poisson)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--input-len", type=int, default=512, help="tokens (fixed) or mean (uniform, normal)")
    p.add_argument("--output-len", type=int, default=256, help="tokens (fixed) or mean (uniform, normal)")
    p.add_argument("--range-ratio", type=float, default=0.5, help="uniform: half-width / mean")
    p.add_argument("--std-ratio", type=float, default=0.25, help="normal: std / mean")
    p.add_argument("--max-input-len", type=int, default=1024, help="sharegpt: clip")
    p.add_argument("--max-output-len", type=int, default=1024, help="sharegpt: clip")
    p.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens shared")
    p.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: distinct prefixes")
    p.add_argument("--prompt-format", default="token-ids", choices=["token-ids", "text"])
    p.add_argument("--tokenizer", default=None, help="tokenizer.json for --prompt-format text "
                   "(default weights/<model>/tokenizer.json)")
    p.add_argument("--warmup-requests", type=int, default=4)
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--timeout-s", type=float, default=600.0, help="client-side limit per request")
    p.add_argument("--max-retries", type=int, default=0,
                   help="resend a 429/503 after its Retry-After, up to this many times (0: a 429 is final)")
    p.add_argument("--max-retry-after", type=float, default=30.0, help="cap on one Retry-After wait (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-info", action="append", default=[], metavar="KEY=VALUE",
                   help="facts about the server for the metadata (backend, dtype, device, ...)")
    p.add_argument("--out", default="benchmarks/results/serve")
    p.add_argument("--label", default="run")
    p.add_argument("--no-progress", action="store_true")
    return p


def _decoder(args):
    if args.prompt_format != "text":
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer or str(metadata.REPO / "weights" / args.model / "tokenizer.json"))
    return lambda ids: tok.decode(ids)


def step_mean_fragmentation(before: dict | None, after: dict | None) -> float | None:
    """Mean KV fragmentation over the engine steps between two ``/metrics`` readings
    (`metadata.parse_metrics` dicts): increase of ``kv_fragmentation_step_ratio_sum`` over
    increase of its ``_count``. None without both readings or without a step in between."""
    keys = ("kv_fragmentation_step_ratio_sum", "kv_fragmentation_step_ratio_count")
    if not before or not after or any(k not in before or k not in after for k in keys):
        return None
    steps = after[keys[1]] - before[keys[1]]
    return (after[keys[0]] - before[keys[0]]) / steps if steps > 0 else None


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    info = dict(kv.split("=", 1) for kv in args.server_info)
    wl = workloads.WorkloadConfig(
        name=args.workload, num_requests=args.num_requests, input_len=args.input_len, output_len=args.output_len,
        range_ratio=args.range_ratio, std_ratio=args.std_ratio, max_input_len=args.max_input_len,
        max_output_len=args.max_output_len, prefix_len=args.prefix_len, num_prefixes=args.num_prefixes,
        seed=args.seed)
    rate = None if args.request_rate is None else float(args.request_rate)
    levels = args.concurrency or ([None] if rate is not None else [1])
    runs = []
    for conc in levels:
        cfg = load.LoadConfig(args.base_url, args.model, concurrency=conc, request_rate=rate,
                              burstiness=args.burstiness, timeout_s=args.timeout_s, seed=args.seed,
                              progress=not args.no_progress, max_retries=args.max_retries,
                              max_retry_after_s=args.max_retry_after)
        label = args.label if len(levels) == 1 else f"{args.label}-c{conc}"
        run = run_benchmark(cfg, wl, label=label, out_dir=Path(args.out), warmup_requests=args.warmup_requests,
                            slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, server_info=info,
                            decode=_decoder(args))
        runs.append(run)
        print(report.markdown_table([(label, run["summary"])]))
    if len(levels) > 1:
        out = Path(args.out)
        report.plot_sweep(out / f"{args.label}_sweep.png",
                          {args.label: [(r["metadata"]["load"]["concurrency"], r["summary"]) for r in runs]})
        (out / f"{args.label}_sweep.md").write_text(report.markdown_table([(r["label"], r["summary"]) for r in runs]))
    return runs


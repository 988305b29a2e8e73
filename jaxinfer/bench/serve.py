"""``python -m jaxinfer.bench serve``: benchmark a running OpenAI-compatible server.

`run_benchmark` is the library entry point (``benchmarks/compare.py`` calls it): build the
workload, warm up, offer the load, aggregate, then write ``<out>/<label>.json``,
``<label>.md`` and ``<label>_cdf.png``. Several ``--concurrency`` values run one after
another and add ``<label>_sweep.png`` / ``<label>_sweep.md``. After each run the console
shows `report.console_summary` (the lines of ``vllm bench serve``'s result).

``--endpoint chat`` sends ``/v1/chat/completions`` with each prompt's text as one user
message (prompts are then text: ``--prompt-format text`` is implied). Input tokens are
counted on the raw prompt text (re-encoded with the tokenizer, no special tokens); the
tokens the server's chat template adds are left out of the throughput and reported apart
as ``server_prompt_tokens`` (the servers' ``usage.prompt_tokens``).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from jaxinfer.bench import client, load, metadata, report, stats, workloads


def run_benchmark(load_cfg: load.LoadConfig, workload: workloads.WorkloadConfig, *, label: str,
                  out_dir: Path | None = None, warmup_requests: int = 0, slo_ttft_ms: float | None = None,
                  slo_tpot_ms: float | None = None, server_info: dict | None = None, decode=None,
                  count_tokens=None) -> dict:
    """Run one benchmark and (if ``out_dir``) write its files.

    Args:
      warmup_requests: requests sent first and excluded from every number.
      slo_ttft_ms, slo_tpot_ms: goodput thresholds in milliseconds.
      server_info: what the caller knows about the server (backend, dtype, device, flags).
      decode: token ids -> text, to send text prompts instead of token ids.
      count_tokens: text -> token count; with ``decode``, prompt lengths are those of the
        text sent (`workloads.build_requests`).

    Returns:
      `report.result_dict`: label, metadata, summary, per-request timings.
    """
    meta = metadata.collect(load_cfg.model, server_info)
    meta.update(workload=workloads.describe(workload), warmup_requests=warmup_requests,
                load={k: v for k, v in dataclasses.asdict(load_cfg).items() if k != "progress"})
    requests = workloads.build_requests(workload, decode=decode, count_tokens=count_tokens)
    warm = workloads.build_requests(workload, warmup_requests, seed_offset=1_000_003, decode=decode,
                                    count_tokens=count_tokens)
    meta["server_before"] = metadata.server_state(load_cfg.base_url)
    results, duration = asyncio.run(load.run(load_cfg, requests, warm))
    meta["server_after"] = after = metadata.server_state(load_cfg.base_url)
    summary = stats.aggregate(results, duration, slo_ttft_ms, slo_tpot_ms)
    frag = step_mean_fragmentation(meta["server_before"]["metrics"], after["metrics"])
    if frag is not None:
        summary["kv_fragmentation"] = frag
    spec = spec_decode_summary(meta["server_before"]["metrics"], after["metrics"])
    if spec is not None:
        summary["spec_decode"] = spec
    run = report.result_dict(label, meta, summary, results)
    if out_dir is not None:
        out_dir = Path(out_dir)
        report.write_json(out_dir / f"{label}.json", run)
        (out_dir / f"{label}.md").write_text(report.markdown_table([(label, summary)]))
        report.plot_cdfs(out_dir / f"{label}_cdf.png", [(label, results)])
    return run


WORKLOAD_HELP = ("fixed: --input-len/--output-len each; uniform / normal: around them; "
                 f"{workloads.SHAREGPT} (alias sharegpt): SYNTHETIC lengths drawn from lognormals with ShareGPT's "
                 "published mean lengths (161 in / 338 out tokens, Kwon et al. 2023), prompts of random tokens; "
                 "the ShareGPT dataset is not used; shared-prefix: --num-prefixes prefixes of --prefix-len tokens; "
                 f"{workloads.INPUT_GROUNDED}: text prompts whose answers copy the prompt (rewrite or continue a "
                 "passage, edit code), passages of at most --input-len tokens")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``serve`` flags, added to ``p`` (also used by ``python -m jaxinfer.bench``)."""
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="completions", choices=list(client.ENDPOINTS),
                   help="completions: /v1/completions; chat: /v1/chat/completions, each prompt's text as one user "
                        "message (implies --prompt-format text; input tokens count the raw text, not the chat "
                        "template's additions)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="`model` field; also weights/<model> for the hash")
    p.add_argument("--workload", default="fixed", choices=workloads.WORKLOADS + tuple(workloads.ALIASES),
                   metavar="{" + ",".join(workloads.WORKLOADS) + "}", help=WORKLOAD_HELP)
    p.add_argument("--concurrency", type=int, nargs="+", default=None,
                   help="closed-loop clients (several values: a sweep); with --request-rate, the in-flight cap")
    p.add_argument("--request-rate", type=float, default=None, help="open-loop arrivals per second (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival times (1 = Poisson)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--input-len", type=int, default=512, help="tokens (fixed) or mean (uniform, normal)")
    p.add_argument("--output-len", type=int, default=256, help="tokens (fixed) or mean (uniform, normal)")
    p.add_argument("--range-ratio", type=float, default=0.5, help="uniform: half-width / mean")
    p.add_argument("--std-ratio", type=float, default=0.25, help="normal: std / mean")
    p.add_argument("--max-input-len", type=int, default=1024, help=f"{workloads.SHAREGPT}: clip")
    p.add_argument("--max-output-len", type=int, default=1024, help=f"{workloads.SHAREGPT}: clip")
    p.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens shared")
    p.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: distinct prefixes")
    p.add_argument("--prompt-format", default=None, choices=["token-ids", "text"],
                   help="default: token-ids for completions, text for chat")
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


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m jaxinfer.bench serve`` on its own."""
    return add_arguments(argparse.ArgumentParser(prog="python -m jaxinfer.bench serve",
                                                 description=__doc__.split("\n\n")[0],
                                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter))


def prompt_format(args) -> str:
    """``--prompt-format``, defaulted per endpoint and workload (text for chat and for
    the input-grounded workload).

    Raises:
      ValueError: token ids with the chat endpoint (messages are text) or with the
        input-grounded workload (its prompts are text).
    """
    grounded = getattr(args, "workload", None) == workloads.INPUT_GROUNDED
    fmt = args.prompt_format or ("text" if args.endpoint == "chat" or grounded else "token-ids")
    if args.endpoint == "chat" and fmt != "text":
        raise ValueError("--endpoint chat sends text messages: use --prompt-format text")
    if grounded and fmt != "text":
        raise ValueError(f"--workload {workloads.INPUT_GROUNDED} sends text prompts: use --prompt-format text")
    return fmt


def _text_codec(args):
    """(decode, count_tokens) for text prompts, or (None, None) for token ids."""
    if prompt_format(args) != "text":
        return None, None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer or str(metadata.REPO / "weights" / args.model / "tokenizer.json"))
    return (lambda ids: tok.decode(ids)), (lambda text: len(tok.encode(text, add_special_tokens=False).ids))


def step_mean_fragmentation(before: dict | None, after: dict | None) -> float | None:
    """Mean KV fragmentation over the engine steps between two ``/metrics`` readings
    (`metadata.parse_metrics` dicts): increase of ``kv_fragmentation_step_ratio_sum`` over
    increase of its ``_count``. None without both readings or without a step in between."""
    keys = ("kv_fragmentation_step_ratio_sum", "kv_fragmentation_step_ratio_count")
    if not before or not after or any(k not in before or k not in after for k in keys):
        return None
    steps = after[keys[1]] - before[keys[1]]
    return (after[keys[0]] - before[keys[0]]) / steps if steps > 0 else None


def spec_decode_summary(before: dict | None, after: dict | None) -> dict | None:
    """Speculative decoding over a run, from two ``/metrics`` readings (`metadata.parse_metrics`
    dicts): the increases of the draft / draft-token / accepted-token counters, the
    acceptance rate (accepted / draft tokens) and the mean acceptance length (tokens per
    verified draft: 1 + accepted / drafts). None without both readings or without drafts."""
    keys = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total")
    if not before or not after or any(k not in before or k not in after for k in keys):
        return None
    drafts, tokens, accepted = (after[k] - before[k] for k in keys)
    if drafts <= 0:
        return None
    return {"num_drafts": int(drafts), "num_draft_tokens": int(tokens), "num_accepted_tokens": int(accepted),
            "acceptance_rate": accepted / tokens if tokens else 0.0, "mean_acceptance_length": 1 + accepted / drafts}


def main(argv: list[str] | None = None) -> list[dict]:
    """``python -m jaxinfer.bench serve [flags]``: parse ``argv`` and `run_cli`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        prompt_format(args)
    except ValueError as exc:
        parser.error(str(exc))
    return run_cli(args)


def run_cli(args: argparse.Namespace) -> list[dict]:
    """Run the benchmark(s) the parsed flags describe, print each run's console summary.

    Returns:
      one `run_benchmark` result per concurrency level.
    """
    info = dict(kv.split("=", 1) for kv in args.server_info)
    wl = workloads.WorkloadConfig(
        name=args.workload, num_requests=args.num_requests, input_len=args.input_len, output_len=args.output_len,
        range_ratio=args.range_ratio, std_ratio=args.std_ratio, max_input_len=args.max_input_len,
        max_output_len=args.max_output_len, prefix_len=args.prefix_len, num_prefixes=args.num_prefixes,
        seed=args.seed)
    decode, count = _text_codec(args)
    rate = None if args.request_rate is None else float(args.request_rate)
    levels = args.concurrency or ([None] if rate is not None else [1])
    runs = []
    for conc in levels:
        cfg = load.LoadConfig(args.base_url, args.model, concurrency=conc, request_rate=rate,
                              burstiness=args.burstiness, timeout_s=args.timeout_s, seed=args.seed,
                              progress=not args.no_progress, max_retries=args.max_retries,
                              max_retry_after_s=args.max_retry_after, endpoint=args.endpoint)
        label = args.label if len(levels) == 1 else f"{args.label}-c{conc}"
        run = run_benchmark(cfg, wl, label=label, out_dir=Path(args.out), warmup_requests=args.warmup_requests,
                            slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, server_info=info,
                            decode=decode, count_tokens=count)
        runs.append(run)
        print(report.console_summary(run["summary"], label))
    if len(levels) > 1:
        out = Path(args.out)
        report.plot_sweep(out / f"{args.label}_sweep.png",
                          {args.label: [(r["metadata"]["load"]["concurrency"], r["summary"]) for r in runs]})
        table = report.markdown_table([(r["label"], r["summary"]) for r in runs])
        (out / f"{args.label}_sweep.md").write_text(table)
        print(table)
    return runs

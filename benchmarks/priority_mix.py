"""The priority scenario of `compare.py`: interactive and batch clients against one server
at once, with the time to first token reported per class.

`INTERACTIVE_SHARE` (20%) of the closed-loop clients send ``"priority": 0`` (interactive),
the rest ``"priority": 5`` (batch); the scenario's requests are split between the two
classes in the same proportion, and both classes start together (warm-up first, each
class its own share of the warm-up requests, both classes' warm-ups done before either
measured phase). The interactive clients start `INTERACTIVE_DELAY_S` after the batch
ones, so they meet a server already full of batch work with a queue behind it: submitted
first, the interactive requests would sit at the head of the queue under FCFS too, and
the mix would measure submission order instead of the policy (a first run with 64
single-request clients, started together, showed the same interactive/batch TTFT ratio,
0.12, under FCFS and priority). `run_priority_mix` returns an entry with
the summary of all requests and one per class (``classes``), so ``compare_report`` can
put interactive TTFT p99 against batch TTFT p99, and the run's throughput against the
same mix under FCFS. Plain Python (the load generator of `jaxinfer.bench`); no JAX import.
"""
from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from jaxinfer.bench import load, metadata, report, stats, workloads

INTERACTIVE_SHARE = 0.2
CLASSES = {"interactive": 0, "batch": 5}  # class -> the request's priority (lower first)
INTERACTIVE_DELAY_S = 1.0  # the interactive clients start this long after the batch ones (module docstring)


def split(n: int) -> tuple[int, int]:
    """(interactive, batch) counts of ``n`` clients or requests: 20% interactive, each class
    at least one when ``n >= 2``."""
    k = min(max(round(n * INTERACTIVE_SHARE), 1), n - 1) if n >= 2 else n
    return k, n - k


async def _run_classes(cfg: load.LoadConfig, requests, warmup) -> dict[str, tuple[list, float]]:
    """Both classes' loads at once; {class: (results, measured seconds)}."""
    clients = split(cfg.concurrency)
    reqs, warm = split(len(requests)), split(len(warmup))
    jobs, start_r, start_w = {}, 0, 0
    for (name, priority), c, nr, nw in zip(CLASSES.items(), clients, reqs, warm):
        body = {**(cfg.extra_body or {}), "priority": priority}
        class_cfg = dataclasses.replace(cfg, concurrency=max(c, 1), extra_body=body, progress=False)
        jobs[name] = (class_cfg, requests[start_r:start_r + nr], warmup[start_w:start_w + nw])
        start_r, start_w = start_r + nr, start_w + nw
    await asyncio.gather(*(load.run(cfg_c, [], warm_c) for cfg_c, _, warm_c in jobs.values()))  # warm-up first

    async def measured(name: str):
        if name == "interactive":
            await asyncio.sleep(INTERACTIVE_DELAY_S)
        return await load.run(*jobs[name][:2])

    return dict(zip(CLASSES, await asyncio.gather(*(measured(name) for name in CLASSES))))


def run_priority_mix(load_cfg: load.LoadConfig, workload: workloads.WorkloadConfig, *, label: str,
                     out_dir: Path | None = None, warmup_requests: int = 0, slo_ttft_ms: float | None = None,
                     slo_tpot_ms: float | None = None, server_info: dict | None = None) -> dict:
    """Run the mix against a started server; write ``<label>.json`` under ``out_dir``.

    Returns:
      `jaxinfer.bench.report.result_dict` of all requests (the measured phase lasts
      until the slower class ends), plus ``classes``: {class: {"priority", "clients",
      "summary"}} with each class's `jaxinfer.bench.stats.aggregate` (times in ms).
    """
    meta = metadata.collect(load_cfg.model, server_info)
    meta.update(workload=workloads.describe(workload), warmup_requests=warmup_requests,
                priority_mix={"interactive_share": INTERACTIVE_SHARE, "classes": CLASSES})
    requests = workloads.build_requests(workload)
    warm = workloads.build_requests(workload, warmup_requests, seed_offset=1_000_003)
    per_class = asyncio.run(_run_classes(load_cfg, requests, warm))
    duration = max(d for _, d in per_class.values())
    results = [r for res, _ in per_class.values() for r in res]
    run = report.result_dict(label, meta, stats.aggregate(results, duration, slo_ttft_ms, slo_tpot_ms), results)
    clients = dict(zip(CLASSES, split(load_cfg.concurrency)))
    run["classes"] = {name: {"priority": CLASSES[name], "clients": clients[name],
                             "summary": stats.aggregate(res, d, slo_ttft_ms, slo_tpot_ms)}
                      for name, (res, d) in per_class.items()}
    if out_dir is not None:
        report.write_json(Path(out_dir) / f"{label}.json", run)
    return run

"""The compile check of the headline layouts, written under benchmarks/results/<date>-scale/.

Runs `jaxinfer.engine.step_check.check_step` (what ``python -m jaxinfer.plan --compile`` runs) for
Llama-3-70B at TP 8 and Llama-3-8B at TP 1, TP 2 and DP 2 x TP 4 (bfloat16, max_model_len 4096,
the server's default buckets and KV rule on 80 GiB devices) on 8 fake CPU devices, and writes one
``<name>.txt`` (the planner's and the check's lines) and ``<name>.json`` per layout, plus
``summary.json``. Exit 1 if any check fails. ``--decode-batches 64,256`` instead compiles the
decode step alone at those batch sizes (``--max-num-seqs B``; no sampler, no CUDA lowering) into
``<name>-b<B>.json``, the inputs of the GPU roofline (`benchmarks/scale_roofline.py`).

  python benchmarks/scale_check.py [--only 8b-tp1,70b-tp8] [--out DIR] [--layers N] [--decode-batches 64,256]
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxinfer.config import EngineConfig, ParallelConfig, SchedulerConfig  # noqa: E402
from jaxinfer.entrypoints.plan import format_plan, load_config, plan_memory  # noqa: E402
from jaxinfer.engine.step_check import check_step, format_report, report_dict  # noqa: E402

MEMORY = 80 * 2**30  # an 80 GiB device (H100 80GB)
LAYOUTS = {  # name -> (config file, TP, DP)
    "8b-tp1": ("llama-3-8b.json", 1, 1),
    "8b-tp2": ("llama-3-8b.json", 2, 1),
    "8b-dp2-tp4": ("llama-3-8b.json", 4, 2),
    "70b-tp8": ("llama-3-70b.json", 8, 1),
}


def run(name: str, out: Path, layers: int | None, batch: int | None = None) -> dict:
    """One layout's check (``batch``: the decode step alone at ``--max-num-seqs batch``)."""
    path, tp, dp = LAYOUTS[name]
    cfg = load_config(str(ROOT / "configs" / path), layers)
    seqs = {} if batch is None else {"max_num_seqs": batch}
    config = EngineConfig(model_path=f"configs/{path}", dtype="bfloat16", parallel=ParallelConfig(tp, dp),
                          scheduler=SchedulerConfig(max_model_len=4096, **seqs), warmup=False)
    plan = plan_memory(cfg, dtype="bfloat16", tensor_parallel_size=tp, data_parallel_size=dp, device_memory=MEMORY,
                       max_model_len=4096, **seqs)
    t0 = time.perf_counter()
    report = check_step(cfg, config, MEMORY, model_name=f"configs/{path}",
                        **({} if batch is None else dict(buckets=("decode",), cuda=False, sampler=False)))
    seconds = time.perf_counter() - t0
    name = name if batch is None else f"{name}-b{batch}"
    text = format_plan(plan, f"configs/{path}") + "\n" + format_report(report) + f"\nwall time {seconds:.1f} s\n"
    (out / f"{name}.txt").write_text(text)
    data = {"plan": dataclasses.asdict(plan), "compile": report_dict(report), "seconds": seconds,
            "layers": cfg.num_hidden_layers}
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    print(text, flush=True)
    return {"name": name, "ok": report.ok, "verdict": report.verdict(), "seconds": round(seconds, 1),
            "layers": cfg.num_hidden_layers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(LAYOUTS), help="comma-separated layout names")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/<today>-scale")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (default: the config's)")
    ap.add_argument("--decode-batches", default=None, help="e.g. 64,256: the decode step alone at these batches")
    args = ap.parse_args()
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"{datetime.date.today().isoformat()}-scale")
    out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if args.decode_batches:
        summary = [run(n, out, args.layers, int(b)) for n in names for b in args.decode_batches.split(",")]
        (out / "summary-decode.json").write_text(json.dumps(summary, indent=1))
    else:
        summary = [run(n, out, args.layers) for n in names]
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0 if all(s["ok"] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Predicted GPU decode step from the compiled step's bytes and collectives (a roofline).

Reads the decode-only compile reports ``<name>-b<B>.json`` that ``benchmarks/scale_check.py
--decode-batches 64,256`` wrote (Llama-3-8B at TP 1, Llama-3-70B at TP 8) and, for an H100 SXM and
an H200 SXM, predicts one decode step at batch B with every sequence at ``--context`` tokens:

  HBM bytes per device  = the compiled step's weight arguments (XLA's per-device shapes)
                          + B * context * KV bytes per token per device (2 * L * K/TP * H * 2)
  FLOPs per device      = 2 * B * (matmul parameters per device: q, k, v, o, gate, up, down, LM head)
                          + 4 * B * context * (N/TP) * H * L (scores and values)
  communication         = every collective of the compiled step at its compiled bytes: ring
                          all-reduce 2 (n-1)/n * bytes, all-gather (n-1)/n * bytes, over one
                          direction of NVLink (half the 900 GB/s bidirectional figure)
  step                  = max(HBM bytes / HBM bandwidth, FLOPs / peak bf16) + communication
                          (XLA runs each all-reduce between a layer's products: no overlap assumed)
  output tok/s          = B / step

and, as a separate column, the step with an assumed fixed latency per collective (``--latency-us``,
not a measured figure). Writes ``roofline.json`` and ``roofline.md`` beside the reports.

  python benchmarks/scale_roofline.py [--dir benchmarks/results/<date>-scale] [--context 2048]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Vendor figures (SXM parts). H100: NVIDIA H100 product page / datasheet; H200: NVIDIA H200 product
# page. The vendor lists bf16 tensor throughput with 2:4 sparsity (1,979 TFLOPS); dense is half.
GPUS = {
    "H100 SXM 80GB": {"hbm_bytes_s": 3.35e12, "nvlink_bytes_s": 450e9, "bf16_flops": 989.4e12, "memory": 80e9},
    "H200 SXM 141GB": {"hbm_bytes_s": 4.8e12, "nvlink_bytes_s": 450e9, "bf16_flops": 989.4e12, "memory": 141e9},
}
LAYOUTS = (("8b-tp1", "llama-3-8b.json"), ("70b-tp8", "llama-3-70b.json"))


def collective_seconds(c: dict, n: int, link: float) -> float:
    """Bandwidth time of one collective on a ring of ``n`` devices (bytes: the result's, per device)."""
    if n <= 1:
        return 0.0
    factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1),
              "all-to-all": (n - 1) / n, "collective-permute": 1.0}[c["kind"]]
    return factor * c["bytes"] / link


def predict(report: dict, cfg: dict, batch: int, context: int, gpu: dict, latency_s: float) -> dict:
    comp = report["compile"]
    tp, L = comp["tensor_parallel_size"], cfg["num_hidden_layers"]
    b = comp["buckets"][0]
    assert b["bucket"]["num_seqs"] == batch, (b["bucket"], batch)
    D, F, N, K, V = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                      "num_key_value_heads", "vocab_size"))
    H = cfg.get("head_dim") or D // N
    k_dev = K // tp if K % tp == 0 else K
    kv_token = 2 * L * k_dev * H * 2  # K and V, bf16, per device
    weights = b["weight_bytes"]
    kv_read = batch * context * kv_token
    matmul_params = (L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F) + D * V) / tp
    flops = 2 * batch * matmul_params + 4 * batch * context * (N // tp) * H * L
    colls = [c for c in b["collectives"]]
    per_step = [(c, c["count"] * (L if c["per_layer"] else 1)) for c in colls]
    comm_bytes = sum(c["bytes"] * m for c, m in per_step)
    t_comm = sum(collective_seconds(c, tp, gpu["nvlink_bytes_s"]) * m for c, m in per_step)
    n_coll = sum(m for _, m in per_step)
    t_mem = (weights + kv_read) / gpu["hbm_bytes_s"]
    t_flop = flops / gpu["bf16_flops"]
    step = max(t_mem, t_flop) + t_comm
    step_lat = step + n_coll * latency_s
    act = report["plan"]["activation_reserve_bytes"]
    fits = weights + kv_read <= 0.9 * gpu["memory"] - act
    return {"batch": batch, "context": context, "tp": tp, "weights_gb": weights / 1e9, "kv_read_gb": kv_read / 1e9,
            "t_mem_ms": t_mem * 1e3, "t_flop_ms": t_flop * 1e3, "comm_mb": comm_bytes / 1e6, "collectives": n_coll,
            "t_comm_ms": t_comm * 1e3, "step_ms": step * 1e3, "tok_s": batch / step,
            "step_latency_ms": step_lat * 1e3, "tok_s_latency": batch / step_lat, "fits": fits,
            "max_batch_at_context": math.floor((0.9 * gpu["memory"] - act - weights) / (context * kv_token))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="the results folder (default: the newest benchmarks/results/*-scale)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--latency-us", type=float, default=10.0, help="assumed fixed cost per collective (not measured)")
    args = ap.parse_args()
    folder = Path(args.dir) if args.dir else sorted((ROOT / "benchmarks" / "results").glob("*-scale"))[-1]
    rows = []
    for name, config_file in LAYOUTS:
        cfg = json.loads((ROOT / "configs" / config_file).read_text())
        for batch in (int(x) for x in args.batches.split(",")):
            path = folder / f"{name}-b{batch}.json"
            if not path.exists():
                print(f"missing {path}: run benchmarks/scale_check.py --decode-batches", file=sys.stderr)
                return 1
            report = json.loads(path.read_text())
            for gpu_name, gpu in GPUS.items():
                rows.append({"layout": name, "gpu": gpu_name,
                             **predict(report, cfg, batch, args.context, gpu, args.latency_us * 1e-6)})
    (folder / "roofline.json").write_text(json.dumps({"context": args.context, "latency_us": args.latency_us,
                                                      "gpus": GPUS, "rows": rows}, indent=1))
    head = ("| layout | GPU | batch | weights GB/dev | KV read GB/dev | HBM ms | bf16 ms | collectives/step | "
            f"comm MB/dev | comm ms | **step ms** | **out tok/s** | + {args.latency_us:g} us/collective: step ms, tok/s "
            "| fits (max batch at context) |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r['layout']} | {r['gpu']} | {r['batch']} | {r['weights_gb']:.2f} | {r['kv_read_gb']:.2f} | "
                     f"{r['t_mem_ms']:.2f} | {r['t_flop_ms']:.2f} | {r['collectives']} | {r['comm_mb']:.1f} | "
                     f"{r['t_comm_ms']:.2f} | **{r['step_ms']:.2f}** | **{r['tok_s']:,.0f}** | "
                     f"{r['step_latency_ms']:.2f}, {r['tok_s_latency']:,.0f} | "
                     f"{'yes' if r['fits'] else 'NO'} ({r['max_batch_at_context']}) |")
    (folder / "roofline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

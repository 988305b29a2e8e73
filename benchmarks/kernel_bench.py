"""Benchmark of ragged paged attention: each GPU kernel (``triton``: Pallas's Triton backend;
``mosaic``: Mosaic GPU, on compute capability 9.0+ with 16-bit pages) against the jnp reference.

Times one call (median of trials; many calls enqueued back to back, then one sync) for
decode batches of 1, 16, 64 and 256 sequences at contexts 512, 2K and 8K and for mixed
prefill+decode batches, in the Llama-3-8B layout (32 q heads, 8 KV heads, head dim 128), and
a few of them in the SmolLM2 layout (9 q heads, 3 KV heads, head dim 64). Reports achieved
bandwidth (each sequence's K/V read once, plus q and out, over the time: the roofline bytes of
docs/kernels.md) against the device's peak HBM bandwidth (`PEAK_HBM_GBPS` by device kind, or
``--peak-gbps``) and against a copy measured in the same run (bytes read plus written), the
attention TFLOP/s, and the largest difference from the reference. Input sets rotate over
disjoint pages so that small configs do not run from L2.

Usage:
  python benchmarks/kernel_bench.py --quick    # CPU: tiny sizes, interpret mode, < 1 min
  python benchmarks/kernel_bench.py            # GPU: full sizes, compiled
  python benchmarks/kernel_bench.py --out DIR  # where the JSON goes (default
                                          # benchmarks/results/)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jaxinfer.kernels.pallas import (  # noqa: E402
    ragged_paged_attention,
    ragged_paged_attention_reference,
)
from jaxinfer.kernels.pallas.mosaic_paged_attention import (  # noqa: E402
    auto_splits,
    check_supported,
    mosaic_ragged_paged_attention,
)
from jaxinfer.kernels.pallas.ragged_paged_attention import auto_decode_splits  # noqa: E402

LAYOUTS = {"llama3-8b": (32, 8, 128), "smollm2": (9, 3, 64)}
L2_BYTES = 64 << 20  # H200: 60 MB of L2; rotate inputs over at least 3x this
MAX_SETS = 128
# Peak HBM bandwidth (GB/s, vendor data sheets) by jax's device_kind.
PEAK_HBM_GBPS = {"NVIDIA H100 80GB HBM3": 3350, "NVIDIA H100 PCIe": 2000, "NVIDIA H100 NVL": 3900,
                 "NVIDIA H200": 4800, "NVIDIA GH200 480GB": 4000, "NVIDIA B200": 8000,
                 "NVIDIA A100-SXM4-80GB": 2039, "NVIDIA A100-SXM4-40GB": 1555,
                 "NVIDIA A100 80GB PCIe": 1935, "NVIDIA L40S": 864}


def full_configs():
    """(layout, kind, q_lens, kv_lens) of the GPU run: the batch x context grid in the
    Llama-3-8B layout, two mixed steps, and three SmolLM2-layout points."""
    out = []
    for batch in (1, 16, 64, 256):
        for ctx in (512, 2048, 8192):
            out.append(("llama3-8b", f"decode b{batch} ctx{ctx}", [1] * batch, [ctx] * batch))
    out.append(("llama3-8b", "mixed 4x512 prefill@2K + 60 decode@4K",
                [512] * 4 + [1] * 60, [2048] * 4 + [4096] * 60))
    out.append(("llama3-8b", "mixed 1x2048 prefill@2K + 63 decode@1K",
                [2048] + [1] * 63, [2048] + [1024] * 63))
    for batch, ctx in ((64, 2048), (256, 512)):
        out.append(("smollm2", f"decode b{batch} ctx{ctx}", [1] * batch, [ctx] * batch))
    out.append(("smollm2", "mixed 4x512 prefill@2K + 60 decode@4K",
                [512] * 4 + [1] * 60, [2048] * 4 + [4096] * 60))
    return out


def quick_configs():
    return [(layout, kind, q, c) for layout in LAYOUTS for kind, q, c in (
        ("decode b4 ctx64", [1] * 4, [64] * 4),
        ("decode b1 ctx256", [1], [256]),
        ("mixed 1x24 prefill + 3 decode", [24, 1, 1, 1], [40, 64, 100, 17]))]


def mosaic_available(device, dtype, layout, block_size) -> str | None:
    """None when the Mosaic GPU kernel can run here (interpreted on CPU, compiled on a GPU of
    compute capability 9.0+), else why not."""
    num_q_heads, num_kv_heads, head_dim = layout
    try:
        check_supported((1, num_q_heads, head_dim), (1, block_size, num_kv_heads, head_dim), dtype)
    except NotImplementedError as e:
        return str(e)
    if device.platform == "gpu":
        cc = str(getattr(device, "compute_capability", "0"))
        if float(cc) < 9.0:
            return f"compute capability {cc} < 9.0"
    return None


def measure_copy_bandwidth(num_bytes: int) -> float:
    """Bytes read plus written per second of a jitted elementwise copy."""
    x = jnp.ones((num_bytes // 4,), jnp.float32) * 1.5
    copy = jax.jit(lambda a: a * 1.0001)
    seconds = time_calls(copy, [(x,)], trials=5)
    return 2 * x.nbytes / seconds


def time_calls(fn, arg_sets, *, trials=5, min_seconds=0.05):
    """Median seconds per call; calls are enqueued back to back, then synced once."""
    for args in arg_sets:
        jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*arg_sets[0]))
    calls = max(len(arg_sets), min(200, math.ceil(min_seconds / max(
        time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(trials):  # only the last output is kept: calls run in order on one stream,
        start = time.perf_counter()  # and holding all of them once took 50 x 2 GiB (OOM)
        for i in range(calls):
            out = fn(*arg_sets[i % len(arg_sets)])
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def make_inputs(key, q_lens, kv_lens, layout, *, block_size, dtype, num_sets):
    """Device arrays for ``num_sets`` batches over disjoint pages of one cache."""
    num_q_heads, num_kv_heads, head_dim = layout
    pages = [-(-c // block_size) for c in kv_lens]
    max_blocks = max(pages)
    num_blocks = 1 + num_sets * sum(pages)
    kq, kk, kv = jax.random.split(key, 3)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_pages = jax.random.normal(kk, shape, dtype)
    v_pages = jax.random.normal(kv, shape, dtype)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = jax.random.normal(kq, (int(qsl[-1]), num_q_heads, head_dim), dtype)
    pool = np.random.default_rng(0).permutation(np.arange(1, num_blocks)).astype(np.int32)
    sets, used = [], 0
    for _ in range(num_sets):
        tables = np.zeros((len(q_lens), max_blocks), np.int32)
        for i, n in enumerate(pages):
            tables[i, :n] = pool[used:used + n]
            used += n
        sets.append((q, k_pages, v_pages, jnp.asarray(kv_lens, jnp.int32),
                     jnp.asarray(tables), jnp.asarray(qsl), jnp.int32(len(q_lens))))
    return sets


def traffic(q_lens, kv_lens, layout, itemsize):
    """Fewest bytes moved and attention FLOPs of one call."""
    num_q_heads, num_kv_heads, head_dim = layout
    kv_bytes = 2 * sum(kv_lens) * num_kv_heads * head_dim * itemsize
    q_out_bytes = 2 * sum(q_lens) * num_q_heads * head_dim * itemsize
    keys_seen = sum(sum(range(c - n + 1, c + 1)) for n, c in zip(q_lens, kv_lens))
    return kv_bytes + q_out_bytes, 4 * keys_seen * num_q_heads * head_dim


def bench_one(kind, q_lens, kv_lens, layout_name, *, interpret, dtype, block_size,
              copy_bw, peak_bw, mosaic_skip, key):
    layout = LAYOUTS[layout_name]
    num_bytes, flops = traffic(q_lens, kv_lens, layout, jnp.dtype(dtype).itemsize)
    kv_bytes = num_bytes
    num_sets = 1 if interpret else min(MAX_SETS, max(1, math.ceil(3 * L2_BYTES / kv_bytes)))
    sets = make_inputs(key, q_lens, kv_lens, layout, block_size=block_size, dtype=dtype,
                       num_sets=num_sets)
    impls = {
        "triton": lambda *a: ragged_paged_attention(*a, interpret=interpret),
        "reference": ragged_paged_attention_reference,
    }
    decode, max_pages = max(q_lens) == 1, max(-(-c // block_size) for c in kv_lens)
    splits = {"triton": auto_decode_splits(len(q_lens) * layout[1], max_pages, block_size),
              "mosaic": auto_splits(len(q_lens) * layout[1], max_pages)}
    if mosaic_skip is None:
        impls["mosaic"] = lambda *a: mosaic_ragged_paged_attention(*a, interpret=interpret)
    for name in ("triton", "mosaic"):  # the default splits the keys here: time without too
        if decode and splits[name] > 1 and name in impls:
            impls[f"{name}-nosplit"] = (
                (lambda *a: ragged_paged_attention(*a, interpret=interpret, decode_splits=1))
                if name == "triton" else
                (lambda *a: mosaic_ragged_paged_attention(*a, interpret=interpret, num_splits=1)))
    outs = {name: np.asarray(fn(*sets[0]), np.float32) for name, fn in impls.items()}
    rows = []
    for name, fn in impls.items():
        other = outs["triton" if name == "reference" else "reference"]
        diff = float(np.abs(outs[name] - other).max())
        seconds = time_calls(fn, sets, trials=3 if interpret else 5)
        base = name.split("-")[0]
        rows.append(dict(
            layout=layout_name, kind=kind, impl=name, num_seqs=len(q_lens),
            q_tokens=int(sum(q_lens)), max_context=int(max(kv_lens)),
            block_size=block_size, dtype=str(jnp.dtype(dtype)), input_sets=num_sets,
            time_us=seconds * 1e6, bytes=num_bytes, GBps=num_bytes / seconds / 1e9,
            frac_of_peak_bw=None if peak_bw is None else num_bytes / seconds / peak_bw,
            frac_of_copy_bw=num_bytes / seconds / copy_bw, TFLOPs=flops / seconds / 1e12,
            decode_splits=(1 if "nosplit" in name or base == "reference" else splits[base]) if decode else None,
            max_abs_diff_vs_other=diff))
    return rows


def print_table(rows, copy_bw, peak_bw):
    print(f"copy bandwidth: {copy_bw / 1e9:.1f} GB/s (read + write); peak HBM: "
          f"{'unknown' if peak_bw is None else f'{peak_bw / 1e9:.0f} GB/s'}")
    print(f"{'layout':10} {'config':40} {'impl':16} {'time_us':>10} {'GB/s':>8} "
          f"{'%peak':>6} {'%copy':>6} {'TFLOP/s':>8} {'diff':>8}")
    for r in rows:
        peak = "-" if r["frac_of_peak_bw"] is None else f"{100 * r['frac_of_peak_bw']:.1f}"
        print(f"{r['layout']:10} {r['kind']:40} {r['impl']:16} {r['time_us']:10.1f} "
              f"{r['GBps']:8.1f} {peak:>6} {100 * r['frac_of_copy_bw']:6.1f} {r['TFLOPs']:8.3f} "
              f"{r['max_abs_diff_vs_other']:8.1e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes in interpret mode (CPU)")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"),
                        help="directory for the JSON result")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="the device's peak HBM bandwidth (default: PEAK_HBM_GBPS by device kind)")
    parser.add_argument("--only", default=None, help="run configs whose name contains this")
    args = parser.parse_args(argv)

    device = jax.devices()[0]
    interpret = args.quick or device.platform == "cpu"
    dtype = jnp.bfloat16  # the GPU engine's cache dtype (--dtype auto), and the Mosaic kernel's
    peak = args.peak_gbps or PEAK_HBM_GBPS.get(device.device_kind)
    peak_bw = None if peak is None else peak * 1e9
    configs = quick_configs() if args.quick else full_configs()
    copy_bw = measure_copy_bandwidth((64 << 20) if args.quick else (2 << 30))
    now = datetime.datetime.now(datetime.timezone.utc)
    result = dict(
        date=now.isoformat(timespec="seconds"), device=device.device_kind,
        platform=device.platform, jax_version=jax.__version__,
        python=platform.python_version(), quick=args.quick, interpret=interpret,
        copy_bandwidth_GBps=copy_bw / 1e9, peak_hbm_GBps=peak, rows=[], mosaic_skipped={})
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"kernels_{now:%Y-%m-%d}_{device.platform}"
                      f"{'_quick' if args.quick else ''}.json")
    key = jax.random.key(0)
    for layout_name, kind, q_lens, kv_lens in configs:
        if args.only and args.only not in kind:
            continue
        key, sub = jax.random.split(key)
        skip = mosaic_available(device, dtype, LAYOUTS[layout_name], args.block_size)
        if skip:
            result["mosaic_skipped"][layout_name] = skip
        result["rows"] += bench_one(
            kind, q_lens, kv_lens, layout_name, interpret=interpret, dtype=dtype,
            block_size=args.block_size, copy_bw=copy_bw, peak_bw=peak_bw, mosaic_skip=skip, key=sub)
        path.write_text(json.dumps(result, indent=1))  # partial results survive
        print(f"done {layout_name} {kind}", flush=True)
    print_table(result["rows"], copy_bw, peak_bw)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

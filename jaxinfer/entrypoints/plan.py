"""Memory planner: will a model fit, and how many sequences can it serve at once?

``python -m jaxinfer.plan --model configs/llama-3-70b.json --devices 8 --device-memory 80GB
--tensor-parallel-size 8 --dtype bfloat16 --max-model-len 4096``

Works from shapes only (``jax.eval_shape`` of the parameter init, `jaxinfer.distributed.sharding`'s
partition specs): nothing is allocated and no accelerator is needed. Per device of a
TP group it reports the weight bytes, the KV bytes per block, the KV blocks that fit
and the largest number of concurrent full-length sequences. The KV pool is sized by the
server's own rule, the same function with the same flags (`jaxinfer.engine.builder.size_kv_pool`):
``--num-blocks``, else ``--kv-cache-memory``, else ``--gpu-memory-utilization`` (default 0.9,
vLLM's) of ``--device-memory`` minus the weights and the activation estimate of
``--max-num-batched-tokens`` / ``--max-num-seqs`` (`jaxinfer.engine.builder.activation_reserve_bytes`):

  weights/device = sum over params of prod(per-device shard shape) * itemsize
  KV/block/device = 2 * L * block_size * K_dev * H * itemsize  (K_dev = K/TP, or K)
  blocks = floor((memory * utilization - weights/device - activations) / (KV/block/device))
  sequences/replica = floor((blocks - 1) / ceil(max_model_len / block_size))
  (block 0 is the null block). Both print the same "why" sentence for the pool.
Memory sizes as ``server.py`` reads them (`jaxinfer.config.args.parse_bytes`, powers of 1024):
``80GB`` = ``80GiB`` = 80 * 2**30 bytes, or a plain byte count.

When a plan does not fit, the CLI tries the other tensor-parallel sizes that split both the
query heads and the KV heads evenly (the divisors of ``gcd(N, K)``: other sizes replicate
attention and the KV cache on every device, `jaxinfer.distributed.sharding`) and names the smallest
that fits (`smallest_fitting_tp`), also when it needs more devices than ``--devices``;
or says that none does.

``--compile`` goes further: it builds the engine's real jitted step on ``--devices`` fake CPU
devices with abstract weights and KV, compiles it and checks its memory and collectives
against this plan and the expected communication (`jaxinfer.engine.step_check`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path

from jaxinfer.config import BLOCK_SIZE, DTYPES, CacheConfig, ModelConfig, SchedulerConfig
from jaxinfer.config.args import add_engine_args, parse_bytes

# server.py's flags the planner takes (`jaxinfer.config.args.FLAGS`: same names, types, choices)
PLAN_FLAGS = ("dtype", "quantization", "block_size", "kv_cache_dtype", "max_model_len", "tensor_parallel_size",
              "data_parallel_size", "gpu_memory_utilization", "kv_cache_memory", "num_blocks", "max_num_seqs",
              "max_num_batched_tokens", "attention_backend", "enable_expert_parallel", "expert_parallel_size")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device memory of one configuration (bytes; blocks include the null block)."""

    tensor_parallel_size: int
    data_parallel_size: int
    dtype: str
    device_memory: int
    gpu_memory_utilization: float
    total_param_bytes: int
    weight_bytes_per_device: int
    replicated_axes: tuple[str, ...]
    kv_bytes_per_block_per_device: int
    activation_reserve_bytes: int
    num_blocks: int  # per replica, null block included; 0 when the weights do not fit
    block_size: int
    max_model_len: int
    blocks_per_sequence: int
    max_concurrent_sequences: int  # per replica, each at max_model_len tokens
    kv_sizing: str  # the server's sentence for the same pool (`jaxinfer.engine.builder.size_kv_pool`)
    quantization: str | None = None  # weights: None (dtype) or "int8"
    kv_cache_dtype: str = "auto"  # KV: "auto" (dtype), "int8" or "fp8"
    expert_parallel_size: int = 1  # the expert mesh axis (1: none; `jaxinfer.distributed.sharding`)

    @property
    def fits(self) -> bool:
        return self.max_concurrent_sequences >= 1

    @property
    def kv_bytes_per_device(self) -> int:
        """The KV pool's bytes on one device (K and V, every block)."""
        return self.num_blocks * self.kv_bytes_per_block_per_device


def plan_memory(cfg: ModelConfig, *, dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                data_parallel_size: int = 1, device_memory: int, block_size: int = BLOCK_SIZE,
                max_model_len: int | None = None, quantization: str | None = None, kv_cache_dtype: str = "auto",
                gpu_memory_utilization: float | None = None, kv_cache_memory: int | None = None,
                num_blocks: int | None = None, max_num_seqs: int | None = None,
                max_num_batched_tokens: int = 512, expert_parallel_size: int = 1) -> MemoryPlan:
    """Plan memory for ``cfg`` on devices of ``device_memory`` bytes (module docstring): the
    server's KV rule (`jaxinfer.engine.builder.size_kv_pool`) for the same flags.
    ``quantization`` "int8" plans int8 weights with their scales (`jaxinfer.layers.quantization.int8`);
    ``kv_cache_dtype`` "int8" / "fp8" an 8-bit KV cache (`jaxinfer.layers.attention.kv_quant`).
    ``expert_parallel_size``: a mixture of experts' experts split over that many of the TP group's
    devices (``--enable-expert-parallel``; 1: none).

    Raises:
      ValueError: a value `jaxinfer.config.CacheConfig` or `SchedulerConfig` refuses.
    """
    from jaxinfer.engine.builder import activation_reserve_bytes, size_kv_pool
    from jaxinfer.models.params import abstract_params
    from jaxinfer.distributed.sharding import per_device_param_bytes, replicated_axes

    tp, ep = tensor_parallel_size, expert_parallel_size
    max_model_len = max_model_len or min(4096, cfg.max_position_embeddings)
    cache = CacheConfig(block_size=block_size, num_blocks=num_blocks, kv_cache_memory=kv_cache_memory,
                        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            max_model_len=max_model_len)
    import jax

    if quantization is not None:
        cfg = dataclasses.replace(cfg, quantization=quantization)
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract_params(cfg, dtype)))
    weights = per_device_param_bytes(cfg, dtype, tp, ep)
    blocks, per_block, why = size_kv_pool(cfg, cache, dtype, weights, tp, sched, tp * data_parallel_size,
                                          device_memory)
    per_seq = math.ceil(max_model_len / block_size)
    return MemoryPlan(tp, data_parallel_size, dtype, device_memory, cache.memory_utilization, int(total), weights,
                      tuple(replicated_axes(cfg, tp, ep)), per_block, activation_reserve_bytes(cfg, sched), blocks,
                      block_size, max_model_len, per_seq, max(0, blocks - 1) // per_seq, why, quantization,
                      kv_cache_dtype, ep)


def head_divisible_tp_sizes(cfg: ModelConfig) -> list[int]:
    """Tensor-parallel sizes that split the query and KV heads evenly: the divisors of
    ``gcd(num_attention_heads, num_key_value_heads)``, ascending."""
    g = math.gcd(cfg.num_attention_heads, cfg.num_key_value_heads)
    return [t for t in range(1, g + 1) if g % t == 0]


def smallest_fitting_tp(cfg: ModelConfig, *, max_tp: int | None = None, **plan_kw) -> MemoryPlan | None:
    """The plan of the smallest head-divisible TP size (`head_divisible_tp_sizes`) that
    fits at least one full-length sequence per replica, or None if none does.

    Args:
      max_tp: try sizes up to this one only (None: every head-divisible size).
      plan_kw: `plan_memory`'s keywords other than ``tensor_parallel_size``
        (``data_parallel_size`` is set to 1: the question is the size of one replica).
    """
    plan_kw = {k: v for k, v in plan_kw.items()
               if k not in ("tensor_parallel_size", "data_parallel_size", "expert_parallel_size")}
    for tp in head_divisible_tp_sizes(cfg):
        if max_tp is not None and tp > max_tp:
            break
        p = plan_memory(cfg, tensor_parallel_size=tp, **plan_kw)
        if p.fits:
            return p
    return None


def suggestion(cfg: ModelConfig, best: MemoryPlan | None, devices: int) -> str:
    """One line for a plan that does not fit: the smallest TP size that would (`smallest_fitting_tp`)."""
    sizes = head_divisible_tp_sizes(cfg)
    if best is None:
        return (f"no tensor-parallel size that divides the {cfg.num_attention_heads} query and "
                f"{cfg.num_key_value_heads} KV heads (tried {', '.join(map(str, sizes))}) fits: use devices with "
                "more memory or a shorter --max-model-len")
    tp = best.tensor_parallel_size
    more = f", more devices than --devices {devices}" if tp > devices else ""
    return (f"smallest tensor-parallel size that fits: --tensor-parallel-size {tp}{more} "
            f"({best.max_concurrent_sequences:,} sequences of {best.max_model_len} tokens per replica)")


def format_plan(p: MemoryPlan, name: str = "") -> str:
    """Human-readable lines for a plan."""
    gib = lambda b: f"{b / 2**30:,.2f} GiB"  # noqa: E731
    lines = [
        f"model {name}: {p.total_param_bytes:,} parameter bytes ({p.quantization or p.dtype}); "
        f"TP {p.tensor_parallel_size} x DP {p.data_parallel_size}"
        + (f", experts over EP {p.expert_parallel_size}" if p.expert_parallel_size > 1 else ""),
        f"device memory: {p.device_memory:,} B ({gib(p.device_memory)}), gpu_memory_utilization "
        f"{p.gpu_memory_utilization:g}, activation estimate {p.activation_reserve_bytes:,} B",
        f"weights per device: {p.weight_bytes_per_device:,} B ({gib(p.weight_bytes_per_device)})",
        f"replicated (TP does not divide): {', '.join(p.replicated_axes) or 'none'}",
        f"KV bytes per block per device: {p.kv_bytes_per_block_per_device:,} B (block size {p.block_size}, "
        f"kv_cache_dtype {p.kv_cache_dtype})",
        f"KV cache (the server's rule for these flags): {p.kv_sizing}",
        f"KV blocks per replica (incl. null block): {p.num_blocks:,}",
        f"max concurrent sequences at {p.max_model_len} tokens ({p.blocks_per_sequence} blocks each): "
        f"{p.max_concurrent_sequences:,} per replica, {p.max_concurrent_sequences * p.data_parallel_size:,} in all",
    ]
    if not p.fits:
        lines.append("DOES NOT FIT: not even one full-length sequence")
    return "\n".join(lines)


def load_config(path: str, num_hidden_layers: int | None = None) -> ModelConfig:
    """A HF ``config.json`` file, or a model folder holding one; ``num_hidden_layers`` overrides
    the depth (benchmarks on a few layers of a large layout)."""
    p = Path(path)
    if num_hidden_layers is None:
        return ModelConfig.from_dir(p) if p.is_dir() else ModelConfig.from_dict(json.loads(p.read_text()))
    raw = json.loads((p / "config.json" if p.is_dir() else p).read_text())
    return ModelConfig.from_dict({**raw, "num_hidden_layers": num_hidden_layers})


def ensure_cpu_devices(n: int) -> None:
    """Make JAX start with at least ``n`` CPU devices for ``--compile``: before JAX's backends
    exist, ``XLA_FLAGS=--xla_force_host_platform_device_count=n`` and ``JAX_PLATFORMS=cpu`` are set
    (the check compiles for the host even on a GPU machine; ``jax_num_cpu_devices`` when JAX is
    imported but not started).

    Raises:
      SystemExit: JAX already started in this process without ``n`` CPU devices (run the command
        in a fresh process).
    """
    if "jax" not in sys.modules:
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", n)
        return
    if jax.default_backend() != "cpu" or len(jax.devices()) < n:
        raise SystemExit(f"--compile needs {n} CPU devices, but JAX already started here with "
                         f"{len(jax.devices())} {jax.default_backend()} devices: run python -m jaxinfer.plan in a "
                         "fresh process")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxinfer.plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF config.json path or model folder")
    ap.add_argument("--devices", type=int, required=True, help="devices available")
    ap.add_argument("--device-memory", required=True, help="memory of one device (80GB, 80GiB, bytes)")
    add_engine_args(ap, ("model", "cache", "scheduler", "parallel"), only=PLAN_FLAGS, titled=False, overrides={
        "dtype": dict(default="bfloat16", choices=tuple(d for d in DTYPES if d != "auto"),
                      help="weights, activations and KV cache (default: bfloat16)"),
        "data_parallel_size": dict(default=None, help="default: devices // TP")})
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--compile", action="store_true", help=(
        "also build the engine's real step with abstract weights and KV on --devices fake CPU devices, compile "
        "it, lower it for CUDA, and check its memory and collectives (jaxinfer.engine.step_check); exit 1 on a "
        "failed check"))
    ap.add_argument("--layers", type=int, default=None,
                    help="override the model's layer count (a shorter compile of a deep model; default: the config's)")
    ap.add_argument("--no-cuda", action="store_true", help="with --compile: skip the CUDA lowering")
    ap.add_argument("--buckets", default="decode,prefill",
                    help="with --compile: which of the largest buckets to check (default: decode,prefill)")
    args = ap.parse_args(argv)
    tp = args.tensor_parallel_size
    dp = args.data_parallel_size or max(1, args.devices // tp)
    if tp * dp > args.devices:
        ap.error(f"TP {tp} x DP {dp} needs {tp * dp} devices; --devices is {args.devices}")
    if args.compile:
        ensure_cpu_devices(args.devices)
    ep = (args.expert_parallel_size or tp) if args.enable_expert_parallel else 1
    if args.expert_parallel_size is not None and not args.enable_expert_parallel:
        ap.error("--expert-parallel-size needs --enable-expert-parallel")
    if tp % ep:
        ap.error(f"--expert-parallel-size {ep} must divide --tensor-parallel-size {tp}")
    cfg = load_config(args.model, args.layers)
    memory = parse_bytes(args.device_memory)
    flags = dict(block_size=args.block_size, max_model_len=args.max_model_len, quantization=args.quantization,
                 kv_cache_dtype=args.kv_cache_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                 kv_cache_memory=args.kv_cache_memory, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                 max_num_batched_tokens=args.max_num_batched_tokens)
    try:
        plan = plan_memory(cfg, dtype=args.dtype, tensor_parallel_size=tp, data_parallel_size=dp,
                           device_memory=memory, expert_parallel_size=ep, **flags)
    except ValueError as e:
        ap.error(str(e))
    extra = {"fits": plan.fits}
    if not plan.fits:
        best = smallest_fitting_tp(cfg, dtype=args.dtype, device_memory=memory, **flags)
        extra["suggested_tensor_parallel_size"] = best.tensor_parallel_size if best else None
        extra["suggestion"] = suggestion(cfg, best, args.devices)
    report = None
    if args.compile and plan.fits:
        report = _compile_check(args, cfg, tp, dp, memory)
    if args.json:
        out = dataclasses.asdict(plan) | extra
        if report is not None:
            from jaxinfer.engine.step_check import report_dict

            out["compile"] = report_dict(report)
        print(json.dumps(out, indent=2, default=str))
    else:
        print(format_plan(plan, args.model))
        if not plan.fits:
            print(extra["suggestion"])
        if report is not None:
            from jaxinfer.engine.step_check import format_report

            print(format_report(report))
    return 0 if plan.fits and (report is None or report.ok) else 1


def _compile_check(args, cfg: ModelConfig, tp: int, dp: int, memory: int):
    """`jaxinfer.engine.step_check.check_step` of the engine the server would build from these flags."""
    from jaxinfer.config.args import engine_config
    from jaxinfer.engine.step_check import check_step

    config = engine_config(argparse.Namespace(**{**vars(args), "data_parallel_size": dp}), cfg)
    buckets = tuple(b.strip() for b in args.buckets.split(",") if b.strip())
    return check_step(cfg, config, memory, model_name=args.model, cuda=not args.no_cuda, buckets=buckets)


if __name__ == "__main__":
    sys.exit(main())

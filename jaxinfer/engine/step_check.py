"""Compile the engine's real step with abstract weights and KV, and check what XLA made of it.

Owns ``python -m jaxinfer.plan --compile``'s check. For an `EngineConfig` and a parallel layout it
builds the engine exactly as the server does (`jaxinfer.engine.dp_router.build_parallel_engine` ->
`jaxinfer.engine.builder.build_replica` -> `jaxinfer.runner.model_runner.ModelRunner`: the model from
the registry, the attention backend, the KV update, the sampler, the bucket ladders of the same
flags), but with ``abstract=True``: weights and KV cache are ``jax.ShapeDtypeStruct`` in their
``NamedSharding``s, so nothing is allocated and a 70B model at TP 8 fits on a laptop. Then, for the
largest decode bucket (T = R = ``max_num_seqs``) and the largest prefill bucket (T =
``max_num_batched_tokens``), both at the widest context:

  * CPU: lowers and compiles the model step and the sampler on the host's (fake) CPU devices
    with the execution plan a sharded CPU engine resolves (XLA attention; the C++ CPU kernels
    are off on a mesh; ``attention_backend="pallas"`` compiles the GPU plan's Pallas attention
    under ``shard_map`` in interpret mode instead, so the GPU step's partitioning is compiled and
    checked too), reads XLA's memory analysis (argument, output, alias and temporary bytes per
    device) and the collectives of the partitioned module (`jaxinfer.distributed.hlo_collectives`);
  * CUDA: builds the same engine with the GPU plan (Pallas attention, `jaxinfer.layers.attention.pallas`,
    under ``shard_map`` on a mesh) and lowers its model step and sampler with
    ``lowering_platforms=("cuda",)`` (``jax.stages.Traced.lower``): the step a GPU server would
    compile; it cannot be compiled here (no CUDA backend), so only the lowering is checked.

Expected communication (`expected_problems`, Megatron-LM tensor parallelism as
`jaxinfer.distributed.sharding` lays it out):
  * TP > 1: inside the layer loop exactly one reduction of the hidden states [T, D] after
    attention (o_proj, row-parallel) and one after the MLP (down_proj): two all-reduces per layer
    (or a reduce-scatter + all-gather pair for each, if sequence sharding were chosen); one
    fewer for a part whose heads (or F) TP does not divide (that part is replicated, computed
    redundantly, and needs no reduction). Nothing else per layer.
  * No collective moves a weight or the KV cache (their operands traced back through data
    movement, `jaxinfer.distributed.hlo_collectives`), and per-device weight bytes are the
    split ones: every weight with a vocab / heads / kv_heads / mlp axis that TP divides holds
    1/TP of it, the rest (norms) whole, computed here from the logical axes, not from the specs.
  * KV cache sharded by KV head: each device's K and V hold K/TP heads; where TP does not divide
    K they hold all K (replicated on every device of the replica, each computing attention for
    its heads over the full cache; `jaxinfer.distributed.sharding.kv_heads_per_device`).
  * TP = 1: no collective at all. DP: each replica's step runs on its own TP group's devices
    only (the executable's devices) and every collective's group is that TP group: nothing
    crosses replicas inside a step.
  * EP (``--enable-expert-parallel``, a mixture-of-experts model; `jaxinfer.models.moe_block`):
    every device routes every token itself (the activations are replicated), so dispatch needs no
    collective (no all-to-all), and the combine is one all-reduce of the [T, D] float32 partial
    sums over the replica's devices per MoE layer, modeled as T * D * 4 bytes: the MLP's
    reduction above, at those bytes. Expert weights hold 1/EP of the experts and 1/(TP/EP) of each
    expert's width on each device.
  * Outside the layers (once per step): the vocab-parallel embedding's reduction of [T, D], the
    gather of the [R, V] logits for the sampler and the argmax's small gathers; listed with
    their bytes, not counted against the layers.
  * Memory: XLA's argument bytes within 10% of the planner's weights + KV per device
    (`jaxinfer.entrypoints.plan`'s figure comes from the same KV rule), and XLA's temporary
    bytes within the activation estimate that rule leaves free (else the sized pool would not fit;
    XLA:CPU's figure, a GPU compile fuses differently).
"""
from __future__ import annotations

import dataclasses
import math
import re
import time
from collections import Counter

import jax

from jaxinfer.config import EngineConfig, ModelConfig
from jaxinfer.distributed import hlo_collectives
from jaxinfer.distributed.hlo_collectives import Collective
from jaxinfer.distributed import sharding
from jaxinfer.platform.execution_plan import resolve_plan
from jaxinfer.runner import batch as batch_mod
from jaxinfer.runner.buckets import Bucket

TP_AXES = ("vocab", "heads", "kv_heads", "mlp")  # logical axes tensor parallelism splits (when divisible)
ARGUMENT_TOLERANCE = 0.10  # XLA's argument bytes against the planner's weights + KV
WEIGHT_TOLERANCE = 0.01  # per-device weight bytes against the split ones


@dataclasses.dataclass
class BucketCheck:
    """What one bucket's compiled step holds, per device of replica 0."""

    name: str  # "decode" or "prefill"
    bucket: Bucket
    devices: list[int]  # the executable's devices (replica 0's TP group)
    memory: dict[str, int]  # XLA's memory analysis: argument, output, alias, temp, generated code
    weight_bytes: int  # entry parameters of the parameter tree (HLO per-device shapes)
    kv_bytes: int  # the k_cache and v_cache parameters
    kv_heads_per_device: int
    collectives: list[Collective]
    sampler_collectives: list[Collective]
    compile_seconds: float
    cuda: dict  # {"lowered": bool, "error": str, "custom_calls": {target: count}, "seconds": float}
    sampler_checked: bool = True  # the sampler was compiled (its collectives are ``sampler_collectives``)
    interpret: bool = False  # attention by the Pallas interpreter: its temporaries are no GPU figure
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def per_layer(self) -> list[Collective]:
        return [c for c in self.collectives if c.per_layer]

    @property
    def per_step(self) -> list[Collective]:
        return [c for c in self.collectives if not c.per_layer]


@dataclasses.dataclass
class CompileReport:
    """The whole check: the layout, the planner's figures and each bucket's `BucketCheck`."""

    model: str
    num_layers: int
    dtype: str
    tensor_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int
    replica_devices: list[list[int]]
    num_blocks: int
    planner_weight_bytes: int
    planner_kv_bytes: int
    expected_weight_bytes: int
    kv_sizing: str
    num_kv_heads: int
    planner_activation_bytes: int  # the KV rule's activation estimate (`jaxinfer.engine.builder.activation_reserve_bytes`)
    moe: bool
    buckets: list[BucketCheck]

    @property
    def ok(self) -> bool:
        return all(not b.problems for b in self.buckets)

    def verdict(self) -> str:
        """One line: PASS or FAIL against the expected communication, and why."""
        tp, dp, ep = self.tensor_parallel_size, self.data_parallel_size, self.expert_parallel_size
        layout = f"TP {tp} x DP {dp}" + (f" (EP {ep})" if ep > 1 else "")
        if not self.ok:
            first = next(p for b in self.buckets for p in b.problems)
            n = sum(len(b.problems) for b in self.buckets)
            return f"FAIL {layout}: {first}" + (f" (+{n - 1} more)" if n > 1 else "")
        b = self.buckets[0]
        kinds = Counter(c.kind for c in b.per_layer)
        per_layer = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no collective"
        kv = ("KV whole on the one device" if tp == 1 else
              f"KV sharded by KV head ({b.kv_heads_per_device} of {self.num_kv_heads} per device)"
              if b.kv_heads_per_device * tp == self.num_kv_heads
              else f"KV replicated (all {b.kv_heads_per_device} heads on every device: TP does not divide them)")
        cuda = "CUDA lowering skipped" if any(x.cuda.get("skipped") for x in self.buckets) else "CUDA lowering ok"
        moe = (", experts dispatched without a collective and combined by one all-reduce of T*D*4 B per layer "
               "as modeled" if self.moe else "")
        return (f"PASS {layout}: {per_layer} per layer, no weight or KV moved by a collective, {kv}{moe}, "
                f"no collective across replicas; {cuda}")


def expected_weight_bytes(cfg: ModelConfig, dtype: str, tp: int, ep: int = 1) -> int:
    """Per-device weight bytes if every weight with a `TP_AXES` axis that ``tp`` divides is split
    ``tp`` ways, a mixture of experts' ``experts`` axis ``ep`` ways and its ``expert_mlp`` axis
    ``tp / ep`` ways (where they divide), and every other weight is whole (from the logical axes,
    not the partition specs)."""
    from jax.sharding import PartitionSpec as P

    from jaxinfer.models.params import abstract_params, param_logical_axes

    def ways(name, size) -> int:
        n = {"experts": ep, "expert_mlp": tp // ep}.get(name, tp if name in TP_AXES else 1)
        return n if n > 1 and size % n == 0 else 1

    def leaf(names, x):
        return x.size * x.dtype.itemsize // math.prod(ways(n, d) for n, d in zip(tuple(names), x.shape))

    return int(sum(jax.tree.leaves(jax.tree.map(leaf, param_logical_axes(cfg), abstract_params(cfg, dtype),
                                                is_leaf=lambda s: isinstance(s, P)))))


def expected_reductions(cfg: ModelConfig, tp: int, ep: int = 1) -> int:
    """Reductions of the hidden states per layer: one after attention when TP splits the heads,
    one after the MLP when TP splits it (a mixture of experts: when EP splits the experts or
    TP / EP their width)."""
    attn = tp > 1 and cfg.num_attention_heads % tp == 0
    if cfg.is_moe:
        f = tp // ep
        mlp = (ep > 1 and cfg.num_experts % ep == 0) or (f > 1 and cfg.moe_intermediate_size % f == 0)
    else:
        mlp = tp > 1 and cfg.intermediate_size % tp == 0
    return int(attn) + int(mlp)


def largest_buckets(ladders) -> dict[str, Bucket]:
    """The largest decode bucket (T = R = ``max_num_seqs``) and prefill bucket (T = the token budget),
    both at the widest context; one entry when they coincide."""
    w = ladders.width_ladder[-1]
    decode = Bucket(ladders.max_num_seqs, ladders.num_seqs_for(ladders.max_num_seqs), w)
    top = ladders.token_ladder[-1]
    prefill = Bucket(top, ladders.num_seqs_for(top), w)
    return {"decode": decode} if prefill == decode else {"decode": decode, "prefill": prefill}


def _entry_param_bytes(text: str) -> dict[str, int]:
    """Bytes per device of the ENTRY computation's parameters by their ``op_name``."""
    comps = hlo_collectives.parse_module(text)
    entry = next(c for c in comps.values() if c.entry)
    out: dict[str, int] = {}
    for ins in entry.instrs.values():
        if ins.opcode == "parameter":
            out[ins.op_name] = out.get(ins.op_name, 0) + hlo_collectives.type_bytes(ins.type)
    return out


def _kv_heads_in(text: str) -> int:
    """KV heads per device: axis 3 of the ``k_cache`` parameter [L, NB, bs, K, H] (its values)."""
    m = re.search(r"= [a-z0-9]+\[(\d+),(\d+),(\d+),(\d+),(\d+)\][^\n]*parameter\(\d+\)[^\n]*op_name=\"k_cache",
                  text)
    return int(m.group(4)) if m else -1


def _memory(compiled) -> dict[str, int]:
    m = compiled.memory_analysis()
    return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp",
                                                                "generated_code")}


def _engines(config: EngineConfig, cfg: ModelConfig, platform: str, device_memory: int):
    """The engine's replicas, built by the server's path with abstract weights and KV, and the
    execution plan of a sharded engine on ``platform`` ("cpu" or "gpu")."""
    from jaxinfer.engine.dp_router import build_parallel_engine

    plan = resolve_plan(cfg, config.dtype, config.attention_backend if platform == "cpu" else None,
                        block_size=config.cache.block_size, sharded=True, platform=platform,
                        cpu_flags=frozenset(), environ={})
    if platform == "cpu" and plan.attention == "pallas":
        plan = dataclasses.replace(plan, pallas_interpret=True)
    engine = build_parallel_engine(dataclasses.replace(config, warmup=False), cfg, None, abstract=True, plan=plan,
                                   device_memory=device_memory)
    return getattr(engine, "engines", [engine])


def _lower_cuda(engine, inputs) -> dict:
    """Lower ``engine``'s model step and sampler for CUDA; the custom calls (Pallas kernels) it holds."""
    t0 = time.perf_counter()
    try:
        step = engine.runner.lower(inputs, lowering_platforms=("cuda",)).as_text()
        engine.runner.lower_sampler(inputs.bucket.num_seqs, inputs.sampling, lowering_platforms=("cuda",))
    except Exception as e:  # reported, not raised: the CPU half of the check still stands
        return {"lowered": False, "error": f"{type(e).__name__}: {e}"[:500], "custom_calls": {},
                "seconds": time.perf_counter() - t0}
    calls = Counter(re.findall(r"custom_call @([\w$.\-]+)", step))
    return {"lowered": True, "error": "", "custom_calls": dict(calls), "seconds": time.perf_counter() - t0}


def expected_problems(b: BucketCheck, cfg: ModelConfig, tp: int, expected_weights: int,
                      planner_args: int, ep: int = 1, num_blocks: int = 0,
                      planner_activation: float = float("inf")) -> list[str]:
    """Where ``b`` departs from the expected communication and memory (module docstring).
    ``num_blocks``: the KV pool's blocks (a collective of the cache's [L, num_blocks, ...] shape
    moves the cache, or its update, whole); ``planner_activation``: the bytes the KV rule leaves
    for the step's temporaries (`jaxinfer.engine.builder.activation_reserve_bytes`)."""
    problems = []
    T, D = b.bucket.num_tokens, cfg.hidden_size
    moved = [c for c in b.collectives + b.sampler_collectives if c.weight]
    for c in moved:
        problems.append(f"{c.kind} of {c.weight} ({c.shape}, {c.bytes:,} B)")
    for c in b.collectives:
        if not c.weight and _dims(c.shape)[:2] == [cfg.num_hidden_layers, num_blocks]:
            problems.append(f"{c.kind} of the KV cache or its update {c.shape} ({c.bytes:,} B per device "
                            f"{'per layer' if c.per_layer else 'per step'})")
    if tp == 1:
        if b.collectives or b.sampler_collectives:
            problems.append(f"{len(b.collectives)} collectives at TP 1 (expected none)")
    else:
        want = expected_reductions(cfg, tp, ep)
        hidden = [c for c in b.per_layer if _dims(c.shape) in ([T, D], [T // tp, D], [T, D // tp])]
        reductions = [c for c in hidden if c.kind == "all-reduce"]
        pairs = [c for c in hidden if c.kind == "reduce-scatter"]
        gathers = [c for c in hidden if c.kind == "all-gather"]
        if not (len(reductions) == want and not pairs and not gathers) and not (
                not reductions and len(pairs) == want and len(gathers) == want):
            problems.append(f"{len(reductions)} all-reduce, {len(pairs)} reduce-scatter, {len(gathers)} all-gather "
                            f"of the hidden states [{T}, {D}] per layer (expected {want} reductions)")
        if cfg.is_moe and any(c.bytes != T * D * 4 for c in reductions):
            problems.append(f"a per-layer reduction moves other than the modeled T*D*4 = {T * D * 4:,} B "
                            f"({[c.bytes for c in reductions]})")
        if cfg.is_moe and cfg.has_dense_mlp:
            problems.append("dense and sparse layers mixed: the per-layer expectation is not modeled for that")
        others = [c for c in b.per_layer if c not in hidden]
        for c in others:
            problems.append(f"unexpected per-layer {c.kind} {c.shape} ({c.op_name or 'no op_name'})"
                            + _why(c, cfg, T, tp))
        for c in b.collectives + b.sampler_collectives:
            if any(len(g) > tp for g in c.groups):
                problems.append(f"{c.kind} {c.shape} spans a group of {max(map(len, c.groups))} devices "
                                f"(more than the TP group of {tp}: it would cross replicas)")
    if len(b.devices) != tp:
        problems.append(f"the step runs on {len(b.devices)} devices, not its TP group of {tp}")
    k_dev = sharding.kv_heads_per_device(cfg, tp)
    if b.kv_heads_per_device != k_dev:
        problems.append(f"KV cache holds {b.kv_heads_per_device} KV heads per device (expected {k_dev})")
    if abs(b.weight_bytes - expected_weights) > WEIGHT_TOLERANCE * expected_weights:
        problems.append(f"weights per device {b.weight_bytes:,} B, expected {expected_weights:,} B "
                        f"(split {1 / tp:.3g} of every TP-split weight)")
    if abs(b.memory["argument"] - planner_args) > ARGUMENT_TOLERANCE * planner_args:
        problems.append(f"XLA argument bytes {b.memory['argument']:,} vs the planner's weights + KV {planner_args:,}")
    if b.memory["temp"] > planner_activation and not b.interpret:
        problems.append(f"XLA's temporaries {b.memory['temp']:,} B exceed the activation estimate the KV pool "
                        f"leaves free ({planner_activation:,} B): a pool sized by that rule would not fit")
    if not b.cuda.get("lowered"):
        problems.append(f"CUDA lowering failed: {b.cuda.get('error')}")
    return problems


def _why(c: Collective, cfg: ModelConfig, T: int, tp: int) -> str:
    """What a known unexpected collective is, or "": the queries [T, N, H] gathered where TP does
    not divide the KV heads (`jaxinfer.layers.attention.pallas` then runs its kernel unsplit under
    ``shard_map``: every device attends for all N query heads)."""
    if c.kind == "all-gather" and cfg.num_key_value_heads % tp and _dims(c.shape) == [
            T, cfg.num_attention_heads, cfg.head_dim]:
        return (f": the queries, gathered because TP {tp} does not divide the {cfg.num_key_value_heads} KV heads "
                f"(the Pallas kernel runs unsplit, every device attends for all {cfg.num_attention_heads} heads)")
    return ""


def _dims(shape: str) -> list[int]:
    d = hlo_collectives._array_dims(shape)
    return d[0] if d else []


def check_step(cfg: ModelConfig, config: EngineConfig, device_memory: int, *, model_name: str = "",
               cuda: bool = True, buckets: tuple[str, ...] = ("decode", "prefill"),
               sampler: bool = True) -> CompileReport:
    """Build, lower and compile the step of ``config`` for ``cfg`` on the host's CPU devices
    (module docstring) and check it.

    Args:
      device_memory: bytes of one (GPU) device, for the KV pool (the server's rule).
      cuda: also lower the GPU plan's step for CUDA.
      buckets: which of `largest_buckets` to check.
      sampler: also compile the sampler (once per row count; it takes replicated logits).
    Raises:
      ValueError: fewer host devices than TP x DP (``XLA_FLAGS=--xla_force_host_platform_device_count``).
    """
    from jaxinfer.entrypoints.plan import plan_memory

    par, sc, cc = config.parallel, config.scheduler, config.cache
    tp, dp, ep = par.tensor_parallel_size, par.data_parallel_size, par.expert_parallel_degree
    plan = plan_memory(cfg, dtype=config.dtype, tensor_parallel_size=tp, data_parallel_size=dp,
                       device_memory=device_memory, block_size=cc.block_size, max_model_len=sc.max_model_len,
                       quantization=config.quantization, kv_cache_dtype=cc.kv_cache_dtype,
                       gpu_memory_utilization=cc.gpu_memory_utilization, kv_cache_memory=cc.kv_cache_memory,
                       num_blocks=cc.num_blocks, max_num_seqs=sc.max_num_seqs,
                       max_num_batched_tokens=sc.max_num_batched_tokens, expert_parallel_size=ep)
    if plan.num_blocks < 2:
        raise ValueError(f"the KV pool holds no block ({plan.kv_sizing}): nothing to compile")
    replicas = _engines(config, cfg, "cpu", device_memory)
    gpu_replicas = _engines(config, cfg, "gpu", device_memory) if cuda else None
    engine = replicas[0]
    expected = expected_weight_bytes(cfg, config.dtype, tp, ep)
    planner_args = plan.weight_bytes_per_device + plan.kv_bytes_per_device
    checks, samplers = [], {}
    for name, bucket in largest_buckets(engine.layout.ladders).items():
        if name in buckets:
            b = _check_bucket(name, bucket, cfg, engine, gpu_replicas[0] if cuda else None, samplers, sampler)
            b.problems = expected_problems(b, cfg, tp, expected, planner_args, ep, engine.runner.kv_shape[1],
                                           plan.activation_reserve_bytes)
            checks.append(b)
    report = CompileReport(model_name, cfg.num_hidden_layers, config.dtype, tp, dp, ep,
                           [sorted(d.id for d in e.mesh.devices.flat) for e in replicas], engine.runner.kv_shape[1],
                           plan.weight_bytes_per_device, plan.kv_bytes_per_device, expected, plan.kv_sizing,
                           cfg.num_key_value_heads, plan.activation_reserve_bytes, cfg.is_moe, checks)
    if len({d for r in report.replica_devices for d in r}) != sum(map(len, report.replica_devices)):
        for b in checks:
            b.problems.append("replicas share devices")
    return report


def _check_bucket(name: str, bucket: Bucket, cfg: ModelConfig, engine, gpu_engine, samplers: dict,
                  sampler: bool) -> BucketCheck:
    """Compile ``engine``'s step of ``bucket`` (and the sampler of its row count, once, into
    ``samplers``), lower ``gpu_engine``'s for CUDA (None: skipped) and read what they hold."""
    inputs = batch_mod.empty_inputs(bucket, engine.layout)
    t0 = time.perf_counter()
    compiled = engine.runner.lower(inputs).compile()
    if sampler and bucket.num_seqs not in samplers:
        text = engine.runner.lower_sampler(bucket.num_seqs, inputs.sampling).compile().as_text()
        samplers[bucket.num_seqs] = hlo_collectives.collectives(text, cfg.num_hidden_layers)
    seconds = time.perf_counter() - t0
    text = compiled.as_text()
    params = _entry_param_bytes(text)
    devices = sorted({d.id for s in jax.tree.leaves(compiled.input_shardings) for d in s.device_set})
    cuda = ({"lowered": True, "error": "", "custom_calls": {}, "seconds": 0.0, "skipped": True} if gpu_engine is None
            else _lower_cuda(gpu_engine, batch_mod.empty_inputs(bucket, gpu_engine.layout)))
    return BucketCheck(name, bucket, devices, _memory(compiled),
                       sum(v for k, v in params.items() if k.startswith(hlo_collectives.WEIGHT_PREFIX)),
                       sum(v for k, v in params.items() if k in ("k_cache", "v_cache")), _kv_heads_in(text),
                       hlo_collectives.collectives(text, cfg.num_hidden_layers), samplers.get(bucket.num_seqs, []),
                       seconds, cuda, sampler_checked=bucket.num_seqs in samplers,
                       interpret=engine.runner.plan.pallas_interpret)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def format_report(r: CompileReport) -> str:
    """Human-readable lines of a `CompileReport` (the CLI's output)."""
    ep = f" (experts over EP {r.expert_parallel_size})" if r.expert_parallel_size > 1 else ""
    lines = [f"compiled step of {r.model} ({r.num_layers} layers, {r.dtype}) at TP {r.tensor_parallel_size} x "
             f"DP {r.data_parallel_size}{ep}; replicas on devices {r.replica_devices}",
             f"planner per device: weights {r.planner_weight_bytes:,} B ({_mib(r.planner_weight_bytes)}), "
             f"KV {r.planner_kv_bytes:,} B ({_mib(r.planner_kv_bytes)}); split weights expected "
             f"{r.expected_weight_bytes:,} B",
             f"KV cache: {r.kv_sizing}"]
    for b in r.buckets:
        m = b.memory
        lines.append(f"[{b.name}] bucket T={b.bucket.num_tokens} R={b.bucket.num_seqs} W={b.bucket.ctx_blocks} "
                     f"blocks, compiled in {b.compile_seconds:.1f} s on devices {b.devices}")
        lines.append(f"  XLA per device: arguments {m['argument']:,} B ({_mib(m['argument'])}) = weights "
                     f"{b.weight_bytes:,} + KV {b.kv_bytes:,} + inputs {m['argument'] - b.weight_bytes - b.kv_bytes:,}"
                     f"; planner {r.planner_weight_bytes + r.planner_kv_bytes:,} "
                     f"({(m['argument'] / max(1, r.planner_weight_bytes + r.planner_kv_bytes) - 1) * 100:+.2f}%); "
                     f"temp {m['temp']:,} B ({_mib(m['temp'])}; the planner's activation estimate "
                     f"{r.planner_activation_bytes:,} B, {_mib(r.planner_activation_bytes)}"
                     f"{'; the Pallas interpreter: not a GPU figure, not checked' if b.interpret else ''}); output {m['output']:,} B, aliased {m['alias']:,} B")
        lines.append(f"  KV heads per device: {b.kv_heads_per_device}")
        for label, group, mult in (("per layer", b.per_layer, r.num_layers), ("per step, outside the layers",
                                                                             b.per_step, 1)):
            lines.append(f"  collectives {label}: {_summary(group)}")
            for c in group:
                src = f" OPERAND IS {c.weight}" if c.weight else ""
                lines.append(f"    {c.kind:18s} {c.shape:28s} {c.bytes:>14,} B x{c.count} groups "
                             f"{_groups(c.groups)}{src}  [{_short(c.op_name)}]")
            if label == "per layer" and group:
                total = sum(c.bytes * c.count for c in group)
                lines.append(f"    per step: {total * mult:,} B ({_mib(total * mult)}) over {r.num_layers} layers")
        lines.append(f"  sampler collectives: {_summary(b.sampler_collectives)}" if b.sampler_checked
                     else "  sampler: not compiled")
        cu = b.cuda
        if cu.get("skipped"):
            lines.append("  CUDA lowering: skipped")
        else:
            lines.append(f"  CUDA lowering: {'ok' if cu['lowered'] else 'FAILED ' + cu['error']} "
                         f"({cu['seconds']:.1f} s; custom calls {cu['custom_calls'] or 'none'})")
        for p in b.problems:
            lines.append(f"  PROBLEM: {p}")
    lines.append(r.verdict())
    return "\n".join(lines)


def _summary(group: list[Collective]) -> str:
    if not group:
        return "none"
    kinds = Counter(c.kind for c in group)
    total = sum(c.bytes * c.count for c in group)
    return ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items())) + f" ({total:,} B)"


def _groups(groups) -> str:
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups[:4]) + (",..." if len(groups) > 4 else "") + "}"


def _short(op_name: str) -> str:
    return op_name.split("/", 1)[-1][-80:] if op_name else "-"


def report_dict(r: CompileReport) -> dict:
    """The report as JSON-ready data (``--json``)."""
    out = dataclasses.asdict(r)
    out["ok"], out["verdict"] = r.ok, r.verdict()
    return out

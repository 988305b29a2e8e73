"""Where every array lives on the device mesh: the one logical-axis -> mesh-axis map.

The mesh has two named axes (`MESH_AXES`): ``data`` (data-parallel replicas, each with
its own scheduler and KV pool) and ``model`` (tensor parallelism inside a replica).
Axis types are Auto (``jax.sharding.Mesh``'s default), so XLA's SPMD partitioner
inserts the collectives itself (``jax.make_mesh`` would default to Explicit axes).

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", sections 3-4):
  * attention is split by heads: q/k/v projections column-parallel over ``heads`` /
    ``kv_heads``; o_proj row-parallel (its input is head-sharded, so its output is a
    partial sum that XLA all-reduces);
  * the MLP is split over ``mlp`` (F): gate/up column-parallel, down_proj row-parallel
    (one all-reduce per MLP);
  * the embedding table and LM head are split over the vocabulary (Megatron's
    vocab-parallel embedding; the logits are then gathered for sampling, as vLLM's
    LogitsProcessor does);
  * the paged KV cache ``[L, num_blocks, block_size, K, H]`` is split over K like
    the k/v projections that fill it, so attention needs no communication;
  * ``embed`` (D), ``head_dim`` (H), ``layers`` (L) and the norms are replicated.

Axes that do not divide evenly are replicated (decision for issue 6). A logical axis
is put on ``model`` only if that dimension is divisible by the TP degree; otherwise
that dimension is replicated on every device of the replica. SmolLM2-135M has 9 query
heads and 3 KV heads, so at TP 2 or 4 its attention weights (q, k, v, o: 26.5M of its
135M parameters) and its whole KV cache are replicated and computed redundantly on
every TP device, while the MLP (F = 1536) and the vocabulary (49152) are split. The
cost of a replicated KV cache is TP x the ideal per-device KV memory (each device holds
all K heads: ``2 * L * block_size * K * H * itemsize`` bytes per block instead of
``/ TP``), so a replica holds TP x fewer blocks than it would with K split;
`kv_heads_per_device` and the planner (``python -m jaxinfer.plan``) account for it.
(vLLM instead duplicates KV heads so each rank owns one when K < TP and TP % K == 0;
that would change the cache shape per TP degree and is not done here.) Llama-3 8B/70B
(32/64 query heads, 8 KV heads) split everything at TP 2, 4 and 8.

Expert parallelism (``--enable-expert-parallel``, vLLM's name; `expert_parallel_degree`): the
replica's ``tp`` devices form a grid ``(expert, model)`` of ``ep x tp / ep`` (mesh axes
`EP_MESH_AXES`). The experts of a mixture-of-experts layer (logical axis ``experts``) are split
over ``expert``, each expert's hidden width (``expert_mlp``) over ``model``; everything the
rules above put on ``model`` (heads, KV heads, the dense MLP, the vocabulary) goes on the whole
group ``("expert", "model")``, so attention stays tensor-parallel over all ``tp`` devices. EP 4
on 4 devices: 1/4 of the experts each, attention TP 4; EP 2 x TP 2: half the experts each, each
expert's width halved, attention TP 4. Without expert parallelism an MoE model's experts are
tensor-parallel (``expert_mlp`` on ``model``, all experts on every device), as vLLM does by
default. The dispatch and combine are `jaxinfer.models.moe_block`'s (``shard_map``, one psum).

Host side: `make_mesh`, `replica_meshes` (one sub-mesh per ``data`` index),
`split_replicas` (per-replica views of globally placed params, no copy),
`put_replicated` (step inputs, also across processes).
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxinfer.config import ModelConfig

MESH_AXES = ("data", "model")
EP_MESH_AXES = ("data", "expert", "model")  # a replica's devices as (expert, model) (module docstring)
EXPERT_AXIS = "expert"

# The one map from the model's logical axis names (see jaxinfer.models.llama) to mesh
# axes; None = replicated. Applied per dimension, subject to divisibility (module doc).
LOGICAL_AXIS_RULES: dict[str, str | None] = {
    "vocab": "model",
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "embed": None,
    "head_dim": None,
    "layers": None,
    "experts": "expert",  # a MoE layer's experts: over the expert axis (replicated without one)
    "expert_mlp": "model",  # one expert's hidden width: over the model axis only
    "router": None,  # the router's [D, E] logits: replicated (every device routes every token)
}
# Rules whose "model" means the model axis alone even on an expert-parallel mesh (the experts
# axis of the same array already takes the expert axis).
_MODEL_AXIS_ONLY = frozenset({"expert_mlp"})

# Logical names of the KV cache dimensions [L, num_blocks, block_size, K, H].
KV_CACHE_LOGICAL_AXES = ("layers", "blocks", "block_slots", "kv_heads", "head_dim")


def make_mesh(tensor_parallel_size: int = 1, data_parallel_size: int = 1,
              devices: Sequence[jax.Device] | None = None, expert_parallel_size: int = 1) -> Mesh:
    """A ``(data, model)`` mesh of shape ``(dp, tp)`` over the first dp * tp devices, or with
    ``expert_parallel_size`` ep > 1 a ``(data, expert, model)`` mesh of shape ``(dp, ep, tp / ep)``.

    Row ``i`` of the device grid is data-parallel replica ``i``; consecutive devices
    (``jax.devices()`` order: by process, then local index) form one TP group, so a TP
    group stays inside a host when tp <= devices per host.

    Args:
      tensor_parallel_size: devices per replica (``model`` axis size), >= 1.
      data_parallel_size: replicas (``data`` axis size), >= 1.
      devices: devices to use (default ``jax.devices()``, all processes).
      expert_parallel_size: the ``expert`` axis size, dividing ``tensor_parallel_size``
        (1: no expert axis).
    Returns:
      ``jax.sharding.Mesh`` with Auto axis types.
    Raises:
      ValueError: sizes < 1, an expert size that does not divide the TP size, or more devices
        requested than available.
    """
    tp, dp, ep = int(tensor_parallel_size), int(data_parallel_size), int(expert_parallel_size)
    if tp < 1 or dp < 1:
        raise ValueError(f"tensor_parallel_size and data_parallel_size must be >= 1, got {tp} and {dp}")
    if ep < 1 or tp % ep:
        raise ValueError(f"expert_parallel_size {ep} must be >= 1 and divide tensor_parallel_size {tp}")
    devices = list(jax.devices() if devices is None else devices)
    if tp * dp > len(devices):
        raise ValueError(f"tensor_parallel_size {tp} x data_parallel_size {dp} = {tp * dp} devices, "
                         f"but only {len(devices)} are available")
    grid = np.array(devices[:tp * dp], dtype=object)
    if ep > 1:
        return Mesh(grid.reshape(dp, ep, tp // ep), EP_MESH_AXES)
    return Mesh(grid.reshape(dp, tp), MESH_AXES)


def mesh_degrees(mesh: Mesh) -> tuple[int, int]:
    """``(tp, ep)`` of a mesh of `make_mesh`: devices per replica, and the expert axis size (1: none)."""
    ep = mesh.shape.get(EXPERT_AXIS, 1)
    return mesh.shape["model"] * ep, ep


def _group_sizes(tp: int, ep: int) -> dict[str, int]:
    """Mesh axis sizes of one replica: ``{"model": tp}`` or ``{"expert": ep, "model": tp / ep}``."""
    return {"model": tp} if ep <= 1 else {EXPERT_AXIS: ep, "model": tp // ep}


def _axis_size(axis_sizes: dict[str, int], name) -> int:
    names = name if isinstance(name, tuple) else (name,)
    return int(np.prod([axis_sizes[n] for n in names]))


def _mesh_axis(name: str | None, size: int, tp: int, ep: int):
    """The mesh axis (or axes) of one dimension, or None (replicated): see `mesh_spec`."""
    axis = LOGICAL_AXIS_RULES.get(name) if name is not None else None
    if axis == EXPERT_AXIS:
        return EXPERT_AXIS if ep > 1 and size % ep == 0 else None
    if axis == "model" and ep > 1:
        if name in _MODEL_AXIS_ONLY:
            return "model" if tp // ep > 1 and size % (tp // ep) == 0 else None
        return (EXPERT_AXIS, "model") if size % tp == 0 else None
    return axis if axis is not None and tp > 1 and size % tp == 0 else None


def mesh_spec(logical: Sequence[str | None], shape: Sequence[int], tp: int, ep: int = 1) -> P:
    """Mesh ``PartitionSpec`` for one array from its logical axis names and shape.

    A dimension goes on ``model`` when its rule says so and ``shape[i] % tp == 0``;
    otherwise it is replicated (module docstring). Unknown names are replicated. With an
    expert axis (``ep`` > 1): ``experts`` on ``expert`` (when ep divides it), ``expert_mlp``
    on ``model`` (size tp / ep) and the other ``model`` rules on ``("expert", "model")``.
    """
    out = [_mesh_axis(name, size, tp, ep) for name, size in zip(logical, shape)]
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def param_partition_specs(cfg: ModelConfig, tp: int, ep: int = 1):
    """Tree of mesh ``PartitionSpec`` matching the params tree, for TP degree ``tp`` and
    expert axis size ``ep``.

    Pure shape arithmetic (``jax.eval_shape``): no devices or mesh needed (the planner).
    """
    from jaxinfer.models.params import abstract_params, param_logical_axes

    logical = param_logical_axes(cfg)
    shapes = abstract_params(cfg)
    return jax.tree.map(lambda spec, x: mesh_spec(tuple(spec), x.shape, tp, ep), logical, shapes,
                        is_leaf=lambda s: isinstance(s, P))


def param_shardings(cfg: ModelConfig, mesh: Mesh):
    """Tree of ``NamedSharding`` for the params on ``mesh`` (replicated over ``data``)."""
    specs = param_partition_specs(cfg, *mesh_degrees(mesh))
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


def expert_weight_specs(cfg: ModelConfig, mesh: Mesh | None) -> tuple[P, P]:
    """``PartitionSpec`` of one layer's expert kernels on ``mesh``: (gate and up ``[E, D, F]``,
    down ``[E, F, D]``), as `param_partition_specs` lays out the stacked ``[L, E, ...]`` ones."""
    tp, ep = (1, 1) if mesh is None else mesh_degrees(mesh)
    e, d, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    return (mesh_spec(("experts", "embed", "expert_mlp"), (e, d, f), tp, ep),
            mesh_spec(("experts", "expert_mlp", "embed"), (e, f, d), tp, ep))


def kv_heads_per_device(cfg: ModelConfig, tp: int) -> int:
    """KV heads each device stores: K / tp when divisible, else all K (replicated)."""
    K = cfg.num_key_value_heads
    return K // tp if tp > 1 and K % tp == 0 else K


def kv_cache_spec(cfg: ModelConfig, tp: int, ep: int = 1) -> P:
    """``PartitionSpec`` of each of K and V ``[L, num_blocks, block_size, K, H]``."""
    return mesh_spec(KV_CACHE_LOGICAL_AXES, (0, 0, 0, cfg.num_key_value_heads, cfg.head_dim), tp, ep)


def kv_cache_sharding(cfg: ModelConfig, mesh: Mesh) -> NamedSharding:
    """``NamedSharding`` of the KV cache on ``mesh``: split over K heads on ``model`` (on
    ``("expert", "model")`` with an expert axis)."""
    return NamedSharding(mesh, kv_cache_spec(cfg, *mesh_degrees(mesh)))


def kv_pages_sharding(pages, mesh: Mesh):
    """The sharding of a KV cache ``pages`` (``[L, NB, bs, K, H]``, or a quantized cache's values
    and ``[L, NB, bs, K]`` scales), of a step's new keys or values ``[T, K, H]``, or of pages read
    from the cache (any ``[..., K, H]``), on ``mesh`` by `kv_cache_spec`'s rule, read from its own
    shape: for pinning them inside the step (`jaxinfer.layers.attention.base.AttentionBackend.keep_layout`)."""
    axes = (None,) * (len(pages.shape) - 2) + KV_CACHE_LOGICAL_AXES[-2:]  # the leading axes are never split
    spec = mesh_spec(axes, pages.shape, *mesh_degrees(mesh))
    values = NamedSharding(mesh, spec)
    if isinstance(pages, jax.Array) or not hasattr(pages, "scales"):
        return values
    return type(pages)(values, NamedSharding(mesh, P(*tuple(spec)[:4])))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated ``NamedSharding`` (step inputs, logits, sampler outputs)."""
    return NamedSharding(mesh, P())


def replicated_axes(cfg: ModelConfig, tp: int, ep: int = 1) -> list[str]:
    """Logical axes that the rules would split but that fall back to replication at ``tp``
    (and expert axis size ``ep``)."""
    sizes = {"vocab": cfg.vocab_size, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads}
    if cfg.has_dense_mlp:
        sizes["mlp"] = cfg.intermediate_size
    if cfg.is_moe:
        sizes.update(experts=cfg.num_experts, expert_mlp=cfg.moe_intermediate_size)
    out = []
    for name, size in sizes.items():
        splits = (ep if name == "experts" else tp // ep if name == "expert_mlp" else tp) > 1
        if splits and _mesh_axis(name, size, tp, ep) is None:
            out.append(name)
    return out


def shard_shape(shape: Sequence[int], spec: P, axis_sizes: dict[str, int]) -> tuple[int, ...]:
    """Per-device shape of an array of ``shape`` laid out by ``spec`` on a mesh with
    ``axis_sizes`` (e.g. ``{"data": 1, "model": 8}``).

    Raises:
      ValueError: a sharded dimension is not divisible by its mesh axes.
    """
    out = list(shape)
    for i, name in enumerate(tuple(spec)):
        if name is None:
            continue
        n = _axis_size(axis_sizes, name)
        if out[i] % n:
            raise ValueError(f"dimension {i} of {tuple(shape)} is not divisible by mesh axes {name} ({n})")
        out[i] //= n
    return tuple(out)


def per_device_param_bytes(cfg: ModelConfig, dtype: str, tp: int, ep: int = 1) -> int:
    """Bytes of parameters each device of a TP group holds (from shapes only); ``ep``: the
    expert axis size (`make_mesh`)."""
    from jaxinfer.models.params import abstract_params

    shapes = abstract_params(cfg, dtype)
    specs = param_partition_specs(cfg, tp, ep)
    sizes = {"data": 1, **_group_sizes(tp, ep)}
    leaves = jax.tree.leaves(jax.tree.map(
        lambda x, s: int(np.prod(shard_shape(x.shape, s, sizes))) * x.dtype.itemsize, shapes, specs,
        is_leaf=lambda s: isinstance(s, P)))
    return int(sum(leaves))


def per_device_bytes(tree) -> int:
    """Bytes of one device's shards of a tree of ``jax.Array`` (every shard of a
    ``NamedSharding`` has the same shape)."""
    return int(sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def init_params_sharded(cfg: ModelConfig, dtype: str, seed: int, shardings):
    """Random params (as `jaxinfer.models.params.init_params`, without ``scale``) created
    directly in their shards by one jitted init with ``out_shardings``: no device or
    host ever holds a full copy (``--load-format dummy`` for big models).

    The values equal the unsharded init with the same seed (JAX's PRNG is sharding-invariant).
    """
    import flax.linen as nn

    from jaxinfer.models.params import _boxed_init

    return jax.jit(lambda: nn.unbox(_boxed_init(cfg, dtype, seed)), out_shardings=shardings)()


def abstract_params_sharded(cfg: ModelConfig, dtype: str, shardings):
    """The params as ``jax.ShapeDtypeStruct`` in ``shardings`` (`param_shardings`): the shapes and
    dtypes of `jaxinfer.models.params.abstract_params`, nothing allocated (ahead-of-time checks of
    the real step at full size, `jaxinfer.engine.step_check`)."""
    from jaxinfer.models.params import abstract_params

    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        abstract_params(cfg, dtype), shardings)


def place_params(params, shardings):
    """Put a params tree in ``shardings``: numpy leaves are sliced per device (each
    device receives only its shard); ``jax.Array`` leaves already so placed are kept."""
    def put(x, s):
        if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim):
            return x
        if jax.process_count() > 1:
            arr = np.asarray(x)
            return jax.make_array_from_callback(arr.shape, s, lambda idx: arr[idx])
        return jax.device_put(x, s)

    return jax.tree.map(put, params, shardings)


def replica_meshes(mesh: Mesh) -> list[Mesh]:
    """One ``(data=1, model=tp)`` (or ``(data=1, expert, model)``) sub-mesh per data-parallel
    replica (row of ``mesh``)."""
    return [Mesh(mesh.devices[i:i + 1], mesh.axis_names) for i in range(mesh.shape["data"])]


def split_replicas(tree, mesh: Mesh) -> list:
    """Per-replica views of a tree placed on the whole ``mesh`` (replicated over ``data``).

    Each returned tree reuses the device buffers of its replica's devices
    (``jax.make_array_from_single_device_arrays``): no copy, no transfer.

    Returns:
      A list of ``mesh.shape["data"]`` trees, tree ``i`` on ``replica_meshes(mesh)[i]``.
    """
    subs = replica_meshes(mesh)

    def views(x):
        if isinstance(x, jax.ShapeDtypeStruct):  # abstract params: the same spec on each replica's mesh
            return [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(sub, x.sharding.spec)) for sub in subs]
        out = []
        for sub in subs:
            devs = set(sub.devices.flat)
            shards = [s.data for s in x.addressable_shards if s.device in devs]
            out.append(jax.make_array_from_single_device_arrays(x.shape, NamedSharding(sub, x.sharding.spec), shards))
        return out

    per_leaf = jax.tree.map(views, tree)
    return [jax.tree.map(lambda v, i=i: v[i], per_leaf, is_leaf=lambda v: isinstance(v, list))
            for i in range(len(subs))]


def put_replicated(arrays, sharding: NamedSharding):
    """Host arrays (any pytree of numpy arrays: a dict, the step's metadata) -> the same
    pytree of replicated device arrays on ``sharding``'s devices.

    Single process: ``jax.device_put``. Multi-process: every process passes the same
    values (process 0 broadcast them) and builds its local shards with
    ``jax.make_array_from_callback`` (``device_put`` would check equality across
    processes with a collective on every step).
    """
    if jax.process_count() == 1:
        return jax.device_put(arrays, sharding)
    return jax.tree.map(lambda v: jax.make_array_from_callback(v.shape, sharding, lambda idx: v[idx]), arrays)

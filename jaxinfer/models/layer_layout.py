"""The two layouts of the decoder layers' parameters, and the one-time split between them.

Stored and sharded layout (checkpoints, `jaxinfer.models.params`, `jaxinfer.distributed.sharding`, int8
quantization): one ``layers`` subtree whose leaves carry all L layers on axis 0 (logical
axis ``layers``, never split), run under ``nn.scan``. Unrolled layout
(``LlamaForCausalLM(scan_layers=False)``): ``layers_0 .. layers_{L-1}`` subtrees of the
same leaves without that axis, one module per layer in a Python loop.

Why two: on XLA:CPU the scanned stack pays a per-iteration cost (the loop, and reading the
layer's weights through a dynamic slice of the stacked arrays) that dominates a one-token
decode step, while slicing one stacked array per layer inside the step copies the weights
every step. Splitting the stacked arrays once, at load, into separate per-layer arrays gives
the unrolled step its weights without any per-step copy (measured in
``benchmarks/decode_probe.py``).
"""
from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxinfer.models.llama import layer_name

STACKED = "layers"


def _layer_sharding(x):
    """The sharding of one layer of stacked array ``x``: its spec without the (replicated)
    ``layers`` axis, on the same mesh; None (the default device) when ``x`` is not on a mesh."""
    s = getattr(x, "sharding", None)
    if not isinstance(s, NamedSharding):
        return None
    spec = tuple(s.spec)
    if spec and spec[0] is not None:
        raise ValueError(f"the layers axis of a stacked parameter is split over {spec[0]!r}; it must be replicated")
    return NamedSharding(s.mesh, P(*spec[1:]))


def unstack_layers(params: dict, num_layers: int) -> dict:
    """The unrolled layout of a stacked ``params`` tree (module docstring).

    Args:
      params: the ``params`` tree with a stacked ``layers`` subtree (leaves [L, ...], jax
        arrays or numpy); other top-level keys (embedding, final norm, LM head) pass through.
      num_layers: L.
    Returns:
      A new tree: the same top-level keys but ``layers`` replaced by ``layers_0..L-1``,
      each leaf ``x[i]`` as its own array (one copy, made here, never per step), placed with
      the stacked array's sharding minus the ``layers`` axis, so every other logical axis
      keeps its mesh axis.
    Raises:
      ValueError: no ``layers`` subtree, a leaf whose first axis is not L, or a ``layers``
        axis that is split over a mesh axis.
    """
    if STACKED not in params:
        raise ValueError(f"params have no stacked {STACKED!r} subtree (keys: {sorted(params)})")
    stacked = params[STACKED]
    for x in jax.tree.leaves(stacked):
        if x.shape[:1] != (num_layers,):
            raise ValueError(f"stacked parameter of shape {x.shape} does not have {num_layers} layers on axis 0")
    layer_shardings = jax.tree.map(_layer_sharding, stacked)
    placed = any(s is not None for s in jax.tree.leaves(layer_shardings, is_leaf=lambda s: s is None))
    split = jax.jit(lambda t: [jax.tree.map(lambda x: x[i], t) for i in range(num_layers)],
                    **({"out_shardings": [layer_shardings] * num_layers} if placed else {}))
    layers = split(stacked)
    out = {k: v for k, v in params.items() if k != STACKED}
    out.update({layer_name(i): layer for i, layer in enumerate(layers)})
    return out

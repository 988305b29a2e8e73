"""The linear-method interface and its registry (after vLLM's ``LinearMethodBase`` /
``quant_method``, vllm/model_executor/layers/linear.py: create_weights,
process_weights_after_loading, apply).

Owns how a projection of `jaxinfer.models.llama` is computed: the model describes each
projection (`Projection`: parameter name, output features, kernel logical axes, contracted
axes) and calls it through the method the execution plan named (`get_linear_method`); the
method creates the flax parameters (the same tree names and logical axes for every method, so
checkpoints load unchanged), packs weights once at load where it has a kernel for them, and
runs the product. The token embedding and the LM head are the method's too (`embedding`,
`embed`, `logits`): a tied head multiplies by the embedding table, whose storage the method
owns (float, or int8 with group scales).

The methods live in `jaxinfer.layers.linear_methods`, one file each, registered by name
(`register_linear_method`); `jaxinfer.platform.execution_plan` documents the names.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import ClassVar

import flax.linen as nn
import jax

# The variable collection of weights packed at load (`LinearMethod.process_weights_after_loading`):
# the model's layer scan broadcasts it whole (read in place by layer index, never sliced).
PACKED_COLLECTION = "amx"


@dataclasses.dataclass(frozen=True)
class Projection:
    """One bias-free projection: contracts the input's last ``n_in`` axes into ``features``.

    Attributes:
      name: the parameter subtree's name (``q_proj``, ``lm_head``...).
      features: output features, an int or a tuple (``(heads, head_dim)``).
      names: the kernel's logical axis names (inputs then outputs, `jaxinfer.distributed.sharding`).
      n_in: the number of contracted (trailing input) axes.
    """

    name: str
    features: int | tuple[int, ...]
    names: tuple[str, ...]
    n_in: int = 1

    @property
    def feature_tuple(self) -> tuple[int, ...]:
        return self.features if isinstance(self.features, tuple) else (self.features,)


@dataclasses.dataclass(frozen=True)
class LinearMethod:
    """How projections run (a hashable linen module attribute). Every call takes the calling
    module (whose ``dtype`` is the compute dtype and ``param_dtype`` the storage dtype) so
    that submodules and variables belong to it.

    Subclasses set ``name`` and implement `create_weights`, `embedding`, `embed` and `logits`;
    the packed ones override `apply`, `fused`, `gated` and `process_weights_after_loading`.
    """

    name: ClassVar[str] = ""

    def create_weights(self, module: nn.Module, p: Projection) -> nn.Module:
        """The projection's submodule (named ``p.name``), a callable ``x [*B, *in] -> [*B, *features]``."""
        raise NotImplementedError

    def apply(self, module: nn.Module, p: Projection, x: jax.Array, layer=None, rows=None) -> jax.Array:
        """``x [*B, *in]`` times the projection's weight -> float32 ``[*B, *features]`` (compute
        dtype operands, float32 accumulation). ``layer``: the layer index ([] int32, traced) where
        the weights are read from a packed stack; ``rows``: the step's real rows ([] int32; None:
        all), a packed product's rows, the others left zero."""
        return self.create_weights(module, p)(x)

    def fused(self, module: nn.Module, group: str, x: jax.Array, layer, rows=None) -> jax.Array | None:
        """The product of the projections packed together as ``group`` ("qkv": ``x [*B, D]`` ->
        float32 ``[prod(B), Nq + Nk + Nv]``, columns in that order), or None: run them one by one."""
        return None

    def gated(self, module: nn.Module, x: jax.Array, layer, act: str, rows=None) -> jax.Array | None:
        """``act(x wg) * (x wu)`` of the MLP's gate and up in one call (``x [*B, D]`` -> ``[*B, F]``),
        or None: run them one by one."""
        return None

    def embedding(self, module: nn.Module, cfg) -> nn.Module:
        """The token embedding submodule ``embed`` (table ``[V, D]``, logical axes (vocab, embed))."""
        raise NotImplementedError

    def embed(self, module: nn.Module, table: nn.Module, ids: jax.Array) -> jax.Array:
        """Rows of ``table`` (`embedding`) at int32 ``ids [T]`` -> float32 ``[T, D]``."""
        raise NotImplementedError

    def logits(self, module: nn.Module, cfg, x: jax.Array, table: nn.Module, rows=None) -> jax.Array:
        """The LM head: hidden states ``x [R, D]`` -> logits ``[R, V]`` (tied to ``table`` or the
        ``lm_head`` kernel, per ``cfg.tie_word_embeddings``), before any soft-capping. ``rows``
        as `apply`'s."""
        raise NotImplementedError

    def process_weights_after_loading(self, params: dict, cfg) -> tuple[dict, dict | None]:
        """``(params the scanned step reads, packed weights or None)`` for a stacked ``params``
        tree (`PACKED_COLLECTION`'s variables); the input tree is not modified."""
        return params, None


_REGISTRY: dict[str, type[LinearMethod]] = {}
_METHOD_MODULES = ("dense", "bf16_gemv", "int8", "amx_packed", "int8_packed")


def register_linear_method(cls: type[LinearMethod]) -> type[LinearMethod]:
    """Class decorator: make ``cls`` buildable by its ``name`` (`get_linear_method`).

    Raises:
      ValueError: no name, or the name is taken by another class.
    """
    if not cls.name or _REGISTRY.get(cls.name, cls) is not cls:
        raise ValueError(f"linear method {cls.__name__}: name {cls.name!r} is empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def get_linear_method(name: str, fallback: str | None = None) -> LinearMethod:
    """The method registered as ``name``; a packed method gets the method ``fallback`` for the
    projections it did not pack (`jaxinfer.platform.execution_plan.ExecutionPlan.linear_fallback`).

    Raises:
      ValueError: an unknown name, or a packed method without a fallback.
    """
    for module in _METHOD_MODULES:
        importlib.import_module(f"jaxinfer.layers.linear_methods.{module}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown linear method {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    cls = _REGISTRY[name]
    if "fallback" in {f.name for f in dataclasses.fields(cls)}:
        if fallback is None:
            raise ValueError(f"linear method {name!r} needs a fallback method")
        return cls(fallback=get_linear_method(fallback))
    return cls()


def default_linear_method(cfg) -> LinearMethod:
    """The method of a model built without a plan (parameter init, conversion): int8 for an
    int8 ``cfg.quantization``, else XLA's dot."""
    return get_linear_method("int8" if cfg.quantization == "int8" else "dense")

"""Which models one server runs, under which names, and each one's share of the KV budget.

``server.py --model A --model B`` runs one engine (one KV pool) per model. This module
turns the flags into a list of `ModelSpec` (a pure function of them, no JAX):

* ``--served-model-name`` pairs with ``--model`` by position (the i-th name serves the
  i-th model; a model without one is served under its ``--model`` string); names must
  be distinct, so the same checkpoint can be served twice with different names.
* ``--fallback-model NAME`` names the model that takes degraded requests: a served name
  already listed, or else another model to load, served as ``NAME``.
* The KV budget is split evenly: ``--kv-cache-memory M`` gives each of N models M / N
  bytes per device; without it, each gets ``1 / N`` of the default budget (of
  ``--gpu-memory-utilization`` on an accelerator, where each model's own weights then
  come out of its share; of the CPU default budget on a CPU). ``--num-blocks`` is
  per model and is not split.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model to serve.

    Attributes:
      path: what ``--model`` said (name under weights/, folder, .gguf file).
      name: the served name (the request's ``model``).
      kv_cache_memory: its KV budget in bytes per device, or None (sized otherwise).
      gpu_memory_utilization: its fraction of device memory, or None (the default).
      chat_template: its ``--chat-template`` (file, bundled name or text), or None (the
        tokenizer's own).
    """

    path: str
    name: str
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    chat_template: str | None = None


def model_specs(models: list[str], served_names: list[str] | None, fallback: str | None,
                chat_templates: list[str] | None = None) -> list[ModelSpec]:
    """The models of the flags, in order, before the KV split.

    Args:
      models: the ``--model`` values (at least one).
      served_names: the ``--served-model-name`` values (at most one per model), or None.
      fallback: ``--fallback-model``, or None.
      chat_templates: the ``--chat-template`` values (at most one per model, paired by
        position like the names), or None.
    Raises:
      ValueError: more served names or chat templates than models, two models under one name,
        or a fallback that is the only model.
    """
    names, templates = list(served_names or []), list(chat_templates or [])
    for flag, what, values in (("--served-model-name", "name", names), ("--chat-template", "template", templates)):
        if len(values) > len(models):
            raise ValueError(f"{len(values)} {flag} values for {len(models)} --model values "
                             f"(give at most one {what} per model, in the same order)")
    specs = [ModelSpec(path, names[i] if i < len(names) else path,
                       chat_template=templates[i] if i < len(templates) else None) for i, path in enumerate(models)]
    if fallback is not None and fallback not in {s.name for s in specs}:
        specs.append(ModelSpec(fallback, fallback))
    if fallback is not None and len(specs) == 1:
        raise ValueError(f"--fallback-model {fallback!r} is the only served model: degradation needs another model "
                         "to send requests to")
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"two models are served as {s.name!r}: give each its own --served-model-name")
        seen.add(s.name)
    return specs


def split_kv_budget(specs: list[ModelSpec], kv_cache_memory: int | None, gpu_memory_utilization: float | None,
                    default_utilization: float, cpu_default_bytes: int | None) -> list[ModelSpec]:
    """Each model's share of the KV budget (even shares).

    Args:
      specs: the models.
      kv_cache_memory: ``--kv-cache-memory`` in bytes per device, or None.
      gpu_memory_utilization: ``--gpu-memory-utilization``, or None (``default_utilization``).
      default_utilization: the utilization used when the flag is not given (0.9).
      cpu_default_bytes: the CPU default KV budget when running on a CPU, else None.
    Returns:
      ``specs`` with ``kv_cache_memory`` (a byte budget given or on a CPU) or
      ``gpu_memory_utilization`` (an accelerator without a byte budget) set; a single
      model keeps the flags as given.
    """
    n = len(specs)
    if n == 1:
        return [dataclasses.replace(specs[0], kv_cache_memory=kv_cache_memory,
                                    gpu_memory_utilization=gpu_memory_utilization)]
    if kv_cache_memory is None and cpu_default_bytes is not None:
        kv_cache_memory = cpu_default_bytes
    if kv_cache_memory is not None:
        return [dataclasses.replace(s, kv_cache_memory=kv_cache_memory // n) for s in specs]
    util = (default_utilization if gpu_memory_utilization is None else gpu_memory_utilization) / n
    return [dataclasses.replace(s, gpu_memory_utilization=util) for s in specs]


def describe_split(specs: list[ModelSpec]) -> str:
    """The start-up line of the split: ``KV budget per model: a 2.00 GiB, b 2.00 GiB``."""
    parts = []
    for s in specs:
        if s.kv_cache_memory is not None:
            parts.append(f"{s.name} {s.kv_cache_memory / 2**30:.2f} GiB")
        elif s.gpu_memory_utilization is not None:
            parts.append(f"{s.name} gpu_memory_utilization {s.gpu_memory_utilization:g}")
        else:
            parts.append(f"{s.name} default")
    return "KV budget per model (per device): " + ", ".join(parts)

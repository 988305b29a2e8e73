"""`ModelRegistry`: the models one server serves, by served name, and their engines.

A server runs one `AsyncEngine` (one engine thread, one KV pool) per model. The registry
owns the name -> model map (the first model is the default for requests that name
none), the fallback designation of graceful degradation, and the lifecycle calls that
span every engine (start, drain, abort, shutdown), so the HTTP layer and ``server.py``
treat one model and several alike. ``/health`` is ready only when every model is.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.engine.async_engine import AsyncEngine, EngineState


@dataclasses.dataclass
class ServedModel:
    """One served model.

    Attributes:
      name: the ``model`` name clients send and ``/v1/models`` lists.
      async_engine: its engine front end (own thread, own KV pool).
      kv_cache_memory: the KV budget in bytes per device it was given (its share of
        ``--kv-cache-memory``), or None when its pool was sized otherwise.
    """

    name: str
    async_engine: AsyncEngine
    kv_cache_memory: int | None = None

    @property
    def has_chat_template(self) -> bool:
        """True when the loaded model's tokenizer has a chat template (False until loaded)."""
        engine = self.async_engine.engine
        tok = getattr(engine, "tokenizer", None)
        return bool(tok is not None and tok.has_chat_template)


class ModelRegistry:
    """The served models, in order (the first is the default).

    Args:
      models: at least one, with distinct names.
      fallback: the name of the model that takes requests whose estimated TTFT on their
        own model exceeds ``degrade_ttft_slo`` (None: no degradation).
      degrade_ttft_slo: the TTFT target in seconds (None: no degradation).
    Raises:
      ValueError: no models, duplicate names, or a fallback that is not among them.
    """

    def __init__(self, models: Iterable[ServedModel], fallback: str | None = None,
                 degrade_ttft_slo: float | None = None):
        self.models: dict[str, ServedModel] = {}
        for m in models:
            if m.name in self.models:
                raise ValueError(f"two models are served as {m.name!r}: give each its own --served-model-name")
            self.models[m.name] = m
        if not self.models:
            raise ValueError("at least one model must be served")
        if fallback is not None and fallback not in self.models:
            raise ValueError(f"fallback model {fallback!r} is not served (served: {', '.join(self.models)})")
        if degrade_ttft_slo is not None and not degrade_ttft_slo > 0:
            raise ValueError(f"degrade_ttft_slo must be > 0 seconds, got {degrade_ttft_slo}")
        self.fallback = fallback
        self.degrade_ttft_slo = degrade_ttft_slo

    @classmethod
    def single(cls, name: str, async_engine: AsyncEngine) -> "ModelRegistry":
        """The registry of a one-model server."""
        return cls([ServedModel(name, async_engine)])

    @property
    def default(self) -> ServedModel:
        """The model of requests that name none (the first one)."""
        return next(iter(self.models.values()))

    def __iter__(self):
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def get(self, name: str | None) -> ServedModel:
        """The model served as ``name`` (the default one for None).

        Raises:
          APIError: 404 ``model_not_found`` (OpenAI's error shape) for any other name.
        """
        if name is None:
            return self.default
        model = self.models.get(name)
        if model is None:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                                f"{', '.join(repr(n) for n in self.models)}", param="model", code="model_not_found")
        return model

    # ----- lifecycle over every engine --------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        """True only when every model is warmed up and serving."""
        return all(m.async_engine.is_healthy for m in self)

    def not_ready(self) -> list[ServedModel]:
        """The models that are not healthy, in order."""
        return [m for m in self if not m.async_engine.is_healthy]

    def dead(self) -> list[ServedModel]:
        """The models whose engine died (the fault policy: the process is about to exit)."""
        return [m for m in self if m.async_engine.is_dead]

    def start(self) -> None:
        """Start every engine thread (loading and warm-up run in parallel, in the background)."""
        for m in self:
            m.async_engine.start()

    def wait_ready(self) -> bool:
        """Block until every engine finished starting; True when all are ready (none died)."""
        for m in self:
            m.async_engine.ready_event.wait()
        return all(m.async_engine.state != EngineState.DEAD for m in self)

    def start_draining(self) -> None:
        """Refuse new requests on every model (SIGTERM)."""
        for m in self:
            m.async_engine.start_draining()

    def num_in_flight_groups(self) -> int:
        """Client requests in flight over all models."""
        return sum(m.async_engine.num_in_flight_groups() for m in self)

    def abort_all(self) -> None:
        """Abort every in-flight request on every model."""
        for m in self:
            m.async_engine.abort_all()

    def shutdown(self) -> None:
        """Stop every engine thread (aborting what is left)."""
        for m in self:
            m.async_engine.shutdown()

"""`PoolingParams`: the per-request options of a pooling (embedding) request, in vLLM's names.

A pooling request computes its prompt once (prefill only), pools the final hidden states
(after the model's final norm) into one vector and returns it instead of sampling
(`jaxinfer.core.pooling`). Frozen and validated at construction; invalid values raise
`jaxinfer.errors.RequestError` naming the field. Plain Python; no JAX import.
"""
from __future__ import annotations

import dataclasses

from jaxinfer.errors import RequestError

POOLING_TYPES = ("last", "mean")  # --pooling-type: the last prompt token's state, or the mean over the prompt
RUNNERS = ("generate", "pooling")  # --runner: vLLM's names


def parse_pooling_type(value: str) -> str:
    """``"LAST"`` / ``"last"`` -> ``"last"`` (vLLM spells them upper case in ``--pooler-config``).

    Raises:
      RequestError: not one of `POOLING_TYPES` (param ``pooling_type``).
    """
    name = value.lower() if isinstance(value, str) else value
    if name not in POOLING_TYPES:
        raise RequestError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {value!r}",
                           param="pooling_type")
    return name


@dataclasses.dataclass(frozen=True)
class PoolingParams:
    """Options of one pooling request (vLLM ``PoolingParams`` field names).

    Attributes:
      dimensions: keep the first ``dimensions`` values of the pooled vector (Matryoshka
        truncation), then normalize again when normalizing; None = the hidden size D. Must be
        in [1, D] (the engine checks the upper bound: `check`).
      normalize: L2-normalize the vector (after truncation); None = the engine's default
        (True, as vLLM's embedding pooler).
      pooling_type: "last" or "mean" (`POOLING_TYPES`); None = the engine's ``--pooling-type``.
    """

    dimensions: int | None = None
    normalize: bool | None = None
    pooling_type: str | None = None

    def __post_init__(self) -> None:
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise RequestError(f"dimensions must be an integer >= 1, got {d!r}", param="dimensions")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise RequestError("normalize must be a bool", param="normalize")
        if self.pooling_type is not None:
            object.__setattr__(self, "pooling_type", parse_pooling_type(self.pooling_type))

    def resolved(self, pooling_type: str, normalize: bool = True) -> "PoolingParams":
        """These options with the engine's defaults filled in (no field left None but ``dimensions``)."""
        return dataclasses.replace(self, pooling_type=self.pooling_type or pooling_type,
                                   normalize=normalize if self.normalize is None else self.normalize)

    def check(self, hidden_size: int) -> None:
        """Raise `RequestError` (param ``dimensions``) if ``dimensions`` exceeds the hidden size."""
        if self.dimensions is not None and self.dimensions > hidden_size:
            raise RequestError(f"dimensions ({self.dimensions}) exceeds this model's embedding size ({hidden_size})",
                               param="dimensions")

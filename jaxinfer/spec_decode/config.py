"""`SpeculativeConfig`: which proposer, how many tokens, and when speculation switches off.

Field names follow vLLM's ``--speculative-config`` JSON (``method``,
``num_speculative_tokens``, ``prompt_lookup_max``, ``prompt_lookup_min``, ``model``,
``disable_by_batch_size``); the acceptance-rate switch is jaxinfer's own. Plain Python; no
JAX import.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

METHODS = ("ngram", "draft_model")


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes:
      method: ``"ngram"`` (prompt lookup, `jaxinfer.spec_decode.ngram`) or ``"draft_model"``.
      num_speculative_tokens: K, the most draft tokens verified per request and step (>= 1).
      prompt_lookup_max, prompt_lookup_min: ngram only: the longest and shortest suffix
        n-gram (tokens) searched for earlier in the request's tokens (1 <= min <= max).
      model: draft_model only: the draft model (a name or folder, as ``--model``); it must
        share the target's vocabulary.
      disable_by_batch_size: no speculation in a step with at least this many running
        requests (None: no limit). A full batch has no spare rows anyway.
      min_acceptance_rate: no speculation while the share of draft tokens accepted over the
        last ``acceptance_window`` drafted tokens is below this (0 disables the switch) ...
      acceptance_window: ... measured over this many recent draft tokens (>= 1) ...
      probe_interval: ... except one probing step every this many steps (>= 1), so that a
        workload that starts to copy its prompt turns speculation back on.

    Raises:
      ValueError: an unknown method, a missing draft model, or a value out of range.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None
    disable_by_batch_size: int | None = None
    min_acceptance_rate: float = 0.25
    acceptance_window: int = 256
    probe_interval: int = 16

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        _check_int(self.num_speculative_tokens, 1, "num_speculative_tokens")
        _check_int(self.prompt_lookup_min, 1, "prompt_lookup_min")
        _check_int(self.prompt_lookup_max, self.prompt_lookup_min, "prompt_lookup_max", "prompt_lookup_min")
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative method 'draft_model' needs 'model' (the draft model's name or folder)")
        if self.disable_by_batch_size is not None:
            _check_int(self.disable_by_batch_size, 1, "disable_by_batch_size")
        if not (isinstance(self.min_acceptance_rate, (int, float)) and 0.0 <= self.min_acceptance_rate <= 1.0):
            raise ValueError(f"min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate!r}")
        _check_int(self.acceptance_window, 1, "acceptance_window")
        _check_int(self.probe_interval, 1, "probe_interval")

    @classmethod
    def from_value(cls, value: "SpeculativeConfig | Mapping[str, Any] | str | None") -> "SpeculativeConfig | None":
        """Parse ``--speculative-config`` / ``LLM(speculative_config=...)``: a JSON object
        string, a dict, a `SpeculativeConfig`, or None (off).

        Raises:
          ValueError: malformed JSON, not an object, unknown keys, or bad values.
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative config is not valid JSON: {e}") from None
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative config must be a JSON object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown speculative config keys {unknown}; known: {', '.join(sorted(known))}")
        return cls(**value)


def _check_int(v: Any, lo: int, name: str, lo_name: str | None = None) -> None:
    """``v`` must be an integer >= ``lo`` (which is the field ``lo_name``'s value, if given)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        bound = f"{lo_name} ({lo})" if lo_name else str(lo)
        raise ValueError(f"{name} must be an integer >= {bound}, got {v!r}")

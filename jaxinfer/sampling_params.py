"""`SamplingParams`: the per-request generation options, in vLLM's field names.

Frozen and validated at construction, so every later stage (scheduler, sampler, API)
can trust it. Plain Python; no JAX import. Invalid values raise `RequestError`
with the offending field in ``param`` (the API turns it into an OpenAI 400 error).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Mapping

from jaxinfer.errors import RequestError
from jaxinfer.structured_outputs.params import StructuredOutputsParams


MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 16384
MAX_STOP_TOKEN_IDS = 1024
MIN_REPETITION_PENALTY = 0.01


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Generation options for one request (vLLM ``SamplingParams`` field names).

    Attributes:
      n: number of completions per prompt (fanned out by the front end).
      temperature: 0 means greedy; range [0, 2] (OpenAI's range).
      top_p: nucleus mass in (0, 1] (Holtzman et al. 2019).
      top_k: keep the k most likely tokens; -1 or 0 disable it; values past the vocab
        are clamped to the vocab size.
      min_p: drop tokens with prob < min_p * max prob; [0, 1].
      presence_penalty, frequency_penalty: OpenAI penalties over generated tokens, [-2, 2].
      repetition_penalty: CTRL-style penalty (Keskar et al. 2019) over prompt and
        generated tokens, [0.01, 10] (1 = off).
      seed: per-request seed. Each draw depends only on the seed, the output index and that
        position's logits, never on other rows. The logits can differ with the batch around a
        request (the step's bucket and kernel path; up to 0.3 in bfloat16, 2e-4 in float32
        for SmolLM2) and with prefix-cache hits, and such a difference changes a token at a near-tie: the
        same request reproduces its text under the same load, not under any load (as vLLM
        outside its batch-invariant mode). Greedy requests behave the same way.
      max_tokens: cap on generated tokens (None = up to max_model_len).
      stop: strings that end generation (not included in the text); at most
        `MAX_STOP_STRINGS` of `MAX_STOP_CHARS` characters in all.
      stop_token_ids: token ids that end generation (in addition to EOS); at most
        `MAX_STOP_TOKEN_IDS`.
      ignore_eos: keep generating past EOS ids.
      logprobs: number of top logprobs to return per token (0 = only the sampled
        token's); None = no logprobs.
      prompt_logprobs: number of top alternatives to return per prompt position, with the
        logprob of the actual prompt token (vLLM's meaning; position 0 gets None). From the
        model's raw logits (no bias, penalties or temperature); None = none. A request with
        it computes its whole prompt (no prefix-cache hits).
      logit_bias: token id -> additive bias in [-100, 100].
      skip_special_tokens: drop special tokens from the text.
      include_stop_str_in_output: keep the matched stop string in the text.
      priority: scheduling priority, lower is served first (vLLM's convention); only
        ``--scheduling-policy priority`` uses it. Any integer; default 0.
      structured_outputs: a constraint the output must match (JSON schema, regex, choice,
        grammar; `jaxinfer.structured_outputs.params.StructuredOutputsParams` or its dict form),
        enforced by a token mask in the sampler; None = unconstrained.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0
    structured_outputs: StructuredOutputsParams | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # Accept the convenient Python types, store hashable ones; anything else is a
        # RequestError naming the field, never a bare TypeError from deep inside.
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        object.__setattr__(self, "stop", _as_tuple(stop, "stop", "a string or a list of strings"))
        object.__setattr__(self, "stop_token_ids", _as_tuple(self.stop_token_ids, "stop_token_ids",
                                                             "a list of token ids"))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        for name in _INT_FIELDS:  # numpy integers (a notebook's np.int64) become plain ints
            if is_integer(getattr(self, name)):
                object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) if is_integer(t) else t for t in self.stop_token_ids))
        if self.structured_outputs is not None:
            object.__setattr__(self, "structured_outputs", StructuredOutputsParams.from_dict(self.structured_outputs))
        self._validate()

    def _validate(self) -> None:
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            _check(isinstance(getattr(self, name), bool), name, f"{name} must be a bool")
        _check(is_integer(self.priority) and -(2**63) <= self.priority < 2**63, "priority",
               "priority must be a 64-bit integer")
        _check(is_integer(self.n) and self.n >= 1, "n", "n must be an integer >= 1")
        _check(all(is_integer(t) for t in self.stop_token_ids), "stop_token_ids", "stop_token_ids must be integers")
        _check_range(self.temperature, 0.0, 2.0, "temperature")
        _check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "top_p must be in (0, 1]")
        _check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= -1,
               "top_k", "top_k must be an integer >= -1 (-1 or 0 disable it)")
        _check_range(self.min_p, 0.0, 1.0, "min_p")
        _check_range(self.presence_penalty, -2.0, 2.0, "presence_penalty")
        _check_range(self.frequency_penalty, -2.0, 2.0, "frequency_penalty")
        # below ~1e-37 dividing float32 logits by it overflows to inf; 0.01 is already extreme
        _check_range(self.repetition_penalty, MIN_REPETITION_PENALTY, 10.0, "repetition_penalty")
        if self.max_tokens is not None:
            _check(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool)
                   and self.max_tokens >= 1, "max_tokens", "max_tokens must be an integer >= 1")
        if self.seed is not None:
            _check(is_integer(self.seed) and -(2**63) <= self.seed < 2**64, "seed", "seed must be a 64-bit integer")
        if self.logprobs is not None:
            _check(is_integer(self.logprobs) and self.logprobs >= 0, "logprobs", "logprobs must be an integer >= 0")
        if self.prompt_logprobs is not None:
            _check(is_integer(self.prompt_logprobs) and self.prompt_logprobs >= 0, "prompt_logprobs",
                   "prompt_logprobs must be an integer >= 0")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings")
        # every step checks every stop string against the new text: bound that work
        _check(len(self.stop) <= MAX_STOP_STRINGS and sum(map(len, self.stop)) <= MAX_STOP_CHARS, "stop",
               f"at most {MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS} characters in all")
        _check(len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS, "stop_token_ids",
               f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids")
        for tok, bias in self.logit_bias:
            _check(_finite(bias) and -100.0 <= bias <= 100.0, "logit_bias", "logit_bias values must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0 or top_k 1)."""
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def check_token_ids(self, vocab_size: int) -> None:
        """Raise `RequestError` if a stop token id or logit_bias key is outside [0, vocab_size)."""
        for t in self.stop_token_ids:
            _check(isinstance(t, int) and 0 <= t < vocab_size, "stop_token_ids",
                   f"stop_token_ids must be in [0, {vocab_size}), got {t}")
        for t, _ in self.logit_bias:
            _check(0 <= t < vocab_size, "logit_bias", f"logit_bias token ids must be in [0, {vocab_size}), got {t}")

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of an ``n > 1`` request: ``seed + index``, wrapped into
    [0, 2**64) so that a seed near the top of the range still works."""
    return None if seed is None else (seed + index) % 2**64


_INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "logprobs", "priority", "prompt_logprobs")


def is_integer(x) -> bool:
    """An integer, Python's or numpy's (``numbers.Integral``), but not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as ``((token id, bias), ...)``. Keys are ints or strings of ASCII
    digits (OpenAI sends strings; ``int()`` would also take " 5", "+5", "1_0")."""
    try:
        pairs = tuple(bias.items() if isinstance(bias, Mapping) else (bias or ()))
        pairs = [(k, float(v)) for k, v in pairs]
    except (TypeError, ValueError):
        raise RequestError("logit_bias must map token ids to numbers", param="logit_bias") from None
    out = []
    for key, value in pairs:
        if isinstance(key, str) and key.isascii() and key.isdigit():
            key = int(key)
        if not is_integer(key):
            raise RequestError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        out.append((key, value))
    return tuple(out)


def _as_tuple(value, param: str, what: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise RequestError(f"{param} must be {what}", param=param)
    return tuple(value)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise RequestError(message, param=param)


def _check_range(x, lo: float, hi: float, param: str) -> None:
    _check(_finite(x) and lo <= x <= hi, param, f"{param} must be in [{lo:g}, {hi:g}], got {x!r}")

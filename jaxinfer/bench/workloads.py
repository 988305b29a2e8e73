"""Benchmark workloads: how long each request's prompt and output are, and the prompts.

Every workload yields `BenchRequest`s with exact token counts; requests are sent with
``ignore_eos: true`` and ``max_tokens = output_len`` so output lengths are exact.

Length distributions (all in tokens, seeded numpy ``Generator``):
  * ``fixed``: every request ``input_len`` / ``output_len``.
  * ``uniform``: ``U[(1 - r) * len, (1 + r) * len]``, ``r = range_ratio``.
  * ``normal``: ``N(len, (std_ratio * len)^2)``, clipped to ``[1, 2 * len]``.
  * ``sharegpt-synthetic`` (alias ``sharegpt``): synthetic ShareGPT-like lengths, not the
    ShareGPT dataset. Lengths come from a lognormal per side whose *mean* is ShareGPT's
    published mean length, clipped to ``[min_len, max_input_len / max_output_len]``, and
    the prompts are random tokens like every other workload here (no conversation text is
    ever sent). Means from Kwon et al. 2023
    ("Efficient Memory Management for LLM Serving with PagedAttention", arXiv:2309.06180,
    section 6.1 and Fig. 11): ShareGPT prompts average **161.31** tokens and outputs
    **337.99** tokens (8.4x / 5.8x Alpaca's). The log-space spreads (``SHAREGPT_SIGMA``)
    are NOT published there: they are our assumption, chosen to give the long right tail
    the paper's histograms show; the raw dataset is not downloaded. ``--input-len`` /
    ``--output-len`` are ignored by this workload (its means are the paper's).
  * ``shared-prefix``: ``num_prefixes`` random prefixes of ``prefix_len`` tokens; request
    ``i`` uses prefix ``i % num_prefixes`` followed by a unique ``input_len``-token suffix.
  * ``input-grounded``: text prompts whose answers copy spans of the prompt (rewrite or
    continue a passage, edit code; `jaxinfer.bench.grounded`), passages of at most
    ``input_len`` tokens, ``output_len`` output tokens: the workload where speculative
    decoding by prompt lookup pays. Always text prompts.
Prompts are random token ids in ``token_id_range`` (special tokens avoided) or, with
``prompt_format="text"``, the same ids decoded by a tokenizer; a text prompt's
``prompt_len`` is then the token count of that text re-encoded without special tokens
(when a counter is given), since decoding and re-encoding random ids need not round-trip.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

SHAREGPT_MEAN_INPUT = 161.31  # tokens, Kwon et al. 2023, section 6.1 / Fig. 11
SHAREGPT_MEAN_OUTPUT = 337.99  # tokens, same source
SHAREGPT_SIGMA = (1.0, 0.8)  # log-space std of input / output lengths: our assumption (see module docstring)
SHAREGPT = "sharegpt-synthetic"
INPUT_GROUNDED = "input-grounded"
WORKLOADS = ("fixed", "uniform", "normal", SHAREGPT, "shared-prefix", INPUT_GROUNDED)
ALIASES = {"sharegpt": SHAREGPT}  # the name before it said "synthetic" (older results and scripts use it)


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    """Parameters of a workload (tokens unless said otherwise).

    Attributes:
      name: one of `WORKLOADS` or `ALIASES` (an alias is replaced by its workload's name).
      num_requests: measured requests (warm-up requests are drawn separately).
      input_len, output_len: lengths (fixed), or means (uniform, normal); for
        shared-prefix, ``input_len`` is the unique suffix length.
      range_ratio: uniform half-width as a fraction of the mean.
      std_ratio: normal standard deviation as a fraction of the mean.
      min_len: lower clip of random lengths.
      max_input_len, max_output_len: upper clips for ``sharegpt-synthetic``.
      prefix_len, num_prefixes: shared-prefix shape.
      token_id_range: [low, high) of random prompt token ids.
      seed: numpy seed.
    """

    name: str = "fixed"
    num_requests: int = 100
    input_len: int = 512
    output_len: int = 256
    range_ratio: float = 0.5
    std_ratio: float = 0.25
    min_len: int = 4
    max_input_len: int = 1024
    max_output_len: int = 1024
    prefix_len: int = 256
    num_prefixes: int = 4
    token_id_range: tuple[int, int] = (256, 16000)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", ALIASES.get(self.name, self.name))
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; choose from {', '.join(WORKLOADS)}")


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """One request to send.

    Attributes:
      prompt: token ids (or text when the workload was rendered as text).
      prompt_len: prompt length in tokens.
      output_len: ``max_tokens`` (exact, with ``ignore_eos``).
    """

    prompt: list[int] | str
    prompt_len: int
    output_len: int


def sample_lengths(cfg: WorkloadConfig, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths for ``n`` requests.

    Returns:
      (input_lens, output_lens), int64 arrays of shape [n], in tokens; for shared-prefix the
      input lengths include the prefix.
    """
    if cfg.name in ("fixed", "shared-prefix", INPUT_GROUNDED):
        extra = cfg.prefix_len if cfg.name == "shared-prefix" else 0
        return np.full(n, cfg.input_len + extra, np.int64), np.full(n, cfg.output_len, np.int64)
    if cfg.name == "uniform":
        return tuple(_clip(_uniform(rng, m, cfg.range_ratio, n), cfg.min_len) for m in (cfg.input_len, cfg.output_len))
    if cfg.name == "normal":
        return tuple(_clip(np.rint(rng.normal(m, cfg.std_ratio * m, n)), cfg.min_len, 2 * m)
                     for m in (cfg.input_len, cfg.output_len))
    ins = lognormal_with_mean(rng, SHAREGPT_MEAN_INPUT, SHAREGPT_SIGMA[0], n)
    outs = lognormal_with_mean(rng, SHAREGPT_MEAN_OUTPUT, SHAREGPT_SIGMA[1], n)
    return _clip(ins, cfg.min_len, cfg.max_input_len), _clip(outs, cfg.min_len, cfg.max_output_len)


def lognormal_with_mean(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """``n`` integer draws of a lognormal with the given mean and log-space std
    (``mu = ln(mean) - sigma^2 / 2``), rounded to the nearest integer."""
    mu = math.log(mean) - sigma**2 / 2
    return np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)


def _uniform(rng: np.random.Generator, mean: int, ratio: float, n: int) -> np.ndarray:
    """Integers uniform on ``[floor((1 - ratio) * mean), floor((1 + ratio) * mean)]``."""
    return rng.integers(math.floor((1 - ratio) * mean), math.floor((1 + ratio) * mean) + 1, n)


def _clip(x: np.ndarray, low: int, high: int | None = None) -> np.ndarray:
    return np.clip(x, low, high if high is not None else np.iinfo(np.int64).max).astype(np.int64)


def build_requests(cfg: WorkloadConfig, n: int | None = None, seed_offset: int = 0,
                   decode: Callable[[list[int]], str] | None = None,
                   count_tokens: Callable[[str], int] | None = None) -> list[BenchRequest]:
    """Draw ``n`` (default ``cfg.num_requests``) requests.

    Args:
      seed_offset: added to the seed (warm-up requests use a different stream).
      decode: token ids -> text; when given, prompts are sent as text.
      count_tokens: text -> its token count (no special tokens); with ``decode``, each
        ``prompt_len`` is the count of the text actually sent (re-tokenizing decoded
        random ids need not give back the same number). Without it, the drawn length.
    """
    n = cfg.num_requests if n is None else n
    rng = np.random.default_rng(cfg.seed + seed_offset)
    if cfg.name == INPUT_GROUNDED:
        from jaxinfer.bench import grounded

        return [BenchRequest(text, n_in, cfg.output_len)
                for text, n_in in grounded.prompts(n, cfg.input_len, rng, count_tokens)]
    ins, outs = sample_lengths(cfg, n, rng)
    lo, hi = cfg.token_id_range
    prefixes = [rng.integers(lo, hi, cfg.prefix_len).tolist() for _ in range(cfg.num_prefixes)]
    out = []
    for i, (n_in, n_out) in enumerate(zip(ins.tolist(), outs.tolist())):
        if cfg.name == "shared-prefix":
            ids = prefixes[i % cfg.num_prefixes] + rng.integers(lo, hi, n_in - cfg.prefix_len).tolist()
        else:
            ids = rng.integers(lo, hi, n_in).tolist()
        prompt = decode(ids) if decode else ids
        if decode and count_tokens:
            n_in = count_tokens(prompt)
        out.append(BenchRequest(prompt, n_in, n_out))
    return out


def describe(cfg: WorkloadConfig) -> dict:
    """The workload's parameters for the result metadata (with the ShareGPT sources)."""
    d = dataclasses.asdict(cfg)
    if cfg.name == SHAREGPT:
        d["sharegpt"] = {"synthetic": True, "prompts": "random token ids, not ShareGPT text",
                         "mean_input": SHAREGPT_MEAN_INPUT, "mean_output": SHAREGPT_MEAN_OUTPUT,
                         "sigma_input": SHAREGPT_SIGMA[0], "sigma_output": SHAREGPT_SIGMA[1],
                         "source": "means: Kwon et al. 2023 (vLLM, arXiv:2309.06180) sec. 6.1 / Fig. 11; "
                                   "log-space sigmas: assumed, not fitted"}
    return d

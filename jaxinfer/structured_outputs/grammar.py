"""The grammar engine: per-request matchers and the per-step token bitmask (host side).

Owns the llguidance tokenizer of a model, the cache of compiled grammars (one compiled
matcher per distinct constraint, deep-copied for each request, so a schema compiles
once), and `fill_bitmask`, which writes each constrained row's allowed-token bits into the
step's ``[rows, ceil(vocab / 32)]`` int32 array (bit ``t % 32`` of word ``t // 32`` set =
token ``t`` allowed; rows left at ``-1`` are unconstrained). The jitted sampler applies the
array (`jaxinfer.layers.sampler`).

Why llguidance, not xgrammar (``benchmarks/grammar_mask.py``, SmolLM2's 49,152-token
vocabulary, a nested JSON schema, this project's shared 2-core CPU host): per step and
row xgrammar's mask is cheaper (p50 about 1 us against about 10 us, mean about 5 us
against about 45 us: llguidance's cost sits in a few lexer-heavy states), but both stay
under 1 ms for 8 rows, a small share of a decode
step here; a new schema compiles in about 1 ms with llguidance against 15-50 ms with
xgrammar, which is latency the first request of every distinct schema pays; and
llguidance needs neither torch nor tvm-ffi at run time. docs/structured_outputs.md has the
table. If GPU steps get short enough for the mask to matter, xgrammar fills the same
bitmask layout and can replace this class.

Overlap with the device: a row's mask for step N+1 depends on the token sampled in step
N, which the host has only once step N's read back returns, so the mask cannot be
computed while step N runs without speculative (asynchronous) scheduling, which this
engine does not do. The masks of one step are computed together with llguidance's
thread pool (`llguidance.numpy.fill_next_token_bitmask_par`, GIL released; on the 2-core
host it measured the same as one row after another).

Reference: llguidance (https://github.com/guidance-ai/llguidance), as used by vLLM's
``structured_output`` backend.
"""
from __future__ import annotations

import collections
import logging
import threading

import numpy as np

from jaxinfer.errors import RequestError
from jaxinfer.structured_outputs.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 256


def bitmask_width(vocab_size: int) -> int:
    """Int32 words per row of the token bitmask: ``ceil(vocab_size / 32)``."""
    return (vocab_size + 31) // 32


class GrammarEngine:
    """Compiles constraints into llguidance matchers for one tokenizer.

    Args:
      tokenizer: a `jaxinfer.tokenizer.tokenizer.Tokenizer` (its transformers tokenizer is read).
      vocab_size: the model's vocabulary (logit rows), which may exceed the tokenizer's.
      eos_token_ids: the ids that end generation; the first is what a finished grammar allows.
    Raises:
      ValueError: the tokenizer cannot be wrapped (not a fast tokenizer).
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        import llguidance
        import llguidance.hf

        eos = sorted(eos_token_ids)
        eos_first = tokenizer.eos_token_id if tokenizer.eos_token_id in eos else (eos[0] if eos else None)
        self.vocab_size = vocab_size
        self.eos_token_id = eos_first
        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer._tok, n_vocab=vocab_size, eos_token=eos_first)
        self._executor = llguidance.LLExecutor()
        self._cache: collections.OrderedDict[tuple, object] = collections.OrderedDict()
        self._lock = threading.Lock()  # requests are added from the API's worker threads
        self.compilations = 0

    def matcher(self, constraint: StructuredOutputsParams):
        """A fresh matcher for ``constraint`` (compiled once per distinct constraint, then copied).

        Raises:
          RequestError (param ``structured_outputs``): the schema, regex or grammar is invalid.
        """
        import llguidance

        key = constraint.cache_key()
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                return template.deep_copy()
        try:
            grammar = constraint.to_grammar()
        except ValueError as exc:
            raise RequestError(f"invalid structured output constraint: {exc}", param="structured_outputs") from None
        template = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if template.is_error():
            raise RequestError(f"invalid structured output constraint: {template.get_error()[:500]}",
                               param="structured_outputs")
        if self._admits_nothing(template):
            raise RequestError("invalid structured output constraint: no text satisfies it (e.g. a schema or "
                               "grammar rule defined only by itself)", param="structured_outputs")
        with self._lock:
            self.compilations += 1
            self._cache[key] = template
            while len(self._cache) > GRAMMAR_CACHE_SIZE:
                self._cache.popitem(last=False)
        return template.deep_copy()

    def _admits_nothing(self, matcher) -> bool:
        """True when ``matcher``, fresh, accepts no text: it is not accepting yet, and its first
        mask allows no token but the EOS that llguidance leaves open at a dead end. (A
        constraint that dead-ends only after some text is not caught here.)"""
        if matcher.is_accepting():
            return False
        mask = np.zeros((1, bitmask_width(self.vocab_size)), dtype=np.int32)
        self.fill_bitmask([(matcher.deep_copy(), 0)], mask)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:self.vocab_size])
        return allowed.size == 0 or (allowed.size == 1 and allowed[0] == self.eos_token_id)

    def fill_bitmask(self, rows: list[tuple[object, int]], bitmask: np.ndarray) -> None:
        """Write the allowed-token bits of each ``(matcher, row)`` into ``bitmask`` [R, W] int32.

        Rows not listed keep their value (``-1``: every token allowed).
        """
        if not rows:
            return
        from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

        if len(rows) == 1:  # the thread pool's hand-off costs more than one row's mask
            fill_next_token_bitmask(rows[0][0], bitmask, rows[0][1])
        else:
            fill_next_token_bitmask_par(self._executor, rows, bitmask)

"""The multi-turn chat workload of ``benchmarks/cluster_bench.py``: its shape, presets and texts.

A *session* is one conversation: a shared system prompt, then ``turns`` requests, each
carrying the whole history so far (earlier user messages and the model's own answers) plus a
new user message. This module owns what such a workload looks like, without any server:

* `ChatShape`, the workload's shape (sessions, turns, token lengths, think time, the KV pool
  each instance gets), and `PRESETS`, the named shapes (`resolve_shape` applies flags on top);
* the texts (`system_prompt`, `user_message`), padded or cut to a token count with the served
  model's tokenizer; the think times (`think_times`); the KV pool size (`kv_pool_blocks`);
* `cache_figures`, the prefix-cache hit rate and miss tokens from the servers' counters.

Plain Python and numpy; no JAX import.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Protocol, Sequence

import numpy as np

SYSTEM = ("You are a concise assistant for a travel agency. Answer in two or three sentences, name concrete "
          "places, and never invent prices. If a question is unclear, say what you would need to know.")
SYSTEM_MORE = ("Prefer public transport, trains and walking over flights for short distances. Mention the season "
               "when it matters. Suggest one well-known sight and one quieter place. Keep the traveller's budget "
               "and group in mind. Do not recommend specific hotels by name. ")
TOPICS = ["Lisbon", "Kyoto", "Patagonia", "Iceland", "Morocco", "Vancouver", "Crete", "Hanoi"]
QUESTIONS = ["I am planning a trip to {topic}. When is the best season to go?",
             "What should I see there in three days?",
             "Which neighbourhood is good to stay in?",
             "How do I get around without a car?",
             "What local food should I try?",
             "Is it a good place for a family with children?",
             "What should I pack?",
             "Give me one day trip from there."]
USER_MORE = (" Some details: we are two adults, we like museums, markets and long walks, we do not drive, "
             "we would rather spend money on food than on hotels, and we can travel in spring or autumn.")
# <|im_start|>role\n ... <|im_end|>\n, what a ChatML template adds around a message: 5 tokens for
# system and user, 6 for assistant ("assistant" is two tokens) with SmolLM2's tokenizer
TEMPLATE_TOKENS_PER_MESSAGE = 6


class Codec(Protocol):
    """What the texts need from a tokenizer (``tokenizers.Tokenizer`` wrapped by `TokenizerCodec`)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TokenizerCodec:
    """A Hugging Face ``tokenizers.Tokenizer`` as a `Codec` (no special tokens added).

    Args:
      path: a ``tokenizer.json`` file.
    """

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


@dataclasses.dataclass(frozen=True)
class ChatShape:
    """The shape of the multi-turn chat workload.

    Attributes:
      sessions: conversations run at once, each with its own ``X-Session-Id``.
      turns: requests per conversation.
      system_tokens: tokens of the shared system prompt (content only, no template); the
        built-in travel-agency prompt is cut or extended to this length; 0 keeps it as is
        (40 tokens with SmolLM2's tokenizer).
      user_tokens: tokens of every user message; the turn's question is extended (never cut)
        to this length; 0 keeps the bare question (5-16 tokens).
      answer_tokens: ``max_tokens`` of every answer (the model may stop earlier).
      think_time_s: mean seconds a user waits between an answer and the next message
        (uniform in [0.5, 1.5] x this), and the span over which the sessions start; 0: no
        wait, every session starts at once.
      cache_sessions: each instance's KV pool (``server.py --num-blocks``) holds this many
        sessions' longest context (`kv_pool_blocks`); None: the server's default pool.
    """
    sessions: int = 24
    turns: int = 6
    system_tokens: int = 0
    user_tokens: int = 0
    answer_tokens: int = 48
    think_time_s: float = 0.0
    cache_sessions: float | None = None

    def __post_init__(self):
        for name in ("sessions", "turns", "answer_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("system_tokens", "user_tokens", "think_time_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.cache_sessions is not None and self.cache_sessions <= 0:
            raise ValueError(f"cache_sessions must be > 0 (or None for the server's default), got {self.cache_sessions}")


PRESETS = {
    # What was measured first (2026-12-01): lockstep turns, short answers, and a KV pool of
    # 5,825 blocks per instance, about three times the whole workload's tokens.
    "travel6": ChatShape(sessions=24, turns=6, system_tokens=0, user_tokens=0, answer_tokens=48, think_time_s=0.0,
                         cache_sessions=None),
    # History-dominated chat: the history is ~95% of the last prompt, users pause between turns,
    # and each instance caches the sessions hashing gives it (HAProxy puts 12 / 7 / 5 of these
    # 24 session ids on 3 instances), not all 24 that round robin spreads over it. See docs/deploy.md.
    "chat": ChatShape(sessions=24, turns=6, system_tokens=32, user_tokens=32, answer_tokens=64, think_time_s=2.0,
                      cache_sessions=12.0),
}
DEFAULT_PRESET = "chat"


def resolve_shape(preset: str, **overrides) -> ChatShape:
    """``PRESETS[preset]`` with every override that is not None replacing its field.

    Raises:
      ValueError: unknown preset, unknown field, or a value `ChatShape` rejects.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ChatShape)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown workload field(s) {sorted(unknown)}")
    return dataclasses.replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


def fit_tokens(text: str, filler: str, n: int, codec: Codec, cut: bool = True) -> str:
    """``text`` extended with repeats of ``filler`` to ``n`` tokens, or cut to ``n`` if longer
    (only when ``cut``); ``n == 0`` returns ``text`` unchanged. The result re-encodes to about
    ``n`` tokens (a cut may merge or split one token at the edge)."""
    if n == 0:
        return text
    ids = codec.encode(text)
    if len(ids) >= n:
        return codec.decode(ids[:n]) if cut else text
    more = codec.encode(filler)
    while len(ids) < n:
        ids = ids + more
    return codec.decode(ids[:n])


def system_prompt(shape: ChatShape, codec: Codec) -> str:
    """The shared system prompt: `SYSTEM` fitted to ``shape.system_tokens``."""
    return fit_tokens(SYSTEM, " " + SYSTEM_MORE, shape.system_tokens, codec)


def user_message(shape: ChatShape, session: int, turn: int, codec: Codec) -> str:
    """Session ``session``'s message at ``turn``: the turn's question (the first names the
    session's destination and traveller, so no two sessions share more than the system prompt),
    extended to ``shape.user_tokens``."""
    question = QUESTIONS[turn % len(QUESTIONS)].format(topic=TOPICS[session % len(TOPICS)])
    if turn == 0:
        question = f"{question} (traveller {session})"
    return fit_tokens(question, USER_MORE, shape.user_tokens, codec, cut=False)


def think_times(shape: ChatShape, seed: int = 0) -> np.ndarray:
    """Seconds each session waits before each turn, ``(sessions, turns)`` float64: column 0 is
    the session's start, uniform in [0, think_time_s); the others uniform in
    [0.5, 1.5) x think_time_s. All zero when ``think_time_s`` is 0."""
    rng = np.random.default_rng(seed)
    out = rng.uniform(0.5, 1.5, size=(shape.sessions, shape.turns)) * shape.think_time_s
    out[:, 0] = rng.uniform(0.0, 1.0, size=shape.sessions) * shape.think_time_s
    return out


def longest_context_tokens(shape: ChatShape, system_len: int, user_lens: Sequence[int]) -> int:
    """At least the tokens of a session's last prompt plus its answer at full length: the system
    prompt and every user message and answer, each with `TEMPLATE_TOKENS_PER_MESSAGE` (an upper
    bound for ChatML). ``user_lens``: the session's user-message lengths, one per turn."""
    per_message = TEMPLATE_TOKENS_PER_MESSAGE
    return (system_len + per_message + sum(n + per_message for n in user_lens)
            + shape.turns * (shape.answer_tokens + per_message))


def kv_pool_blocks(shape: ChatShape, longest_context: int, block_size: int) -> int | None:
    """``server.py --num-blocks`` for ``shape.cache_sessions`` sessions of ``longest_context``
    tokens: ``ceil(cache_sessions * longest_context / block_size)`` plus the null block.
    None when ``cache_sessions`` is None (the server sizes its pool itself)."""
    if shape.cache_sessions is None:
        return None
    return math.ceil(shape.cache_sessions * longest_context / block_size) + 1


def cache_figures(before: Sequence[dict], after: Sequence[dict]) -> dict:
    """Token-weighted prefix-cache figures between two readings of every instance's counters.

    Each reading is `jaxinfer.bench.metadata.parse_metrics` of one instance's ``/metrics``
    (``prefix_cache_queries_total``: prompt tokens of every admitted request;
    ``prefix_cache_hits_total``: those found in the prefix cache, whole blocks only;
    ``prefix_cache_evictions_total``: cached blocks reclaimed for new allocations). Sums over
    the instances, so one request counts once wherever it ran.

    Returns:
      ``{"query_tokens", "hit_tokens", "miss_tokens", "hit_rate", "evicted_blocks"}``: the
      increases, misses = queries - hits (the prompt tokens the instances had to prefill),
      hits / queries (None when no token was queried), and the blocks evicted (None when a
      reading lacks the counter: a server from before it existed).

    Raises:
      ValueError: the readings cover different numbers of instances, or a counter is missing
        or went down (an instance restarted in between).
    """
    if len(before) != len(after):
        raise ValueError(f"{len(before)} readings before, {len(after)} after")
    totals = {}
    for key in ("prefix_cache_queries_total", "prefix_cache_hits_total"):
        deltas = []
        for b, a in zip(before, after):
            if key not in (b or {}) or key not in (a or {}):
                raise ValueError(f"{key} missing from an instance's /metrics")
            if a[key] < b[key]:
                raise ValueError(f"{key} went down ({b[key]} -> {a[key]}): did an instance restart?")
            deltas.append(a[key] - b[key])
        totals[key] = sum(deltas)
    queries, hits = totals["prefix_cache_queries_total"], totals["prefix_cache_hits_total"]
    key = "prefix_cache_evictions_total"
    evicted = (sum(a[key] - b[key] for b, a in zip(before, after))
               if all(key in (r or {}) for r in (*before, *after)) else None)
    return {"query_tokens": queries, "hit_tokens": hits, "miss_tokens": queries - hits,
            "hit_rate": hits / queries if queries else None, "evicted_blocks": evicted}


# histogram (without the jaxinfer_ prefix) -> the key `server_phase_means` reports it under
SERVER_PHASES = {"time_to_first_token_seconds": "ttft_s", "request_queue_time_seconds": "queue_s",
                 "request_prefill_time_seconds": "prefill_s", "time_per_output_token_seconds": "tpot_s"}


def server_phase_means(before: Sequence[dict], after: Sequence[dict]) -> dict:
    """The servers' own mean of each `SERVER_PHASES` histogram between two readings of every
    instance (`jaxinfer.bench.metadata.parse_metrics`): the increase of ``<name>_sum`` over that
    of ``<name>_count``, summed over the instances, in seconds; None for a phase with no
    observation or missing from a reading. Against the clients' TTFT this splits a request's
    wait into the engine's part (queue: arrival to first scheduled; prefill: first scheduled to
    first token) and the rest (HTTP, the balancer, streaming)."""
    out = {}
    for name, key in SERVER_PHASES.items():
        sums = counts = 0.0
        for b, a in zip(before, after):
            if any(f"{name}_{part}" not in (r or {}) for r in (b, a) for part in ("sum", "count")):
                sums = counts = None
                break
            sums += a[f"{name}_sum"] - b[f"{name}_sum"]
            counts += a[f"{name}_count"] - b[f"{name}_count"]
        out[key] = sums / counts if counts else None
    return out
